//! What a test does to a pod's processes, as a node's failures would: kill the
//! trainer's workers, an OOM kill, a hung node (SIGSTOP), and reading its log.

use std::path::PathBuf;

use super::TestCluster;
use crate::control_plane::Error;
use crate::node_agent::container::{children, signal_group};

impl TestCluster {
    /// The directory of node `node`'s pod `namespace/name` (the newest, if several).
    pub fn pod_dir(&self, namespace: &str, name: &str) -> Option<PathBuf> {
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
        for (node, _) in &self.agents {
            let pods = self.dir.join("nodes").join(node).join("pods");
            let Ok(dir) = std::fs::read_dir(&pods) else { continue };
            for e in dir.flatten() {
                let file = e.file_name().to_string_lossy().to_string();
                if file.starts_with(&format!("{namespace}_{name}_")) {
                    let t = e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
                    found.push((t, e.path()));
                }
            }
        }
        found.into_iter().max().map(|(_, p)| p)
    }

    /// The pid of pod `namespace/name`'s container process (the leader of its process
    /// group), from the pid file its node's agent writes.
    pub fn container_pid(&self, namespace: &str, name: &str) -> Result<u32, Error> {
        let dir = self.pod_dir(namespace, name).ok_or_else(|| Error::Setup(format!("no directory for pod {name}")))?;
        let file = dir.join("pid");
        let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
        text.trim().parse().map_err(|_| Error::Setup(format!("{}: not a pid: {text:?}", file.display())))
    }

    /// SIGKILLs the processes the pod's container started (the trainer's workers under
    /// `trainer launch`); how many there were. On real nodes the container is found
    /// through its node's runtime.
    pub fn kill_workers(&self, namespace: &str, name: &str) -> Result<usize, Error> {
        let container = match self.nodes.is_empty() {
            true => self.container_pid(namespace, name)?,
            false => self.runtime_container_pid(namespace, name)?,
        };
        let workers = children(container);
        for w in &workers {
            // SAFETY: kill(2) on a worker of a container this cluster's agent started.
            unsafe { libc::kill(*w as libc::pid_t, libc::SIGKILL) };
        }
        Ok(workers.len())
    }

    /// The kernel's OOM killer on the pod's container: every process SIGKILLed, and the
    /// agent reports `OOMKilled`, as the kubelet would.
    pub fn oom_kill(&self, namespace: &str, name: &str) -> Result<(), Error> {
        let pid = self.container_pid(namespace, name)?;
        let dir = self.pod_dir(namespace, name).expect("the pod's directory holds its pid");
        let marker = dir.join("oom");
        std::fs::write(&marker, b"").map_err(|e| Error::io(&marker, e))?;
        signal_group(pid, libc::SIGKILL);
        Ok(())
    }

    /// Sends `signal` to every process of the pod's container (SIGSTOP: a hung node).
    pub fn signal_pod(&self, namespace: &str, name: &str, signal: libc::c_int) -> Result<(), Error> {
        signal_group(self.container_pid(namespace, name)?, signal);
        Ok(())
    }

    /// The pod's container log (stdout and stderr).
    pub fn pod_log(&self, namespace: &str, name: &str) -> Result<String, Error> {
        let file = self
            .pod_dir(namespace, name)
            .ok_or_else(|| Error::Setup(format!("no directory for pod {name}")))?
            .join("log");
        std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))
    }
}
