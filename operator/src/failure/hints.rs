//! The hint each failure reason's message ends with: what to change before a new run.

use crds::RunConfig;
use crds::contract::FailureReason;

/// What to do about a run that failed for `reason`, given its configuration.
pub(super) fn hint(reason: FailureReason, cfg: &RunConfig) -> String {
    match reason {
        FailureReason::OutOfMemory => {
            let (recomputed, blocks) = (cfg.recomputed_blocks(), cfg.model.n_layer);
            let more = if !cfg.gradient_checkpointing {
                " or set spec.gradientCheckpointing: true".to_string()
            } else if recomputed < blocks {
                format!(" or raise spec.checkpointedBlocks (now {recomputed} of {blocks})")
            } else {
                String::new()
            };
            format!("lower spec.batch.microBatch (now {}){more}", cfg.batch.micro_batch)
        }
        FailureReason::NaNLoss => {
            let rollback = if cfg.failure.on_nan == crds::types::OnNaN::Fail {
                ", or set spec.failurePolicy.onNaN: rollback to restart from it past this step's samples"
            } else {
                ""
            };
            format!(
                "lower spec.optimizer.lr or raise warmupTokens; the last checkpoint is before the divergence{rollback}"
            )
        }
        FailureReason::InvalidConfig => "fix the spec and create a new run".into(),
        FailureReason::DataError => "check the data sources in spec.data and their credentials".into(),
        FailureReason::CollectiveTimeout => {
            "a peer died or the network failed; restarting from the last checkpoint".into()
        }
        FailureReason::StorageFull => {
            let c = &cfg.checkpoint;
            let best = if c.keep_best > 0 { format!(" or keepBest (now {})", c.keep_best) } else { String::new() };
            format!(
                "a restart would fill it again: free space on it, raise spec.checkpoint.size (when its storage \
                 class allows expansion) or lower spec.checkpoint.keepLast (now {}){best}, then recreate the run",
                c.keep_last
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};

    #[test]
    fn the_out_of_memory_hint_names_the_next_memory_knob() {
        let mut cfg = crds::resolve(&run(GPU_SPEC)).unwrap();
        let blocks = cfg.model.n_layer;
        cfg.gradient_checkpointing = false;
        assert!(hint(FailureReason::OutOfMemory, &cfg).ends_with(" or set spec.gradientCheckpointing: true"));
        cfg.gradient_checkpointing = true;
        cfg.checkpointed_blocks = Some(2);
        let h = hint(FailureReason::OutOfMemory, &cfg);
        assert!(h.ends_with(&format!(" or raise spec.checkpointedBlocks (now 2 of {blocks})")), "{h}");
        cfg.checkpointed_blocks = None;
        let h = hint(FailureReason::OutOfMemory, &cfg);
        assert!(h.starts_with("lower spec.batch.microBatch (now ") && !h.contains(" or "), "{h}");
    }
}
