//! A dynamic provisioner for the test cluster's default StorageClass: each claim of the
//! class gets a PersistentVolume backed by a directory (`hostPath`), pre-bound to the
//! claim so that the real PV controller completes the binding; a Released volume of
//! the `Delete` policy loses its directory and its object, as an external provisioner
//! does.

use std::collections::BTreeMap;
use std::path::PathBuf;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

pub const STORAGE_CLASS: &str = "standard";
pub const PROVISIONER: &str = "e2e.puretransformer.dev/hostpath";

/// Creates the default StorageClass.
pub async fn install(client: &kube::Client) -> Result<(), kube::Error> {
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    }))
    .expect("a StorageClass");
    match Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The volume of a claim, if it is one of the class and still needs one.
pub fn volume_for(claim: &PersistentVolumeClaim, root: &std::path::Path) -> Option<PersistentVolume> {
    let spec = claim.spec.as_ref()?;
    if spec.storage_class_name.as_deref() != Some(STORAGE_CLASS)
        || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
    {
        return None;
    }
    let uid = claim.metadata.uid.as_ref()?;
    let name = format!("pvc-{uid}");
    let size = spec.resources.as_ref()?.requests.as_ref()?.get("storage")?.0.clone();
    let path = root.join(&name);
    Some(
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": spec.access_modes.clone().unwrap_or_default(),
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": STORAGE_CLASS,
                "hostPath": {"path": path.display().to_string(), "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "namespace": claim.metadata.namespace, "name": claim.metadata.name, "uid": uid},
            },
        }))
        .expect("a PersistentVolume"),
    )
}

/// The volume's directory, writable by any user, as local-path-provisioner makes it: a
/// kubelet applies no `fsGroup` to a `hostPath` volume, and the pods run as non-root.
fn make_volume_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

/// Runs the provisioner until the task is dropped.
pub async fn run(client: kube::Client, root: PathBuf) {
    let _ = std::fs::create_dir_all(&root);
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let (claim_reader, claim_writer) = reflector::store();
    let (volume_reader, volume_writer) = reflector::store();
    let claim_events = reflector(claim_writer, watcher(claims, watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .map(|_| ());
    let volume_events = reflector(volume_writer, watcher(volumes.clone(), watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .map(|_| ());
    let events = futures::stream::select(claim_events, volume_events);
    futures::pin_mut!(events);
    // What this provisioner created and has not seen yet, so one event burst makes one volume.
    let mut created: BTreeMap<String, ()> = BTreeMap::new();
    while events.next().await.is_some() {
        let existing: Vec<String> = volume_reader.state().iter().filter_map(|v| v.metadata.name.clone()).collect();
        created.retain(|name, _| !existing.contains(name));
        for claim in claim_reader.state() {
            let Some(pv) = volume_for(&claim, &root) else { continue };
            let name = pv.metadata.name.clone().unwrap_or_default();
            if existing.contains(&name) || created.contains_key(&name) {
                continue;
            }
            if let Err(e) = make_volume_dir(&root.join(&name)) {
                tracing::warn!("provisioning {name}: {e}");
                continue;
            }
            match volumes.create(&PostParams::default(), &pv).await {
                Ok(_) => {
                    created.insert(name, ());
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => tracing::warn!("provisioning {name}: {e}"),
            }
        }
        for pv in volume_reader.state() {
            let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
            let ours = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
                .map(String::as_str)
                == Some(PROVISIONER);
            let delete = pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete");
            if released && ours && delete && pv.metadata.deletion_timestamp.is_none() {
                if let Some(path) = pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| PathBuf::from(&h.path))
                {
                    let _ = std::fs::remove_dir_all(path);
                }
                let name = pv.metadata.name.clone().unwrap_or_default();
                if let Err(e) = volumes.delete(&name, &DeleteParams::default()).await {
                    tracing::warn!("deleting released volume {name}: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(class: Option<&str>, bound: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "ckpt", "namespace": "ml", "uid": "u-1"},
            "spec": {"storageClassName": class, "volumeName": bound, "accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap()
    }

    #[test]
    fn a_volume_only_for_an_unbound_claim_of_the_class() {
        let root = std::path::Path::new("/v");
        let pv = volume_for(&claim(Some(STORAGE_CLASS), None), root).expect("a volume");
        let spec = pv.spec.unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u-1"));
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteMany".to_string()]);
        assert_eq!(spec.host_path.unwrap().path, "/v/pvc-u-1");
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!((claim_ref.namespace.as_deref(), claim_ref.uid.as_deref()), (Some("ml"), Some("u-1")));
        assert!(volume_for(&claim(Some("other"), None), root).is_none());
        assert!(volume_for(&claim(Some(STORAGE_CLASS), Some("pvc-x")), root).is_none());
    }
}
