//! `failurePolicy.onNaN`, pure: a non-finite step fails the run (NaNLoss), or rolls it
//! back to the newest checkpoint before that step as a new attempt not counted against
//! maxRestarts, never training on the step's samples again and at a lowered learning
//! rate for a while; and the RolledBack condition that stays once a run has rolled back.

use crds::contract::{FailureReason, RunReason};
use crds::types::{RollbackSkip, RunPhase, TrainingRunStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::context::{Ctx, Draft};
use super::outcome::Outcome;
use crate::status::{Cond, ROLLED_BACK};
use crds::rollback::NonFinite;

/// A trainer's step was not finite: a rollback recorded in `status.effective.rollbacks`
/// and a new attempt, or the run fails as NaNLoss.
pub(super) fn non_finite(ctx: &Ctx, draft: &mut Draft, message: &str, at: &NonFinite) -> Outcome {
    let (cfg, new) = (ctx.cfg, &mut draft.new);
    let done = new.effective.as_ref().map_or(&[][..], |e| &e.rollbacks[..]);
    let trained = new.progress.as_ref().map_or(0, |p| p.step);
    match cfg.rollback_plan(done, new.attempt, *at, trained) {
        Ok(r) => {
            let n = done.len() + 1;
            let skipped = match (at.samples, cfg.failure.rollback_skip) {
                (None, _) => "its samples are unknown (its pods are gone), so none are skipped".to_string(),
                (Some(_), RollbackSkip::FailingStep) => {
                    format!("never training on samples {}..{} (that step's global batch) again", r.skip_from, r.skip_to)
                }
                (Some(_), RollbackSkip::SinceCheckpoint) => format!(
                    "never training on samples {}..{} (every batch since the checkpoint) again",
                    r.skip_from, r.skip_to
                ),
            };
            let outcome_message = format!(
                "{message}; rolling back ({n} of {}, failurePolicy.onNaN: rollback): the gang restarts as attempt {} \
                 from the newest checkpoint before step {}, {skipped}, at {}× the learning rate through step {}; not \
                 counted toward maxRestarts",
                cfg.failure.max_rollbacks,
                new.attempt + 1,
                r.step,
                r.lr_factor,
                r.lr_until_step
            );
            new.effective.get_or_insert_default().rollbacks.push(r);
            draft.next_attempt(&ctx.current_name);
            Outcome::new(RunPhase::Restarting, RunReason::NaNRollback, outcome_message)
        }
        Err(why) => {
            new.completion_time = Some(Time(ctx.now));
            Outcome::new(RunPhase::Failed, FailureReason::NaNLoss.as_str(), format!("{message}{why}"))
        }
    }
}

/// RolledBack: True from a run's first rollback on, listing them.
pub(super) fn rolled_back(new: &TrainingRunStatus, max_rollbacks: u32) -> Cond {
    let done = new.effective.as_ref().map_or(&[][..], |e| &e.rollbacks[..]);
    if done.is_empty() {
        return Cond {
            type_: ROLLED_BACK,
            status: false,
            reason: RunReason::NotRolledBack.into(),
            message: String::new(),
        };
    }
    let each: Vec<String> = done
        .iter()
        .map(|r| {
            format!(
                "step {} of attempt {} (samples {}..{} skipped, {}× the learning rate through step {})",
                r.step, r.attempt, r.skip_from, r.skip_to, r.lr_factor, r.lr_until_step
            )
        })
        .collect();
    Cond {
        type_: ROLLED_BACK,
        status: true,
        reason: RunReason::NaNRollback.into(),
        message: format!("{} of {max_rollbacks} rollbacks after non-finite steps: {}", done.len(), each.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};
    use crds::RunConfig;
    use crds::contract::FailedSamples;

    fn config(policy: &str) -> RunConfig {
        let spec = format!("{GPU_SPEC}  checkpoint: {{everySteps: 100}}\n  failurePolicy:\n{policy}");
        crate::validate::validate(&run(&spec), 1).unwrap()
    }

    #[test]
    fn the_condition_lists_every_rollback() {
        let mut s = TrainingRunStatus::default();
        let c = rolled_back(&s, 2);
        assert_eq!((c.status, c.reason.as_str()), (false, "NotRolledBack"));
        let at = NonFinite { step: Some(13), samples: Some(FailedSamples { from: 96, to: 104, checkpoint: 80 }) };
        let r = config("    onNaN: rollback\n").rollback_plan(&[], 1, at, 12).unwrap();
        s.effective.get_or_insert_default().rollbacks.push(r);
        let c = rolled_back(&s, 2);
        assert_eq!((c.status, c.reason.as_str()), (true, "NaNRollback"));
        assert_eq!(
            c.message,
            "1 of 2 rollbacks after non-finite steps: step 13 of attempt 1 (samples 96..104 skipped, 0.5× the \
             learning rate through step 113)"
        );
    }
}
