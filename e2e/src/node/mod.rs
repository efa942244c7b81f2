//! A real node of the test cluster: containerd with runc and the CNI plugins, the
//! kubelet and kube-proxy, built from source (`scripts/setup-node.sh`), in the node's
//! own network namespace ([`crate::network::nodes`]), cgroup ([`cgroups`]) and mount
//! namespace. Pods are containers of the images `scripts/setup-images.sh` builds
//! ([`images`]), run exactly as their spec says.
//!
//! The mount namespace is shared by the node's daemons (the kubelet's volume mounts
//! must be what containerd bind-mounts into containers) and keeps the host's kernel
//! tunables: the kubelet sets `vm.overcommit_memory`, `kernel.panic` and others at
//! start, and here it writes them into plain files mounted over those `/proc/sys`
//! entries. Host mounts made later beneath a shared mount (the cluster's volumes,
//! [`crate::mounts::SharedMount`]) reach the node (slave propagation); the node's own
//! never reach the host, and all of them end with the namespace.

pub mod cgroups;
pub mod config;
pub mod images;
pub mod seed;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::control_plane::process::Daemon;
use crate::control_plane::{ControlPlane, Error, wait_until};
use crate::network::nodes::NodeNetwork;
use cgroups::NodeCgroup;
pub use config::{NodeFacts, SHORT_ROOT};

/// The kernel tunables the kubelet sets at start (`setupKernelTunables`), which the
/// node's mount namespace turns into plain files.
pub const KUBELET_TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// What test processes that died before their clean-up left of their real nodes: the
/// short-path directories and the cgroups of clusters `pt<pid>-<n>` whose process is
/// gone (its mount namespaces ended with it, so nothing is mounted there).
pub fn sweep_stale() {
    let dead = |name: &str| {
        let pid = name.strip_prefix("pt").and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok());
        pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    for e in std::fs::read_dir(SHORT_ROOT).into_iter().flatten().flatten() {
        if dead(&e.file_name().to_string_lossy()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    cgroups::sweep(dead);
}

/// Where the node binaries are: `$PT_NODE_BIN` (set by `make test`), else what
/// `scripts/setup-node.sh` prints (building them if needed).
pub fn binaries() -> Result<PathBuf, Error> {
    crate::control_plane::tool_dir("PT_NODE_BIN", "setup-node.sh")
}

/// Where this machine's node slots are: `node-slots` in the project's cache
/// (`$PT_CACHE`, else `$XDG_CACHE_HOME/puretransformer`, else
/// `~/.cache/puretransformer`), shared by every checkout and target directory.
pub fn slots_root() -> PathBuf {
    let cache = std::env::var_os("PT_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
        base.join("puretransformer")
    });
    cache.join("node-slots")
}

/// A lock on one of this machine's node slots: the slot's containerd root (images and
/// their unpacked layers) is kept between clusters, and only one containerd may use it.
pub struct Slot {
    pub number: usize,
    pub containerd_root: PathBuf,
    _lock: std::fs::File,
}

impl Slot {
    /// The first free slot under `root`.
    pub fn take(root: &Path) -> Result<Slot, Error> {
        for number in 0..64 {
            let dir = root.join(format!("slot-{number}"));
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            let lock_path = dir.join("lock");
            let lock = std::fs::File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
            // SAFETY: flock(2) on a file we own.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Slot { number, containerd_root: dir.join("containerd"), _lock: lock });
            }
        }
        Err(Error::Setup(format!("no free node slot under {}", root.display())))
    }
}

/// The namespaces a node daemon enters between fork and exec, opened before the fork.
struct Namespaces {
    mnt: OwnedFd,
    net: OwnedFd,
}

impl Namespaces {
    fn open(holder_pid: u32, netns: &Path) -> Result<Namespaces, Error> {
        let open = |p: &Path| std::fs::File::open(p).map(OwnedFd::from).map_err(|e| Error::io(p, e));
        Ok(Namespaces { mnt: open(Path::new(&format!("/proc/{holder_pid}/ns/mnt")))?, net: open(netns)? })
    }

