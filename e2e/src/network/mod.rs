//! The test cluster's pod network, on Linux network namespaces this harness creates and
//! deletes (needs root: `CAP_NET_ADMIN` and `CAP_SYS_ADMIN`):
//!
//! ```text
//!   netns pt-<id>-c (the cluster)             netns pt-<id>-<node>-<slot> (one per pod)
//!   ┌───────────────────────────────┐         ┌──────────────────────────────┐
//!   │ br0 10.244.0.1/16             │◄─veth──►│ eth0 10.244.<node+1>.<slot>  │
//!   │ lo  10.96.0.1:443 → API relay │         │ the pod's processes          │
//!   │ the operator                  │         └──────────────────────────────┘
//!   └───────────────────────────────┘
//! ```
//!
//! Every pod has its own network namespace and address, so two pods may listen on the
//! same port, `status.podIP` is the address the pod's processes use, and the
//! EndpointSlice controller publishes it (it refuses loopback addresses). The control
//! plane stays on the host's loopback; the `kubernetes` Service's ClusterIP in the
//! cluster namespace relays to it ([`relay`]). No address exists outside these
//! namespaces.
//!
//! Names resolve through hosts files ([`hosts`]): each pod's `/etc/hosts` (bind-mounted
//! in its own mount namespace) holds what the kubelet writes (localhost, the pod's own
//! name) and what cluster DNS would answer, generated from the real EndpointSlices; its
//! `/etc/resolv.conf` has the kubelet's search path and a server that refuses at once,
//! so a name not yet published fails as fast as cluster DNS's NXDOMAIN.

pub mod egress;
mod error;
pub mod hosts;
pub mod nodes;
pub mod relay;

pub use error::Error;

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::mounts::Binds;

/// A node's network is cut while this file exists in its agent's root: the host side of
/// every pod link of the node is down, also of pods started meanwhile ([`NodeLinks`]).
pub const PARTITIONED: &str = "partitioned";

/// Every pod range of the cluster: node `i`'s is [`pod_cidr`]`(i)`.
pub const POD_RANGE: &str = "10.244.0.0/16";
/// The `kube-dns` Service's ClusterIP, which the kubelets give pods as their resolver.
pub const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// The bridge's address and the pods' gateway.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
pub const POD_PREFIX: u8 = 16;

/// Runs `program` with `args`; a failure is `failed(args, stderr)`.
fn run(program: &str, args: &[&str], failed: fn(String, String) -> Error) -> Result<(), Error> {
    let out =
        Command::new(program).args(args).output().map_err(|e| Error::Io { path: PathBuf::from(program), source: e })?;
    if !out.status.success() {
        return Err(failed(args.join(" "), String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(())
}

/// Runs `ip` with `args`.
pub fn ip(args: &[&str]) -> Result<(), Error> {
    run("ip", args, |args, stderr| Error::Ip { args, stderr })
}

/// Runs `tc` with `args`.
pub fn tc(args: &[&str]) -> Result<(), Error> {
    run("tc", args, |args, stderr| Error::Tc { args, stderr })
}

/// The path of a named network namespace.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// A node's pod range: `10.244.<node + 1>.0/24`.
pub fn pod_cidr(node: u8) -> String {
    format!("10.244.{}.0/24", u16::from(node) + 1)
}

/// The address of a pod in a node's range.
pub fn pod_ip(node: u8, slot: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, node.saturating_add(1), slot)
}

/// The cluster's network namespace and bridge; deleted with every pod namespace of
/// this cluster when dropped.
pub struct ClusterNetwork {
    pub prefix: String,
    pub netns: String,
}

impl ClusterNetwork {
    /// Creates `<prefix>-c` with the bridge and the API relay's address. `prefix` must be
    /// unique on the machine (the test process id and a counter).
    pub fn create(prefix: &str) -> Result<ClusterNetwork, Error> {
        sweep_stale();
        let netns = format!("{prefix}-c");
        ip(&["netns", "add", &netns])?;
        let net = ClusterNetwork { prefix: prefix.to_string(), netns: netns.clone() };
        let gw = format!("{GATEWAY}/{POD_PREFIX}");
        let api = format!("{}/32", crate::control_plane::KUBERNETES_SERVICE_IP);
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        ip(&["-n", &netns, "addr", "add", &api, "dev", "lo"])?;
        ip(&["-n", &netns, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &netns, "addr", "add", &gw, "dev", "br0"])?;
        ip(&["-n", &netns, "link", "set", "br0", "up"])?;
        Ok(net)
    }

    pub fn path(&self) -> PathBuf {
        netns_path(&self.netns)
    }
}

impl Drop for ClusterNetwork {
    fn drop(&mut self) {
        delete_namespaces(&format!("{}-", self.prefix));
    }
}

/// Deletes every named network namespace that starts with `prefix`.
fn delete_namespaces(prefix: &str) {
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with(prefix) {
            let _ = ip(&["netns", "delete", &name]);
        }
    }
}

/// Namespaces of test clusters whose process is gone (`pt<pid>-...`): a test killed
/// before its clean-up.
pub(crate) fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let pid = name.strip_prefix("pt").and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = ip(&["netns", "delete", &name]);
        }
    }
}

