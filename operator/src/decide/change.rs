//! A change of the spec, pure: the Accepted condition it leaves, more tokens for a
//! finished run, and a change that restarts the gang.

use crds::contract::RunReason;
use crds::types::RunPhase;

use super::context::{Ctx, Draft};
use super::outcome::{Decision, Note, Outcome};
use crate::change::Change;
use crate::status::{self, Cond};

/// Accepted: True with what the run trains, or False while a change is refused (an
/// event when the refusal is new). A change the operator applies in place is told.
pub(super) fn accepted(ctx: &Ctx, d: &mut Decision) -> Cond {
    let cfg = ctx.cfg;
    let accepted = Cond {
        type_: "Accepted",
        status: true,
        reason: RunReason::Accepted.into(),
        message: format!(
            "{} on {}: {} steps of {} tokens",
            cfg.model.preset, cfg.topology.display, cfg.schedule.total_steps, cfg.batch.tokens_per_step
        ),
    };
    match ctx.change {
        Change::Refused { message } => {
            let was = status::condition(&ctx.old, "Accepted");
            if was.is_none_or(|c| c.reason != RunReason::ChangeRefused.as_str() || c.message != *message) {
                d.notes.push(Note { warning: true, reason: RunReason::ChangeRefused.into(), message: message.clone() });
            }
            Cond { type_: "Accepted", status: false, reason: RunReason::ChangeRefused.into(), message: message.clone() }
        }
        Change::Operator { changes } if !status::is_terminal(&ctx.old) => {
            let message = format!("{}; nothing restarts", changes.join(", "));
            d.notes.push(Note { warning: false, reason: RunReason::Reconfigured.into(), message });
            accepted
        }
        Change::Unchanged | Change::Operator { .. } | Change::Restart { .. } => accepted,
    }
}

/// More tokens for a Succeeded run: it trains on from its final checkpoint as a new
/// attempt, not counted toward maxRestarts.
pub(super) fn train_on(ctx: &Ctx, draft: &mut Draft) -> Option<Outcome> {
    let Change::Restart { reason, summary, .. } = ctx.change else { return None };
    let trained_steps = ctx.old.progress.as_ref().map_or(0, |p| p.step);
    if ctx.old.phase != Some(RunPhase::Succeeded) || ctx.cfg.schedule.total_steps <= trained_steps {
        return None;
    }
    draft.new.completion_time = None;
    draft.next_attempt(&ctx.current_name);
    Some(Outcome::new(
        RunPhase::Restarting,
        *reason,
        format!(
            "{summary}: training on from the final checkpoint (step {trained_steps} of {}) as attempt {} (not counted \
             toward maxRestarts)",
            ctx.cfg.schedule.total_steps, draft.new.attempt
        ),
    ))
}

/// A change that needs new pods, while the current attempt's Job exists: the gang
/// restarts from the last checkpoint, not counted toward maxRestarts.
pub(super) fn restart_gang(ctx: &Ctx, draft: &mut Draft) -> Option<Outcome> {
    let Change::Restart { reason, summary, .. } = ctx.change else { return None };
    ctx.current?;
    draft.next_attempt(&ctx.current_name);
    Some(Outcome::new(
        RunPhase::Restarting,
        *reason,
        format!(
            "{summary}: restarting the gang from the last checkpoint as attempt {} (not counted toward maxRestarts)",
            draft.new.attempt
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::Scene;
    use crate::resources::testing::GPU_SPEC;
    use crds::types::RunPhase::{Running, Succeeded};

    fn restart() -> Change {
        Change::Restart {
            reason: RunReason::Resized,
            summary: "spec.topology.nodes 2 → 1".into(),
            changes: vec!["spec.topology.nodes".into()],
        }
    }

    #[test]
    fn accepted_follows_the_change() {
        let refused = || Change::Refused { message: "spec.model cannot change".into() };
        let operator = || Change::Operator { changes: vec!["spec.checkpoint.everySteps".into()] };
        struct Case {
            change: Change,
            phase: Option<RunPhase>,
            /// The reason of the Accepted condition before (empty: none).
            was: &'static str,
            status: bool,
            reason: &'static str,
            events: &'static [&'static str],
        }
        let case = |change, phase, was, status, reason, events| Case { change, phase, was, status, reason, events };
        let cases = [
            case(Change::Unchanged, None, "", true, "Accepted", &[]),
            case(restart(), Some(Running), "", true, "Accepted", &[]),
            case(refused(), Some(Running), "", false, "ChangeRefused", &["ChangeRefused"]),
            case(refused(), Some(Running), "ChangeRefused", false, "ChangeRefused", &[]),
            case(operator(), Some(Running), "", true, "Accepted", &["Reconfigured"]),
            case(operator(), Some(Succeeded), "", true, "Accepted", &[]),
        ];
        for Case { change, phase, was, status, reason, events } in cases {
            let scene = Scene::new(GPU_SPEC).change(change.clone()).status(|s| {
                s.phase = phase;
                if !was.is_empty() {
                    s.conditions.push(crate::decide::testing::condition(
                        "Accepted",
                        "False",
                        was,
                        "spec.model cannot change",
                    ));
                }
            });
            let ctx = scene.ctx();
            let mut d = Decision::default();
            let c = accepted(&ctx, &mut d);
            assert_eq!((c.status, c.reason.as_str()), (status, reason), "{change:?} from {phase:?}/{was}");
            let told: Vec<&str> = d.notes.iter().map(|n| n.reason.as_str()).collect();
            assert_eq!(told, events, "{change:?} from {phase:?}/{was}");
        }
    }

    #[test]
    fn more_tokens_train_a_finished_run_on() {
        // (change, phase, steps trained, a new attempt)
        let cases = [
            (restart(), Some(Succeeded), 100, true),
            (restart(), Some(Succeeded), 244, false),
            (restart(), Some(Running), 100, false),
            (Change::Unchanged, Some(Succeeded), 100, false),
        ];
        for (change, phase, step, trains_on) in cases {
            let scene = Scene::new(GPU_SPEC).change(change.clone()).status(|s| {
                s.phase = phase;
                s.attempt = 1;
                s.progress.get_or_insert_default().step = step;
            });
            let ctx = scene.ctx();
            let mut draft = Draft::start(&ctx);
            let o = train_on(&ctx, &mut draft);
            assert_eq!(o.is_some(), trains_on, "{change:?} {phase:?} at step {step}");
            if let Some(o) = o {
                assert_eq!(
                    (o.phase, draft.new.attempt, &draft.d.delete_jobs[..]),
                    (RunPhase::Restarting, 2, &["llm-a1".to_string()][..])
                );
                assert!(o.message.contains("(step 100 of 244)"), "{}", o.message);
            }
        }
    }

    #[test]
    fn a_restarting_change_needs_the_current_job() {
        for (with_job, restarts) in [(true, true), (false, false)] {
            let scene = Scene::new(GPU_SPEC).change(restart()).status(|s| s.attempt = 1);
            let scene = if with_job { scene.job(1) } else { scene };
            let ctx = scene.ctx();
            let mut draft = Draft::start(&ctx);
            assert_eq!(restart_gang(&ctx, &mut draft).is_some(), restarts, "job observed: {with_job}");
        }
    }
}
