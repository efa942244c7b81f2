//! A whole test cluster on this machine: the real control plane, the pod network, one
//! node agent process per node, cluster DNS as hosts files, the volume provisioner, and
//! operators started out of cluster as a ServiceAccount. Dropping it stops everything
//! and deletes its network namespaces, and its directory unless the test failed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::control_plane::process::Daemon;
use crate::control_plane::{self, ControlPlane, Error, KUBERNETES_SERVICE_IP};
use crate::cpus;
use crate::network::hosts::{self, HostsDir};
use crate::network::relay::{self, Relay};
use crate::network::{ClusterNetwork, Enter};

mod dns;
mod nodes;
mod pods;
mod real;

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// How to build the cluster.
#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: usize,
    /// The node agent binary (`env!("CARGO_BIN_EXE_node-agent")` in a test).
    pub agent: PathBuf,
    /// CPUs, memory and GPUs each node reports.
    pub cpu: String,
    pub memory: String,
    pub gpus: u32,
    /// Image repository suffix → the binary it runs.
    pub images: BTreeMap<String, PathBuf>,
    /// Real nodes (the kubelet, containerd, runc, kube-proxy and CoreDNS) running the
    /// images of this directory (`scripts/setup-images.sh`), started by
    /// [`TestCluster::start_real`] instead of node agents.
    /// A real node offers its share of the machine's CPUs and its memory, whatever
    /// `cpu` and `memory` say.
    pub real_images: Option<PathBuf>,
}

impl Options {
    /// `nodes` nodes of 8 CPUs and 32 GiB that run the trainer image as `trainer`.
    pub fn with_nodes(nodes: usize, agent: &Path, trainer: &Path) -> Options {
        Options {
            nodes,
            agent: agent.to_path_buf(),
            cpu: "8".into(),
            memory: "32Gi".into(),
            gpus: 0,
            images: [("trainer".to_string(), trainer.to_path_buf())].into(),
            real_images: None,
        }
    }
}

/// A running operator: its process and where it serves `/metrics`.
pub struct Operator {
    pub daemon: Daemon,
    pub metrics: SocketAddr,
}

pub struct TestCluster {
    // Dropped in this order: operators, node agents (and their pods), the
    // controllers of this harness, the relay, the network, the control plane.
    pub operators: Vec<Operator>,
    pub agents: Vec<(String, Daemon)>,
    /// The real nodes, when the cluster has them.
    pub nodes: Vec<crate::node::RealNode>,
    /// Cluster DNS and the provisioner, on a runtime of their own: a test may block its
    /// thread (on `kubectl wait`) without stopping them.
    controllers: Option<tokio::runtime::Runtime>,
    /// Held for its `Drop`: the `kubernetes` Service inside the cluster network.
    _relay: Relay,
    /// The API server's way to the kubelets (real nodes only).
    _egress: Option<crate::network::egress::EgressProxy>,
    pub net: ClusterNetwork,
    pub cp: ControlPlane,
    pub dir: PathBuf,
    pub hosts: HostsDir,
    pub client: kube::Client,
    options: Options,
    /// This cluster's number in the process: where its nodes' CPUs start.
    number: usize,
}

impl TestCluster {
    /// Starts the cluster in a fresh directory under `root` and waits until every node is
    /// Ready and the `default` ServiceAccount exists (the controllers run).
    pub async fn start(root: &Path, options: Options) -> Result<TestCluster, Error> {
        let (dir, prefix, n) = fresh_dir(root)?;
        let node_names: Vec<String> = (0..options.nodes).map(|i| format!("node-{i}")).collect();
        let cp = ControlPlane::start(&dir.join("control-plane"), &node_names, None).await?;
        let client = cp.client().await?;
        let net = ClusterNetwork::create(&prefix).map_err(|e| Error::Setup(e.to_string()))?;
        let relay = Relay::start(
            &net.path(),
            SocketAddr::from((KUBERNETES_SERVICE_IP, 443)),
            SocketAddr::from(([127, 0, 0, 1], cp.api_port)),
        )
        .map_err(|e| Error::Setup(e.to_string()))?;
        let hosts = HostsDir(dir.join("hosts.d"));
        std::fs::create_dir_all(&hosts.0).map_err(|e| Error::io(&hosts.0, e))?;
        crate::provisioner::install(&client).await.map_err(|e| Error::Setup(format!("the StorageClass: {e}")))?;
        let controllers = controllers_runtime()?;
        // Their clients are made on their runtime: a client's connection tasks live on
        // the runtime that made it.
        let (kubeconfig, dns_dir, volumes) = (cp.kubeconfig.clone(), hosts.clone(), dir.join("volumes"));
        controllers.spawn(async move {
            match control_plane::client_for(&kubeconfig).await {
                Ok(client) => {
                    tokio::join!(hosts::Dns::run(client.clone(), dns_dir), crate::provisioner::run(client, volumes));
                }
                Err(e) => tracing::error!("the cluster's controllers: {e}"),
            }
        });
        let mut cluster = TestCluster {
            operators: Vec::new(),
            agents: Vec::new(),
            nodes: Vec::new(),
            controllers: Some(controllers),
            _relay: relay,
            _egress: None,
            net,
            cp,
            dir,
            hosts,
            client,
            options,
            number: n,
        };
        for i in 0..cluster.options.nodes {
            cluster.start_agent(i)?;
        }
        cluster.wait_nodes_ready().await?;
        cluster.wait_default_service_account("default").await?;
        Ok(cluster)
    }

