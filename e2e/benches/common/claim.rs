//! What the real-cluster benchmarks share: the benchmark's clock, waits that print what
//! they last saw, and a run's records on its checkpoint claim.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::test_cluster::TestCluster;
use serde_json::Value;

use crate::harness::kubectl;

pub fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

/// Polls `check` every 100 ms until it returns `Ok`, or panics after `limit` with the
/// last state it described.
pub fn until<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(state) if start.elapsed() > limit => panic!("{what}: not within {limit:?}; last seen: {state}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The directory of claim `pvc` in namespace `ns` once bound (the hostPath of its volume).
pub fn claim_dir(c: &TestCluster, ns: &str, pvc: &str) -> PathBuf {
    let volume = until(&format!("claim {pvc} bound"), Duration::from_secs(300), || {
        match c.kubectl_out(&["-n", ns, "get", "pvc", pvc, "-o", "jsonpath={.spec.volumeName}"]) {
            Ok(v) if !v.is_empty() => Ok(v),
            other => Err(format!("{other:?}")),
        }
    });
    PathBuf::from(kubectl(c, &["get", "pv", &volume, "-o", "jsonpath={.spec.hostPath.path}"]))
}

/// The trainer's records (`metrics.jsonl`) in a checkpoint directory, oldest first.
pub fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
