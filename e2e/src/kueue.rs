//! Kueue's controller (`sigs.k8s.io/kueue`, built from the Go module proxy by
//! `scripts/setup-kueue.sh`) on a test cluster, installed as its release manifests
//! install it: its CRDs, and the controller with the webhooks of its own kinds and of
//! the one integration enabled here, `batch/job`, registered with the API server.
//!
//! Only those webhooks: the release registers one per integration with
//! `failurePolicy: Fail`, and a webhook whose integration is off (pods, Deployments,
//! StatefulSets...) would refuse every object of its kind. The controller runs beside the
//! control plane on the host, as kube-controller-manager does here; the API server calls
//! its webhooks at a loopback URL, trusting a CA made for it. Leader election, the
//! visibility server and the metrics endpoint are off, and so is the cert rotator
//! (`internalCertManagement.enable: false`) since the certificates are made here. Kueue
//! then reads its metrics certificate from a path compiled into it,
//! `/etc/kueue/metrics/certs`: the controller runs in a mount namespace of its own with
//! the harness's certificate bound there ([`crate::mounts`]).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::control_plane::pki::Pki;
use crate::control_plane::process::Daemon;
use crate::control_plane::{Error, free_port, wait_until};
use crate::mounts::Binds;
use crate::test_cluster::TestCluster;

/// Where Kueue's binary, CRDs (`crd/`) and webhook manifests (`webhooks.yaml`) are:
/// `$PT_KUEUE_DIR`, else what `scripts/setup-kueue.sh` prints (building them if needed).
pub fn binaries() -> Result<PathBuf, Error> {
    crate::control_plane::tool_dir("PT_KUEUE_DIR", "setup-kueue.sh")
}

/// The integrations enabled, as Kueue's configuration names them.
pub const FRAMEWORKS: [&str; 1] = ["batch/job"];

/// Where Kueue looks for its metrics certificate when it does not manage its own.
const METRICS_CERTS: &str = "/etc/kueue/metrics/certs";

/// Kueue's namespace (its configuration's `namespace`), as the release creates it.
pub const NAMESPACE: &str = "kueue-system";

/// The running controller; stopped when dropped.
pub struct Kueue {
    pub daemon: Daemon,
    /// Its directory: configuration, certificates, log.
    pub dir: PathBuf,
}

/// Whether a webhook serves Kueue's own kinds or the Jobs of the `batch/job` integration.
fn enabled(webhook: &Value) -> bool {
    let rules = webhook["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(String::from)).collect()
    };
    !rules.is_empty()
        && rules.iter().all(|r| {
            let groups = strings(&r["apiGroups"]);
            let resources = strings(&r["resources"]);
            groups == ["kueue.x-k8s.io"] || (groups == ["batch"] && resources == ["jobs"])
        })
}

/// The webhook configurations of Kueue's `config/components/webhook/manifests.yaml`,
/// named as the release names them (`kueue-` first), with only the webhooks of Kueue's
/// own kinds and of `batch/job`, each called at `base` + its path with `ca_pem` trusted.
pub fn webhook_configurations(manifests: &str, base: &str, ca_pem: &str) -> Result<Value, String> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let mut items = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(manifests) {
        let mut object = Value::deserialize(doc).map_err(|e| format!("webhooks.yaml: {e}"))?;
        if object.is_null() {
            continue;
        }
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        if !kind.ends_with("WebhookConfiguration") {
            return Err(format!("webhooks.yaml: a {kind:?}, not a webhook configuration"));
        }
        let name = object["metadata"]["name"].as_str().ok_or("webhooks.yaml: a configuration without a name")?;
        object["metadata"] = json!({"name": format!("kueue-{name}")});
        let webhooks = object["webhooks"].as_array().cloned().unwrap_or_default();
        let mut kept = Vec::new();
        for mut hook in webhooks.into_iter().filter(enabled) {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .ok_or_else(|| format!("webhooks.yaml: webhook {} has no service path", hook["name"]))?;
            hook["clientConfig"] = json!({"url": format!("{base}{path}"), "caBundle": ca});
            kept.push(hook);
        }
        object["webhooks"] = Value::Array(kept);
        items.push(object);
    }
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

