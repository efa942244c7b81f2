//! The real Kubernetes control plane, built from source by
//! `scripts/setup-control-plane.sh`: etcd, kube-apiserver (token and ServiceAccount
//! authentication, `Node,RBAC` authorization, NodeRestriction), kube-controller-manager
//! (every default controller, each with its own ServiceAccount) and kube-scheduler, on
//! loopback ports with a fresh data directory. Startup is waited for on `/readyz` and
//! `/healthz`; dropping it stops every process it started.

pub mod audit;
mod error;
pub mod pki;
pub mod process;

pub use error::Error;

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pki::{Identity, Pki};
use process::Daemon;

/// The `kubernetes` Service's ClusterIP: the first address of the service range.
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// How long the node-lifecycle controller waits for a node's Lease renewal (the agents
/// renew every 10 s) before it marks the node NotReady.
pub const NODE_MONITOR_GRACE: Duration = Duration::from_secs(30);

pub const SA_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Where the control plane's binaries are: `$PT_CONTROL_PLANE_BIN` (set by `make
/// test`), else what `scripts/setup-control-plane.sh` prints (building them if needed).
pub fn binaries() -> Result<PathBuf, Error> {
    tool_dir("PT_CONTROL_PLANE_BIN", "setup-control-plane.sh")
}

