//! What a test does to a whole node, as the failures that cost GPU-days do: its link cut
//! and healed (a failed NIC or switch port), slowed (a NIC at a lower speed), its kubelet
//! crashed and started again, and the node lost (powered off: its link silent first,
//! then every daemon and container gone).

use std::process::Command;

use super::TestCluster;
use crate::control_plane::Error;
use crate::network::nodes::{node_link, set_node_link};
use crate::network::tc;

impl TestCluster {
    /// The index of node `name`: its link is `node<index>` at the router.
    fn node_index(&self, name: &str) -> Result<u8, Error> {
        Ok(self.node(name)?.facts.index)
    }

    /// Cuts node `name`'s link at the router (`cut`), or heals it: the node, its kubelet
    /// and its pods keep their addresses and sockets, and no frame reaches or leaves them.
    /// The links it set.
    pub fn partition_node(&self, name: &str, cut: bool) -> Result<Vec<String>, Error> {
        let index = self.node_index(name)?;
        set_node_link(&self.net.netns, index, !cut).map_err(|e| Error::Setup(format!("node {name}'s link: {e}")))?;
        Ok(vec![node_link(index)])
    }

    /// Caps node `name`'s link at `rate` each way ("16mbit"), or lifts the cap (`None`):
    /// a NIC that negotiated a lower speed. A token bucket on both ends of the link: the
    /// router's side shapes what reaches the node, the node's `eth0` what leaves it. The
    /// links it shaped.
    pub fn slow_node(&self, name: &str, rate: Option<&str>) -> Result<Vec<String>, Error> {
        let node = self.node(name)?;
        let link = node_link(node.facts.index);
        for (netns, dev) in [(self.net.netns.as_str(), link.as_str()), (node.net.netns.as_str(), "eth0")] {
            let shaped = match rate {
                // A burst of 32 KiB passes at line rate; a queue of up to 1 s, so that the
                // cap slows traffic rather than dropping it.
                Some(r) => tc(&[
                    "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", r, "burst", "32kb", "latency",
                    "1s",
                ]),
                None => match tc(&["-n", netns, "qdisc", "del", "dev", dev, "root"]) {
                    // The kernel's default qdisc has nothing to delete.
                    Err(crate::network::Error::Tc { stderr, .. })
                        if stderr.contains("Cannot delete qdisc with handle of zero") =>
                    {
                        Ok(())
                    }
                    r => r,
                },
            };
            shaped.map_err(|e| Error::Setup(format!("node {name}'s link: {e}")))?;
        }
        Ok(vec![link])
    }

    /// Node `name`'s link at the router, and whether it is up.
    pub fn node_links(&self, name: &str) -> Result<Vec<(String, bool)>, Error> {
        let link = node_link(self.node_index(name)?);
        let out = Command::new("ip")
            .args(["-n", &self.net.netns, "-o", "link", "show", &link])
            .output()
            .map_err(|e| Error::Spawn { program: "ip".into(), source: e })?;
        if !out.status.success() {
            return Err(Error::Setup(format!("ip link show {link}: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        // "12: node1@if3: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 ..."
        let text = String::from_utf8_lossy(&out.stdout);
        let flags = text.split('<').nth(1).and_then(|f| f.split('>').next()).unwrap_or_default();
        Ok(vec![(link, flags.split(',').any(|f| f == "UP"))])
    }

    /// SIGKILLs node `name`'s kubelet, as a crash: its pods run on, its Lease stops.
    pub fn kill_kubelet(&mut self, name: &str) -> Result<(), Error> {
        self.node_mut(name)?.kill_kubelet();
        Ok(())
    }

    /// Starts node `name`'s kubelet again.
    pub fn start_kubelet(&mut self, name: &str) -> Result<(), Error> {
        let i = self.nodes.iter().position(|n| n.facts.name == name);
        let node = i.map(|i| &mut self.nodes[i]).ok_or_else(|| Error::Setup(format!("no real node {name}")))?;
        node.start_kubelet(&self.cp)
    }

    /// Loses node `name` as a power loss would: its link goes silent first (no FIN or RST
    /// reaches its peers), then its kubelet, kube-proxy, containerd and every container
    /// die. Its Lease is no longer renewed; what follows is the control plane's.
    pub fn lose_node(&mut self, name: &str) -> Result<(), Error> {
        self.partition_node(name, true)?;
        self.node_mut(name)?.power_off();
        Ok(())
    }

    fn node_mut(&mut self, name: &str) -> Result<&mut crate::node::RealNode, Error> {
        self.nodes.iter_mut().find(|n| n.facts.name == name).ok_or_else(|| Error::Setup(format!("no real node {name}")))
    }
}
