//! End-to-end harness: a stateful fake API server and a simulated cluster (job
//! controller, kubelet, pod network) that runs the real trainer (see the README).

pub mod cluster;
pub mod fake_api;
