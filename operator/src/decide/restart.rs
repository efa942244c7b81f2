//! A failed attempt restarts the gang, pure: from the last checkpoint as the next
//! attempt, until `failurePolicy.maxRestarts` is spent.

use crds::contract::RunReason;
use crds::types::RunPhase;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::context::{Ctx, Draft};
use super::outcome::Outcome;

/// Why the current attempt failed.
pub(super) struct Failure<'a> {
    pub(super) reason: &'a str,
    pub(super) message: &'a str,
    /// Whether the restart counts toward `maxRestarts` (a disruption does not).
    pub(super) counts: bool,
}

/// The next attempt, or Failed/MaxRestartsExceeded when a counted restart is left.
pub(super) fn restart(ctx: &Ctx, draft: &mut Draft, f: Failure) -> Outcome {
    let max = ctx.cfg.failure.max_restarts;
    let Failure { reason, message, counts } = f;
    if counts && draft.new.restarts >= max {
        draft.new.completion_time = Some(Time(ctx.now));
        return Outcome::new(
            RunPhase::Failed,
            RunReason::MaxRestartsExceeded,
            format!(
                "{reason}: {message}; no restarts left after {} (failurePolicy.maxRestarts {max})",
                draft.new.restarts
            ),
        );
    }
    let failed_attempt = draft.next_attempt(&ctx.current_name) - 1;
    if counts {
        draft.new.restarts += 1;
    }
    let budget = if counts {
        format!("restart {} of {max}", draft.new.restarts)
    } else {
        "not counted toward maxRestarts".into()
    };
    Outcome::new(
        RunPhase::Restarting,
        reason,
        format!(
            "attempt {failed_attempt} failed: {message}; restarting the gang from the last checkpoint as attempt {} ({budget})",
            draft.new.attempt
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::Scene;
    use crate::resources::testing::GPU_SPEC;

    #[test]
    fn restarts_count_until_the_budget_is_spent() {
        let spec = format!("{GPU_SPEC}  failurePolicy: {{maxRestarts: 2}}\n");
        // (restarts so far, counts, phase, reason, restarts after, attempt after, the Job deleted)
        let cases = [
            (0, true, RunPhase::Restarting, "PodFailed", 1, 2, true),
            (1, true, RunPhase::Restarting, "PodFailed", 2, 2, true),
            (2, true, RunPhase::Failed, "MaxRestartsExceeded", 2, 1, false),
            (2, false, RunPhase::Restarting, "PodFailed", 2, 2, true),
        ];
        for (before, counts, phase, reason, after, attempt, deleted) in cases {
            let scene = Scene::new(&spec).status(|s| {
                s.attempt = 1;
                s.restarts = before;
            });
            let ctx = scene.ctx();
            let mut draft = Draft::start(&ctx);
            let o = restart(&ctx, &mut draft, Failure { reason: "PodFailed", message: "exit 1", counts });
            let what = format!("{before} restarts, counted: {counts}");
            assert_eq!((o.phase, o.reason.as_str()), (phase, reason), "{what}: {}", o.message);
            assert_eq!((draft.new.restarts, draft.new.attempt), (after, attempt), "{what}");
            assert_eq!(draft.d.delete_jobs == ["llm-a1"], deleted, "{what}");
            assert_eq!(draft.new.completion_time.is_some(), phase == RunPhase::Failed, "{what}");
        }
    }
}