    fn apply(self, cmd: &mut Command) {
        // SAFETY: setns(2) only, on descriptors opened before the fork.
        unsafe {
            cmd.pre_exec(move || {
                for (fd, kind) in [(&self.net, libc::CLONE_NEWNET), (&self.mnt, libc::CLONE_NEWNS)] {
                    if libc::setns(fd.as_raw_fd(), kind) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
}

/// Starts the holder of a node's mount namespace: a process that sleeps in a new mount
/// namespace (slave to the host's) where each of [`KUBELET_TUNABLES`] is a plain file of
/// `dir` holding the host's value.
fn start_holder(dir: &Path) -> Result<Daemon, Error> {
    let mut binds: Vec<(CString, CString)> = Vec::new();
    let cstr = |p: &Path| CString::new(p.display().to_string()).expect("no NUL in a path");
    for key in KUBELET_TUNABLES {
        let proc = Path::new("/proc/sys").join(key);
        let value = std::fs::read_to_string(&proc).map_err(|e| Error::io(&proc, e))?;
        let file = dir.join("sysctl").join(key.replace('/', "."));
        std::fs::create_dir_all(file.parent().expect("a parent")).map_err(|e| Error::io(&file, e))?;
        std::fs::write(&file, value).map_err(|e| Error::io(&file, e))?;
        binds.push((cstr(&file), cstr(&proc)));
    }
    let mut cmd = Command::new("sleep");
    cmd.arg("infinity");
    // SAFETY: unshare(2) and mount(2) only, on strings prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            let flags = libc::MS_REC | libc::MS_SLAVE;
            check(libc::mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), flags, std::ptr::null()))?;
            for (source, target) in &binds {
                let null = std::ptr::null();
                check(libc::mount(source.as_ptr(), target.as_ptr(), null, libc::MS_BIND, std::ptr::null()))?;
            }
            Ok(())
        });
    }
    Daemon::spawn("node mount namespace", cmd, &dir.join("holder.log"))
}

/// A running real node.
pub struct RealNode {
    pub facts: NodeFacts,
    pub net: NodeNetwork,
    pub cpus: Vec<usize>,
    // Dropped by `Drop` in order: kube-router, kube-proxy, the kubelet, the pods,
    // containerd, the mount namespace, the cgroup.
    pub kube_router: Option<Daemon>,
    pub kube_proxy: Option<Daemon>,
    pub kubelet: Option<Daemon>,
    pub containerd: Option<Daemon>,
    holder: Option<Daemon>,
    cgroup: Option<NodeCgroup>,
    _slot: Slot,
}

/// What starting a node needs beyond its facts.
pub struct NodeStart<'a> {
    pub cp: &'a ControlPlane,
    pub net: NodeNetwork,
    pub slot: Slot,
    pub cpus: Vec<usize>,
    pub cluster: &'a str,
    pub images: &'a BTreeMap<String, images::Image>,
    /// The store the slot is a copy of ([`seed::seed`]).
    pub seed: &'a Path,
}

