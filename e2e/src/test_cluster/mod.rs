//! A whole test cluster on this machine: the real control plane, real nodes (the
//! kubelet, containerd, runc, kube-proxy, kube-router) on a routed network, CoreDNS, and
//! the volume provisioner. Dropping it stops everything and deletes its network
//! namespaces, and its directory unless the test failed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::control_plane::{self, ControlPlane, Error};
use crate::network::ClusterNetwork;
use crate::network::relay::{self, Relay};

mod dns;
mod netpol;
mod nodes;
mod pods;
mod start;

pub use start::IMAGES;

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// How to build the cluster.
#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: usize,
    /// The directory of the images the nodes run (`scripts/setup-images.sh`).
    pub images: PathBuf,
    /// `nvidia.com/gpu` each node advertises as an extended resource (its status'
    /// capacity), which the scheduler and Kueue count; no device stands behind it.
    pub gpus: u32,
}

impl Options {
    /// `nodes` nodes that run the images of `images`.
    pub fn with_nodes(nodes: usize, images: &Path) -> Options {
        Options { nodes, images: images.to_path_buf(), gpus: 0 }
    }
}

pub struct TestCluster {
    // Dropped in this order: the nodes (and their pods), the controllers of this
    // harness, the volumes' mount, the API forwarder, the egress proxy, the network, the
    // control plane.
    pub nodes: Vec<crate::node::RealNode>,
    /// The provisioner, on a runtime of its own: a test may block its thread (on
    /// `kubectl wait`) without stopping it.
    controllers: Option<tokio::runtime::Runtime>,
    /// The volumes' directory as a shared mount, until the cluster goes.
    volumes_mount: Option<crate::mounts::SharedMount>,
    /// Held for its `Drop`: the API server's port at the router, for the nodes and pods.
    _relay: Relay,
    /// The API server's way to the kubelets.
    _egress: crate::network::egress::EgressProxy,
    pub net: ClusterNetwork,
    pub cp: ControlPlane,
    pub dir: PathBuf,
    pub client: kube::Client,
    options: Options,
}

impl TestCluster {
    async fn wait_nodes_ready(&self) -> Result<(), Error> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.client.clone());
        let want = self.options.nodes;
        control_plane::wait_until("every node Ready", Duration::from_secs(90), || {
            let nodes = nodes.clone();
            async move {
                let list = nodes.list(&Default::default()).await.map_err(|e| e.to_string())?;
                let ready = |n: &k8s_openapi::api::core::v1::Node| {
                    let conditions = n.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
                    let taints = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
                    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        && !taints.iter().any(|t| t.key == "node.kubernetes.io/not-ready")
                };
                let summary: Vec<String> = list
                    .items
                    .iter()
                    .map(|n| format!("{}: ready={}", n.metadata.name.clone().unwrap_or_default(), ready(n)))
                    .collect();
                if list.items.len() == want && list.items.iter().all(ready) { Ok(()) } else { Err(summary.join(", ")) }
            }
        })
        .await
        .map_err(|e| Error::Setup(format!("{e}\n{}", self.node_logs())))
    }

    /// Waits for the token controller to give `namespace` its `default` ServiceAccount.
    pub async fn wait_default_service_account(&self, namespace: &str) -> Result<(), Error> {
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(self.client.clone(), namespace);
        control_plane::wait_until(
            &format!("the default ServiceAccount of {namespace}"),
            Duration::from_secs(60),
            || {
                let sas = sas.clone();
                async move {
                    match sas.get_opt("default").await {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err("absent".to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
            },
        )
        .await
    }

    /// The ends of the nodes' daemons' logs, for failure messages.
    pub fn node_logs(&self) -> String {
        self.nodes.iter().map(|n| n.log_tails(15)).collect::<Vec<_>>().join("\n")
    }

    /// `kubectl` as the admin.
    pub fn kubectl(&self) -> Command {
        self.cp.kubectl()
    }

    /// `kubectl args...`, its stdout; an error carries stderr.
    pub fn kubectl_out(&self, args: &[&str]) -> Result<String, String> {
        self.cp.kubectl_out(args)
    }

    /// `kubectl args...` fed `stdin`: its stdout; an error carries stderr.
    pub fn kubectl_in(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        self.cp.kubectl_in(args, stdin)
    }

    /// What a failed wait prints: the cluster's objects in `namespace`, the nodes, the
    /// operator's and the nodes' daemons' logs.
    pub fn dump(&self, namespace: &str) -> String {
        let mut out = String::new();
        for args in [
            vec!["get", "nodes", "-o", "wide"],
            vec!["-n", namespace, "get", "trainingruns,jobs,pods,pvc,svc,configmaps,endpointslices", "-o", "wide"],
            vec!["-n", namespace, "get", "trainingruns,jobs,pods", "-o", "yaml"],
            vec!["-n", namespace, "get", "events", "--sort-by=.lastTimestamp"],
        ] {
            out.push_str(&format!("$ kubectl {}\n", args.join(" ")));
            out.push_str(&self.kubectl_out(&args).unwrap_or_else(|e| e));
            out.push('\n');
        }
        // The chart's operator, when it is installed.
        let args = ["-n", "trainingrun-system", "logs", "deployment/trainingrun-operator", "--tail=30"];
        out.push_str(&format!("$ kubectl {}\n{}\n", args.join(" "), self.kubectl_out(&args).unwrap_or_else(|e| e)));
        out.push_str(&self.node_logs());
        out
    }

    /// Pod `namespace/name`'s address (`status.podIP`).
    pub fn pod_ip(&self, namespace: &str, name: &str) -> Result<std::net::IpAddr, Error> {
        let ip = self
            .kubectl_out(&["-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.podIP}"])
            .map_err(Error::Setup)?;
        ip.trim().parse().map_err(|_| Error::Setup(format!("pod {namespace}/{name} has no address yet: {ip:?}")))
    }

    /// `GET http://<addr><path>` from the router, as a scraper outside the nodes reaches
    /// a pod: the body of a 200.
    pub fn http_get(&self, addr: std::net::SocketAddr, path: &str) -> Result<String, Error> {
        relay::http_get(&self.net.path(), addr, path).map_err(Error::Setup)
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(Path::new(crate::node::SHORT_ROOT).join(&self.net.prefix));
        if let Some(rt) = self.controllers.take() {
            rt.shutdown_background();
        }
        self.volumes_mount.take();
        // A failed test's cluster stays for its logs, and every cluster with
        // `E2E_KEEP_CLUSTERS=1`; a passed one's goes (etcd alone preallocates 64 MB of WAL).
        if !std::thread::panicking() && std::env::var_os("E2E_KEEP_CLUSTERS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The runtime of a cluster's own controllers (the provisioner): one of
/// their own, so that a test may block its thread (on `kubectl wait`) without stopping
/// them.
fn controllers_runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("e2e-controllers")
        .enable_all()
        .build()
        .map_err(|e| Error::Setup(format!("a runtime for the cluster's controllers: {e}")))
}

/// A fresh directory for the next cluster of this process under `root`: its path, its
/// prefix (`pt<pid>-<n>`, unique on the machine) and its number `n`.
fn fresh_dir(root: &Path) -> Result<(PathBuf, String, usize), Error> {
    let n = CLUSTERS.fetch_add(1, Ordering::Relaxed) as usize;
    let prefix = format!("pt{}-{n}", std::process::id());
    let dir = root.join(&prefix);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok((dir, prefix, n))
}
