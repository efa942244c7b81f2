//! A suspended or suspending Job, pure: `spec.suspend` suspends it, the operator
//! resumes what it suspended, and never resumes what Kueue or a person suspended.

use crds::contract::RunReason;
use crds::types::RunPhase;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use super::context::{Ctx, Draft};
use super::outcome::Outcome;
use crate::resources::SUSPENDED_BY_OPERATOR;

/// The outcome when the spec or the Job is suspended; `None` when neither is.
pub(super) fn outcome(ctx: &Ctx, draft: &mut Draft, job: &Job) -> Option<Outcome> {
    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
    let ours = job.annotations().contains_key(SUSPENDED_BY_OPERATOR);
    let name = &ctx.current_name;
    if ctx.run.spec.suspend {
        if !suspended {
            draft.d.suspend_job = Some(true);
        }
        return Some(Outcome::new(
            RunPhase::Suspended,
            RunReason::Suspended,
            "suspended by spec.suspend; resuming continues from the last checkpoint",
        ));
    }
    if !suspended {
        return None;
    }
    if ours {
        draft.d.suspend_job = Some(false);
        return Some(Outcome::new(
            RunPhase::Pending,
            RunReason::Resuming,
            format!("resuming Job {name} from the last checkpoint"),
        ));
    }
    Some(match &ctx.run.spec.queue_name {
        Some(q) => Outcome::new(
            RunPhase::Pending,
            RunReason::WaitingForQueue,
            format!("Job {name} is suspended until Kueue admits it from LocalQueue {q}"),
        ),
        None => Outcome::new(
            RunPhase::Suspended,
            RunReason::JobSuspended,
            format!("Job {name} was suspended outside the operator"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::Scene;
    use crate::resources::testing::GPU_SPEC;

    #[test]
    fn who_suspended_decides_who_resumes() {
        use RunPhase::*;
        let suspend = format!("{GPU_SPEC}  suspend: true\n");
        let queued = format!("{GPU_SPEC}  queueName: team\n");
        struct Case<'a> {
            spec: &'a str,
            /// The Job is suspended, and by the operator.
            suspended: bool,
            ours: bool,
            /// Phase and reason; `None`: the Job runs on.
            expect: Option<(RunPhase, &'a str)>,
            /// What the Job's `spec.suspend` is set to.
            set: Option<bool>,
        }
        let case = |spec, suspended, ours, expect, set| Case { spec, suspended, ours, expect, set };
        let cases = [
            case(GPU_SPEC, false, false, None, None),
            case(&suspend, false, false, Some((Suspended, "Suspended")), Some(true)),
            case(&suspend, true, true, Some((Suspended, "Suspended")), None),
            case(GPU_SPEC, true, true, Some((Pending, "Resuming")), Some(false)),
            case(GPU_SPEC, true, false, Some((Suspended, "JobSuspended")), None),
            case(&queued, true, false, Some((Pending, "WaitingForQueue")), None),
            case(&queued, true, true, Some((Pending, "Resuming")), Some(false)),
        ];
        for Case { spec, suspended, ours, expect, set } in cases {
            let mut scene = Scene::new(spec).status(|s| s.attempt = 1).job(1);
            let job = scene.obs.jobs.last_mut().unwrap();
            job.spec.get_or_insert_default().suspend = Some(suspended);
            if ours {
                job.metadata.annotations = Some([(SUSPENDED_BY_OPERATOR.to_string(), "true".to_string())].into());
            }
            let ctx = scene.ctx();
            let mut draft = Draft::start(&ctx);
            let o = outcome(&ctx, &mut draft, ctx.current.unwrap());
            let what = format!("suspend in spec: {}, Job suspended {suspended} (ours {ours})", ctx.run.spec.suspend);
            assert_eq!(o.map(|o| (o.phase, o.reason)), expect.map(|(p, r)| (p, r.to_string())), "{what}");
            assert_eq!(draft.d.suspend_job, set, "{what}");
        }
    }
}
