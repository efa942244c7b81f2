//! The test cluster's network, on Linux network namespaces this harness creates and
//! deletes (needs root: `CAP_NET_ADMIN` and `CAP_SYS_ADMIN`):
//!
//! ```text
//!   netns pt-<id>-c (the router)                  netns pt-<id>-n<i> (node i)
//!   ┌─────────────────────────────────┐           ┌──────────────────────────────────┐
//!   │ br0 172.18.0.1/16               │◄─node<i>─►│ eth0 172.18.0.<i+2>              │
//!   │ API forwarder :<api port>       │           │ kubelet, containerd, kube-proxy  │
//!   │ routes 10.244.<i+1>.0/24 → node │           │ cni0 10.244.<i+1>.1/24 → pods    │
//!   └─────────────────────────────────┘           └──────────────────────────────────┘
//! ```
//!
//! [`nodes`] builds the router and the nodes' links; each node's CNI bridge gives its
//! pods their addresses, and kube-proxy routes the Services. The control plane stays on
//! the host's loopback: the router forwards the API server's port to it ([`relay`]), and
//! the API server reaches the kubelets through [`egress`]. No address exists outside
//! these namespaces.

pub mod egress;
mod error;
pub mod nodes;
pub mod relay;

pub use error::Error;

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every pod range of the cluster: node `i`'s is [`pod_cidr`]`(i)`.
pub const POD_RANGE: &str = "10.244.0.0/16";
/// The `kube-dns` Service's ClusterIP, which the kubelets give pods as their resolver.
pub const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

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

/// The cluster's router namespace ([`nodes::create_router`]); deleted with every
/// namespace of the cluster when dropped.
pub struct ClusterNetwork {
    pub prefix: String,
    pub netns: String,
}

impl ClusterNetwork {
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

/// Makes `cmd` enter the network namespace at `netns` between fork and exec.
pub fn enter(cmd: &mut Command, netns: &Path) -> Result<(), Error> {
    let fd: OwnedFd =
        std::fs::File::open(netns).map_err(|e| Error::Io { path: netns.to_path_buf(), source: e })?.into();
    // SAFETY: setns(2) only, on a descriptor opened before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}
