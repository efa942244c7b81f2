//! The ConfigMap holding the resolved run: exactly the `RunConfig` the trainer reads,
//! the current attempt included.

use std::collections::BTreeMap;

use crds::contract::CONFIG_KEY;
use k8s_openapi::api::core::v1::ConfigMap;

use super::meta::{Inputs, configmap_name};

pub fn configmap(i: &Inputs) -> ConfigMap {
    let json = serde_json::to_string_pretty(i.cfg).expect("RunConfig serializes");
    ConfigMap {
        metadata: i.meta(configmap_name(&i.name()), "config", true),
        data: Some(BTreeMap::from([(CONFIG_KEY.to_string(), json)])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};

    #[test]
    fn holds_the_resolved_run_with_its_attempt() {
        let r = run(GPU_SPEC);
        let mut cfg = crds::resolve(&r).unwrap();
        cfg.attempt = 3;
        let cm = configmap(&Inputs { run: &r, cfg: &cfg, trainer_image: "img" });
        assert_eq!(cm.metadata.name.as_deref(), Some("llm-config"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("ml"));
        let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("TrainingRun", "llm", "0d5c-uid"));
        assert_eq!(owner.controller, Some(true));
        let data = cm.data.unwrap();
        let back: crds::RunConfig = serde_json::from_str(&data[CONFIG_KEY]).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(back.attempt, 3);
        assert_eq!(back.batch.grad_accum, 4);
    }
}
