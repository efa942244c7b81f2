//! Slow links, pure: the pod whose network link, timed by the operator at each poll of
//! rank 0 (the seconds to fetch a fixed probe from its status port), stays over
//! `failurePolicy.stragglerFactor` × the median of the other pods' and over
//! [`LINK_PROBE_FLOOR_SECONDS`] for `stragglerReadings` readings in a row. A slow link
//! slows every collective of the gang alike, so the ranks' own timings cannot name it;
//! one seat that times every pod's link can. Report only, as for a straggler.

use crds::contract::{LINK_PROBE_BYTES, LINK_PROBE_FLOOR_SECONDS};
use crds::types::SlowLink;

use super::outlier;
use crate::observed::LinkProbe;

/// The slowest link when it is over `factor` × the median of the others' and over the
/// floor. Needs two pods or more.
pub fn slowest(links: &[LinkProbe], factor: f64) -> Option<(&LinkProbe, f64)> {
    let (slow, median) = outlier::slowest(links, |l| l.seconds)?;
    (slow.seconds > LINK_PROBE_FLOOR_SECONDS && slow.seconds > factor * median).then_some((slow, median))
}

/// The slow link after one reading of every pod's link: `prev` counted once more when
/// the same pod is still slowest and over, a new one from 1, or none.
pub fn track(prev: Option<&SlowLink>, links: &[LinkProbe], factor: f64) -> Option<SlowLink> {
    let (slow, median) = slowest(links, factor)?;
    let readings = match prev {
        Some(p) if p.node_rank == slow.node_rank && p.pod == slow.pod => p.readings + 1,
        _ => 1,
    };
    Some(SlowLink {
        node_rank: slow.node_rank,
        pod: slow.pod.clone(),
        node: slow.node.clone(),
        probe_seconds: slow.seconds,
        median_seconds: median,
        readings,
    })
}

/// What the Straggler condition says of a link found slow `readings` times in a row.
pub fn message(l: &SlowLink) -> String {
    let node = l.node.as_deref().map_or(String::new(), |n| format!(" on node {n}"));
    format!(
        "the network link of pod {} (node rank {}{node}) takes {:.1}× the other pods' median to carry the operator's \
         {} KiB probe ({:.3} s against {:.3} s) for {} readings in a row, and every collective of the gang crosses it: \
         look at that node's NIC and switch port (errors, drops, negotiated speed, a rate limit), or cordon the node \
         and delete the pod to move the gang",
        l.pod,
        l.node_rank,
        l.probe_seconds / l.median_seconds.max(f64::MIN_POSITIVE),
        LINK_PROBE_BYTES / 1024,
        l.probe_seconds,
        l.median_seconds,
        l.readings
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(seconds: &[f64]) -> Vec<LinkProbe> {
        seconds
            .iter()
            .enumerate()
            .map(|(r, &s)| LinkProbe {
                node_rank: r as u32,
                pod: format!("llm-a1-{r}-x"),
                node: Some(format!("n{r}")),
                seconds: s,
            })
            .collect()
    }

    #[test]
    fn the_slowest_link_over_the_factor_and_the_floor() {
        // Each pod's probe seconds, and the slow pod's node rank with the others' median.
        type Case<'a> = (&'a [f64], Option<(u32, f64)>);
        let cases: [Case; 9] = [
            (&[], None),
            (&[0.9], None),
            (&[0.004, 0.006], None),
            // Over the factor but under the floor: scheduling noise on a fast link.
            (&[0.004, 0.040], None),
            (&[0.030, 0.045], None),
            (&[0.030, 0.060], Some((1, 0.030))),
            (&[0.030, 0.520], Some((1, 0.030))),
            (&[0.003, 0.004, 0.300, 0.005], Some((2, 0.004))),
            // A busy moment on every link is no one pod's.
            (&[0.200, 0.220, 0.240], None),
        ];
        for (seconds, want) in cases {
            let got = slowest(&links(seconds), 1.3).map(|(l, m)| (l.node_rank, m));
            assert_eq!(got, want, "{seconds:?}");
        }
    }

    #[test]
    fn readings_count_in_a_row_for_one_pod() {
        let slow = links(&[0.01, 0.6]);
        let first = track(None, &slow, 1.3).unwrap();
        assert_eq!((first.node_rank, first.pod.as_str(), first.readings), (1, "llm-a1-1-x", 1));
        assert_eq!(track(Some(&first), &slow, 1.3).unwrap().readings, 2);
        let replaced = SlowLink { pod: "llm-a1-1-old".into(), ..first.clone() };
        assert_eq!(track(Some(&replaced), &slow, 1.3).unwrap().readings, 1, "a new pod at the rank starts again");
        assert_eq!(track(Some(&first), &links(&[0.7, 0.01]), 1.3).unwrap().readings, 1, "another pod starts again");
        assert_eq!(track(Some(&first), &links(&[0.01, 0.012]), 1.3), None, "healed");
    }

    #[test]
    fn the_message_names_the_pod_its_node_and_the_figures() {
        let l = SlowLink {
            node_rank: 1,
            pod: "llm-a1-1-x".into(),
            node: Some("n1".into()),
            probe_seconds: 0.52,
            median_seconds: 0.04,
            readings: 3,
        };
        assert!(
            message(&l).starts_with(
                "the network link of pod llm-a1-1-x (node rank 1 on node n1) takes 13.0× the other pods' median to \
                 carry the operator's 256 KiB probe (0.520 s against 0.040 s) for 3 readings in a row"
            ),
            "{}",
            message(&l)
        );
    }
}
