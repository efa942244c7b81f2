//! Step 1 of the pipeline, pure: the spec resolved through the API crate, exactly
//! as `trainer run` resolves it, with the current attempt filled in and the settings a
//! failure policy changed (`status.effective`) applied.

use crds::{InvalidSpec, RunConfig, TrainingRun};
use kube::ResourceExt;

use crds::resolve::FieldError;

pub fn validate(run: &TrainingRun, attempt: u32) -> Result<RunConfig, InvalidSpec> {
    if run.namespace().is_none() {
        return Err(InvalidSpec(vec![FieldError {
            field: "metadata.namespace".into(),
            message: "is required".into(),
        }]));
    }
    let mut cfg = crds::resolve(run)?;
    cfg.attempt = attempt.max(1);
    let effective = run.status.as_ref().and_then(|s| s.effective.as_ref());
    if let Some(e) = effective {
        cfg.rollbacks = e.rollbacks.clone();
    }
    if let Some(micro) = effective.and_then(|e| e.micro_batch).filter(|m| *m < cfg.batch.micro_batch) {
        // A spec whose new global batch or topology the reduced micro-batch does not
        // divide starts again from the spec's.
        if let Ok(reduced) = cfg.with_micro_batch(micro) {
            cfg = reduced;
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};

    #[test]
    fn resolves_with_the_attempt() {
        let cfg = validate(&run(GPU_SPEC), 4).unwrap();
        assert_eq!((cfg.attempt, cfg.topology.world_size, cfg.name.as_str()), (4, 8, "llm"));
        assert_eq!(validate(&run(GPU_SPEC), 0).unwrap().attempt, 1);
    }

    /// A micro-batch the out-of-memory policy reduced applies, unless the spec's is smaller.
    #[test]
    fn the_effective_micro_batch_applies() {
        let mut r = run(GPU_SPEC);
        let spec = validate(&r, 1).unwrap();
        assert_eq!((spec.batch.micro_batch, spec.batch.grad_accum), (8, 4));
        r.status = Some(crds::TrainingRunStatus {
            effective: Some(crds::types::EffectiveSettings { micro_batch: Some(2), rollbacks: Vec::new() }),
            ..Default::default()
        });
        let cfg = validate(&r, 2).unwrap();
        assert_eq!((cfg.batch.micro_batch, cfg.batch.grad_accum, cfg.batch.global_sequences), (2, 16, 256));
        let mut smaller = run(&GPU_SPEC.replace("microBatch: 8", "microBatch: 1"));
        smaller.status = r.status.clone();
        assert_eq!(validate(&smaller, 2).unwrap().batch.micro_batch, 1);
    }

    /// The rollbacks in status are the config's: the ConfigMap carries them to the trainer.
    #[test]
    fn the_rollbacks_apply() {
        let mut r = run(GPU_SPEC);
        assert!(validate(&r, 1).unwrap().rollbacks.is_empty());
        let rollback = crds::types::Rollback {
            step: 13,
            attempt: 1,
            skip_from: 1664,
            skip_to: 1792,
            lr_factor: 0.5,
            lr_until_step: 113,
            from_step: None,
        };
        r.status = Some(crds::TrainingRunStatus {
            effective: Some(crds::types::EffectiveSettings { micro_batch: None, rollbacks: vec![rollback.clone()] }),
            ..Default::default()
        });
        let cfg = validate(&r, 2).unwrap();
        assert_eq!(cfg.rollbacks, [rollback]);
        assert_eq!(cfg.batch.micro_batch, 8, "no micro-batch was reduced");
    }

    #[test]
    fn errors_name_the_field() {
        let err = validate(&run(&GPU_SPEC.replace("microBatch: 8", "microBatch: 7")), 1).unwrap_err();
        assert!(err.names("spec.batch.globalTokens"), "{err}");
        let mut r = run(GPU_SPEC);
        r.metadata.namespace = None;
        assert!(validate(&r, 1).unwrap_err().names("metadata.namespace"));
    }
}
