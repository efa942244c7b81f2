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
///
/// A queued run's Job is Kueue's to suspend: Kueue un-suspends any suspended Job whose
/// Workload it admitted. The operator suspends a queued run by deactivating its
/// Workload (`spec.active: false`), which Kueue answers by evicting it, and resumes it
/// by activating the Workload again, which queues it.
pub(super) fn outcome(ctx: &Ctx, draft: &mut Draft, job: &Job) -> Option<Outcome> {
    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
    let ours = job.annotations().contains_key(SUSPENDED_BY_OPERATOR);
    let name = &ctx.current_name;
    let queued = ctx.run.spec.queue_name.is_some();
    let workload = ctx.obs.workload.as_ref();
    if ctx.run.spec.suspend {
        match workload {
            Some(w) if queued && w.active => draft.d.workload_active = Some(false),
            _ if !queued && !suspended => draft.d.suspend_job = Some(true),
            _ => {}
        }
        return Some(Outcome::new(
            RunPhase::Suspended,
            RunReason::Suspended,
            "suspended by spec.suspend; resuming continues from the last checkpoint",
        ));
    }
    if let Some(w) = workload.filter(|w| queued && !w.active && w.deactivated_by_operator) {
        draft.d.workload_active = Some(true);
        return Some(Outcome::new(
            RunPhase::Pending,
            RunReason::Resuming,
            format!("activating Workload {} again: Kueue admits Job {name} from the last checkpoint", w.name),
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
    use crate::resources::QueuedWorkload;
    use crate::resources::testing::GPU_SPEC;

    #[test]
    fn who_suspended_decides_who_resumes() {
        use RunPhase::*;
        let suspend = format!("{GPU_SPEC}  suspend: true\n");
        let queued = format!("{GPU_SPEC}  queueName: team\n");
        let queued_suspended = format!("{queued}  suspend: true\n");
        /// The Kueue Workload seen: active, and deactivated by the operator.
        #[derive(Clone, Copy)]
        struct Wl {
            active: bool,
            ours: bool,
        }
        struct Case<'a> {
            spec: &'a str,
            /// The Job is suspended, and by the operator.
            suspended: bool,
            ours: bool,
            workload: Option<Wl>,
            /// Phase and reason; `None`: the Job runs on.
            expect: Option<(RunPhase, &'a str)>,
            /// What the Job's `spec.suspend` is set to.
            set: Option<bool>,
            /// What the Workload's `spec.active` is set to.
            activate: Option<bool>,
        }
        let case = |spec, suspended, ours, expect, set| Case {
            spec,
            suspended,
            ours,
            workload: None,
            expect,
            set,
            activate: None,
        };
        let active = Some(Wl { active: true, ours: false });
        let deactivated = Some(Wl { active: false, ours: true });
        let by_someone_else = Some(Wl { active: false, ours: false });
        let cases = [
            case(GPU_SPEC, false, false, None, None),
            case(&suspend, false, false, Some((Suspended, "Suspended")), Some(true)),
            case(&suspend, true, true, Some((Suspended, "Suspended")), None),
            case(GPU_SPEC, true, true, Some((Pending, "Resuming")), Some(false)),
            case(GPU_SPEC, true, false, Some((Suspended, "JobSuspended")), None),
            case(&queued, true, false, Some((Pending, "WaitingForQueue")), None),
            case(&queued, true, true, Some((Pending, "Resuming")), Some(false)),
            // Queued: suspended through the Workload, never the Job, which Kueue owns.
            Case { workload: active, ..case(&queued, false, false, None, None) },
            Case {
                workload: active,
                activate: Some(false),
                ..case(&queued_suspended, false, false, Some((Suspended, "Suspended")), None)
            },
            Case {
                workload: deactivated,
                ..case(&queued_suspended, true, false, Some((Suspended, "Suspended")), None)
            },
            Case { workload: None, ..case(&queued_suspended, false, false, Some((Suspended, "Suspended")), None) },
            Case {
                workload: deactivated,
                activate: Some(true),
                ..case(&queued, true, false, Some((Pending, "Resuming")), None)
            },
            Case { workload: by_someone_else, ..case(&queued, true, false, Some((Pending, "WaitingForQueue")), None) },
        ];
        for Case { spec, suspended, ours, workload, expect, set, activate } in cases {
            let mut scene = Scene::new(spec).status(|s| s.attempt = 1).job(1);
            let job = scene.obs.jobs.last_mut().unwrap();
            job.spec.get_or_insert_default().suspend = Some(suspended);
            if ours {
                job.metadata.annotations = Some([(SUSPENDED_BY_OPERATOR.to_string(), "true".to_string())].into());
            }
            scene.obs.workload = workload.map(|w| QueuedWorkload {
                name: "job-llm-a1".into(),
                active: w.active,
                deactivated_by_operator: w.ours,
            });
            let ctx = scene.ctx();
            let mut draft = Draft::start(&ctx);
            let o = outcome(&ctx, &mut draft, ctx.current.unwrap());
            let what = format!(
                "suspend in spec: {}, Job suspended {suspended} (ours {ours}), Workload {:?}",
                ctx.run.spec.suspend,
                workload.map(|w| (w.active, w.ours))
            );
            assert_eq!(o.map(|o| (o.phase, o.reason)), expect.map(|(p, r)| (p, r.to_string())), "{what}");
            assert_eq!(draft.d.suspend_job, set, "{what}");
            assert_eq!(draft.d.workload_active, activate, "{what}");
        }
    }
}
