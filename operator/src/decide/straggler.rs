//! Stragglers, pure: the rank whose own work per step (before the gradient all-reduce,
//! as rank 0 reports every rank's) stays over `failurePolicy.stragglerFactor` × the
//! median of the other ranks' for `stragglerReadings` readings of rank 0's status in a
//! row, each at a new step; or a pod whose link is slow ([`slow_link`]). Report only: the Straggler condition names the rank, its
//! pod and its node, an event and an alert follow, and nothing restarts.

use crds::contract::{RankTiming, RunReason};
use crds::types::{SlowLink, Straggler};
use k8s_openapi::api::core::v1::Pod;

use super::{outlier, slow_link};
use crate::failure::completion_index;
use crate::status::{Cond, STRAGGLER};

/// The slowest rank, with the median of the others' compute seconds per step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slowest {
    pub rank: u32,
    pub compute_seconds: f64,
    pub median_seconds: f64,
}

/// The slowest rank when its compute time is over `factor` × the median of the
/// others'. Needs two ranks or more.
pub fn slowest(ranks: &[RankTiming], factor: f64) -> Option<Slowest> {
    let (slow, median) = outlier::slowest(ranks, |r| r.compute_seconds)?;
    (median > 0.0 && slow.compute_seconds > factor * median).then_some(Slowest {
        rank: slow.rank,
        compute_seconds: slow.compute_seconds,
        median_seconds: median,
    })
}

/// The straggler after a reading of rank 0's status at `step`: `prev` counted once more
/// when the same rank is still over the factor, a new one from 1, or none. The same
/// reading seen again (no new step) changes nothing.
pub fn track(prev: Option<&Straggler>, ranks: &[RankTiming], step: u64, factor: f64) -> Option<Straggler> {
    if let Some(p) = prev.filter(|p| p.step == step) {
        return Some(p.clone());
    }
    let Slowest { rank, compute_seconds, median_seconds } = slowest(ranks, factor)?;
    let readings = match prev {
        Some(p) if p.rank == rank => p.readings + 1,
        _ => 1,
    };
    Some(Straggler { rank, pod: None, node: None, compute_seconds, median_seconds, readings, step })
}

/// `s` with the pod and node of its rank: the pod of node rank `rank / procs_per_node`.
pub fn placed(mut s: Straggler, pods: &[Pod], procs_per_node: u32) -> Straggler {
    let node_rank = s.rank / procs_per_node.max(1);
    let pod = pods.iter().find(|p| completion_index(p) == Some(node_rank) && p.metadata.deletion_timestamp.is_none());
    s.pod = pod.and_then(|p| p.metadata.name.clone());
    s.node = pod.and_then(|p| p.spec.as_ref()?.node_name.clone());
    s
}

