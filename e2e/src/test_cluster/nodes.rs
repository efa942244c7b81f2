//! What a test does to a whole node, as the failures that cost GPU-days do: its network
//! cut and healed (a failed NIC or switch port), slowed (a NIC at a lower speed), and
//! the node lost (powered off: its
//! network silent first, then its agent and every process gone).

use super::TestCluster;
use crate::control_plane::Error;
use crate::network::{NodeLinks, PARTITIONED};
use crate::node_agent::container::signal_group;

impl TestCluster {
    /// The number of node `name` (its pod range is `10.244.<number + 1>.0/24`).
    fn node_number(&self, name: &str) -> Result<u8, Error> {
        let i = self
            .cp
            .nodes
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| Error::Setup(format!("no node {name:?} in this cluster")))?;
        u8::try_from(i).map_err(|_| Error::Setup(format!("node {name:?}: more nodes than pod ranges")))
    }

    /// Cuts node `name` off the pod network (`cut`), or heals it: every pod link of the
    /// node down or up, and its pods started meanwhile cut too until it heals. The links
    /// it set.
    pub fn partition_node(&self, name: &str, cut: bool) -> Result<Vec<String>, Error> {
        let node = self.node_number(name)?;
        let marker = self.dir.join("nodes").join(name).join(PARTITIONED);
        // The marker before the links: a pod whose link appears after the listing below
        // finds the marker when its agent checks it.
        if cut {
            std::fs::write(&marker, b"").map_err(|e| Error::io(&marker, e))?;
        } else if let Err(e) = std::fs::remove_file(&marker)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(Error::io(&marker, e));
        }
        NodeLinks { cluster_netns: &self.net.netns, node }
            .set(!cut)
            .map_err(|e| Error::Setup(format!("node {name}'s links: {e}")))
    }

    /// Caps node `name`'s pod links at `rate` each way ("16mbit"), or lifts the cap
    /// (`None`): a slow node. The links it shaped.
    pub fn slow_node(&self, name: &str, rate: Option<&str>) -> Result<Vec<String>, Error> {
        let node = self.node_number(name)?;
        NodeLinks { cluster_netns: &self.net.netns, node }
            .shape(rate)
            .map_err(|e| Error::Setup(format!("node {name}'s links: {e}")))
    }

    /// Node `name`'s pod links, and whether each is up.
    pub fn node_links(&self, name: &str) -> Result<Vec<(String, bool)>, Error> {
        let node = self.node_number(name)?;
        NodeLinks { cluster_netns: &self.net.netns, node }
            .list()
            .map_err(|e| Error::Setup(format!("node {name}'s links: {e}")))
    }

    /// Loses node `name` as a power loss would: its network goes silent first (no FIN or
    /// RST reaches its peers), then its agent and every process of its pods die. Its
    /// Lease is no longer renewed; what follows is the control plane's.
    pub fn lose_node(&mut self, name: &str) -> Result<(), Error> {
        self.partition_node(name, true)?;
        self.kill_agent(name);
        let pods = self.dir.join("nodes").join(name).join("pods");
        for pod in std::fs::read_dir(&pods).map_err(|e| Error::io(&pods, e))?.flatten() {
            let pid = std::fs::read_to_string(pod.path().join("pid")).ok().and_then(|t| t.trim().parse::<u32>().ok());
            // Only a group that still leads itself: an earlier pod's pid may be reused.
            // SAFETY: getpgid(2) has no preconditions.
            if let Some(pid) = pid.filter(|&p| unsafe { libc::getpgid(p as libc::pid_t) } == p as libc::pid_t) {
                signal_group(pid, libc::SIGKILL);
            }
        }
        Ok(())
    }
}
