//! Step 1 of the pipeline, pure: the spec resolved through the API crate, exactly
//! as `trainer run` resolves it, with the current attempt filled in.

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

    #[test]
    fn errors_name_the_field() {
        let err = validate(&run(&GPU_SPEC.replace("microBatch: 8", "microBatch: 7")), 1).unwrap_err();
        assert!(err.names("spec.batch.globalTokens"), "{err}");
        let mut r = run(GPU_SPEC);
        r.metadata.namespace = None;
        assert!(validate(&r, 1).unwrap_err().names("metadata.namespace"));
    }
}
