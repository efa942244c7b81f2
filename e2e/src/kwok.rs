//! kwok (`sigs.k8s.io/kwok`, built from the Go module proxy by `scripts/setup-kwok.sh`)
//! as the nodes of a real control plane started without real ones
//! ([`ControlPlane::start_with`] with no [`crate::control_plane::RealNodes`]). It keeps
//! the Node objects [`create_nodes`] makes Ready, renewing a Lease for each as a kubelet
//! renews its own, and moves the pods bound to them through the stages of
//! `e2e/kwok/stages.yaml` instead of running anything: Running at once, then ended as
//! their first container's env says ([`RUN_SECONDS_ENV`], [`EXIT_CODE_ENV`]), or as a
//! trainer ends on SIGTERM when deleted ([`SIGTERM_EXIT_CODE`]). So the scheduler, the
//! Job controller and the node-lifecycle controller work on many nodes, at the cost of
//! objects alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;

use crate::control_plane::process::Daemon;
use crate::control_plane::{ControlPlane, Error, free_port};

/// The stages kwok plays, ours (see the file's comments).
pub const STAGES: &str = include_str!("../kwok/stages.yaml");

/// The annotation kwok manages a node by (`--manage-nodes-with-annotation-selector`),
/// with [`NODE_ANNOTATION_VALUE`]: a node of a real kubelet in the same cluster is left
/// alone.
pub const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
pub const NODE_ANNOTATION_VALUE: &str = "fake";
/// The label every kwok node carries (`type=kwok`), for selectors.
pub const NODE_LABEL: (&str, &str) = ("type", "kwok");

/// The addresses kwok hands its pods (`--cidr`): apart from the service range
/// (10.96.0.0/16) and the real nodes' pods (10.244.0.0/16), and room for 65,534 pods.
pub const POD_CIDR: &str = "10.200.0.0/16";
/// The InternalIP of every kwok node (`--node-ip`), and so its pods' hostIP.
pub const NODE_IP: &str = "10.199.0.1";
/// A kwok node's Lease duration; kwok renews it every quarter of that (10 s), as a
/// kubelet renews its own, well within the controller manager's
/// [`crate::control_plane::NODE_MONITOR_GRACE`].
pub const LEASE_DURATION: Duration = Duration::from_secs(40);

/// A pod whose first container has this env (seconds) ends that long after its
/// startTime; without it, it runs until deleted.
pub const RUN_SECONDS_ENV: &str = "KWOK_RUN_SECONDS";
/// The exit code of that end (0 unless set): 0 is Succeeded, anything else Failed.
pub const EXIT_CODE_ENV: &str = "KWOK_EXIT_CODE";
/// The exit code of a pod deleted before it ended: a trainer's on SIGTERM (128 + 15).
pub const SIGTERM_EXIT_CODE: i32 = 143;

/// Where kwok's binary is: `$PT_KWOK_DIR`, else what `scripts/setup-kwok.sh` prints
/// (building it if needed).
pub fn binaries() -> Result<PathBuf, Error> {
    crate::control_plane::tool_dir("PT_KWOK_DIR", "setup-kwok.sh")
}

/// The running kwok; stopped when dropped.
pub struct Kwok {
    pub daemon: Daemon,
    /// Its directory: the config with the stages, the log.
    pub dir: PathBuf,
}

impl Kwok {
    /// Starts kwok against `cp` as its admin, with its state under `dir`, and returns
    /// once it serves `/healthz` (it starts serving after its controllers have started
    /// watching). It manages only nodes annotated [`NODE_ANNOTATION`]` =
    /// `[`NODE_ANNOTATION_VALUE`], with Leases of [`LEASE_DURATION`], pod addresses
    /// from [`POD_CIDR`], and [`STAGES`] alone: `HOME` is `dir`, so a
    /// `~/.kwok/kwok.yaml` of the user's, which kwok would load first, stays out.
    pub fn start(cp: &ControlPlane, dir: &Path) -> Result<Kwok, Error> {
        let bin = binaries()?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let config = dir.join("kwok.yaml");
        std::fs::write(&config, STAGES).map_err(|e| Error::io(&config, e))?;
        let port = free_port();
        let mut cmd = Command::new(bin.join("kwok"));
        cmd.arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
            .arg(format!("--config={}", config.display()))
            .arg(format!("--manage-nodes-with-annotation-selector={NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}"))
            .arg(format!("--cidr={POD_CIDR}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg(format!("--node-lease-duration-seconds={}", LEASE_DURATION.as_secs()))
            .arg(format!("--server-address=127.0.0.1:{port}"))
            .current_dir(dir)
            .env("HOME", dir);
        let mut kwok = Kwok { daemon: Daemon::spawn("kwok", cmd, &dir.join("kwok.log"))?, dir: dir.to_path_buf() };
        kwok.wait_healthy(port, Duration::from_secs(60))?;
        Ok(kwok)
    }

    /// Polls kwok's `/healthz` until it answers `ok`; fails at once if kwok exits. A
    /// second or so of blocking: kwok is up once it has listed the nodes and pods.
    fn wait_healthy(&mut self, port: u16, timeout: Duration) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let last = match healthz(port) {
                Ok(answer) if answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok") => return Ok(()),
                Ok(answer) => answer,
                Err(e) => e.to_string(),
            };
            let exited = self.daemon.exited();
            if exited.is_some() || start.elapsed() >= timeout {
                let how = exited.map_or("is running".to_string(), |s| format!("exited ({s})"));
                let state = format!("last answer: {last}; kwok {how}; its log ends:\n{}", self.daemon.log_tail(30));
                return Err(Error::NotReady { what: "kwok /healthz".into(), waited: start.elapsed(), state });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `GET /healthz` of kwok's plain-HTTP server on loopback `port`: the whole answer.
fn healthz(port: u16) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer.trim().to_string())
}

/// A kwok node's object: annotated for kwok, labelled [`NODE_LABEL`], and the capacity
/// of a GPU server (64 CPUs, 512 GiB, 110 pods, `gpus` of `nvidia.com/gpu`) in its
/// status, which the API server keeps on create and kwok's node-initialize keeps after.
fn node_object(name: &str, gpus: u32) -> Result<Node, Error> {
    let resources = serde_json::json!({
        "cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string(),
    });
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: NODE_ANNOTATION_VALUE},
            "labels": {
                NODE_LABEL.0: NODE_LABEL.1,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "status": {"capacity": resources, "allocatable": resources},
    });
    serde_json::from_value(node).map_err(|e| Error::Setup(format!("node {name}: {e}")))
}

