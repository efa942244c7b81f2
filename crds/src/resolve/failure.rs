//! `spec.failurePolicy`.

use super::errors::Errors;
use crate::config::*;
use crate::types::*;

/// `checkpoint_every` (`checkpoint.everySteps`) is `rollbackLrSteps`'s default.
pub(super) fn resolve_failure(e: &mut Errors, f: &FailurePolicy, checkpoint_every: u32) -> Option<ResolvedFailure> {
    let stall = match humantime::parse_duration(f.stall_timeout.trim()) {
        Ok(d) if d.as_secs() >= 60 => Some(d.as_secs()),
        Ok(_) => {
            e.add("spec.failurePolicy.stallTimeout", format!("{:?} is shorter than 1m", f.stall_timeout));
            None
        }
        Err(err) => {
            e.add(
                "spec.failurePolicy.stallTimeout",
                format!("{:?} is not a duration like \"30m\" or \"1h30m\": {err}", f.stall_timeout),
            );
            None
        }
    };
    let factor = f.rollback_lr_factor;
    if !(factor > 0.0 && factor <= 1.0) {
        e.add("spec.failurePolicy.rollbackLrFactor", format!("{factor} is not in (0, 1]"));
    }
    if f.straggler_factor.is_nan() || f.straggler_factor <= 1.0 {
        e.add("spec.failurePolicy.stragglerFactor", format!("{} is not above 1", f.straggler_factor));
    }
    if f.max_rollbacks as usize > crate::types::bounds::ROLLBACKS {
        e.add(
            "spec.failurePolicy.maxRollbacks",
            format!(
                "{} is more than the {} rollbacks status can record",
                f.max_rollbacks,
                crate::types::bounds::ROLLBACKS
            ),
        );
    }
    if f.straggler_readings == 0 {
        e.add("spec.failurePolicy.stragglerReadings", "must be at least 1");
    }
    Some(ResolvedFailure {
        max_restarts: f.max_restarts,
        stall_timeout_seconds: stall?,
        on_stall: f.on_stall,
        on_out_of_memory: f.on_out_of_memory,
        on_nan: f.on_nan,
        max_rollbacks: f.max_rollbacks,
        rollback_lr_factor: factor,
        rollback_lr_steps: u64::from(f.rollback_lr_steps.unwrap_or(checkpoint_every)),
        rollback_skip: f.rollback_skip,
        straggler_factor: f.straggler_factor,
        straggler_readings: f.straggler_readings,
    })
}