    /// Starts (or restarts) the agent of node `i`.
    pub fn start_agent(&mut self, i: usize) -> Result<(), Error> {
        let (name, id) = self.cp.nodes[i].clone();
        let node_dir = self.dir.join("nodes").join(&name);
        std::fs::create_dir_all(&node_dir).map_err(|e| Error::io(&node_dir, e))?;
        let kubeconfig = node_dir.join("kubeconfig");
        self.cp.write_kubeconfig(&kubeconfig, &self.cp.server(), &id.user, &id.token)?;
        let mut cmd = Command::new(&self.options.agent);
        cmd.args(["--node", &name, "--index", &i.to_string()])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--root")
            .arg(&node_dir)
            .args(["--cluster-netns", &self.net.netns, "--netns-prefix", &self.net.prefix])
            .arg("--hosts-dir")
            .arg(&self.hosts.0)
            .args(["--cpu", &self.options.cpu, "--memory", &self.options.memory])
            .args(["--gpus", &self.options.gpus.to_string()]);
        cpus::pin(&mut cmd, &cpus::node_share(&cpus::host_cpus(), self.options.nodes, self.number, i));
        for (image, binary) in &self.options.images {
            cmd.arg("--image").arg(format!("{image}={}", binary.display()));
        }
        self.agents.retain(|(n, _)| n != &name);
        let daemon = Daemon::spawn(&format!("agent {name}"), cmd, &node_dir.join("agent.log"))?;
        self.agents.push((name, daemon));
        Ok(())
    }

    /// Stops node `name`'s agent as a crash of its kubelet would: its pods' processes run
    /// on, and nothing reports them ([`TestCluster::lose_node`] ends them too).
    pub fn kill_agent(&mut self, name: &str) {
        if let Some((_, d)) = self.agents.iter_mut().find(|(n, _)| n == name) {
            d.kill();
        }
    }

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
        .map_err(|e| Error::Setup(format!("{e}\n{}", self.agent_logs())))
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

    /// The agents' or the real nodes' logs' ends, for failure messages.
    pub fn agent_logs(&self) -> String {
        let agents = self.agents.iter().map(|(n, d)| format!("--- agent {n}:\n{}", d.log_tail(20)));
        let nodes = self.nodes.iter().map(|n| n.log_tails(15));
        agents.chain(nodes).collect::<Vec<_>>().join("\n")
    }

    /// `kubectl` as the admin.
    pub fn kubectl(&self) -> Command {
        self.cp.kubectl()
    }

    /// `kubectl args...`, its stdout; an error carries stderr.
    pub fn kubectl_out(&self, args: &[&str]) -> Result<String, String> {
        let out = self.kubectl().args(args).output().map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    /// `kubectl args...` fed `stdin`: its stdout; an error carries stderr.
    pub fn kubectl_in(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        use std::io::Write;
        use std::process::Stdio;
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("kubectl: {e}"))?;
        child.stdin.take().expect("piped").write_all(stdin.as_bytes()).map_err(|e| format!("kubectl's stdin: {e}"))?;
        let out = child.wait_with_output().map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    /// What a failed wait prints: the cluster's objects in `namespace`, the nodes and the
    /// agents' and operators' logs.
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
        if !self.nodes.is_empty() {
            // The chart's operator, when it runs as its Deployment.
            let args = ["-n", "trainingrun-system", "logs", "deployment/trainingrun-operator", "--tail=30"];
            out.push_str(&format!("$ kubectl {}\n{}\n", args.join(" "), self.kubectl_out(&args).unwrap_or_else(|e| e)));
        }
        out.push_str(&self.agent_logs());
        for (i, op) in self.operators.iter().enumerate() {
            out.push_str(&format!("\n--- operator {i}:\n{}", op.daemon.log_tail(40)));
        }
        out
    }

