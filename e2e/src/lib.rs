//! End-to-end harness: a stateful fake API server and a simulated kubelet (see the README).

pub mod fake_api;
