//! What the kubelet projects into every pod that does not opt out
//! (`automountServiceAccountToken: false`): a token of the pod's ServiceAccount bound to
//! the pod (TokenRequest, which the Node authorizer grants a node for the pods bound to
//! it), the cluster's CA and the pod's namespace, at [`MOUNT`], where client libraries'
//! in-cluster configuration reads them.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

use super::config::{Config, Error};

/// Where a pod's processes find the files.
pub const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The kubelet's default lifetime of a projected token; a test pod does not outlive it.
const EXPIRATION_SECONDS: i64 = 3600;

/// Whether the pod gets the files.
pub fn wanted(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.automount_service_account_token != Some(false))
}

/// Writes the files for `pod` into `<dir>/serviceaccount`; that directory.
pub async fn project(client: &kube::Client, cfg: &Config, pod: &Pod, dir: &Path) -> Result<PathBuf, Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(EXPIRATION_SECONDS),
        },
        ..Default::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .map_err(|e| Error::kube(format!("a token of serviceaccount {ns}/{account}"), e))?;
    let token =
        issued.status.map(|s| s.token).ok_or_else(|| Error::Pod(format!("serviceaccount {account}: no token")))?;
    let at = dir.join("serviceaccount");
    std::fs::create_dir_all(&at).map_err(|e| Error::io(&at, e))?;
    for (file, text) in [("token", token.as_str()), ("ca.crt", cfg.ca_pem.as_str()), ("namespace", ns.as_str())] {
        let path = at.join(file);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    }
    Ok(at)
}
