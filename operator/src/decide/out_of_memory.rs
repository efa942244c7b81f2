//! `failurePolicy.onOutOfMemory`, pure: a trainer out of GPU memory fails the run, or
//! restarts it at a smaller micro-batch.

use crds::contract::{FailureReason, RunReason};
use crds::types::{OnOutOfMemory, RunPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::context::{Ctx, Draft};
use super::outcome::Outcome;

/// A trainer ran out of GPU memory: with `onOutOfMemory: reduceMicroBatch` and a
/// micro-batch left to reduce, a restart (not counted) at the reduced one, recorded in
/// `status.effective`; otherwise the run fails.
pub(super) fn out_of_memory(ctx: &Ctx, draft: &mut Draft, message: &str) -> Outcome {
    let cfg = ctx.cfg;
    let reduce = cfg.failure.on_out_of_memory == OnOutOfMemory::ReduceMicroBatch && cfg.grpo.is_none();
    let reduced = cfg.reduced_micro_batch().and_then(|m| cfg.with_micro_batch(m).ok());
    match reduced.filter(|_| reduce) {
        Some(smaller) => {
            let (was, now_micro) = (cfg.batch.micro_batch, smaller.batch.micro_batch);
            draft.new.effective.get_or_insert_default().micro_batch = Some(now_micro);
            draft.next_attempt(&ctx.current_name);
            Outcome::new(
                RunPhase::Restarting,
                RunReason::MicroBatchReduced,
                format!(
                    "{message}; restarting the gang from the last checkpoint as attempt {} with micro-batch {now_micro} \
                     (was {was}; accumulation {} → {}, the global batch unchanged), not counted toward maxRestarts \
                     (failurePolicy.onOutOfMemory: reduceMicroBatch)",
                    draft.new.attempt, cfg.batch.grad_accum, smaller.batch.grad_accum
                ),
            )
        }
        None => {
            draft.new.completion_time = Some(Time(ctx.now));
            let spent = if reduce { "; the micro-batch is 1, nothing is left to reduce" } else { "" };
            Outcome::new(RunPhase::Failed, FailureReason::OutOfMemory.as_str(), format!("{message}{spent}"))
        }
    }
}
