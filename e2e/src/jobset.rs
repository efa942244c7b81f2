//! JobSet's controller (`sigs.k8s.io/jobset`, built from the Go module proxy by
//! `scripts/setup-jobset.sh`) on a test cluster, installed as its release manifests
//! install it: its CRD, and the controller with its four webhooks (defaulting and
//! validating JobSets, and JobSet pods) registered with the API server. The controller
//! runs beside the control plane on the host, as kube-controller-manager does here; the
//! API server calls its webhooks at a loopback URL, trusting a CA made for it. Leader
//! election and the metrics server are off; the cert rotator is off
//! (`internalCertManagement.enable: false`) since the certificate is made here.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::control_plane::pki::Pki;
use crate::control_plane::process::Daemon;
use crate::control_plane::{ControlPlane, Error, free_port, wait_until};
use crate::test_cluster::TestCluster;

/// The CRD file `scripts/setup-jobset.sh` copies beside the binary.
pub const CRD_FILE: &str = "jobset.x-k8s.io_jobsets.yaml";
pub const CRD_NAME: &str = "jobsets.jobset.x-k8s.io";

/// Where JobSet's binary and CRD are: `$PT_JOBSET_DIR`, else what
/// `scripts/setup-jobset.sh` prints (building them if needed).
pub fn binaries() -> Result<PathBuf, Error> {
    crate::control_plane::tool_dir("PT_JOBSET_DIR", "setup-jobset.sh")
}

/// The running controller; stopped when dropped.
pub struct JobSetController {
    pub daemon: Daemon,
    /// Its directory: config, certificate, log.
    pub dir: PathBuf,
}

/// The four webhooks of JobSet's `config/components/webhook` (with its patches: the pod
/// webhooks only for JobSet pods), at `base` with `ca_pem` trusted.
fn webhook_configurations(base: &str, ca_pem: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let hook = |name: &str, path: &str, group: &str, version: &str, resource: &str, ops: &[&str], pods: bool| {
        let selector = if pods {
            r#", "objectSelector": {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}"#
        } else {
            ""
        };
        format!(
            r#"{{"name": "{name}", "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
              "clientConfig": {{"url": "{base}{path}", "caBundle": "{ca}"}},
              "rules": [{{"apiGroups": ["{group}"], "apiVersions": ["{version}"], "operations": {ops}, "resources": ["{resource}"]}}]{selector}}}"#,
            ops = serde_json::to_string(ops).expect("strings")
        )
    };
    let jobsets = ("jobset.x-k8s.io", "v1alpha2", "jobsets");
    format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [
          {{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {{"name": "jobset-mutating-webhook-configuration"}}, "webhooks": [{}, {}]}},
          {{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {{"name": "jobset-validating-webhook-configuration"}}, "webhooks": [{}, {}]}}]}}"#,
        hook(
            "mjobset.kb.io",
            "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
            jobsets.0,
            jobsets.1,
            jobsets.2,
            &["CREATE"],
            false
        ),
        hook("mpod.kb.io", "/mutate--v1-pod", "", "v1", "pods", &["CREATE"], true),
        hook(
            "vjobset.kb.io",
            "/validate-jobset-x-k8s-io-v1alpha2-jobset",
            jobsets.0,
            jobsets.1,
            jobsets.2,
            &["CREATE", "UPDATE"],
            false
        ),
        hook("vpod.kb.io", "/validate--v1-pod", "", "v1", "pods", &["CREATE"], true),
    )
}

/// A JobSet the webhooks must admit, for the server-side dry run that proves them up.
const PROBE: &str = r#"{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
  "metadata": {"name": "webhook-probe", "namespace": "default"},
  "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": {
    "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}]}}"#;

impl JobSetController {
    /// Installs the CRD, starts the controller as the cluster's admin and registers its
    /// webhooks; returns once the API server admits a JobSet through them.
    pub async fn start(c: &TestCluster) -> Result<JobSetController, Error> {
        JobSetController::start_on(&c.cp, &c.dir.join("jobset"), &c.cp.kubeconfig).await
    }

    /// [`JobSetController::start`] on a control plane alone (kwok's nodes, a scale
    /// bench), with its state under `dir`, its client's identity `kubeconfig`'s.
    pub async fn start_on(cp: &ControlPlane, dir: &Path, kubeconfig: &Path) -> Result<JobSetController, Error> {
        let bin = binaries()?;
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).map_err(|e| Error::io(&certs, e))?;
        let crd = bin.join(CRD_FILE);
        cp.kubectl_out(&["apply", "--server-side", "-f", &crd.display().to_string()]).map_err(Error::Setup)?;
        cp.kubectl_out(&["wait", "--for=condition=Established", &format!("crd/{CRD_NAME}"), "--timeout=60s"])
            .map_err(Error::Setup)?;

        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let pki = Pki::create(&dir.join("pki"), &[loopback], &[], &[])?;
        for (from, to) in [(&pki.serving_cert, "tls.crt"), (&pki.serving_key, "tls.key")] {
            std::fs::copy(from, certs.join(to)).map_err(|e| Error::io(from, e))?;
        }
        let (port, health) = (free_port(), free_port());
        let config = dir.join("config.yaml");
        let text = format!(
            "apiVersion: config.jobset.x-k8s.io/v1alpha1\nkind: Configuration\n\
             webhook: {{host: 127.0.0.1, port: {port}, certDir: {certs}}}\n\
             internalCertManagement: {{enable: false}}\n\
             leaderElection: {{leaderElect: false}}\n\
             metrics: {{bindAddress: \"0\"}}\n\
             health: {{healthProbeBindAddress: \"127.0.0.1:{health}\"}}\n",
            certs = certs.display()
        );
        std::fs::write(&config, text).map_err(|e| Error::io(&config, e))?;
        let mut cmd = Command::new(bin.join("jobset"));
        cmd.arg("--config").arg(&config).arg("--kubeconfig").arg(kubeconfig);
        let daemon = Daemon::spawn("jobset", cmd, &dir.join("jobset.log"))?;

        let hooks = webhook_configurations(&format!("https://127.0.0.1:{port}"), &pki.ca_pem);
        cp.kubectl_in(&["apply", "-f", "-"], &hooks).map_err(Error::Setup)?;
        wait_until("JobSet's webhooks", Duration::from_secs(120), || async {
            cp.kubectl_in(&["create", "--dry-run=server", "-o", "name", "-f", "-"], PROBE).map(|_| ())
        })
        .await
        .map_err(|e| Error::Setup(format!("{e}\n--- jobset:\n{}", daemon.log_tail(30))))?;
        Ok(JobSetController { daemon, dir: dir.to_path_buf() })
    }
}
