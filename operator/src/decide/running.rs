//! The current attempt runs, pure: the trainer's report becomes progress, metrics and
//! the straggler reading, the links timed the slow-link reading, and a step that stops advancing is a stall (reported, or a
//! restart with `onStall: restart`).

use crds::contract::RunReason;
use crds::types::{OnStall, RunPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::context::{Ctx, Draft};
use super::outcome::Outcome;
use super::restart::{Failure, restart};
use super::{slow_link, stall, straggler};
use crate::status;

pub(super) fn outcome(ctx: &Ctx, draft: &mut Draft) -> Outcome {
    let (old, cfg) = (&ctx.old, ctx.cfg);
    let was_running = old.phase == Some(RunPhase::Running) && old.attempt == ctx.attempt;
    let old_step = old.progress.as_ref().map_or(0, |p| p.step);
    if let Some(t) = &ctx.obs.trainer {
        status::apply_report(&mut draft.new, cfg, t);
        let f = cfg.failure.straggler_factor;
        draft.new.straggler = straggler::track(old.straggler.as_ref(), &t.ranks, t.step, f)
            .map(|s| straggler::placed(s, &ctx.pods, cfg.topology.procs_per_node));
    }
    if let Some(links) = &ctx.obs.links {
        draft.new.slow_link = slow_link::track(old.slow_link.as_ref(), links, cfg.failure.straggler_factor);
    }
    let p = draft.new.progress.as_mut().expect("Draft::start sets the progress");
    let last = old.progress.as_ref().and_then(|p| p.last_progress_time.as_ref()).map(|t| t.0);
    let s = stall::check(was_running, last, p.step > old_step, ctx.now, cfg.failure.stall_timeout_seconds);
    p.last_progress_time = Some(Time(s.last_progress));
    let step = p.step;
    match s.stalled_for {
        Some(secs) if cfg.failure.on_stall == OnStall::Restart => {
            let message = format!("step {step} has not advanced for {}", status::short_duration(secs));
            restart(ctx, draft, Failure { reason: RunReason::Stalled.as_str(), message: &message, counts: true })
        }
        _ => {
            draft.stall = Some(s);
            Outcome::new(
                RunPhase::Running,
                RunReason::Training,
                format!("{} pod(s) of Job {} running", cfg.topology.nodes, ctx.current_name),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::Scene;
    use crate::resources::testing::GPU_SPEC;
    use jiff::ToSpan;

    #[test]
    fn a_step_that_stops_is_a_stall() {
        use RunPhase::*;
        let report = format!("{GPU_SPEC}  failurePolicy: {{stallTimeout: 10m}}\n");
        let restarts = format!("{GPU_SPEC}  failurePolicy: {{stallTimeout: 10m, onStall: restart}}\n");
        struct Case<'a> {
            spec: &'a str,
            was_running: bool,
            /// Since the step last advanced.
            minutes: i64,
            phase: RunPhase,
            reason: &'a str,
            /// The stall reading's seconds over the timeout; `None`: no reading kept.
            stall: Option<Option<u64>>,
        }
        let case = |spec, was_running, minutes, phase, reason, stall| Case {
            spec,
            was_running,
            minutes,
            phase,
            reason,
            stall,
        };
        let cases = [
            case(&report, false, 60, Running, "Training", Some(None)),
            case(&report, true, 5, Running, "Training", Some(None)),
            case(&report, true, 10, Running, "Training", Some(None)),
            case(&report, true, 11, Running, "Training", Some(Some(660))),
            case(&restarts, true, 11, Restarting, "Stalled", None),
        ];
        for Case { spec, was_running, minutes, phase, reason, stall } in cases {
            let scene = Scene::new(spec).job(1);
            let since = scene.now - minutes.minutes();
            let scene = scene.status(|s| {
                s.attempt = 1;
                s.phase = Some(if was_running { Running } else { Pending });
                s.progress.get_or_insert_default().last_progress_time = Some(Time(since));
            });
            let ctx = scene.ctx();
            let mut draft = Draft::start(&ctx);
            let o = outcome(&ctx, &mut draft);
            let what = format!("running before: {was_running}, {minutes} min");
            assert_eq!((o.phase, o.reason.as_str()), (phase, reason), "{what}: {}", o.message);
            assert_eq!(draft.stall.map(|s| s.stalled_for), stall, "{what}");
        }
    }
}
