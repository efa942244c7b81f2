//! The network of a cluster of real nodes, on namespaces this harness creates:
//!
//! ```text
//!   netns pt-<id>-c (the switch and router)       netns pt-<id>-n<i> (node i)
//!   ┌─────────────────────────────────────┐       ┌────────────────────────────────────┐
//!   │ br0 172.18.0.1/16                   │◄veth─►│ eth0 172.18.0.<i+2>/16             │
//!   │ 172.18.0.1:<api port> → API server  │       │ the kubelet, containerd, kube-proxy│
//!   │ 10.244.<i+1>.0/24 via 172.18.0.<i+2>│       │ cni0 10.244.<i+1>.1/24 ◄─► pods    │
//!   └─────────────────────────────────────┘       └────────────────────────────────────┘
//! ```
//!
//! A node's link is its NIC and switch port: down, nothing of the node or its pods
//! reaches the others. Pods keep their own addresses across nodes (no masquerade), so a
//! NetworkPolicy sees who talks. The control plane stays on the host's loopback; the
//! router's address relays to it ([`super::relay`]), the address the API server
//! advertises for the `kubernetes` Service. No address exists outside these namespaces.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::{ClusterNetwork, Error, ip, netns_path, pod_cidr};

/// The router's address on the node network: the nodes' gateway, and the address at
/// which the API server is reached from inside the cluster.
pub const ROUTER: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 1);
pub const NODE_PREFIX: u8 = 16;

/// Node `i`'s address.
pub fn node_ip(node: u8) -> Ipv4Addr {
    Ipv4Addr::new(172, 18, 0, node.saturating_add(2))
}

/// The host side of node `i`'s link, in the router's namespace.
pub fn node_link(node: u8) -> String {
    format!("node{node}")
}

/// Writes `value` to `/proc/sys/<key>` inside the network namespace at `netns` (the
/// `net.*` keys are the namespace's own).
pub fn sysctl_in(netns: &std::path::Path, key: &str, value: &str) -> Result<(), Error> {
    let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
    let value = value.to_string();
    super::relay::in_netns(netns, move || std::fs::write(&path, value))
}

/// Creates `<prefix>-c` as the nodes' switch and router: the bridge with [`ROUTER`],
/// forwarding on. Deleted with every namespace of the cluster when dropped.
pub fn create_router(prefix: &str) -> Result<ClusterNetwork, Error> {
    super::sweep_stale();
    let netns = format!("{prefix}-c");
    ip(&["netns", "add", &netns])?;
    let net = ClusterNetwork { prefix: prefix.to_string(), netns: netns.clone() };
    let netns = netns.as_str();
    let gw = format!("{ROUTER}/{NODE_PREFIX}");
    ip(&["-n", netns, "link", "set", "lo", "up"])?;
    ip(&["-n", netns, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", netns, "addr", "add", &gw, "dev", "br0"])?;
    ip(&["-n", netns, "link", "set", "br0", "up"])?;
    sysctl_in(&netns_path(netns), "net.ipv4.ip_forward", "1")?;
    Ok(net)
}

/// Node `node`'s network namespace `<prefix>-n<node>`, linked to the router in
/// `cluster_netns`; deleted with the cluster's namespaces.
pub struct NodeNetwork {
    pub netns: String,
    pub ip: Ipv4Addr,
}

impl NodeNetwork {
    pub fn create(prefix: &str, cluster_netns: &str, node: u8) -> Result<NodeNetwork, Error> {
        let netns = format!("{prefix}-n{node}");
        let host_link = node_link(node);
        let addr = node_ip(node);
        ip(&["netns", "add", &netns])?;
        ip(&["-n", cluster_netns, "link", "add", &host_link, "type", "veth", "peer", "name", "eth0", "netns", &netns])?;
        ip(&["-n", cluster_netns, "link", "set", &host_link, "master", "br0", "up"])?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        ip(&["-n", &netns, "addr", "add", &format!("{addr}/{NODE_PREFIX}"), "dev", "eth0"])?;
        ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &netns, "route", "add", "default", "via", &ROUTER.to_string()])?;
        // The router reaches the node's pods through the node.
        ip(&["-n", cluster_netns, "route", "add", &pod_cidr(node), "via", &addr.to_string()])?;
        let path = netns_path(&netns);
        sysctl_in(&path, "net.ipv4.ip_forward", "1")?;
        // Bridged pod traffic passes iptables, so kube-proxy's rules apply between two
        // pods of one node (the kubelet's and kube-proxy's requirement for a bridge).
        sysctl_in(&path, "net.bridge.bridge-nf-call-iptables", "1")?;
        Ok(NodeNetwork { netns, ip: addr })
    }

    pub fn path(&self) -> PathBuf {
        netns_path(&self.netns)
    }
}

/// Sets node `node`'s link up or down: a failed NIC or switch port. The node and its
/// pods keep their addresses and sockets; no frame reaches or leaves them.
pub fn set_node_link(cluster_netns: &str, node: u8, up: bool) -> Result<(), Error> {
    ip(&["-n", cluster_netns, "link", "set", &node_link(node), if up { "up" } else { "down" }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_and_their_pods_have_ranges_of_their_own() {
        assert_eq!(node_ip(0), Ipv4Addr::new(172, 18, 0, 2));
        assert_eq!(node_ip(2), Ipv4Addr::new(172, 18, 0, 4));
        assert_eq!(pod_cidr(0), "10.244.1.0/24");
        assert_eq!(node_link(3), "node3");
    }
}
