//! The current attempt's Job runs, pure: what its pods and conditions came to
//! (`failure::classify`) becomes the run's outcome, each verdict by its own policy.

use crds::RunConfig;
use crds::contract::{RunReason, TrainerStatus};
use crds::types::RunPhase;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::context::{Ctx, Draft};
use super::outcome::Outcome;
use super::restart::{Failure, restart};
use super::{out_of_memory, rollback, running};
use crate::failure::{self, Verdict};
use crate::status;

pub(super) fn outcome(ctx: &Ctx, draft: &mut Draft, job: &Job) -> Outcome {
    match failure::classify(job, &ctx.pods, ctx.cfg, ctx.now, ctx.settings) {
        Verdict::Succeeded { report } => succeeded(ctx, draft, report.as_deref()),
        Verdict::Failed { reason, message } => {
            draft.new.completion_time = Some(Time(ctx.now));
            Outcome::new(RunPhase::Failed, &reason, message)
        }
        Verdict::DeviceOutOfMemory { message } => out_of_memory::out_of_memory(ctx, draft, &message),
        Verdict::NonFinite { message, at } => rollback::non_finite(ctx, draft, &message, &at),
        Verdict::Restart { reason, message, counts } => {
            restart(ctx, draft, Failure { reason: &reason, message: &message, counts })
        }
        Verdict::AwaitingCause { message } => Outcome::new(RunPhase::Running, RunReason::Training, message),
        Verdict::Running => running::outcome(ctx, draft),
        Verdict::Pending { stuck: Some((reason, message)) } => Outcome::new(RunPhase::Pending, &reason, message),
        Verdict::Pending { stuck: None } if ctx.attempt > 1 && ctx.old.phase == Some(RunPhase::Restarting) => {
            ctx.still_restarting(format!("attempt {} is starting", ctx.attempt))
        }
        Verdict::Pending { stuck: None } => Outcome::new(
            RunPhase::Pending,
            RunReason::PodsPending,
            format!("waiting for the pods of Job {} to run", ctx.current_name),
        ),
    }
}

/// The Job completed: the trainer's last report, the progress at 100%, the final loss.
fn succeeded(ctx: &Ctx, draft: &mut Draft, report: Option<&TrainerStatus>) -> Outcome {
    let cfg: &RunConfig = ctx.cfg;
    if let Some(r) = report {
        status::apply_report(&mut draft.new, cfg, r);
    }
    status::complete_progress(&mut draft.new, cfg);
    draft.new.completion_time = Some(Time(ctx.now));
    let loss =
        draft.new.metrics.as_ref().and_then(|m| m.loss).map_or(String::new(), |l| format!("; final loss {l:.4}"));
    Outcome::new(
        RunPhase::Succeeded,
        RunReason::Completed,
        format!("trained {} tokens in {} steps{loss}", cfg.schedule.total_tokens, cfg.schedule.total_steps),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::{Scene, restarting_after_pod_failed};
    use crate::failure::tests::{exited, running};
    use crate::resources::ATTEMPT_LABEL;
    use crate::resources::testing::GPU_SPEC;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn of_attempt(mut p: Pod, attempt: u32) -> Pod {
        p.metadata.labels = Some([(ATTEMPT_LABEL.to_string(), attempt.to_string())].into());
        p
    }

    #[test]
    fn each_verdict_has_its_outcome() {
        use RunPhase::*;
        let nan = crds::contract::TerminationMessage {
            reason: crds::contract::FailureReason::NaNLoss,
            step: Some(7),
            detail: "loss=nan".into(),
            samples: None,
        }
        .to_json();
        /// A scene, the current Job's status conditions and pods, and what it comes to:
        /// the phase and reason, whether the run ended, the attempt after.
        struct Case {
            what: &'static str,
            scene: Scene,
            conditions: serde_json::Value,
            pods: Vec<Pod>,
            expect: (RunPhase, &'static str, bool, u32),
        }
        let nan_exit = crds::contract::FailureReason::NaNLoss.exit_code();
        let fresh = || Scene::new(GPU_SPEC);
        let cases = [
            Case {
                what: "complete",
                scene: fresh(),
                conditions: json!([{"type": "Complete", "status": "True"}]),
                pods: vec![],
                expect: (Succeeded, "Completed", true, 1),
            },
            Case {
                what: "no pods yet",
                scene: fresh(),
                conditions: json!([]),
                pods: vec![],
                expect: (Pending, "PodsPending", false, 1),
            },
            Case {
                what: "a restart starting",
                scene: fresh().status(restarting_after_pod_failed),
                conditions: json!([]),
                pods: vec![],
                expect: (Restarting, "PodFailed", false, 2),
            },
            Case {
                what: "running",
                scene: fresh(),
                conditions: json!([]),
                pods: vec![running(0), running(1)],
                expect: (Running, "Training", false, 1),
            },
            Case {
                what: "a NaN",
                scene: fresh(),
                conditions: json!([]),
                pods: vec![exited(0, nan_exit, "Error", &nan), running(1)],
                expect: (Failed, "NaNLoss", true, 1),
            },
        ];
        for Case { what, scene, conditions, pods, expect: (phase, reason, ended, attempt) } in cases {
            let a = scene_attempt(&scene);
            let mut scene = scene.job_with(a, conditions);
            scene.obs.pods = pods.into_iter().map(|p| of_attempt(p, a)).collect();
            let ctx = scene.ctx();
            let mut draft = Draft::start(&ctx);
            let o = outcome(&ctx, &mut draft, ctx.current.unwrap());
            assert_eq!((o.phase, o.reason.as_str()), (phase, reason), "{what}: {}", o.message);
            assert_eq!(draft.new.completion_time.is_some(), ended, "{what}");
            assert_eq!(draft.new.attempt, attempt, "{what}");
        }
    }

    fn scene_attempt(scene: &Scene) -> u32 {
        scene.run.status.as_ref().map_or(1, |s| s.attempt.max(1))
    }
}
