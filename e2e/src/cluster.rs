//! A simulated job controller and kubelet around [`FakeApi`]: what turns the
//! operator's Indexed Jobs into real `trainer launch` processes on this machine.
//!
//! Each tick (every 100 ms) of one background thread:
//! - **Job controller.** An unsuspended, unfinished Indexed Job gets one pod per
//!   completion index (hostname `<job>-<index>`, the index annotation and label, an
//!   owner reference). The first pod that fails ends the Job (`backoffLimit: 0`):
//!   `FailureTarget`, the other pods deleted, then `Failed` once they are gone, with
//!   reason `PodFailurePolicy` when the exit code matches a `FailJob` rule. Every
//!   index succeeded: `Complete`. Suspending deletes the pods; resuming recreates
//!   them. (`DisruptionTarget` rules are not simulated: nothing here disrupts pods.)
//! - **Kubelet.** A new pod's container runs as a process: the template's command
//!   (`trainer` is the trainer binary), args and env, with fieldRefs resolved and
//!   `JOB_COMPLETION_INDEX` set. Each pod gets a root directory where every volume
//!   mount is a link to its backing directory: a claim's directory (shared by every
//!   pod and attempt, removed when the PVC object is deleted, as with a `Delete`
//!   reclaim policy), the ConfigMap's items written out, or an empty directory. A
//!   process cannot see mounts, so paths under a mount in the env are rewritten to
//!   the pod root, and the trainer gets the pod root's `/checkpoints` and `/init`
//!   as `--output` and `--init-dir` and its termination message path as
//!   `TRAINER_TERMINATION_LOG`.
//! - **Network.** Every hostname is 127.0.0.1; each (pod hostname, container port)
//!   gets its own host port, so `MASTER_ADDR`/`MASTER_PORT` and
//!   `TRAINER_STATUS_PORT` are rewritten, and [`SimulatedCluster::status_url`] is a
//!   template for the operator's `--status-url` that reaches rank 0's `/status`
//!   through a small proxy.
//! - **Status.** Pods go Pending → Running → Succeeded/Failed with the container's
//!   terminated state: exit code (128 + signal when killed), reason (`Completed`,
//!   `Error`, `OOMKilled`) and the termination message, or under
//!   `FallbackToLogsOnError` the log's tail. A deleted pod's processes get SIGTERM
//!   and, after the grace period (capped), SIGKILL; the pod object stays (a kubelet
//!   finalizer) until they are gone, as a real pod stays Terminating.
//!
//! Tests act as the infrastructure through [`SimulatedCluster::kill_worker`],
//! [`SimulatedCluster::oom_kill`], [`SimulatedCluster::pause`] and
//! [`SimulatedCluster::resume`].

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crds::contract::{self, env};
use serde_json::{Value, json};

use crate::fake_api::FakeApi;
use crate::node_agent::container::{children, signal_group, tail};

/// Holds a pod object until the kubelet has stopped its processes.
pub const KUBELET_FINALIZER: &str = "e2e.puretransformer.dev/kubelet";
const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
const TICK: Duration = Duration::from_millis(100);
/// The termination message is cut here, as the kubelet does.
const MESSAGE_BYTES: usize = 4096;
/// `FallbackToLogsOnError` takes at most this much of the log's end.
const LOG_TAIL_BYTES: usize = 2048;

/// How the cluster runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The namespace the cluster serves.
    pub namespace: String,
    /// The binary every container image runs.
    pub trainer: PathBuf,
    /// Pod roots, claim directories and logs live here.
    pub root: PathBuf,
    /// A deleted pod's processes get at most this long after SIGTERM.
    pub max_grace: Duration,
}

pub struct SimulatedCluster {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    proxy_port: u16,
}

struct Shared {
    api: FakeApi,
    opts: Options,
    stop: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Running containers by pod name.
    procs: BTreeMap<String, Proc>,
    /// (hostname, container port) → port on 127.0.0.1.
    ports: BTreeMap<(String, u16), u16>,
    /// Pods whose next exit is reported as OOMKilled.
    oom: BTreeSet<String>,
    /// Pods created so far (for unique names).
    created: u64,
    /// Claims that have had a directory.
    claims: BTreeSet<String>,
}