/// Kueue's CRDs (the YAML files of `crd/`) as a List, those named in `conversion` (the
/// release's `webhook_in_*` patches) converted between versions by the webhook at
/// `base`/convert with `ca_pem` trusted, as the release patches them.
pub fn crds(files: &[(String, String)], conversion: &[&str], base: &str, ca_pem: &str) -> Result<Value, String> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let mut items = Vec::new();
    for (file, text) in files {
        let mut crd: Value = serde_yaml_ng::from_str(text).map_err(|e| format!("{file}: {e}"))?;
        let name = crd["metadata"]["name"].as_str().ok_or_else(|| format!("{file}: a CRD without a name"))?;
        if conversion.contains(&name) {
            crd["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": format!("{base}/convert"), "caBundle": ca},
                "conversionReviewVersions": ["v1"]}});
        }
        items.push(crd);
    }
    let names: Vec<&str> = items.iter().filter_map(|c| c["metadata"]["name"].as_str()).collect();
    if let Some(missing) = conversion.iter().find(|c| !names.contains(c)) {
        return Err(format!("conversion-webhooks.txt names {missing}, which no CRD file defines"));
    }
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

/// A ResourceFlavor the webhooks must admit, for the server-side dry run that proves
/// them up.
const PROBE: &str = r#"{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
  "metadata": {"name": "webhook-probe"}}"#;

impl Kueue {
    /// Installs the CRDs, starts the controller as the cluster's admin and registers its
    /// webhooks; returns once the API server admits a Kueue object through them.
    pub async fn start(c: &TestCluster) -> Result<Kueue, Error> {
        let bin = binaries()?;
        let dir = c.dir.join("kueue");
        let (certs, metrics_certs) = (dir.join("certs"), dir.join("metrics-certs"));
        for d in [&certs, &metrics_certs] {
            std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
        }
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let pki = Pki::create(&dir.join("pki"), &[loopback], &[], &[])?;
        for to in [&certs, &metrics_certs] {
            for (from, name) in [(&pki.serving_cert, "tls.crt"), (&pki.serving_key, "tls.key")] {
                std::fs::copy(from, to.join(name)).map_err(|e| Error::io(from, e))?;
            }
        }
        let (port, health) = (free_port(), free_port());
        let base = format!("https://127.0.0.1:{port}");

        let read = |path: &Path| std::fs::read_to_string(path).map_err(|e| Error::io(path, e));
        let crd_dir = bin.join("crd");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&crd_dir).map_err(|e| Error::io(&crd_dir, e))? {
            let path = entry.map_err(|e| Error::io(&crd_dir, e))?.path();
            files.push((path.display().to_string(), read(&path)?));
        }
        files.sort();
        let conversion = read(&bin.join("conversion-webhooks.txt"))?;
        let conversion: Vec<&str> = conversion.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let crds = crds(&files, &conversion, &base, &pki.ca_pem).map_err(Error::Setup)?;
        c.kubectl_in(&["apply", "--server-side", "-f", "-"], &crds.to_string()).map_err(Error::Setup)?;
        let names: Vec<String> = crds["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["metadata"]["name"].as_str().map(|n| format!("crd/{n}")))
            .collect();
        let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        wait.extend(names.iter().map(String::as_str));
        c.kubectl_out(&wait).map_err(Error::Setup)?;
        c.kubectl_in(
            &["apply", "-f", "-"],
            &format!(r#"{{"apiVersion": "v1", "kind": "Namespace", "metadata": {{"name": "{NAMESPACE}"}}}}"#),
        )
        .map_err(Error::Setup)?;

        let config = dir.join("config.yaml");
        let text = format!(
            "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\nnamespace: {NAMESPACE}\n\
             webhook: {{host: 127.0.0.1, port: {port}, certDir: {certs}}}\n\
             internalCertManagement: {{enable: false}}\n\
             leaderElection: {{leaderElect: false}}\n\
             metrics: {{bindAddress: \"0\"}}\n\
             health: {{healthProbeBindAddress: \"127.0.0.1:{health}\"}}\n\
             featureGates: {{VisibilityOnDemand: false}}\n\
             integrations: {{frameworks: {frameworks}}}\n",
            certs = certs.display(),
            frameworks = serde_json::to_string(&FRAMEWORKS).expect("strings"),
        );
        std::fs::write(&config, text).map_err(|e| Error::io(&config, e))?;
        let mut cmd = Command::new(bin.join("kueue"));
        cmd.arg("--config").arg(&config).arg("--kubeconfig").arg(&c.cp.kubeconfig);
        Binds::default()
            .bind(&metrics_certs, Path::new(METRICS_CERTS))
            .map_err(|e| Error::io(Path::new(METRICS_CERTS), e))?
            .apply(&mut cmd);
        let daemon = Daemon::spawn("kueue", cmd, &dir.join("kueue.log"))?;

        let hooks =
            webhook_configurations(&read(&bin.join("webhooks.yaml"))?, &base, &pki.ca_pem).map_err(Error::Setup)?;
        c.kubectl_in(&["apply", "-f", "-"], &hooks.to_string()).map_err(Error::Setup)?;
        wait_until("Kueue's webhooks", Duration::from_secs(120), || async {
            c.kubectl_in(&["create", "--dry-run=server", "-o", "name", "-f", "-"], PROBE).map(|_| ())
        })
        .await
        .map_err(|e| Error::Setup(format!("{e}\n--- kueue:\n{}", daemon.log_tail(30))))?;
        Ok(Kueue { daemon, dir })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of Kueue's manifests: one configuration of each kind, a webhook per
    /// framework, each at the `webhook-service` Service.
    const MANIFESTS: &str = r#"---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - apiGroups: [batch]
    apiVersions: [v1]
    operations: [CREATE]
    resources: [jobs]
  sideEffects: None
- clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
- clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-apps-v1-deployment}
  name: mdeployment.kb.io
  rules:
  - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
- clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-jobset-x-k8s-io-v1alpha2-jobset}
  name: mjobset.kb.io
  rules:
  - {apiGroups: [jobset.x-k8s.io], apiVersions: [v1alpha2], operations: [CREATE], resources: [jobsets]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-kueue-x-k8s-io-v1beta2-clusterqueue}
  name: vclusterqueue.kb.io
  rules:
  - {apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE, UPDATE], resources: [clusterqueues]}
- clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-batch-v1-cronjob}
  name: vcronjob.example
  rules:
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [cronjobs]}
"#;

    #[test]
    fn only_the_enabled_integrations_webhooks_are_registered_at_the_harness_url() {
        let list = webhook_configurations(MANIFESTS, "https://127.0.0.1:9443", "PEM").unwrap();
        let items = list["items"].as_array().unwrap();
        let names = |i: usize| -> Vec<&str> {
            items[i]["webhooks"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect()
        };
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["metadata"]["name"], "kueue-mutating-webhook-configuration");
        assert_eq!(names(0), ["mjob.kb.io"], "no pod, Deployment or JobSet webhook");
        assert_eq!(names(1), ["vclusterqueue.kb.io"], "no CronJob webhook: batch/job is Jobs only");
        let hook = &items[0]["webhooks"][0];
        assert_eq!(hook["clientConfig"]["url"], "https://127.0.0.1:9443/mutate-batch-v1-job");
        assert_eq!(hook["clientConfig"]["caBundle"], "UEVN", "base64 of the CA");
        assert!(hook["clientConfig"].get("service").is_none());
        assert_eq!(hook["failurePolicy"], "Fail", "the rest of the webhook as released");
    }

    #[test]
    fn the_crds_the_release_patches_convert_through_the_webhook() {
        let crd = |name: &str| {
            (
                format!("{name}.yaml"),
                format!(
                    "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: {name}}}\nspec: {{group: kueue.x-k8s.io}}\n"
                ),
            )
        };
        let files = [crd("workloads.kueue.x-k8s.io"), crd("resourceflavors.kueue.x-k8s.io")];
        let list = crds(&files, &["workloads.kueue.x-k8s.io"], "https://127.0.0.1:9443", "PEM").unwrap();
        let items = list["items"].as_array().unwrap();
        let conversion = &items[0]["spec"]["conversion"];
        assert_eq!(conversion["strategy"], "Webhook");
        assert_eq!(conversion["webhook"]["clientConfig"]["url"], "https://127.0.0.1:9443/convert");
        assert_eq!(items[0]["spec"]["group"], "kueue.x-k8s.io", "the rest of the CRD as released");
        assert!(items[1]["spec"].get("conversion").is_none(), "resourceflavors has one version: no webhook");
        let err = crds(&files, &["cohorts.kueue.x-k8s.io"], "https://x", "PEM").unwrap_err();
        assert!(err.contains("cohorts.kueue.x-k8s.io"), "{err}");
    }

    #[test]
    fn a_manifest_that_is_not_a_webhook_configuration_is_refused_by_name() {
        let err = webhook_configurations("kind: Service\nmetadata: {name: x}\n", "https://x", "PEM").unwrap_err();
        assert!(err.contains("\"Service\""), "{err}");
    }
}
