//! A container as a process: what the kubelet and a runtime do between "the pod is
//! bound here" and "the process exits", minus the image: the container's command runs
//! on this machine, in the pod's network, mount and UTS namespaces.

use std::collections::BTreeMap;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::config::Error;

/// The kubelet cuts the termination message here.
pub const MESSAGE_BYTES: usize = 4096;
/// `FallbackToLogsOnError` takes at most this much of the log's end.
pub const LOG_TAIL_BYTES: usize = 2048;
/// The annotation of an Indexed Job's completion index.
pub const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// How a container ended, as `containerStatuses[].state.terminated` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terminated {
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub started_at: String,
    pub finished_at: String,
}

pub struct Process {
    pub child: Child,
    pub started_at: String,
    pub termination: PathBuf,
    pub log: PathBuf,
    /// When SIGTERM was sent, and the grace period that followed.
    pub term_sent: Option<(Instant, std::time::Duration)>,
    /// The next exit is reported as the kernel's OOM kill (a test's marker file).
    pub oom_marker: PathBuf,
}

pub fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The last `max` bytes of a file, from a line start where possible.
pub fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    let s = String::from_utf8_lossy(&text[start..]).to_string();
    match (start > 0, s.find('\n')) {
        (true, Some(i)) => s[i + 1..].to_string(),
        _ => s,
    }
}

/// A downward-API field of the pod (`env[].valueFrom.fieldRef.fieldPath`).
pub fn field(pod: &Pod, pod_ip: &str, host_ip: &str, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| -> Option<Option<String>> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key).cloned()))
    };
    if let Some(v) = keyed("metadata.annotations['", &meta.annotations) {
        return v;
    }
    if let Some(v) = keyed("metadata.labels['", &meta.labels) {
        return v;
    }
    let spec = pod.spec.as_ref();
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" | "status.podIPs" => Some(pod_ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some(host_ip.to_string()),
        _ => None,
    }
}

impl Process {
    /// Whether it has exited; if so, how, as the kubelet reports it.
    pub fn exited(&mut self, container: &Container) -> Option<Terminated> {
        let status = self.child.try_wait().ok().flatten()?;
        let exit_code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        let oom = self.oom_marker.exists();
        let reason = match (oom, exit_code) {
            (true, _) => "OOMKilled",
            (false, 0) => "Completed",
            _ => "Error",
        };
        let mut message = std::fs::read(&self.termination)
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(MESSAGE_BYTES)]).to_string())
            .unwrap_or_default();
        let fallback = container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
        if message.is_empty() && fallback && exit_code != 0 {
            message = tail(&self.log, LOG_TAIL_BYTES);
        }
        Some(Terminated {
            exit_code,
            reason: reason.to_string(),
            message,
            started_at: self.started_at.clone(),
            finished_at: now_rfc3339(),
        })
    }
}

/// What a container's process is started with.
pub struct Launch<'a> {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: &'a Path,
    pub log: PathBuf,
    pub termination: PathBuf,
    pub enter: crate::network::Enter,
    pub oom_marker: PathBuf,
}

/// Starts the process in its own process group with a clean environment.
pub fn start(l: Launch<'_>) -> Result<Process, Error> {
    let out = std::fs::File::create(&l.log).map_err(|e| Error::io(&l.log, e))?;
    let err = out.try_clone().map_err(|e| Error::io(&l.log, e))?;
    let mut cmd = Command::new(&l.program);
    cmd.args(&l.args).current_dir(l.cwd).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
    cmd.env_clear();
    // What every image's environment has.
    cmd.env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    cmd.env("HOME", "/root");
    for (k, v) in &l.env {
        cmd.env(k, v);
    }
    l.enter.apply(&mut cmd);
    let _ = std::fs::remove_file(&l.oom_marker);
    let child = cmd.spawn().map_err(|e| Error::Spawn { program: l.program.display().to_string(), source: e })?;
    Ok(Process {
        child,
        started_at: now_rfc3339(),
        termination: l.termination,
        log: l.log,
        term_sent: None,
        oom_marker: l.oom_marker,
    })
}

/// A signal to every process of a container.
pub fn signal_group(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on the process group of a container we started (its own group).
    unsafe {
        libc::kill(-(pid as libc::pid_t), signal);
    }
}

/// Direct children of a process, from /proc.
pub fn children(pid: u32) -> Vec<u32> {
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