    /// A kubeconfig that reaches the API server from inside the cluster network (the
    /// `kubernetes` Service) with a ServiceAccount's token, as a pod of that account
    /// would: `kubectl create token <account> -n <namespace>`.
    pub fn service_account_kubeconfig(&self, namespace: &str, account: &str, path: &Path) -> Result<(), Error> {
        let token =
            self.kubectl_out(&["-n", namespace, "create", "token", account, "--duration=2h"]).map_err(Error::Setup)?;
        let server = format!("https://{KUBERNETES_SERVICE_IP}:443");
        self.cp.write_kubeconfig(path, &server, &format!("system:serviceaccount:{namespace}:{account}"), token.trim())
    }

    /// Starts an operator inside the cluster network with `kubeconfig` and the
    /// environment `env` (its flags' variables), serving `/metrics` on its own address.
    pub fn start_operator(
        &mut self,
        binary: &Path,
        kubeconfig: &Path,
        env: &[(String, String)],
    ) -> Result<&Operator, Error> {
        let i = self.operators.len();
        let port = 18080 + i as u16;
        let metrics = SocketAddr::from((crate::network::GATEWAY, port));
        let names = self
            .hosts
            .register(&format!("operator-{i}"), &format!("# the operator's hosts file\n{}", hosts::LOCALHOST), None)
            .map_err(|e| Error::Setup(e.to_string()))?;
        let mut cmd = Command::new(binary);
        cmd.env_clear()
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("METRICS_ADDR", metrics.to_string());
        Enter::new(&self.net.path(), &names, None).map_err(|e| Error::Setup(e.to_string()))?.apply(&mut cmd);
        let daemon = Daemon::spawn(&format!("operator {i}"), cmd, &self.dir.join(format!("operator-{i}.log")))?;
        self.operators.push(Operator { daemon, metrics });
        Ok(self.operators.last().expect("just pushed"))
    }

    /// Operator `i`'s `/metrics`, fetched from inside the cluster network as Prometheus
    /// would scrape it.
    pub fn operator_metrics(&self, i: usize) -> Result<String, Error> {
        use std::io::{Read, Write};
        let op = self.operators.get(i).ok_or_else(|| Error::Setup(format!("no operator {i}")))?;
        let addr = op.metrics;
        let setup = |e: std::io::Error| Error::Setup(format!("GET http://{addr}/metrics: {e}"));
        let mut stream = relay::connect_in(&self.net.path(), addr).map_err(|e| Error::Setup(e.to_string()))?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(setup)?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: operator\r\n\r\n").map_err(setup)?;
        let mut response = String::new();
        stream.read_to_string(&mut response).map_err(setup)?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
        if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
            return Err(Error::Setup(format!(
                "GET http://{addr}/metrics: {}",
                head.lines().next().unwrap_or("no response")
            )));
        }
        Ok(body.to_string())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.operators.clear();
        self.agents.clear();
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(Path::new(crate::node::SHORT_ROOT).join(&self.net.prefix));
        // An agent killed as a crash leaves its containers running, as a node's would.
        for pid_file in glob_pid_files(&self.dir.join("nodes")) {
            if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<u32>().ok()) {
                crate::node_agent::container::signal_group(pid, libc::SIGKILL);
            }
        }
        if let Some(rt) = self.controllers.take() {
            rt.shutdown_background();
        }
        // A failed test's cluster stays for its logs, and every cluster with
        // `E2E_KEEP_CLUSTERS=1`; a passed one's goes (etcd alone preallocates 64 MB of WAL).
        if !std::thread::panicking() && std::env::var_os("E2E_KEEP_CLUSTERS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The runtime of a cluster's own controllers (cluster DNS, the provisioner): one of
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

/// `<nodes>/*/pods/*/pid`.
fn glob_pid_files(nodes: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for node in std::fs::read_dir(nodes).into_iter().flatten().flatten() {
        for pod in std::fs::read_dir(node.path().join("pods")).into_iter().flatten().flatten() {
            let pid = pod.path().join("pid");
            if pid.exists() {
                out.push(pid);
            }
        }
    }
    out
}
