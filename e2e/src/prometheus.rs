//! Prometheus (built from the Go module proxy by `scripts/setup-prometheus.sh`) on a test
//! cluster, configured from the chart's own monitoring objects ([`crate::monitoring`]):
//! it runs at the cluster's router, as a Prometheus outside the nodes that routes to the
//! pods' addresses, and discovers its targets through the real API server as its own
//! ServiceAccount (`monitoring/prometheus`, with the read access prometheus-operator's
//! examples give it). Its HTTP API is read from the router's namespace.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::control_plane::process::Daemon;
use crate::control_plane::{Error, wait_until};
use crate::monitoring::{Discovery, translate};
use crate::network::nodes::ROUTER;
use crate::network::relay;
use crate::test_cluster::TestCluster;

/// Where Prometheus serves at the router.
pub const PORT: u16 = 19090;
pub const NAMESPACE: &str = "monitoring";
const ACCOUNT: &str = "prometheus";

/// Where Prometheus' binary is: `$PT_PROMETHEUS_DIR`, else what
/// `scripts/setup-prometheus.sh` prints (building it if needed).
pub fn binaries() -> Result<PathBuf, Error> {
    crate::control_plane::tool_dir("PT_PROMETHEUS_DIR", "setup-prometheus.sh")
}

/// The read access Prometheus needs to discover pods and EndpointSlices.
const RBAC: &str = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}},
  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", "namespace": "monitoring"}},
  {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "e2e-prometheus"},
   "rules": [{"apiGroups": [""], "resources": ["nodes", "services", "endpoints", "pods", "namespaces"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
             {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
  {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "e2e-prometheus"},
   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-prometheus"},
   "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]}]}"#;

/// A running Prometheus; stopped when dropped.
pub struct Prometheus {
    pub daemon: Daemon,
    pub addr: SocketAddr,
    netns: PathBuf,
    pub dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus with the scrape jobs and rules of the monitoring objects among
    /// `objects` (the chart rendered by `helm template`), evaluating rules every
    /// `evaluation_interval`; returns once it is ready.
    pub async fn start(c: &TestCluster, objects: &[Value], evaluation_interval: &str) -> Result<Prometheus, Error> {
        let bin = binaries()?.join("prometheus");
        let dir = c.dir.join("prometheus");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut apply = c.kubectl();
        apply.args(["apply", "-f", "-"]).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = apply.spawn().map_err(|e| Error::Spawn { program: "kubectl".into(), source: e })?;
        child.stdin.take().expect("piped").write_all(RBAC.as_bytes()).map_err(|e| Error::io(&dir, e))?;
        let out = child.wait_with_output().map_err(|e| Error::io(&dir, e))?;
        if !out.status.success() {
            return Err(Error::Setup(format!("Prometheus' RBAC: {}", String::from_utf8_lossy(&out.stderr))));
        }
        let token =
            c.kubectl_out(&["-n", NAMESPACE, "create", "token", ACCOUNT, "--duration=2h"]).map_err(Error::Setup)?;
        let token_file = dir.join("token");
        std::fs::write(&token_file, token.trim()).map_err(|e| Error::io(&token_file, e))?;
        let api_server = crate::node::router_server(&c.cp);
        let discovery = Discovery { api_server: &api_server, ca_file: &c.cp.pki.ca_cert, token_file: &token_file };
        let rules_file = dir.join("rules.yaml");
        let (config, rules) = translate(objects, &discovery, &rules_file, evaluation_interval).map_err(Error::Setup)?;
        let config_file = dir.join("prometheus.yaml");
        for (path, doc) in [(&config_file, &config), (&rules_file, &rules)] {
            let text = serde_json::to_string_pretty(doc).expect("JSON");
            std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
        }

        let addr = SocketAddr::from((ROUTER, PORT));
        let mut cmd = Command::new(&bin);
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=info");
        crate::network::enter(&mut cmd, &c.net.path()).map_err(|e| Error::Setup(e.to_string()))?;
        let daemon = Daemon::spawn("prometheus", cmd, &dir.join("prometheus.log"))?;
        let p = Prometheus { daemon, addr, netns: c.net.path(), dir };
        wait_until("Prometheus ready", Duration::from_secs(60), || async {
            p.get("/-/ready").map(|_| ()).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| Error::Setup(format!("{e}\n--- prometheus:\n{}", p.daemon.log_tail(30))))?;
        Ok(p)
    }

    /// `GET path` from the router's namespace: the body of a 200.
    pub fn get(&self, path: &str) -> Result<String, Error> {
        relay::http_get(&self.netns, self.addr, path).map_err(Error::Setup)
    }

    /// `GET /api/v1/<endpoint>`'s `data`.
    pub fn api(&self, endpoint: &str) -> Result<Value, Error> {
        let body = self.get(&format!("/api/v1/{endpoint}"))?;
        let v: Value = serde_json::from_str(&body).map_err(|e| Error::Setup(format!("/api/v1/{endpoint}: {e}")))?;
        if v["status"] != "success" {
            return Err(Error::Setup(format!("/api/v1/{endpoint}: {body}")));
        }
        Ok(v["data"].clone())
    }

    /// The result vector of an instant query (`expr` URL-encoded here).
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, Error> {
        let data = self.api(&format!("query?query={}", encode(expr)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Every alert Prometheus holds now (pending or firing).
    pub fn alerts(&self) -> Result<Vec<Value>, Error> {
        Ok(self.api("alerts")?["alerts"].as_array().cloned().unwrap_or_default())
    }
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