/// Creates `count` kwok nodes, `<prefix>0` to `<prefix><count - 1>`, each with `gpus`
/// GPUs ([`node_object`]), sixteen requests at a time; their names, in order.
pub async fn create_nodes(client: &kube::Client, prefix: &str, count: usize, gpus: u32) -> Result<Vec<String>, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    futures::stream::iter(names.iter())
        .map(|name| {
            let nodes = nodes.clone();
            async move {
                let node = node_object(name, gpus)?;
                nodes
                    .create(&PostParams::default(), &node)
                    .await
                    .map_err(|e| Error::Setup(format!("creating node {name}: {e}")))
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<Node>>()
        .await?;
    Ok(names)
}

/// Why a node is not yet ready to schedule onto: `None` once its Ready condition is
/// True and the node-lifecycle controller has lifted its `node.kubernetes.io/not-ready`
/// taint (the API server puts it on every new node).
fn not_ready(node: &Node) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map_or("none".to_string(), |c| c.status.clone());
    let taints: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect())
        .unwrap_or_default();
    let tainted = taints.iter().any(|t| t.starts_with("node.kubernetes.io/not-ready:"));
    (ready != "True" || tainted).then(|| format!("Ready={ready} taints={taints:?}"))
}

/// The nodes of `names` not yet ready, in a line: how many, and the first few with why.
fn summary(names: &[String], seen: &BTreeMap<String, Option<String>>) -> String {
    let waiting: Vec<String> = names
        .iter()
        .filter_map(|n| match seen.get(n) {
            Some(None) => None,
            Some(Some(why)) => Some(format!("{n}: {why}")),
            None => Some(format!("{n}: not seen")),
        })
        .collect();
    let first: Vec<&str> = waiting.iter().take(5).map(String::as_str).collect();
    format!(
        "{} of {} nodes Ready and untainted; waiting for {}: {}",
        names.len() - waiting.len(),
        names.len(),
        waiting.len(),
        first.join("; ")
    )
}

/// Waits, on a watch of the kwok nodes, until every node of `names` is Ready and no
/// longer tainted not-ready ([`not_ready`]), or fails after `timeout` with what it saw
/// last of the ones it still waits for.
pub async fn wait_nodes_ready(client: &kube::Client, names: &[String], timeout: Duration) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let selector = format!("{}={}", NODE_LABEL.0, NODE_LABEL.1);
    let mut events = watcher(nodes, watcher::Config::default().labels(&selector)).default_backoff().boxed();
    let mut seen: BTreeMap<String, Option<String>> = BTreeMap::new();
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error = String::new();
    while !names.iter().all(|n| matches!(seen.get(n), Some(None))) {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => {
                let state = format!("{}{last_error}", summary(names, &seen));
                return Err(Error::NotReady {
                    what: format!("{} kwok nodes", names.len()),
                    waited: start.elapsed(),
                    state,
                });
            }
            Ok(None) => return Err(Error::Setup("the watch of kwok nodes ended".into())),
            Ok(Some(Err(e))) => last_error = format!("; the watch failed last with: {e}"),
            Ok(Some(Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)))) => {
                seen.insert(node.metadata.name.clone().unwrap_or_default(), not_ready(&node));
            }
            Ok(Some(Ok(watcher::Event::Delete(node)))) => {
                seen.insert(node.metadata.name.clone().unwrap_or_default(), Some("deleted".into()));
            }
            Ok(Some(Ok(watcher::Event::Init | watcher::Event::InitDone))) => {}
        }
    }
    eprintln!("kwok: {} nodes Ready and untainted after {:.1} s", names.len(), start.elapsed().as_secs_f64());
    Ok(())
}
