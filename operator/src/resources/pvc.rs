//! The checkpoint PersistentVolumeClaim.

use std::collections::BTreeMap;

use crds::types::AccessMode;
use crds::{RunConfig, TrainingRunSpec};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements};

use super::meta::{Inputs, pvc_name};

/// The claim's access mode: ReadWriteMany when pods on the run's nodes (`cfg`'s, the
/// accepted topology) share it, unless the spec says otherwise.
pub fn access_mode(spec: &TrainingRunSpec, cfg: &RunConfig) -> String {
    let mode = spec.checkpoint.access_mode.unwrap_or(if cfg.topology.nodes > 1 {
        AccessMode::ReadWriteMany
    } else {
        AccessMode::ReadWriteOnce
    });
    serde_json::to_value(mode).expect("enum serializes").as_str().expect("string").to_string()
}

/// With `retainOnDelete` the claim has no owner reference, so deleting the run
/// leaves it (and the checkpoints) behind.
pub fn pvc(i: &Inputs) -> PersistentVolumeClaim {
    let c = &i.run.spec.checkpoint;
    let mode = access_mode(&i.run.spec, i.cfg);
    PersistentVolumeClaim {
        metadata: i.meta(pvc_name(&i.name()), "checkpoints", !c.retain_on_delete),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![mode]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), c.size.clone())])),
                ..Default::default()
            }),
            storage_class_name: c.storage_class_name.clone(),
            volume_mode: Some("Filesystem".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};

    fn build(extra: &str) -> PersistentVolumeClaim {
        let r = run(&format!("{GPU_SPEC}{extra}"));
        let cfg = crds::resolve(&r).unwrap();
        pvc(&Inputs { run: &r, cfg: &cfg, trainer_image: "img" })
    }

    #[test]
    fn many_nodes_share_a_read_write_many_claim() {
        let p = build("  checkpoint: {size: 500Gi, storageClassName: fast}\n");
        assert_eq!(p.metadata.name.as_deref(), Some("llm-checkpoints"));
        let spec = p.spec.unwrap();
        assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteMany"]);
        assert_eq!(spec.resources.unwrap().requests.unwrap()["storage"].0, "500Gi");
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert!(p.metadata.owner_references.is_some());
    }

    #[test]
    fn one_node_defaults_to_read_write_once_and_the_spec_wins() {
        let one = "  topology: {nodes: 1, gpusPerNode: 8}\n";
        let r = run(&GPU_SPEC.replace("  topology: {nodes: 2, gpusPerNode: 4}\n", one));
        let cfg = crds::resolve(&r).unwrap();
        let p = pvc(&Inputs { run: &r, cfg: &cfg, trainer_image: "img" });
        assert_eq!(p.spec.unwrap().access_modes.unwrap(), vec!["ReadWriteOnce"]);
        let p = build("  checkpoint: {accessMode: ReadWriteMany}\n");
        assert_eq!(p.spec.unwrap().access_modes.unwrap(), vec!["ReadWriteMany"]);
    }

    #[test]
    fn retained_claims_have_no_owner() {
        let p = build("  checkpoint: {retainOnDelete: true}\n");
        assert_eq!(p.metadata.owner_references, None);
        assert_eq!(p.metadata.labels.unwrap()["training.puretransformer.dev/run"], "llm");
    }
}