/// Straggler: True once the same rank was over the factor, or the same pod's link was
/// slow ([`slow_link`]), for `readings` readings in a row; a slow rank first when both.
pub fn condition(s: Option<&Straggler>, link: Option<&SlowLink>, readings: u32) -> Cond {
    let s = s.filter(|s| s.readings >= readings);
    let link = link.filter(|l| l.readings >= readings).map(slow_link::message);
    let Some(s) = s else {
        return match link {
            Some(message) => Cond { type_: STRAGGLER, status: true, reason: RunReason::SlowLink.into(), message },
            None => {
                Cond { type_: STRAGGLER, status: false, reason: RunReason::NoStraggler.into(), message: String::new() }
            }
        };
    };
    let pod = s.pod.as_deref().unwrap_or("its pod is gone");
    let node = s.node.as_deref().map_or(String::new(), |n| format!(" on node {n}"));
    let mut message = format!(
        "rank {} ({pod}{node}) takes {:.2}× the other ranks' median work per step ({:.3} s against {:.3} s) for {} \
         readings in a row, and every step of the gang waits for it: look at that node's GPU (clocks, temperature, \
         ECC errors) and data path, or cordon the node and delete the pod to move the gang",
        s.rank,
        s.compute_seconds / s.median_seconds,
        s.compute_seconds,
        s.median_seconds,
        s.readings
    );
    if let Some(link) = link {
        message = format!("{message}; and {link}");
    }
    Cond { type_: STRAGGLER, status: true, reason: RunReason::Straggler.into(), message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ranks(compute: &[f64]) -> Vec<RankTiming> {
        compute
            .iter()
            .enumerate()
            .map(|(r, &c)| RankTiming { rank: r as u32, compute_seconds: c, data_wait_seconds: 0.01 })
            .collect()
    }

    #[test]
    fn the_slowest_rank_over_the_factor_of_the_others_median() {
        let s = |rank, compute_seconds, median_seconds| Some(Slowest { rank, compute_seconds, median_seconds });
        let cases: [(&[f64], Option<Slowest>); 7] = [
            (&[], None),
            (&[0.4], None),
            (&[0.40, 0.41], None),
            (&[0.40, 0.60], s(1, 0.60, 0.40)),
            (&[0.40, 0.42, 0.41, 0.80], s(3, 0.80, 0.41)),
            (&[0.40, 0.42, 0.41, 0.52], None),
            // Nothing measured yet.
            (&[0.0, 0.0], None),
        ];
        for (compute, want) in cases {
            assert_eq!(slowest(&ranks(compute), 1.3), want, "{compute:?}");
        }
    }

    #[test]
    fn readings_count_in_a_row_for_one_rank_at_new_steps() {
        let slow = ranks(&[0.4, 0.4, 0.9]);
        let first = track(None, &slow, 10, 1.3).unwrap();
        assert_eq!((first.rank, first.readings), (2, 1));
        assert_eq!(track(Some(&first), &slow, 10, 1.3), Some(first.clone()), "the same reading counts once");
        let second = track(Some(&first), &slow, 18, 1.3).unwrap();
        assert_eq!(second.readings, 2);
        let other = track(Some(&second), &ranks(&[0.9, 0.4, 0.4]), 26, 1.3).unwrap();
        assert_eq!((other.rank, other.readings), (0, 1), "another rank starts again");
        assert_eq!(track(Some(&second), &ranks(&[0.4, 0.4, 0.41]), 26, 1.3), None, "recovered");
        assert_eq!(track(Some(&second), &[], 26, 1.3), None, "no reading of the ranks");
    }

    #[test]
    fn the_condition_names_the_rank_its_pod_and_node() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "llm-a1-1-xyz", "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
            "spec": {"nodeName": "gpu-7", "containers": []}
        }))
        .unwrap();
        let s = Straggler {
            rank: 5,
            compute_seconds: 0.6,
            median_seconds: 0.4,
            readings: 2,
            step: 40,
            ..Default::default()
        };
        let s = placed(s, &[pod], 4);
        assert_eq!((s.pod.as_deref(), s.node.as_deref()), (Some("llm-a1-1-xyz"), Some("gpu-7")));
        let c = condition(Some(&s), None, 3);
        assert_eq!((c.status, c.reason.as_str()), (false, "NoStraggler"), "2 readings of 3");
        let c = condition(Some(&Straggler { readings: 3, ..s.clone() }), None, 3);
        assert_eq!((c.status, c.reason.as_str()), (true, "Straggler"));
        assert!(
            c.message.starts_with(
                "rank 5 (llm-a1-1-xyz on node gpu-7) takes 1.50× the other ranks' median work per step (0.600 s \
                 against 0.400 s) for 3 readings in a row"
            ),
            "{}",
            c.message
        );
        assert!(!condition(None, None, 3).status);

        let link = SlowLink { node_rank: 1, pod: "llm-a1-1-xyz".into(), readings: 3, ..Default::default() };
        let c = condition(None, Some(&link), 3);
        assert_eq!((c.status, c.reason.as_str()), (true, "SlowLink"), "{}", c.message);
        assert!(c.message.starts_with("the network link of pod llm-a1-1-xyz"), "{}", c.message);
        let c = condition(None, Some(&SlowLink { readings: 2, ..link.clone() }), 3);
        assert_eq!(c.reason.as_str(), "NoStraggler", "2 readings of 3");
        let c = condition(Some(&Straggler { readings: 3, ..s }), Some(&link), 3);
        assert_eq!(c.reason.as_str(), "Straggler", "a slow rank first");
        assert!(c.message.contains("; and the network link of pod llm-a1-1-xyz"), "{}", c.message);
    }
}
