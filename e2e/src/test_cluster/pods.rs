//! What a test does to a pod's processes, as a node's failures would: kill the
//! trainer's workers, stop and continue a container (a hung node), read its log. Each
//! container is found through its node's runtime; its processes through its cgroup.

use super::TestCluster;
use crate::control_plane::Error;
use crate::node::cgroups::procs_beside;

impl TestCluster {
    /// SIGKILLs the processes the pod's container started (the trainer's workers under
    /// `trainer launch`); how many there were.
    pub fn kill_workers(&self, namespace: &str, name: &str) -> Result<usize, Error> {
        let workers = children(self.container_pid(namespace, name)?);
        for w in &workers {
            // SAFETY: kill(2) on a worker of a container of this cluster.
            unsafe { libc::kill(*w as libc::pid_t, libc::SIGKILL) };
        }
        Ok(workers.len())
    }

    /// Sends `signal` to every process of the pod's container, found through its cgroup
    /// (SIGSTOP: a hung node; SIGCONT: it continues); how many.
    pub fn signal_pod(&self, namespace: &str, name: &str, signal: libc::c_int) -> Result<usize, Error> {
        let procs = procs_beside(self.container_pid(namespace, name)?)?;
        for pid in &procs {
            // SAFETY: kill(2) on a process of a container of this cluster.
            unsafe { libc::kill(*pid, signal) };
        }
        Ok(procs.len())
    }

    /// The pod's container log (stdout and stderr), as `kubectl logs` reads it from its
    /// node's kubelet.
    pub fn pod_log(&self, namespace: &str, name: &str) -> Result<String, Error> {
        self.kubectl_out(&["-n", namespace, "logs", name]).map_err(Error::Setup)
    }
}

/// Direct children of a process, from /proc.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}
