//! A scale bench's cluster: the real control plane with no real node, kwok's nodes of 8
//! GPUs, the volume provisioner (every claim binds), both CRDs, and the operator's
//! ServiceAccount with the chart's own RBAC, whose token the operator's processes use,
//! so the audit log tells its requests apart from everyone else's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::control_plane::{ControlPlane, Error, Tuning, free_port, wait_until};
use crate::kwok::Kwok;

/// Where the runs are, and where the operator runs (its Lease).
pub const RUNS_NS: &str = "bench";
pub const OPERATOR_NS: &str = "bench-system";
/// The chart's release name: its ServiceAccount's name.
pub const RELEASE: &str = "trainingrun-operator";
/// The operator's ServiceAccount, as the audit log names it.
pub const OPERATOR_USER: &str = "system:serviceaccount:bench-system:trainingrun-operator";

pub struct Cluster {
    pub cp: ControlPlane,
    pub kwok: Kwok,
    pub client: kube::Client,
    /// The operator's kubeconfig (its ServiceAccount's token).
    pub operator_kubeconfig: PathBuf,
    pub nodes: Vec<String>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(mut cmd: Command, what: &str, stdin: Option<&str>) -> Result<String, Error> {
    use std::io::Write;
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| Error::Setup(format!("{what}: {e}")))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(|e| Error::Setup(format!("{what}: {e}")))?;
    }
    let out = child.wait_with_output().map_err(|e| Error::Setup(format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Setup(format!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr))));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Cluster {
    /// Starts it under `dir` with `nodes` kwok nodes Ready, the API server started with
    /// `apiserver` flags besides its own (a busy server's `--max-requests-inflight`).
    pub async fn start(dir: &Path, nodes: usize, apiserver: &[&str]) -> Result<Cluster, Error> {
        // A thousand nodes' not-ready taints are lifted by the node-lifecycle
        // controller's client: at its default 20 requests/s that alone takes minutes.
        let tuning = Tuning {
            controller_manager: vec!["--kube-api-qps=200".into(), "--kube-api-burst=400".into()],
            apiserver: apiserver.iter().map(|f| f.to_string()).collect(),
        };
        let cp = ControlPlane::start_with(&dir.join("control-plane"), &[], None, &tuning).await?;
        let client = cp.client().await?;
        let kwok = Kwok::start(&cp, &dir.join("kwok"))?;
        let names = crate::kwok::create_nodes(&client, "kwok", nodes, crate::scale::load::GPUS_PER_NODE).await?;
        crate::kwok::wait_nodes_ready(&client, &names, Duration::from_secs(60 + nodes as u64 / 5)).await?;
        crate::provisioner::install(&client).await.map_err(|e| Error::Setup(format!("the StorageClass: {e}")))?;
        tokio::spawn(crate::provisioner::run(client.clone(), dir.join("volumes")));
        for crd in ["crds/trainingruns.yaml", "crds/trainingdatasets.yaml"] {
            let path = repo().join(crd);
            let mut kubectl = cp.kubectl();
            kubectl.args(["apply", "--server-side", "-f"]).arg(&path);
            run(kubectl, &format!("kubectl apply {crd}"), None)?;
        }
        for ns in [RUNS_NS, OPERATOR_NS] {
            let mut kubectl = cp.kubectl();
            kubectl.args(["create", "namespace", ns]);
            run(kubectl, &format!("creating namespace {ns}"), None)?;
        }
        let operator_kubeconfig = operator_identity(&cp, dir)?;
        let mut c = Cluster { cp, kwok, client, operator_kubeconfig, nodes: names };
        c.wait_established().await?;
        c.wait_default_service_account().await?;
        Ok(c)
    }

    async fn wait_established(&mut self) -> Result<(), Error> {
        for plural in ["trainingruns", "trainingdatasets"] {
            let name = format!("crd/{plural}.training.puretransformer.dev");
            wait_until(&format!("{name} Established"), Duration::from_secs(60), || async {
                let mut kubectl = self.cp.kubectl();
                kubectl.args(["get", &name, "-o", "jsonpath={.status.conditions[?(@.type==\"Established\")].status}"]);
                let status = run(kubectl, "kubectl get crd", None).map_err(|e| e.to_string())?;
                if status.trim() == "True" { Ok(()) } else { Err(format!("Established={status:?}")) }
            })
            .await?;
        }
        Ok(())
    }

    /// Pods are admitted only once their namespace's default ServiceAccount exists.
    async fn wait_default_service_account(&self) -> Result<(), Error> {
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(self.client.clone(), RUNS_NS);
        wait_until("the default ServiceAccount", Duration::from_secs(60), || async {
            match sas.get_opt("default").await {
                Ok(Some(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await
    }

    /// Why the first few pending pods of the runs wait: what the scheduler said of each.
    pub fn pending_pods(&self) -> String {
        let mut kubectl = self.cp.kubectl();
        let jsonpath = "jsonpath={range .items[*]}{.metadata.name}: {.status.conditions[*].message}{'\\n'}{end}";
        kubectl.args(["-n", RUNS_NS, "get", "pods", "--field-selector=status.phase=Pending", "-o", jsonpath]);
        match run(kubectl, "kubectl get pods", None) {
            Ok(out) => out.lines().take(5).collect::<Vec<_>>().join("\n"),
            Err(e) => e.to_string(),
        }
    }

    /// Starts an operator replica named `name` (its Lease identity) with `env`.
    pub fn operator(&self, bin: &Path, name: &str, env: &[(&str, String)], log: &Path) -> Result<Replica, Error> {
        let metrics_port = free_port();
        let log_file = std::fs::File::create(log).map_err(|e| Error::io(log, e))?;
        let err_file = log_file.try_clone().map_err(|e| Error::io(log, e))?;
        let mut cmd = Command::new(bin);
        cmd.env("KUBECONFIG", &self.operator_kubeconfig)
            .env("RUST_LOG", "warn")
            .env("WATCH_NAMESPACE", RUNS_NS)
            .env("POD_NAMESPACE", OPERATOR_NS)
            .env("POD_NAME", name)
            .env("METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(log_file)
            .stderr(err_file);
        crate::control_plane::process::die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|e| Error::Spawn { program: bin.display().to_string(), source: e })?;
        Ok(Replica { name: name.to_string(), child, metrics_port })
    }
}

/// The chart's ServiceAccount and RBAC for the operator (as `helm template` renders
/// them), and a kubeconfig with a token of that ServiceAccount.
fn operator_identity(cp: &ControlPlane, dir: &Path) -> Result<PathBuf, Error> {
    let mut helm = cp.helm();
    helm.args(["template", RELEASE])
        .arg(repo().join("charts/trainingrun-operator"))
        .args(["-n", OPERATOR_NS, "--set", &format!("watchNamespace={RUNS_NS}")])
        .args(["--show-only", "templates/rbac.yaml", "--show-only", "templates/serviceaccount.yaml"]);
    let manifests = run(helm, "helm template (the chart's RBAC)", None)?;
    let mut kubectl = cp.kubectl();
    kubectl.args(["apply", "-f", "-"]);
    run(kubectl, "kubectl apply (the chart's RBAC)", Some(&manifests))?;
    let mut kubectl = cp.kubectl();
    kubectl.args(["-n", OPERATOR_NS, "create", "token", RELEASE, "--duration=24h"]);
    let token = run(kubectl, "kubectl create token", None)?;
    let path = dir.join("operator.kubeconfig");
    cp.write_kubeconfig(&path, &cp.server(), RELEASE, token.trim())?;
    Ok(path)
}

/// One operator process.
pub struct Replica {
    pub name: String,
    pub child: Child,
    pub metrics_port: u16,
}

impl Replica {
    /// Its `/metrics`.
    pub async fn metrics(&self) -> Result<String, Error> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = format!("127.0.0.1:{}", self.metrics_port);
        let fail = |e: std::io::Error| Error::Setup(format!("{}'s /metrics at {addr}: {e}", self.name));
        let mut conn = tokio::net::TcpStream::connect(&addr).await.map_err(fail)?;
        conn.write_all(b"GET /metrics HTTP/1.0\r\nhost: operator\r\n\r\n").await.map_err(fail)?;
        let mut text = String::new();
        conn.read_to_string(&mut text).await.map_err(fail)?;
        Ok(text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
    }

    /// SIGKILL: no chance to release its Lease.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}