/// A directory of tools built from the Go module proxy: `$<env>` when set, else what
/// `scripts/<script>` prints (building them if needed).
pub fn tool_dir(env: &str, script: &str) -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os(env) {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Error::Spawn { program: script.display().to_string(), source: e })?;
    if !out.status.success() {
        return Err(Error::Setup(format!("{} failed ({})", script.display(), out.status)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A free port on 127.0.0.1 (bound and released; the kernel does not hand it out again
/// at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

/// Polls `check` until it returns `Ok`, or fails after `timeout` with the last state it
/// reported.
pub async fn wait_until<T, F: std::future::Future<Output = Result<T, String>>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> Result<T, Error> {
    let start = Instant::now();
    let mut interval = Duration::from_millis(20);
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(state) if start.elapsed() >= timeout => {
                return Err(Error::NotReady { what: what.to_string(), waited: start.elapsed(), state });
            }
            Err(_) => {}
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(250));
    }
}

/// What the control plane needs to know of real nodes (kubelets): their addresses, for
/// their serving certificates, the address it advertises for the `kubernetes` Service
/// (where the nodes reach it), and the `EgressSelectorConfiguration` through which it
/// reaches them.
#[derive(Clone, Debug)]
pub struct RealNodes {
    pub ips: Vec<Ipv4Addr>,
    pub advertise: Ipv4Addr,
    pub egress_selector: String,
}

/// Flags for the API server and the controller manager beyond their own, given after
/// them so that one of the same name wins: a drill's narrower limits
/// (`--max-requests-inflight=3 --max-mutating-requests-inflight=1`, for 429s), or a big
/// cluster's wider client (`--kube-api-qps=200 --kube-api-burst=400` for the controller
/// manager of 1,000 nodes, whose not-ready taints took 223 s to lift at the default 20
/// QPS).
#[derive(Clone, Debug, Default)]
pub struct Tuning {
    pub apiserver: Vec<String>,
    pub controller_manager: Vec<String>,
}

pub struct ControlPlane {
    pub bin: PathBuf,
    pub dir: PathBuf,
    pub pki: Pki,
    pub api_port: u16,
    pub admin: Identity,
    /// Static identities of the kubelets, by node name.
    pub nodes: Vec<(String, Identity)>,
    /// kube-proxy's identity (`system:kube-proxy`, which the default `system:node-proxier`
    /// binding names).
    pub kube_proxy: Identity,
    /// kube-router's identity (`system:kube-router`), bound to a read-only ClusterRole by
    /// `crate::test_cluster::netpol`.
    pub kube_router: Identity,
    /// The admin's kubeconfig (what `kubectl` and the tests use).
    pub kubeconfig: PathBuf,
    /// Dropped last to first: the scheduler and the controllers before the API server,
    /// the API server before etcd.
    daemons: Vec<Daemon>,
    /// Each daemon's arguments, by name, to start it again as it was.
    args: std::collections::BTreeMap<String, Vec<String>>,
    /// etcd's client port (its URL is in the API server's arguments).
    etcd_port: u16,
}

impl ControlPlane {
    /// Starts etcd, the API server, the controller manager and the scheduler with their
    /// state under `dir`, with static tokens for the admin and for the kubelets of
    /// `nodes`, which `real` describes.
    pub async fn start(dir: &Path, nodes: &[String], real: &RealNodes) -> Result<ControlPlane, Error> {
        ControlPlane::start_with(dir, nodes, Some(real), &Tuning::default()).await
    }

    /// [`ControlPlane::start`], with `tuning`'s flags, and without real nodes when
    /// `real` is `None` (a cluster of simulated nodes, `crate::kwok`): then the API
    /// server advertises 127.0.0.1 for the `kubernetes` Service, with no endpoint
    /// reconciler (it refuses a loopback address otherwise, and no pod would reach it),
    /// and has no egress selector or kubelet client flags (it never calls a kubelet).
    /// `nodes` still get static tokens.
    pub async fn start_with(
        dir: &Path,
        nodes: &[String],
        real: Option<&RealNodes>,
        tuning: &Tuning,
    ) -> Result<ControlPlane, Error> {
        let bin = binaries()?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let admin = Identity::admin();
        let controllers = Identity::new("system:kube-controller-manager", &[]);
        let scheduler = Identity::new("system:kube-scheduler", &[]);
        let kube_proxy = Identity::new("system:kube-proxy", &[]);
        let kube_router = Identity::new("system:kube-router", &[]);
        let node_ids: Vec<(String, Identity)> = nodes.iter().map(|n| (n.clone(), Identity::node(n))).collect();
        let mut identities =
            vec![admin.clone(), controllers.clone(), scheduler.clone(), kube_proxy.clone(), kube_router.clone()];
        identities.extend(node_ids.iter().map(|(_, id)| id.clone()));
        let mut ips = vec![IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(KUBERNETES_SERVICE_IP)];
        ips.extend(real.map(|r| IpAddr::V4(r.advertise)));
        let kubelets: Vec<(String, IpAddr)> = match real {
            Some(r) => nodes.iter().cloned().zip(r.ips.iter().map(|ip| IpAddr::V4(*ip))).collect(),
            None => Vec::new(),
        };
        let pki = Pki::create(&dir.join("pki"), &ips, &identities, &kubelets)?;
        let mut cp = ControlPlane {
            bin,
            dir: dir.to_path_buf(),
            pki,
            api_port: free_port(),
            admin,
            nodes: node_ids,
            kube_proxy,
            kube_router,
            kubeconfig: dir.join("admin.kubeconfig"),
            daemons: Vec::new(),
            args: Default::default(),
            etcd_port: 0,
        };
        let server = cp.server();
        let write = |p: &Path, text: String| std::fs::write(p, text).map_err(|e| Error::io(p, e));
        write(&cp.kubeconfig, cp.pki.kubeconfig(&server, "admin", &cp.admin.token))?;
        let kcm_config = dir.join("controller-manager.kubeconfig");
        write(&kcm_config, cp.pki.kubeconfig(&server, "kube-controller-manager", &controllers.token))?;
        let scheduler_config = dir.join("scheduler.kubeconfig");
        write(&scheduler_config, cp.pki.kubeconfig(&server, "kube-scheduler", &scheduler.token))?;

        let etcd_port = cp.start_etcd().await?;
        cp.etcd_port = etcd_port;
        cp.start_apiserver(etcd_port, real, &tuning.apiserver).await?;
        cp.start_controller_manager(&kcm_config, &tuning.controller_manager).await?;
        cp.start_scheduler(&scheduler_config).await?;
        Ok(cp)
    }

    /// Where the API server writes its audit log ([`audit::POLICY`]).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// Every request the API server has completed so far ([`audit::read`]).
    pub fn audit(&self) -> Result<Vec<audit::Request>, Error> {
        audit::read(&self.audit_log())
    }

    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// A kubeconfig file for `token` against `server`.
    pub fn write_kubeconfig(&self, path: &Path, server: &str, user: &str, token: &str) -> Result<(), Error> {
        std::fs::write(path, self.pki.kubeconfig(server, user, token)).map_err(|e| Error::io(path, e))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn spawn(&mut self, name: &str, args: Vec<String>) -> Result<(), Error> {
        let daemon = self.daemon(name, &args)?;
        self.daemons.push(daemon);
        self.args.insert(name.to_string(), args);
        Ok(())
    }

    fn daemon(&self, name: &str, args: &[String]) -> Result<Daemon, Error> {
        let mut cmd = Command::new(self.bin.join(name));
        cmd.args(args).current_dir(&self.dir);
        Daemon::spawn(name, cmd, &self.log(name))
    }

    /// Stops `name` (`etcd` or `kube-apiserver`: SIGTERM, as an upgrade or a node
    /// restart does), keeps it away for `away`, then starts it again with the same
    /// arguments, state and port and waits until it is ready. Everything else keeps
    /// running meanwhile and finds it again at the same address.
    pub async fn restart(&mut self, name: &str, away: Duration) -> Result<(), Error> {
        let args = self.args.get(name).cloned().ok_or_else(|| Error::NotReady {
            what: format!("{name} restart"),
            waited: Duration::ZERO,
            state: format!("{name} was not started"),
        })?;
        let at = self.daemons.iter().position(|d| d.name == name).expect("a started daemon is held");
        self.daemons[at].stop(Duration::from_secs(10));
        tokio::time::sleep(away).await;
        // At the same place, so the daemons still stop in dependency order.
        self.daemons[at] = self.daemon(name, &args)?;
        match name {
            "etcd" => {
                let probe = probe_client(&format!("http://127.0.0.1:{}", self.etcd_port))?;
                self.wait_ready("etcd", &probe, "/health", |body| body.contains("\"health\":\"true\"")).await
            }
            _ => {
                let client = self.client().await?;
                self.wait_ready(name, &client, "/readyz", |body| body.trim() == "ok").await
            }
        }
    }

    /// The daemon `name`, for the failure message of a wait.
    fn state_of(&mut self, name: &str) -> String {
        match self.daemons.iter_mut().find(|d| d.name == name) {
            Some(d) => match d.exited() {
                Some(status) => format!("{name} exited ({status}); its log ends:\n{}", d.log_tail(30)),
                None => format!("{name} is running; its log ends:\n{}", d.log_tail(15)),
            },
            None => format!("{name} was not started"),
        }
    }

    async fn start_etcd(&mut self) -> Result<u16, Error> {
        let (client, peer) = (free_port(), free_port());
        let data = self.dir.join("etcd");
        let args = vec![
            "--name=e2e".into(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=e2e=http://127.0.0.1:{peer}"),
            // A test cluster's state dies with it: durability buys nothing here.
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        self.spawn("etcd", args)?;
        let probe = probe_client(&format!("http://127.0.0.1:{client}"))?;
        self.wait_ready("etcd", &probe, "/health", |body| body.contains("\"health\":\"true\"")).await?;
        Ok(client)
    }

    /// The API server's flags for reaching, and being reached by, the nodes.
    fn node_args(&self, real: &RealNodes) -> Result<Vec<String>, Error> {
        let selector = self.dir.join("egress-selector.yaml");
        std::fs::write(&selector, &real.egress_selector).map_err(|e| Error::io(&selector, e))?;
        let p = &self.pki;
        Ok(vec![
            // The `kubernetes` Service's endpoint, which relays to this loopback port;
            // kube-proxy on each node routes the ClusterIP to it.
            format!("--advertise-address={}", real.advertise),
            format!("--egress-selector-config-file={}", selector.display()),
            format!("--kubelet-client-certificate={}", p.kubelet_client.cert.display()),
            format!("--kubelet-client-key={}", p.kubelet_client.key.display()),
            format!("--kubelet-certificate-authority={}", p.ca_cert.display()),
            "--kubelet-preferred-address-types=InternalIP".into(),
        ])
    }

    async fn start_apiserver(
        &mut self,
        etcd_port: u16,
        real: Option<&RealNodes>,
        extra: &[String],
    ) -> Result<(), Error> {
        let p = self.pki.clone();
        let policy = self.dir.join("audit-policy.yaml");
        std::fs::write(&policy, audit::POLICY).map_err(|e| Error::io(&policy, e))?;
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", self.api_port),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            format!("--tls-cert-file={}", p.serving_cert.display()),
            format!("--tls-private-key-file={}", p.serving_key.display()),
            format!("--client-ca-file={}", p.ca_cert.display()),
            format!("--token-auth-file={}", p.token_file.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--service-account-issuer={SA_ISSUER}"),
            format!("--service-account-key-file={}", p.sa_pub.display()),
            format!("--service-account-signing-key-file={}", p.sa_key.display()),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            format!("--cert-dir={}", self.dir.join("apiserver-certs").display()),
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", self.audit_log().display()),
            "--audit-log-format=json".into(),
            "--v=1".into(),
        ];
        match real {
            Some(real) => args.extend(self.node_args(real)?),
            None => args.extend(["--advertise-address=127.0.0.1".into(), "--endpoint-reconciler-type=none".into()]),
        }
        args.extend_from_slice(extra);
        self.spawn("kube-apiserver", args)?;
        let client = self.client().await?;
        self.wait_ready("kube-apiserver", &client, "/readyz", |body| body.trim() == "ok").await
    }

    async fn start_controller_manager(&mut self, kubeconfig: &Path, extra: &[String]) -> Result<(), Error> {
        let port = free_port();
        let p = self.pki.clone();
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", self.dir.join("controller-manager-certs").display()),
            // Every default controller: job, garbage collector, namespace,
            // serviceaccount-token, endpointslice, PV binder, node lifecycle, pod GC,
            // ttl-after-finished, disruption, replicaset, deployment, ...
            "--controllers=*".into(),
            "--use-service-account-credentials=true".into(),
            // A node whose agent stops renewing its Lease is NotReady within
            // NODE_MONITOR_GRACE (the default, 50 s, would double the wait).
            format!("--node-monitor-grace-period={}s", NODE_MONITOR_GRACE.as_secs()),
            "--node-monitor-period=2s".into(),
            format!("--service-account-private-key-file={}", p.sa_key.display()),
            format!("--root-ca-file={}", p.ca_cert.display()),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        args.extend_from_slice(extra);
        self.spawn("kube-controller-manager", args)?;
        self.wait_healthz("kube-controller-manager", port).await
    }

    async fn start_scheduler(&mut self, kubeconfig: &Path) -> Result<(), Error> {
        let port = free_port();
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", self.dir.join("scheduler-certs").display()),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        self.spawn("kube-scheduler", args)?;
        self.wait_healthz("kube-scheduler", port).await
    }

    /// A component's own `/healthz` (self-signed serving certificate, no credentials).
    async fn wait_healthz(&mut self, name: &str, port: u16) -> Result<(), Error> {
        let probe = probe_client(&format!("https://127.0.0.1:{port}"))?;
        self.wait_ready(name, &probe, "/healthz", |body| body.trim() == "ok").await
    }

    /// Polls `GET path` until `ok(body)`; a daemon that exits fails the wait at once.
    async fn wait_ready(
        &mut self,
        name: &str,
        client: &kube::Client,
        path: &str,
        ok: impl Fn(&str) -> bool,
    ) -> Result<(), Error> {
        let timeout = Duration::from_secs(120);
        let start = Instant::now();
        let mut interval = Duration::from_millis(20);
        let mut last: String;
        loop {
            let request = http::Request::get(path).body(Vec::new()).expect("a GET request");
            match client.request_text(request).await {
                Ok(body) if ok(&body) => return Ok(()),
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            let exited = self.daemons.iter_mut().find(|d| d.name == name).and_then(|d| d.exited()).is_some();
            if exited || start.elapsed() >= timeout {
                let state = format!("last answer: {last}; {}", self.state_of(name));
                return Err(Error::NotReady { what: format!("{name} {path}"), waited: start.elapsed(), state });
            }
            tokio::time::sleep(interval).await;
            interval = (interval * 2).min(Duration::from_millis(250));
        }
    }

    /// The log file of a component (`etcd`, `kube-apiserver`, ...).
    pub fn log_of(&self, name: &str) -> PathBuf {
        self.log(name)
    }

    /// `kubectl` as the admin.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.env("KUBECONFIG", &self.kubeconfig).env("KUBECACHEDIR", self.dir.join("kubectl-cache"));
        cmd
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

    /// `helm` as the admin, with its caches under the cluster's directory.
    pub fn helm(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("helm"));
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"));
        cmd
    }

    /// A kube-rs client as the admin.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_for(&self.kubeconfig).await
    }
}

/// Chooses rustls' ring provider for this process: a workspace build enables both ring
/// and aws-lc-rs (the AWS SDK), and rustls then cannot pick one on its own.
fn tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A kube-rs client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client, Error> {
    tls_provider();
    let config = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Setup(format!("{}: {e}", kubeconfig.display())))?;
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(config, &options)
        .await
        .map_err(|e| Error::Setup(format!("{}: {e}", kubeconfig.display())))?;
    kube::Client::try_from(config).map_err(|e| Error::Setup(format!("{}: {e}", kubeconfig.display())))
}

/// The CA a kubeconfig trusts (its first cluster's `certificate-authority-data`), PEM.
pub fn kubeconfig_ca(kubeconfig: &Path) -> Result<String, Error> {
    use base64::Engine;
    let bad = |why: String| Error::Setup(format!("{}: {why}", kubeconfig.display()));
    let config = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| bad(e.to_string()))?;
    let data = config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref()?.certificate_authority_data.clone())
        .ok_or_else(|| bad("no certificate-authority-data".into()))?;
    let pem = base64::engine::general_purpose::STANDARD.decode(data.trim()).map_err(|e| bad(e.to_string()))?;
    String::from_utf8(pem).map_err(|e| bad(e.to_string()))
}

/// A client for a component's health endpoint: plain HTTP, or HTTPS that accepts the
/// component's self-signed certificate, no credentials.
fn probe_client(url: &str) -> Result<kube::Client, Error> {
    tls_provider();
    let uri = url.parse().map_err(|e| Error::Setup(format!("{url}: {e}")))?;
    let mut config = kube::Config::new(uri);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    kube::Client::try_from(config).map_err(|e| Error::Setup(format!("{url}: {e}")))
}
