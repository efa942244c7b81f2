//! NetworkPolicy on real nodes: kube-router's firewall on each node (started by
//! [`crate::node::RealNode::start_kube_router`]) with the read-only access its upstream
//! manifests grant it, bound to its static identity `system:kube-router`.

use std::time::Duration;

use crate::control_plane::{Error, wait_until};
use crate::node::RealNode;

/// The ClusterRole and its binding, for `kubectl apply -f -`: what kube-router's
/// informers list and watch, and nothing it could change.
pub const RBAC: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:kube-router"}
rules:
- apiGroups: [""]
  resources: [namespaces, pods, services, nodes, endpoints]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:kube-router"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kube-router"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:kube-router"}]
"#;

/// The chain kube-router hooks into the node's FORWARD chain once it has synced its
/// informers and set up its top-level rules: from then on it judges pod traffic.
const FORWARD_CHAIN: &str = "KUBE-ROUTER-FORWARD";

/// Waits until kube-router on `node` has hooked its chains into the node's filter table.
pub async fn wait_enforcing(node: &RealNode) -> Result<(), Error> {
    let netns = node.net.netns.clone();
    wait_until(
        &format!("kube-router on {} enforcing NetworkPolicies", node.facts.name),
        Duration::from_secs(60),
        || {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &netns, "iptables-save", "-t", "filter"])
                .output();
            let log = node.kube_router.as_ref().map(|d| d.log_tail(5)).unwrap_or_default();
            async move {
                let rules = out.map_err(|e| format!("iptables-save: {e}"))?;
                let rules = String::from_utf8_lossy(&rules.stdout);
                let jump = format!("-j {FORWARD_CHAIN}");
                if rules.lines().any(|l| l.starts_with("-A FORWARD ") && l.ends_with(&jump)) {
                    Ok(())
                } else {
                    Err(format!("FORWARD does not jump to {FORWARD_CHAIN} yet; kube-router's log:\n{log}"))
                }
            }
        },
    )
    .await
}