/// The host sides of one node's pod links in the cluster namespace (`veth<node>x<slot>`):
/// a switch port each. Down, the node's pods keep their addresses and sockets but no
/// frame reaches or leaves them, as when a node's NIC or its top-of-rack port fails.
pub struct NodeLinks<'a> {
    pub cluster_netns: &'a str,
    pub node: u8,
}

impl NodeLinks<'_> {
    /// The links that exist now, and whether each is up.
    pub fn list(&self) -> Result<Vec<(String, bool)>, Error> {
        let out = Command::new("ip")
            .args(["-n", self.cluster_netns, "-o", "link", "show"])
            .output()
            .map_err(|e| Error::Io { path: PathBuf::from("ip"), source: e })?;
        if !out.status.success() {
            return Err(Error::Ip {
                args: format!("-n {} -o link show", self.cluster_netns),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let prefix = format!("veth{}x", self.node);
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                // "12: veth1x2@if3: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 ..."
                let mut fields = l.split(": ");
                let name = fields.nth(1)?;
                let name = name.split('@').next().unwrap_or(name);
                let flags = fields.next()?.split('>').next()?.trim_start_matches('<');
                let up = flags.split(',').any(|f| f == "UP");
                name.starts_with(&prefix).then(|| (name.to_string(), up))
            })
            .collect())
    }

    /// Sets every link of the node up or down; the links it set.
    pub fn set(&self, up: bool) -> Result<Vec<String>, Error> {
        let links: Vec<String> = self.list()?.into_iter().map(|(name, _)| name).collect();
        for link in &links {
            set_link(self.cluster_netns, link, up)?;
        }
        Ok(links)
    }

    /// Caps every link of the node at `rate` each way (tc's notation: "16mbit"), as a
    /// NIC that negotiated a lower speed or a policed switch port does, or lifts the cap
    /// (`None`). A token bucket on both ends of each pod's veth: the host side shapes
    /// what reaches the pod, the pod's `eth0` what leaves it. The links it shaped.
    pub fn shape(&self, rate: Option<&str>) -> Result<Vec<String>, Error> {
        let links: Vec<String> = self.list()?.into_iter().map(|(name, _)| name).collect();
        let prefix = self.cluster_netns.strip_suffix("-c").unwrap_or(self.cluster_netns);
        for link in &links {
            let slot = link.strip_prefix(&format!("veth{}x", self.node)).unwrap_or_default();
            let pod_netns = format!("{prefix}-{}-{slot}", self.node);
            for (netns, dev) in [(self.cluster_netns, link.as_str()), (pod_netns.as_str(), "eth0")] {
                match rate {
                    // A burst of 32 KiB passes at line rate; a queue of up to 1 s, so that
                    // the cap slows traffic rather than dropping it.
                    Some(r) => tc(&[
                        "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", r, "burst", "32kb",
                        "latency", "1s",
                    ])?,
                    None => match tc(&["-n", netns, "qdisc", "del", "dev", dev, "root"]) {
                        // The kernel's default qdisc has nothing to delete.
                        Err(Error::Tc { stderr, .. }) if stderr.contains("Cannot delete qdisc with handle of zero") => {
                        }
                        r => r?,
                    },
                }
            }
        }
        Ok(links)
    }
}

fn set_link(cluster_netns: &str, link: &str, up: bool) -> Result<(), Error> {
    ip(&["-n", cluster_netns, "link", "set", link, if up { "up" } else { "down" }])
}

/// One pod's network: its namespace, with a veth into the cluster's bridge.
#[derive(Clone, Debug)]
pub struct PodNetwork {
    pub netns: String,
    pub ip: Ipv4Addr,
    host_link: String,
    cluster_netns: String,
    /// False once deleted: the slot, and with it these names, may then be another pod's.
    live: bool,
}