struct Proc {
    child: Child,
    container: String,
    started_at: String,
    image: String,
    termination: PathBuf,
    log: PathBuf,
    message_policy: String,
    claims: Vec<String>,
    term_sent: Option<(Instant, Duration)>,
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn name_of(v: &Value) -> String {
    str_at(v, "/metadata/name").unwrap_or_default().to_string()
}

fn has_condition(obj: &Value, type_: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
}

fn owned_by(pod: &Value, uid: &str) -> bool {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
}

fn index_of(pod: &Value) -> Option<u32> {
    str_at(pod, &format!("/metadata/annotations/{}", INDEX_ANNOTATION.replace('/', "~1")))?.parse().ok()
}

/// Host ports come from below Linux's ephemeral range (32768–60999), so no outgoing
/// connection or `bind(0)` takes a port between its allocation and the trainer's bind.
const HOST_PORTS: std::ops::Range<u16> = 20000..32000;
static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

fn free_port() -> u16 {
    let span = HOST_PORTS.end - HOST_PORTS.start;
    // Test processes started at once begin at different places.
    let _ = NEXT_PORT.compare_exchange(
        0,
        (std::process::id() % u32::from(span)) as u16 + 1,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let port = HOST_PORTS.start + NEXT_PORT.fetch_add(1, Ordering::Relaxed) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {HOST_PORTS:?}")
}

impl SimulatedCluster {
    /// Starts the job controller, the kubelet and the status proxy.
    pub fn start(api: FakeApi, opts: Options) -> SimulatedCluster {
        std::fs::create_dir_all(opts.root.join("pvc")).expect("cluster root");
        let shared = Arc::new(Shared { api, opts, stop: AtomicBool::new(false), state: Mutex::new(State::default()) });
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let proxy_port = listener.local_addr().expect("proxy address").port();
        let s = shared.clone();
        let nodes = std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                s.tick();
                std::thread::sleep(TICK);
            }
            s.shutdown();
        });
        let s = shared.clone();
        let proxy = std::thread::spawn(move || s.proxy(listener));
        SimulatedCluster { shared, threads: vec![nodes, proxy], proxy_port }
    }

    /// The operator's status URL: rank 0's `/status` of `{job}` through the proxy.
    pub fn status_url(&self) -> String {
        format!("http://127.0.0.1:{}/{{job}}/status", self.proxy_port)
    }

    /// The directory behind a PersistentVolumeClaim.
    pub fn claim_dir(&self, claim: &str) -> PathBuf {
        self.shared.opts.root.join("pvc").join(claim)
    }

    /// The container log of a pod (stdout and stderr).
    pub fn log(&self, pod: &str) -> PathBuf {
        self.shared.opts.root.join("pods").join(pod).join("log")
    }

    /// Names of pods with a running container.
    pub fn running(&self) -> Vec<String> {
        self.shared.lock().procs.keys().cloned().collect()
    }

    /// The running pod of a Job's completion index.
    pub fn pod_of(&self, job: &str, index: u32) -> Option<String> {
        let ns = &self.shared.opts.namespace;
        let pods = self.shared.api.list("v1", "Pod", Some(ns));
        let running = self.running();
        pods.iter()
            .filter(|p| str_at(p, "/metadata/labels/job-name") == Some(job) && index_of(p) == Some(index))
            .map(name_of)
            .find(|n| running.contains(n))
    }

    /// SIGKILLs the trainer workers of a pod's container (not its launcher): a
    /// trainer process that dies.
    pub fn kill_worker(&self, pod: &str) -> usize {
        let pid = self
            .shared
            .lock()
            .procs
            .get(pod)
            .map(|p| p.child.id())
            .unwrap_or_else(|| panic!("no running container in pod {pod}"));
        let workers = children(pid);
        for w in &workers {
            // SAFETY: kill(2) on a process of the pod's container.
            unsafe {
                libc::kill(*w as libc::pid_t, libc::SIGKILL);
            }
        }
        workers.len()
    }

    /// The kernel's OOM killer in the pod's memory cgroup: SIGKILL, reported as OOMKilled.
    pub fn oom_kill(&self, pod: &str) {
        let mut st = self.shared.lock();
        let pid =
            st.procs.get(pod).map(|p| p.child.id()).unwrap_or_else(|| panic!("no running container in pod {pod}"));
        st.oom.insert(pod.to_string());
        signal_group(pid, libc::SIGKILL);
    }

    /// SIGSTOP to every process of the pod's container (a hung node).
    pub fn pause(&self, pod: &str) {
        let pid = self
            .shared
            .lock()
            .procs
            .get(pod)
            .map(|p| p.child.id())
            .unwrap_or_else(|| panic!("no running container in pod {pod}"));
        signal_group(pid, libc::SIGSTOP);
    }

    /// SIGCONT to every process of the pod's container.
    pub fn resume(&self, pod: &str) {
        if let Some(pid) = self.shared.lock().procs.get(pod).map(|p| p.child.id()) {
            signal_group(pid, libc::SIGCONT);
        }
    }
}