impl RealNode {
    /// Fills its slot from the seed, starts containerd, pins the images (importing any
    /// the store lacks), then starts the kubelet and kube-proxy.
    pub async fn start(facts: NodeFacts, s: NodeStart<'_>) -> Result<RealNode, Error> {
        for dir in [&facts.dir, &facts.run_dir] {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let cpus = (!s.cpus.is_empty()).then(|| cgroups::cpu_list(&s.cpus));
        let cgroup = NodeCgroup::create(s.cluster, &facts.name, cpus.as_deref())?;
        if seed::fill_slot(&facts.containerd_root, s.seed)? {
            tracing::info!("{}: slot {} copied from {}", facts.name, s.slot.number, s.seed.display());
        }
        let holder = start_holder(&facts.dir)?;
        let mut node = RealNode {
            facts,
            net: s.net,
            cpus: s.cpus,
            kube_router: None,
            kube_proxy: None,
            kubelet: None,
            containerd: None,
            holder: Some(holder),
            cgroup: Some(cgroup),
            _slot: s.slot,
        };
        node.start_containerd().await?;
        let imported = images::import(&node.facts.bin, &node.facts.containerd_socket(), s.images)?;
        tracing::info!("{}: images imported {imported:?}", node.facts.name);
        node.start_kubelet(s.cp)?;
        node.start_kube_proxy(s.cp)?;
        Ok(node)
    }

    fn write(&self, name: &str, text: &str) -> Result<PathBuf, Error> {
        let path = self.facts.dir.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        Ok(path)
    }

    /// A command for one of the node's daemons: in its namespaces, on its CPUs.
    fn daemon_command(&self, program: &str) -> Result<Command, Error> {
        let holder = self.holder.as_ref().and_then(Daemon::pid).ok_or_else(|| Error::Setup("no holder".into()))?;
        let mut cmd = Command::new(self.facts.bin.join(program));
        Namespaces::open(holder, &self.net.path())?.apply(&mut cmd);
        crate::cpus::pin(&mut cmd, &self.cpus);
        Ok(cmd)
    }

    async fn start_containerd(&mut self) -> Result<(), Error> {
        let f = &self.facts;
        std::fs::create_dir_all(f.cni_dir()).map_err(|e| Error::io(&f.cni_dir(), e))?;
        self.write("cni/10-pods.conflist", &config::cni_conflist(f))?;
        let conf = self.write("containerd.toml", &config::containerd(f))?;
        let mut cmd = self.daemon_command("containerd")?;
        cmd.arg("--config").arg(&conf).args(["--log-level", "warn"]);
        let daemon = Daemon::spawn("containerd", cmd, &f.dir.join("containerd.log"))?;
        // Its shims, and with them every container, follow it into the node's cgroup:
        // whatever outlives a stop is found there.
        if let (Some(cgroup), Some(pid)) = (&self.cgroup, daemon.pid()) {
            cgroup.adopt("runtime", pid)?;
        }
        self.containerd = Some(daemon);
        let socket = f.containerd_socket();
        let what = format!("{}'s containerd", f.name);
        let containerd = self.containerd.as_mut().expect("just started");
        wait_until(&what, Duration::from_secs(60), || {
            let state = match containerd.exited() {
                Some(status) => Some(format!("exited ({status}): {}", containerd.log_tail(5))),
                None if socket.exists() => None,
                None => Some(containerd.log_tail(5)),
            };
            async move {
                match state {
                    None => Ok(Ok(())),
                    Some(s) if s.starts_with("exited") => Ok(Err(s)),
                    Some(s) => Err(s),
                }
            }
        })
        .await?
        .map_err(|state| Error::NotReady { what, waited: Duration::ZERO, state })
    }

    /// Starts (or starts again) the node's kubelet.
    pub fn start_kubelet(&mut self, cp: &ControlPlane) -> Result<(), Error> {
        let f = &self.facts;
        let id = &cp.nodes.iter().find(|(n, _)| n == &f.name).expect("the node's identity").1;
        let kubeconfig = f.dir.join("kubelet.kubeconfig");
        cp.write_kubeconfig(&kubeconfig, &router_server(cp), &id.user, &id.token)?;
        let serving = &cp.pki.kubelets.iter().find(|(n, _)| n == &f.name).expect("a serving certificate").1;
        // The pods' upstream resolver: none (cluster DNS answers the cluster's names).
        let resolv = self.write("resolv.conf", "")?;
        let conf = self.write("kubelet.yaml", &config::kubelet(f, &cp.pki.ca_cert, serving, &resolv))?;
        let mut cmd = self.daemon_command("kubelet")?;
        cmd.arg("--config")
            .arg(&conf)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--root-dir")
            .arg(f.kubelet_root())
            .arg("--cert-dir")
            .arg(f.dir.join("kubelet-pki"))
            .args(["--hostname-override", &f.name, "--node-ip", &f.ip.to_string(), "--v=1"]);
        self.kubelet = Some(Daemon::spawn("kubelet", cmd, &f.dir.join("kubelet.log"))?);
        Ok(())
    }

    fn start_kube_proxy(&mut self, cp: &ControlPlane) -> Result<(), Error> {
        let f = &self.facts;
        let kubeconfig = f.dir.join("kube-proxy.kubeconfig");
        cp.write_kubeconfig(&kubeconfig, &router_server(cp), &cp.kube_proxy.user, &cp.kube_proxy.token)?;
        let conf = self.write("kube-proxy.yaml", &config::kube_proxy(f, &kubeconfig))?;
        let mut cmd = self.daemon_command("kube-proxy")?;
        cmd.arg("--config").arg(&conf).arg("--v=1");
        self.kube_proxy = Some(Daemon::spawn("kube-proxy", cmd, &f.dir.join("kube-proxy.log"))?);
        Ok(())
    }

    /// Starts kube-router, the node's NetworkPolicy enforcer; it reads its Node, so after
    /// the kubelet registered it.
    pub fn start_kube_router(&mut self, cp: &ControlPlane) -> Result<(), Error> {
        let f = &self.facts;
        let kubeconfig = f.dir.join("kube-router.kubeconfig");
        cp.write_kubeconfig(&kubeconfig, &router_server(cp), &cp.kube_router.user, &cp.kube_router.token)?;
        let mut cmd = self.daemon_command("kube-router")?;
        cmd.args(config::kube_router_args(f, &kubeconfig));
        self.kube_router = Some(Daemon::spawn("kube-router", cmd, &f.dir.join("kube-router.log"))?);
        Ok(())
    }

    /// SIGKILLs the kubelet, as a crash: the pods run on, and nothing reports them.
    pub fn kill_kubelet(&mut self) {
        if let Some(d) = self.kubelet.as_mut() {
            d.kill();
        }
    }

    /// Loses the node as a power failure does, its link already down: the kubelet,
    /// kube-proxy, kube-router and containerd SIGKILLed, then every process left in the node's cgroups
    /// (the shims and the pods' containers).
    pub fn power_off(&mut self) {
        let daemons = [&mut self.kubelet, &mut self.kube_proxy, &mut self.kube_router, &mut self.containerd];
        for d in daemons.into_iter().flatten() {
            d.kill();
        }
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
    }

    /// `crictl` against this node's containerd.
    pub fn crictl(&self) -> Command {
        let mut cmd = Command::new(self.facts.bin.join("crictl"));
        cmd.arg("--runtime-endpoint").arg(format!("unix://{}", self.facts.containerd_socket().display()));
        cmd.args(["--timeout", "20s"]);
        cmd
    }

    /// Stops and removes every pod sandbox (the kubelet is already gone: stopping it
    /// leaves its pods running).
    fn remove_pods(&self) {
        let _ = self.crictl().args(["rmp", "--all", "--force"]).output();
    }

    /// The ends of the node's daemons' logs, for failure messages.
    pub fn log_tails(&self, lines: usize) -> String {
        [&self.kubelet, &self.containerd, &self.kube_proxy, &self.kube_router]
            .into_iter()
            .flatten()
            .map(|d| format!("--- {} {}:\n{}", self.facts.name, d.name, d.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The API server's address as the nodes reach it: the router's, at its port.
pub fn router_server(cp: &ControlPlane) -> String {
    format!("https://{}:{}", crate::network::nodes::ROUTER, cp.api_port)
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.kube_router.take();
        self.kube_proxy.take();
        self.kubelet.take();
        if self.containerd.as_mut().is_some_and(|d| d.exited().is_none()) {
            self.remove_pods();
        }
        self.containerd.take();
        self.holder.take();
        self.cgroup.take();
        let _ = std::fs::remove_dir_all(&self.facts.run_dir);
    }
}
