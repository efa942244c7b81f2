//! §2: a real node to the node-lifecycle controller. When a node's kubelet crashes, its
//! Lease goes stale and the real controller marks the node NotReady (Ready Unknown, the
//! unreachable taint); started again, the node is Ready. The other node stays Ready
//! throughout.

use std::time::{Duration, Instant};

use e2e::control_plane::NODE_MONITOR_GRACE;
use e2e::node::config::LEASE_RENEW;

use crate::harness::*;
use crate::slots::cluster_slot;

fn ready(c: &e2e::test_cluster::TestCluster, node: &str) -> String {
    kubectl(c, &["get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])
}

fn taints(c: &e2e::test_cluster::TestCluster, node: &str) -> String {
    kubectl(c, &["get", "node", node, "-o", "jsonpath={.spec.taints[*].key}"])
}

#[tokio::test]
async fn a_node_whose_kubelet_stops_goes_not_ready_and_comes_back() {
    let _slot = cluster_slot().await;
    let mut c = cluster(2).await;
    assert_eq!((ready(&c, "node-0"), ready(&c, "node-1")), ("True".into(), "True".into()));

    let stopped = Instant::now();
    c.kill_kubelet("node-1").unwrap_or_else(|e| panic!("{e}"));
    let deadline = NODE_MONITOR_GRACE + Duration::from_secs(30);
    wait_for(&c, "default", "node/node-1", "condition=Ready=Unknown", deadline);
    let reason =
        kubectl(&c, &["get", "node", "node-1", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}"]);
    assert_eq!(reason, "NodeStatusUnknown");
    poll(&c, "default", "the unreachable taint", Duration::from_secs(30), || {
        let t = taints(&c, "node-1");
        if t.contains("node.kubernetes.io/unreachable") { Ok(()) } else { Err(format!("taints: {t:?}")) }
    });
    let after = stopped.elapsed();
    eprintln!("node-1 NotReady {:.1} s after its kubelet stopped (grace {NODE_MONITOR_GRACE:?})", after.as_secs_f64());
    // The grace runs from the last renewal, at most one renewal period before the stop.
    assert!(after >= NODE_MONITOR_GRACE - LEASE_RENEW, "NotReady before the grace period ran out: {after:?}");
    assert_eq!(ready(&c, "node-0"), "True", "the other node stays Ready");

    c.start_kubelet("node-1").unwrap_or_else(|e| panic!("{e}"));
    wait_for(&c, "default", "node/node-1", "condition=Ready", Duration::from_secs(60));
    poll(&c, "default", "the taint lifted", Duration::from_secs(60), || {
        let t = taints(&c, "node-1");
        if t.contains("node.kubernetes.io/unreachable") { Err(format!("taints: {t:?}")) } else { Ok(()) }
    });
}