impl Drop for SimulatedCluster {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ns(&self) -> &str {
        &self.opts.namespace
    }

    fn tick(&self) {
        self.job_controller();
        self.kubelet();
        self.reclaim_volumes();
    }

    fn shutdown(&self) {
        let mut st = self.lock();
        for p in st.procs.values_mut() {
            signal_group(p.child.id(), libc::SIGKILL);
            let _ = p.child.wait();
        }
        st.procs.clear();
    }

    // ---- job controller ----

    fn job_controller(&self) {
        let ns = self.ns().to_string();
        let pods = self.api.list("v1", "Pod", Some(&ns));
        for job in self.api.list("batch/v1", "Job", Some(&ns)) {
            if deleting(&job) || has_condition(&job, "Complete") || has_condition(&job, "Failed") {
                continue;
            }
            let name = name_of(&job);
            let uid = str_at(&job, "/metadata/uid").unwrap_or_default().to_string();
            let mine: Vec<&Value> = pods.iter().filter(|p| owned_by(p, &uid)).collect();
            let phase = |p: &Value| str_at(p, "/status/phase").unwrap_or("Pending").to_string();
            let active: Vec<&Value> =
                mine.iter().copied().filter(|p| !matches!(phase(p).as_str(), "Succeeded" | "Failed")).collect();
            let succeeded: BTreeSet<u32> =
                mine.iter().filter(|p| phase(p) == "Succeeded").filter_map(|p| index_of(p)).collect();
            // Pods the controller deleted (suspension, a failed Job) are not failures.
            let failed: Vec<&Value> = mine.iter().copied().filter(|p| phase(p) == "Failed" && !deleting(p)).collect();
            let completions = job.pointer("/spec/completions").and_then(Value::as_u64).unwrap_or(1) as u32;
            let suspended = job.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true);
            let mut conditions: Vec<Value> = Vec::new();
            let condition = |type_: &str, reason: &str, message: &str| json!({"type": type_, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now_rfc3339(), "lastProbeTime": now_rfc3339()});
            let keep = |type_: &str| {
                job.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
            };
            let delete_active = || {
                for p in active.iter().filter(|p| !deleting(p)) {
                    let _ = self.api.delete("v1", "Pod", Some(&ns), &name_of(p));
                }
            };
            let mut finished = false;
            if let Some(first) = failed.first() {
                let (reason, message) = failure_of(&job, first);
                conditions.push(keep("FailureTarget").unwrap_or_else(|| condition("FailureTarget", &reason, &message)));
                delete_active();
                if active.is_empty() {
                    conditions.push(condition("Failed", &reason, &message));
                    finished = true;
                }
            } else if succeeded.len() as u32 >= completions {
                conditions.push(condition(
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ));
                conditions.push(condition(
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ));
                finished = true;
            } else if suspended {
                conditions.push(
                    keep("Suspended")
                        .filter(|c| c["status"] == "True")
                        .unwrap_or_else(|| condition("Suspended", "JobSuspended", "Job suspended")),
                );
                delete_active();
            } else {
                if let Some(mut c) = keep("Suspended") {
                    c["status"] = json!("False");
                    c["reason"] = json!("JobResumed");
                    conditions.push(c);
                }
                // One pod per index; a replacement only once the old pod is gone.
                let present: BTreeSet<u32> = mine.iter().filter_map(|p| index_of(p)).collect();
                for index in (0..completions).filter(|i| !present.contains(i)) {
                    self.create_pod(&job, &name, &uid, index);
                }
            }
            let ready = active.iter().filter(|p| phase(p) == "Running" && !deleting(p)).count();
            let mut status = json!({
                "active": active.iter().filter(|p| !deleting(p)).count(),
                "ready": ready,
                "succeeded": succeeded.len(),
                "failed": failed.len(),
                "terminating": active.iter().filter(|p| deleting(p)).count(),
            });
            if !conditions.is_empty() {
                status["conditions"] = Value::Array(conditions);
            }
            if let Some(t) = job.pointer("/status/startTime") {
                status["startTime"] = t.clone();
            } else if !suspended {
                status["startTime"] = json!(now_rfc3339());
            }
            if finished {
                status["completionTime"] = json!(now_rfc3339());
            }
            let _ = self.api.set_status("batch/v1", "Job", Some(&ns), &name, status);
        }
    }

    fn create_pod(&self, job: &Value, name: &str, uid: &str, index: u32) {
        let ns = self.ns().to_string();
        let n = {
            let mut st = self.lock();
            st.created += 1;
            st.created
        };
        let mut labels = job.pointer("/spec/template/metadata/labels").cloned().unwrap_or_else(|| json!({}));
        labels["job-name"] = json!(name);
        labels["batch.kubernetes.io/job-name"] = json!(name);
        labels["controller-uid"] = json!(uid);
        labels[INDEX_ANNOTATION] = json!(index.to_string());
        let mut spec = job.pointer("/spec/template/spec").cloned().unwrap_or_else(|| json!({}));
        spec["hostname"] = json!(format!("{name}-{index}"));
        spec["nodeName"] = json!("simulated-node");
        self.api.insert(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": format!("{name}-{index}-{n:05x}"), "namespace": ns,
                "labels": labels,
                "annotations": {INDEX_ANNOTATION: index.to_string()},
                "finalizers": [KUBELET_FINALIZER],
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}],
                "creationTimestamp": now_rfc3339(),
            },
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
        }));
    }

    // ---- kubelet ----

    fn kubelet(&self) {
        let ns = self.ns().to_string();
        let pods: BTreeMap<String, Value> =
            self.api.list("v1", "Pod", Some(&ns)).into_iter().map(|p| (name_of(&p), p)).collect();
        // Start new pods, rank 0's first: it owns the rendezvous port the others use.
        let mut new: Vec<(&String, &Value)> = pods.iter().collect();
        new.sort_by_key(|(name, pod)| (index_of(pod), name.to_string()));
        for (name, pod) in new {
            let started = self.lock().procs.contains_key(name);
            let pending = str_at(pod, "/status/phase").unwrap_or("Pending") == "Pending";
            if !started
                && pending
                && !deleting(pod)
                && let Err(why) = self.start(name, pod)
            {
                let _ = self.api.set_status("v1", "Pod", Some(&ns), name, json!({
                    "phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "containerStatuses": [{"name": container_name(pod), "ready": false, "restartCount": 0, "image": "", "imageID": "",
                        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": why}}}],
                }));
            }
        }
        // Stop the containers of deleted pods.
        let mut st = self.lock();
        for (name, p) in st.procs.iter_mut() {
            let pod = pods.get(name);
            if pod.is_none_or(deleting) && p.term_sent.is_none() {
                let grace = pod
                    .and_then(|o| o.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_u64))
                    .map_or(Duration::from_secs(30), Duration::from_secs)
                    .min(self.opts.max_grace);
                signal_group(p.child.id(), libc::SIGTERM);
                signal_group(p.child.id(), libc::SIGCONT);
                p.term_sent = Some((Instant::now(), grace));
            }
            if let Some((at, grace)) = p.term_sent
                && at.elapsed() > grace
            {
                signal_group(p.child.id(), libc::SIGKILL);
            }
        }
        // Report exits.
        let mut exits = Vec::new();
        for (name, p) in st.procs.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                exits.push((name.clone(), status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))));
            }
        }
        for (name, code) in exits {
            let p = st.procs.remove(&name).expect("listed above");
            // The rest of the group (workers) goes with the container.
            signal_group(p.child.id(), libc::SIGKILL);
            let oom = st.oom.remove(&name);
            let reason = if oom {
                "OOMKilled"
            } else if code == 0 {
                "Completed"
            } else {
                "Error"
            };
            let mut message = std::fs::read(&p.termination)
                .map(|b| String::from_utf8_lossy(&b[..b.len().min(MESSAGE_BYTES)]).to_string())
                .unwrap_or_default();
            if message.trim().is_empty() && code != 0 && p.message_policy == "FallbackToLogsOnError" {
                message = tail(&p.log, LOG_TAIL_BYTES);
            }
            let finished = now_rfc3339();
            let status = json!({
                "phase": if code == 0 { "Succeeded" } else { "Failed" },
                "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False", "reason": "PodCompleted"}],
                "containerStatuses": [{"name": p.container, "ready": false, "restartCount": 0, "started": false,
                    "image": p.image, "imageID": "",
                    "state": {"terminated": {"exitCode": code, "reason": reason, "message": message, "startedAt": p.started_at, "finishedAt": finished}}}],
            });
            if pods.contains_key(&name) {
                let _ = self.api.set_status("v1", "Pod", Some(&ns), &name, status);
            }
            drop(p.child);
        }
        let running: BTreeSet<String> = st.procs.keys().cloned().collect();
        drop(st);
        // A deleted pod whose containers are gone goes away.
        for (name, pod) in &pods {
            if deleting(pod) && !running.contains(name) {
                let _ = self.api.update_with("v1", "Pod", Some(&ns), name, |o| {
                    if let Some(f) = o.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                        f.retain(|x| x != KUBELET_FINALIZER);
                    }
                });
            }
        }
    }

    /// Mounts the volumes under a pod root, resolves the env and starts the container.
    fn start(&self, name: &str, pod: &Value) -> Result<(), String> {
        let ns = self.ns().to_string();
        let container = pod.pointer("/spec/containers/0").ok_or("the pod has no container")?;
        let pod_dir = self.opts.root.join("pods").join(name);
        let root = pod_dir.join("root");
        let _ = std::fs::remove_dir_all(&pod_dir);
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let hostname = str_at(pod, "/spec/hostname").unwrap_or(name).to_string();

        // Volumes.
        let mut backing: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut claims = Vec::new();
        for v in pod.pointer("/spec/volumes").and_then(Value::as_array).cloned().unwrap_or_default() {
            let vname = str_at(&v, "/name").unwrap_or_default().to_string();
            let dir = if let Some(claim) = str_at(&v, "/persistentVolumeClaim/claimName") {
                if self.api.get("v1", "PersistentVolumeClaim", Some(&ns), claim).is_none() {
                    return Err(format!("persistentvolumeclaim \"{claim}\" not found"));
                }
                let dir = self.opts.root.join("pvc").join(claim);
                self.lock().claims.insert(claim.to_string());
                claims.push(claim.to_string());
                dir
            } else if let Some(cm) = str_at(&v, "/configMap/name") {
                let obj = self
                    .api
                    .get("v1", "ConfigMap", Some(&ns), cm)
                    .ok_or_else(|| format!("configmap \"{cm}\" not found"))?;
                let dir = pod_dir.join("volumes").join(&vname);
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                let data = obj["data"].as_object().cloned().unwrap_or_default();
                let items: Vec<(String, String)> = match v.pointer("/configMap/items").and_then(Value::as_array) {
                    Some(items) => items
                        .iter()
                        .map(|i| (i["key"].as_str().unwrap_or("").into(), i["path"].as_str().unwrap_or("").into()))
                        .collect(),
                    None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
                };
                for (key, path) in items {
                    let text = data
                        .get(&key)
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("configmap \"{cm}\" has no key {key:?}"))?;
                    std::fs::write(dir.join(path), text).map_err(|e| e.to_string())?;
                }
                dir
            } else {
                pod_dir.join("volumes").join(&vname)
            };
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            backing.insert(vname, dir);
        }
        let mut mounts: Vec<String> = Vec::new();
        for m in container.pointer("/volumeMounts").and_then(Value::as_array).cloned().unwrap_or_default() {
            let vname = str_at(&m, "/name").unwrap_or_default();
            let path = str_at(&m, "/mountPath").unwrap_or_default().trim_end_matches('/').to_string();
            let dir = backing.get(vname).ok_or_else(|| format!("volume mount {vname:?} names no volume"))?;
            let at = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(at.parent().expect("a mount path has a parent")).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(dir, &at).map_err(|e| format!("{}: {e}", at.display()))?;
            mounts.push(path);
        }
        let in_root = |p: &str| root.join(p.trim_start_matches('/'));
        let under_mount = |p: &str| mounts.iter().any(|m| p == m || p.starts_with(&format!("{m}/")));

        // Env: fieldRefs resolved, paths under mounts rewritten, the network contract mapped.
        let mut vars: Vec<(String, String)> = Vec::new();
        for e in container.pointer("/env").and_then(Value::as_array).cloned().unwrap_or_default() {
            let key = str_at(&e, "/name").unwrap_or_default().to_string();
            let value = if let Some(v) = str_at(&e, "/value") {
                v.to_string()
            } else if let Some(path) = str_at(&e, "/valueFrom/fieldRef/fieldPath") {
                field(pod, path).ok_or_else(|| format!("env {key}: cannot resolve fieldRef {path}"))?
            } else if let Some(secret) = e.pointer("/valueFrom/secretKeyRef") {
                if secret["optional"] == true {
                    continue;
                }
                return Err(format!("env {key}: the simulated kubelet does not serve Secrets ({secret})"));
            } else {
                String::new()
            };
            vars.push((key, value));
        }
        let termination_path =
            str_at(container, "/terminationMessagePath").unwrap_or(contract::TERMINATION_LOG).to_string();
        let termination = in_root(&termination_path);
        std::fs::create_dir_all(termination.parent().expect("a file has a parent")).map_err(|e| e.to_string())?;
        let master = vars
            .iter()
            .find(|(k, _)| k == env::MASTER_ADDR)
            .map(|(_, v)| v.split('.').next().unwrap_or("").to_string());
        let mut st = self.lock();
        // A new pod behind a hostname gets new ports: its predecessor's may still be
        // in TIME_WAIT.
        st.ports.retain(|(host, _), _| *host != hostname);
        let mut port_of = |host: &str, port: &str| -> Result<String, String> {
            let port: u16 = port.parse().map_err(|_| format!("port {port:?} is not a number"))?;
            Ok(st.ports.entry((host.to_string(), port)).or_insert_with(free_port).to_string())
        };
        for (k, v) in vars.iter_mut() {
            match k.as_str() {
                env::MASTER_ADDR => *v = "127.0.0.1".into(),
                env::MASTER_PORT => *v = port_of(master.as_deref().unwrap_or(&hostname), v)?,
                env::STATUS_PORT => *v = port_of(&hostname, v)?,
                _ if v.starts_with('/') && under_mount(v) => *v = in_root(v).display().to_string(),
                _ => {}
            }
        }
        drop(st);
        if let Some(i) = index_of(pod) {
            vars.push((env::JOB_COMPLETION_INDEX.into(), i.to_string()));
        }
        vars.push((env::TERMINATION_LOG.into(), termination.display().to_string()));

        let command: Vec<String> = container
            .pointer("/command")
            .and_then(Value::as_array)
            .map_or(vec![], |a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect());
        let args: Vec<String> = container
            .pointer("/args")
            .and_then(Value::as_array)
            .map_or(vec![], |a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect());
        let mut argv = command.into_iter().chain(args);
        let program = argv.next().ok_or("the container has no command")?;
        if program != "trainer" {
            return Err(format!("the simulated kubelet runs only the trainer image's `trainer`, not {program:?}"));
        }
        let mut argv: Vec<String> = argv.collect();
        if argv.first().map(String::as_str) == Some("launch") {
            argv.extend(["--output".into(), in_root(contract::CHECKPOINT_MOUNT).display().to_string()]);
            argv.extend(["--init-dir".into(), in_root(contract::INIT_MOUNT).display().to_string()]);
        }
        let log = pod_dir.join("log");
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.opts.trainer);
        cmd.args(&argv).current_dir(&root).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        for inherited in
            [env::RANK, env::LOCAL_RANK, env::WORLD_SIZE, env::NODE_RANK, env::NNODES, env::NPROC_PER_NODE, "RUST_LOG"]
        {
            cmd.env_remove(inherited);
        }
        cmd.envs(vars.iter().map(|(k, v)| (k, v)));
        let child = cmd.spawn().map_err(|e| format!("{}: {e}", self.opts.trainer.display()))?;
        let started_at = now_rfc3339();
        let image = str_at(container, "/image").unwrap_or_default().to_string();
        let _ = self.api.set_status(
            "v1",
            "Pod",
            Some(&ns),
            name,
            json!({
                "phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1", "startTime": started_at,
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": container_name(pod), "ready": true, "started": true, "restartCount": 0,
                    "image": image, "imageID": "", "state": {"running": {"startedAt": started_at}}}],
            }),
        );
        let message_policy = str_at(container, "/terminationMessagePolicy").unwrap_or("File").to_string();
        self.lock().procs.insert(
            name.to_string(),
            Proc {
                child,
                container: container_name(pod),
                started_at,
                image,
                termination,
                log,
                message_policy,
                claims,
                term_sent: None,
            },
        );
        Ok(())
    }

    /// A claim's directory goes with its PVC object once no container uses it.
    fn reclaim_volumes(&self) {
        let ns = self.ns().to_string();
        let mut st = self.lock();
        let in_use: BTreeSet<String> = st.procs.values().flat_map(|p| p.claims.clone()).collect();
        let gone: Vec<String> = st
            .claims
            .iter()
            .filter(|c| !in_use.contains(*c) && self.api.get("v1", "PersistentVolumeClaim", Some(&ns), c).is_none())
            .cloned()
            .collect();
        for c in gone {
            let _ = std::fs::remove_dir_all(self.opts.root.join("pvc").join(&c));
            st.claims.remove(&c);
        }
    }

    // ---- network ----

    /// `GET /<job>/status` → rank 0's (`<job>-0`) status port.
    fn proxy(&self, listener: TcpListener) {
        listener.set_nonblocking(true).expect("nonblocking listener");
        while !self.stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, _)) => {
                    let target = {
                        let st = self.lock();
                        st.ports.clone()
                    };
                    std::thread::spawn(move || forward(conn, &target));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

fn forward(mut conn: TcpStream, ports: &BTreeMap<(String, u16), u16>) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 4096];
    let n = conn.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let job = parts.next().unwrap_or_default();
    let rest = parts.next().unwrap_or_default();
    let reply = ports.get(&(format!("{job}-0"), contract::STATUS_PORT)).and_then(|port| {
        let mut up = TcpStream::connect_timeout(&([127, 0, 0, 1], *port).into(), Duration::from_secs(2)).ok()?;
        up.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        up.write_all(format!("GET /{rest} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").as_bytes())
            .ok()?;
        let mut body = Vec::new();
        up.read_to_end(&mut body).ok()?;
        (!body.is_empty()).then_some(body)
    });
    let reply =
        reply.unwrap_or_else(|| b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec());
    let _ = conn.write_all(&reply);
}

