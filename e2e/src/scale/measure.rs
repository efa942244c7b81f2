//! What a scale bench measures: one client's requests from the API server's audit log
//! (read as it grows), a process's memory and CPU from `/proc`, and figures from the
//! API server's own `/metrics`.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::control_plane::Error;
use crate::control_plane::audit::Request;

/// The audit log, read from where the last read stopped: a bench's log grows by
/// gigabytes, and each window wants only its own requests.
pub struct AuditTail {
    path: PathBuf,
    offset: u64,
}

impl AuditTail {
    /// From the log's current end: what comes after now.
    pub fn from_end(path: &Path) -> Result<AuditTail, Error> {
        let offset = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(AuditTail { path: path.to_path_buf(), offset })
    }

    /// The requests completed since the last read, in order; a line the API server is
    /// still writing waits for the next read.
    pub fn read_new(&mut self) -> Result<Vec<Request>, Error> {
        let mut file = std::fs::File::open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        file.seek(SeekFrom::Start(self.offset)).map_err(|e| Error::io(&self.path, e))?;
        let mut text = Vec::new();
        file.read_to_end(&mut text).map_err(|e| Error::io(&self.path, e))?;
        let complete = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        self.offset += complete as u64;
        Ok(text[..complete].split(|b| *b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect())
    }
}

/// Requests of `user` that are not watches (a watch is one long request), counted by
/// `verb resource`.
pub fn by_verb(requests: &[Request], user: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for r in requests.iter().filter(|r| r.user.username == user && r.verb != "watch") {
        *counts.entry(format!("{} {}", r.verb, r.resource())).or_insert(0) += 1;
    }
    counts
}

/// The writes among [`by_verb`]'s counts, the leader's Lease aside: its renewals are
/// the leader's heartbeat, every few seconds whatever the runs do, and are counted among
/// the requests, not as a reconcile's writes.
pub fn writes(counts: &BTreeMap<String, u64>) -> u64 {
    let write =
        |k: &str| ["create ", "update ", "patch ", "delete ", "deletecollection "].iter().any(|v| k.starts_with(v));
    counts.iter().filter(|(k, _)| write(k) && !k.ends_with(" leases")).map(|(_, n)| n).sum()
}

/// A process's resident memory now and at its peak (MiB), and its CPU seconds (user
/// and system) so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
    pub cpu_seconds: f64,
}

pub fn usage(pid: u32) -> Result<Usage, Error> {
    let status_path = PathBuf::from(format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(&status_path).map_err(|e| Error::io(&status_path, e))?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat_path = PathBuf::from(format!("/proc/{pid}/stat"));
    let stat = std::fs::read_to_string(&stat_path).map_err(|e| Error::io(&stat_path, e))?;
    // Fields after the command's closing parenthesis; utime and stime are the 14th and
    // 15th of the line, the 12th and 13th after it.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(Usage {
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_rss_mib: kib("VmHWM:") / 1024.0,
        cpu_seconds: (ticks(11) + ticks(12)) / hz.max(1.0),
    })
}

/// The sum of a metric's samples (any labels) in Prometheus' text format.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A metric's samples summed by the value of the first of `labels` each carries
/// (`apiserver_watch_events_total` names the resource `kind` before Kubernetes 1.34
/// and `resource` since).
pub fn metric_by(text: &str, name: &str, labels: &[&str]) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else { continue };
        let Some((set, value)) = rest.rsplit_once("} ") else { continue };
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        let label = |l: &str| {
            set.split(',').find_map(|kv| kv.strip_prefix(l)?.strip_prefix("=\"")?.strip_suffix('"').map(str::to_string))
        };
        let key = labels.iter().find_map(|l| label(l)).unwrap_or_default();
        *sums.entry(key).or_insert(0.0) += value;
    }
    sums
}

/// `after`'s values less `before`'s, by key.
pub fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The API server's `/metrics`, as the admin.
pub async fn apiserver_metrics(client: &kube::Client) -> Result<String, Error> {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("a GET request");
    client.request_text(request).await.map_err(|e| Error::Setup(format!("the API server's /metrics: {e}")))
}

/// The `q`-quantile of `xs` (sorted here), nearest rank; 0 when empty.
pub fn quantile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1;
    xs[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((quantile(&mut xs, 0.5), quantile(&mut xs, 0.99), quantile(&mut xs, 1.0)), (50.0, 99.0, 100.0));
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }

    #[test]
    fn a_metric_sums_over_its_labels_and_not_over_longer_names() {
        let text = "# HELP x\nx{a=\"1\"} 2\nx{a=\"2\"} 3.5\nx_total 7\nx 1\n";
        assert_eq!(metric_sum(text, "x"), 6.5);
    }

    #[test]
    fn a_metric_sums_by_the_first_label_it_carries() {
        let text = "apiserver_watch_events_total{group=\"\",kind=\"Pod\",version=\"v1\"} 5\n\
                    apiserver_watch_events_total{group=\"batch\",resource=\"jobs\",version=\"v1\"} 2\n\
                    apiserver_watch_events_total{group=\"batch\",resource=\"jobs\",version=\"v2\"} 1\n\
                    apiserver_watch_events_sizes_sum{kind=\"Pod\"} 900\n";
        let by = metric_by(text, "apiserver_watch_events_total", &["resource", "kind"]);
        assert_eq!(by, [("Pod".to_string(), 5.0), ("jobs".to_string(), 3.0)].into());
        let later = [("Pod".to_string(), 9.0), ("jobs".to_string(), 3.0)].into();
        assert_eq!(delta(&by, &later), [("Pod".to_string(), 4.0)].into());
    }

    #[test]
    fn the_leases_renewals_are_not_a_reconciles_writes() {
        let counts = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        assert_eq!(writes(&counts(&[("get leases", 6), ("patch leases", 3)])), 0);
        assert_eq!(writes(&counts(&[("patch leases", 3), ("patch trainingruns", 2), ("create events", 1)])), 3);
        assert_eq!(writes(&counts(&[("get trainingruns", 4), ("list pods", 1)])), 0);
    }

    #[test]
    fn this_process_has_memory_and_cpu() {
        let u = usage(std::process::id()).unwrap();
        assert!(u.rss_mib > 0.0 && u.peak_rss_mib >= u.rss_mib, "{u:?}");
    }
}
