//! The current attempt has no Job, pure: it was deleted under the run, it waits for
//! the pods of earlier attempts or for the run it starts from, or it is created.

use crds::config::ResolvedInit;
use crds::contract::RunReason;
use crds::types::RunPhase;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::context::{Ctx, Draft};
use super::outcome::Outcome;
use super::restart::{Failure, restart};
use crate::observed::InitRun;

pub(super) fn outcome(ctx: &Ctx, draft: &mut Draft) -> Outcome {
    if ctx.old.seen_job_attempt == Some(ctx.attempt) {
        let message = format!(
            "Job {} was deleted before it finished (by hand, or by spec.ttlSecondsAfterFinished)",
            ctx.current_name
        );
        return restart(
            ctx,
            draft,
            Failure { reason: RunReason::JobDeleted.as_str(), message: &message, counts: true },
        );
    }
    if blocked(ctx) {
        let (stale, attempt) = (ctx.stale_pods, ctx.attempt);
        return ctx.still_restarting(format!(
            "waiting for {stale} pod(s) of earlier attempts to terminate before attempt {attempt} starts"
        ));
    }
    waiting_for_init_run(ctx).unwrap_or_else(|| create(ctx, draft))
}

/// Whether the current attempt's Job must wait: pods of earlier attempts still hold
/// the hostnames and GPUs.
fn blocked(ctx: &Ctx) -> bool {
    ctx.stale_pods > 0 || ctx.obs.jobs.iter().any(|j| j.name_any() != ctx.current_name)
}

/// `initFrom.trainingRun` names a run that has not succeeded (yet).
fn waiting_for_init_run(ctx: &Ctx) -> Option<Outcome> {
    let (Some(ResolvedInit::TrainingRun { name }), Some(state)) = (&ctx.cfg.init_from, &ctx.obs.init_run) else {
        return None;
    };
    let now_is = match state {
        InitRun::Phase(Some(RunPhase::Succeeded)) => return None,
        InitRun::Missing => "does not exist".to_string(),
        InitRun::Phase(Some(p)) => format!("is {p:?}"),
        InitRun::Phase(None) => "has not started".to_string(),
    };
    Some(Outcome::new(
        RunPhase::Waiting,
        RunReason::WaitingForInitRun,
        format!("waiting for TrainingRun {name} to succeed; it {now_is}"),
    ))
}