/// A downward-API field of the pod.
fn field(pod: &Value, path: &str) -> Option<String> {
    let map = |prefix: &str, at: &str| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        str_at(pod, &format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"))).map(String::from)
    };
    match path {
        "metadata.name" => str_at(pod, "/metadata/name").map(String::from),
        "metadata.namespace" => str_at(pod, "/metadata/namespace").map(String::from),
        "spec.nodeName" => str_at(pod, "/spec/nodeName").map(String::from),
        "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
        _ => map("metadata.annotations['", "/metadata/annotations")
            .or_else(|| map("metadata.labels['", "/metadata/labels")),
    }
}

fn container_name(pod: &Value) -> String {
    str_at(pod, "/spec/containers/0/name").unwrap_or("trainer").to_string()
}

/// Why the Job failed, from its first failed pod and the pod failure policy.
fn failure_of(job: &Value, pod: &Value) -> (String, String) {
    let code = pod.pointer("/status/containerStatuses/0/state/terminated/exitCode").and_then(Value::as_i64);
    let container = container_name(pod);
    let ns = str_at(pod, "/metadata/namespace").unwrap_or_default();
    let rules = job.pointer("/spec/podFailurePolicy/rules").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, r) in rules.iter().enumerate() {
        let Some(req) = r.get("onExitCodes") else { continue };
        let values: Vec<i64> =
            req["values"].as_array().map_or(vec![], |v| v.iter().filter_map(Value::as_i64).collect());
        let hit = code.is_some_and(|c| match req["operator"].as_str() {
            Some("In") => values.contains(&c),
            Some("NotIn") => !values.contains(&c),
            _ => false,
        });
        if hit && r["action"] == "FailJob" {
            let message = format!(
                "Container {container} for pod {ns}/{} failed with exit code {} matching FailJob rule at index {i}",
                name_of(pod),
                code.unwrap_or_default()
            );
            return ("PodFailurePolicy".into(), message);
        }
    }
    ("BackoffLimitExceeded".into(), "Job has reached the specified backoff limit".into())
}