impl PodNetwork {
    /// Creates `<prefix>-<node>-<slot>` with `eth0` at [`pod_ip`] (what a CNI plugin's
    /// ADD does).
    pub fn create(prefix: &str, cluster_netns: &str, node: u8, slot: u8) -> Result<PodNetwork, Error> {
        let netns = format!("{prefix}-{node}-{slot}");
        let host_link = format!("veth{node}x{slot}");
        let addr = pod_ip(node, slot);
        let _ = ip(&["netns", "delete", &netns]);
        let _ = ip(&["-n", cluster_netns, "link", "delete", &host_link]);
        ip(&["netns", "add", &netns])?;
        let cidr = format!("{addr}/{POD_PREFIX}");
        let gw = GATEWAY.to_string();
        ip(&["-n", cluster_netns, "link", "add", &host_link, "type", "veth", "peer", "name", "eth0", "netns", &netns])?;
        ip(&["-n", cluster_netns, "link", "set", &host_link, "master", "br0", "up"])?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        ip(&["-n", &netns, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &netns, "route", "add", "default", "via", &gw])?;
        Ok(PodNetwork { netns, ip: addr, host_link, cluster_netns: cluster_netns.to_string(), live: true })
    }

    /// Sets the host side of the pod's link up or down (see [`NodeLinks`]).
    pub fn set_link(&self, up: bool) -> Result<(), Error> {
        set_link(&self.cluster_netns, &self.host_link, up)
    }

    /// Deletes the namespace and its link (a CNI DEL), once: a pod that finished gives
    /// its slot back at once, so a second delete when the API removes it would take a
    /// newer pod's namespace of the same name.
    pub fn delete(&mut self) {
        if !std::mem::replace(&mut self.live, false) {
            return;
        }
        let _ = ip(&["netns", "delete", &self.netns]);
        let _ = ip(&["-n", &self.cluster_netns, "link", "delete", &self.host_link]);
    }
}

/// What a process enters before it execs: a network namespace, a private mount
/// namespace with its name files bind-mounted over `/etc/hosts` and `/etc/resolv.conf`,
/// and, for a pod, its own UTS
/// namespace with the pod's hostname.
pub struct Enter {
    netns: OwnedFd,
    hostname: Option<CString>,
    /// The name files over `/etc/hosts` and `/etc/resolv.conf` (where this machine has
    /// one to mount over), then the directories bound by [`Enter::bind`].
    binds: Binds,
}

impl Enter {
    pub fn new(netns: &Path, names: &hosts::NameFiles, hostname: Option<&str>) -> Result<Enter, Error> {
        let fd = std::fs::File::open(netns).map_err(|e| Error::Io { path: netns.to_path_buf(), source: e })?;
        let resolv = Path::new("/etc/resolv.conf");
        let mut binds = Binds::default()
            .bind(&names.hosts, Path::new("/etc/hosts"))
            .map_err(|e| Error::Io { path: names.hosts.clone(), source: e })?;
        if resolv.exists() {
            binds =
                binds.bind(&names.resolv, resolv).map_err(|e| Error::Io { path: names.resolv.clone(), source: e })?;
        }
        let hostname = hostname.map(|h| CString::new(h).expect("no NUL in a hostname"));
        Ok(Enter { netns: fd.into(), hostname, binds })
    }

    /// Also bind-mounts directory `source` over `target`, which is created on the host
    /// (empty) when missing: a mount point needs one.
    pub fn bind(mut self, source: &Path, target: &Path) -> Result<Enter, Error> {
        self.binds =
            self.binds.bind(source, target).map_err(|e| Error::Io { path: target.to_path_buf(), source: e })?;
        Ok(self)
    }

    /// Makes `cmd` enter these namespaces between fork and exec.
    pub fn apply(self, cmd: &mut Command) {
        let Enter { netns, hostname, binds } = self;
        // SAFETY: only async-signal-safe system calls run between fork and exec, on
        // values prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
                check(libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET))?;
                binds.mount(if hostname.is_some() { libc::CLONE_NEWUTS } else { 0 })?;
                if let Some(h) = &hostname {
                    check(libc::sethostname(h.as_ptr(), h.as_bytes().len()))?;
                }
                Ok(())
            });
        }
    }
}
