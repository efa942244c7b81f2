//! A node's own cgroup, in every cgroup v1 hierarchy of this machine: the kubelet's
//! `cgroupRoot`, under which its pods' cgroups go (`<root>/kubepods/<qos>/pod<uid>/…`),
//! and, in the cpuset hierarchy, the node's share of the CPUs, which every pod inherits.

use std::path::{Path, PathBuf};

use crate::control_plane::Error;

const CGROUPS: &str = "/sys/fs/cgroup";

/// The cgroup `/<cluster>/<node>` in every hierarchy; removed with everything under it
/// when dropped (once nothing runs in it).
pub struct NodeCgroup {
    /// The path below each hierarchy's root, `/pt<pid>-<n>/node-<i>`.
    pub path: String,
}

/// The mounted v1 hierarchies (`cpu`, `memory`, ..., `systemd`), not the unified one.
fn hierarchies() -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(CGROUPS) else { return Vec::new() };
    let mut out: Vec<PathBuf> = dir
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.file_name() != "unified")
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

fn write(path: &Path, value: &str) -> Result<(), Error> {
    std::fs::write(path, value).map_err(|e| Error::io(path, e))
}

/// Gives a new cpuset cgroup `dir` its CPUs (or its parent's) and its parent's memory
/// nodes: a cpuset cgroup without them admits no task.
fn init_cpuset(dir: &Path, cpus: Option<&str>) -> Result<(), Error> {
    let parent = dir.parent().expect("a cgroup below the root");
    let read = |f: &str| std::fs::read_to_string(parent.join(f)).map_err(|e| Error::io(&parent.join(f), e));
    let cpus = match cpus {
        Some(c) => c.to_string(),
        None => read("cpuset.cpus")?.trim().to_string(),
    };
    write(&dir.join("cpuset.cpus"), &cpus)?;
    write(&dir.join("cpuset.mems"), read("cpuset.mems")?.trim())
}

impl NodeCgroup {
    /// Creates `/<cluster>/<node>` in every hierarchy, with `cpus` (a list like "0-1" or
    /// "1") as the node's cpuset when given.
    pub fn create(cluster: &str, node: &str, cpus: Option<&str>) -> Result<NodeCgroup, Error> {
        let path = format!("/{cluster}/{node}");
        for h in hierarchies() {
            let cluster_dir = h.join(cluster);
            let node_dir = cluster_dir.join(node);
            let is_cpuset = h.join("cpuset.cpus").exists();
            if !cluster_dir.exists() {
                std::fs::create_dir(&cluster_dir).map_err(|e| Error::io(&cluster_dir, e))?;
                if is_cpuset {
                    init_cpuset(&cluster_dir, None)?;
                }
            }
            std::fs::create_dir_all(&node_dir).map_err(|e| Error::io(&node_dir, e))?;
            if is_cpuset {
                init_cpuset(&node_dir, cpus)?;
            }
        }
        Ok(NodeCgroup { path })
    }

    /// Moves process `pid` into the node's child cgroup `name`, in every hierarchy.
    pub fn adopt(&self, name: &str, pid: u32) -> Result<(), Error> {
        let rel = self.path.trim_start_matches('/');
        for h in hierarchies() {
            let dir = h.join(rel).join(name);
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            if h.join("cpuset.cpus").exists() {
                init_cpuset(&dir, None)?;
            }
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// SIGKILLs every process left in the node's cgroups.
    pub fn kill_all(&self) {
        let mut pids = Vec::new();
        collect_procs(&Path::new(CGROUPS).join("pids").join(self.path.trim_start_matches('/')), &mut pids);
        for pid in pids {
            // SAFETY: kill(2) on a process of this node's cgroup, which this harness made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// The node's directory in hierarchy `name` (`memory`, `cpuset`, ...).
    pub fn dir(&self, name: &str) -> PathBuf {
        Path::new(CGROUPS).join(name).join(self.path.trim_start_matches('/'))
    }
}

/// Every process of the cgroup process `pid` is in (in the `pids` hierarchy), and of the
/// cgroups below it: a container's processes, from one of them.
pub fn procs_beside(pid: u32) -> Result<Vec<libc::pid_t>, Error> {
    let file = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
    // "7:pids:/pt1-0/node-1/kubepods/besteffort/pod…/<container>"
    let path = text
        .lines()
        .filter_map(|l| l.split_once(':').and_then(|(_, rest)| rest.split_once(':')))
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "pids"))
        .map(|(_, path)| path.trim_start_matches('/').to_string())
        .ok_or_else(|| Error::Setup(format!("{}: no pids cgroup in {text:?}", file.display())))?;
    let mut out = Vec::new();
    collect_procs(&Path::new(CGROUPS).join("pids").join(path), &mut out);
    Ok(out)
}

/// The processes of cgroup `dir` and of every cgroup below it.
fn collect_procs(dir: &Path, out: &mut Vec<libc::pid_t>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<libc::pid_t>().ok()));
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_procs(&e.path(), out);
        }
    }
}

/// Removes the cgroup `dir` and every cgroup below it, deepest first (a cgroup goes
/// only once its children have and no task is left in it).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for NodeCgroup {
    fn drop(&mut self) {
        self.kill_all();
        // A killed process leaves its cgroup once the kernel has reaped it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let dir = Path::new(CGROUPS).join("pids").join(self.path.trim_start_matches('/'));
        let mut left = Vec::new();
        while {
            left.clear();
            collect_procs(&dir, &mut left);
            !left.is_empty()
        } && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let rel = self.path.trim_start_matches('/');
        let cluster = rel.split('/').next().unwrap_or_default().to_string();
        for h in hierarchies() {
            remove_tree(&h.join(rel));
            // The cluster's own cgroup goes with its last node.
            let _ = std::fs::remove_dir(h.join(&cluster));
        }
    }
}

/// Kills what is left in, and removes, the clusters' cgroups whose name `dead` judges
/// stale.
pub fn sweep(dead: impl Fn(&str) -> bool) {
    let mut stale = Vec::new();
    for h in hierarchies() {
        for e in std::fs::read_dir(&h).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if e.file_type().is_ok_and(|t| t.is_dir()) && dead(&name) && !stale.contains(&name) {
                stale.push(name);
            }
        }
    }
    for name in stale {
        let mut pids = Vec::new();
        collect_procs(&Path::new(CGROUPS).join("pids").join(&name), &mut pids);
        for pid in pids {
            // SAFETY: kill(2) on a process left in a dead test cluster's cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for h in hierarchies() {
            remove_tree(&h.join(&name));
        }
    }
}

/// The CPU list a cpuset file takes, from CPU numbers: `[0, 1, 3]` → "0,1,3".
pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}