/// Creates the Job: suspended by the spec, held by Kueue, a restart's new attempt, or
/// the first.
fn create(ctx: &Ctx, draft: &mut Draft) -> Outcome {
    if ctx.run.spec.suspend && ctx.run.spec.queue_name.is_some() {
        // Kueue would admit a queued Job however it is suspended (see `suspension`):
        // a queued run suspended from the start gets its Job when it is resumed.
        return Outcome::new(
            RunPhase::Suspended,
            RunReason::Suspended,
            "suspended by spec.suspend; its Job is created for Kueue to admit when it is resumed",
        );
    }
    draft.d.create_job = true;
    if draft.new.start_time.is_none() {
        draft.new.start_time = Some(Time(ctx.now));
    }
    let (job, attempt) = (&ctx.current_name, ctx.attempt);
    if ctx.run.spec.suspend {
        Outcome::new(RunPhase::Suspended, RunReason::Suspended, "suspended by spec.suspend")
    } else if let Some(q) = &ctx.run.spec.queue_name {
        Outcome::new(
            RunPhase::Pending,
            RunReason::WaitingForQueue,
            format!("Job {job} waits for Kueue to admit it from LocalQueue {q}"),
        )
    } else if attempt > 1 {
        ctx.still_restarting(format!("created Job {job} for attempt {attempt}"))
    } else {
        Outcome::new(RunPhase::Pending, RunReason::JobCreated, format!("created Job {job}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::{Scene, restarting_after_pod_failed};
    use crate::failure::tests::running;
    use crate::resources::testing::{GPU_SPEC, GRPO_SPEC};

    /// What a scene came to: (phase, reason, the Job created, the attempt after).
    fn decided(scene: &Scene) -> (RunPhase, String, bool, u32) {
        let ctx = scene.ctx();
        let mut draft = Draft::start(&ctx);
        let o = outcome(&ctx, &mut draft);
        (o.phase, o.reason, draft.d.create_job, draft.new.attempt)
    }

    #[test]
    fn each_situation_without_a_job() {
        use RunPhase::*;
        let stale_pod = |mut scene: Scene| {
            let mut p = running(0);
            p.metadata.labels = Some([(crate::resources::ATTEMPT_LABEL.to_string(), "1".to_string())].into());
            scene.obs.pods.push(p);
            scene
        };
        // Evicted from an unreachable node, never confirmed gone.
        let left_on_lost_node = |mut scene: Scene| {
            let mut p = running(1);
            p.metadata.labels = Some([(crate::resources::ATTEMPT_LABEL.to_string(), "1".to_string())].into());
            p.metadata.deletion_timestamp = Some(Time(scene.now));
            let evicted =
                serde_json::json!({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"});
            p.status
                .get_or_insert_with(Default::default)
                .conditions
                .get_or_insert_with(Vec::new)
                .push(serde_json::from_value(evicted).expect("a pod condition"));
            scene.obs.pods.push(p);
            scene
        };
        /// What is observed, and what it comes to: the phase and reason, whether the
        /// Job is created, the attempt after.
        struct Case {
            what: &'static str,
            scene: Scene,
            expect: (RunPhase, &'static str, bool, u32),
        }
        let case = |what, scene, phase, reason, created, attempt| Case {
            what,
            scene,
            expect: (phase, reason, created, attempt),
        };
        let cases = [
            case("a new run", Scene::new(GPU_SPEC), Pending, "JobCreated", true, 1),
            case("spec.suspend", Scene::new(&format!("{GPU_SPEC}  suspend: true\n")), Suspended, "Suspended", true, 1),
            case("a queue", Scene::new(&format!("{GPU_SPEC}  queueName: team\n")), Pending, "WaitingForQueue", true, 1),
            case(
                "a queue, suspended",
                Scene::new(&format!("{GPU_SPEC}  queueName: team\n  suspend: true\n")),
                Suspended,
                "Suspended",
                false,
                1,
            ),
            case(
                "a restart's attempt",
                Scene::new(GPU_SPEC).status(restarting_after_pod_failed),
                Restarting,
                "PodFailed",
                true,
                2,
            ),
            case(
                "old pods",
                stale_pod(Scene::new(GPU_SPEC).status(restarting_after_pod_failed)),
                Restarting,
                "PodFailed",
                false,
                2,
            ),
            case(
                "an old pod left on a lost node",
                left_on_lost_node(Scene::new(GPU_SPEC).status(restarting_after_pod_failed)),
                Restarting,
                "PodFailed",
                true,
                2,
            ),
            case(
                "an old Job",
                Scene::new(GPU_SPEC).status(restarting_after_pod_failed).job(1),
                Restarting,
                "PodFailed",
                false,
                2,
            ),
            case(
                "its Job deleted",
                Scene::new(GPU_SPEC).status(|s| {
                    s.attempt = 1;
                    s.seen_job_attempt = Some(1);
                }),
                Restarting,
                "JobDeleted",
                false,
                2,
            ),
            case(
                "the base run running",
                Scene::new(GRPO_SPEC).init_run(InitRun::Phase(Some(Running))),
                Waiting,
                "WaitingForInitRun",
                false,
                1,
            ),
            case(
                "the base run missing",
                Scene::new(GRPO_SPEC).init_run(InitRun::Missing),
                Waiting,
                "WaitingForInitRun",
                false,
                1,
            ),
            case(
                "the base run done",
                Scene::new(GRPO_SPEC).init_run(InitRun::Phase(Some(Succeeded))),
                Pending,
                "JobCreated",
                true,
                1,
            ),
        ];
        for Case { what, scene, expect: (phase, reason, created, attempt) } in cases {
            assert_eq!(decided(&scene), (phase, reason.to_string(), created, attempt), "{what}");
        }
    }
}
