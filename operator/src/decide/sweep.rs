//! The children that must go, pure: Jobs of other attempts, and pods no live Job owns.

use kube::ResourceExt;

use super::context::{Ctx, Draft};

/// Records that the current attempt's Job was seen, and asks to delete every other
/// Job of the run and every pod whose Job is gone (deleted with orphan propagation,
/// such pods would hold their hostnames and GPUs forever).
pub(super) fn children(ctx: &Ctx, draft: &mut Draft) {
    if ctx.current.is_some() {
        draft.new.seen_job_attempt = Some(ctx.attempt);
    }
    let jobs = &ctx.obs.jobs;
    draft.d.delete_jobs = jobs
        .iter()
        .filter(|j| j.name_any() != ctx.current_name && j.metadata.deletion_timestamp.is_none())
        .map(|j| j.name_any())
        .collect();
    let job_uids: Vec<&str> = jobs.iter().filter_map(|j| j.metadata.uid.as_deref()).collect();
    draft.d.delete_pods = ctx
        .obs
        .pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !p.owner_references().iter().any(|o| o.kind == "Job" && job_uids.contains(&o.uid.as_str())))
        .map(|p| p.name_any())
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::{Scene, owned_by};
    use crate::failure::tests::running;
    use crate::resources::testing::GPU_SPEC;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn other_attempts_and_orphans_go() {
        struct Case {
            attempt: u32,
            /// The Jobs observed: their attempt, and whether they are being deleted.
            jobs: &'static [(u32, bool)],
            /// The pods observed: the attempt of the Job that owns each.
            pods: &'static [Option<u32>],
            delete_jobs: &'static [&'static str],
            delete_pods: &'static [&'static str],
        }
        let case =
            |attempt, jobs, pods, delete_jobs, delete_pods| Case { attempt, jobs, pods, delete_jobs, delete_pods };
        let cases = [
            case(1, &[], &[], &[], &[]),
            case(1, &[(1, false)], &[Some(1)], &[], &[]),
            case(2, &[(1, false), (2, false)], &[Some(1), Some(2)], &["llm-a1"], &[]),
            case(2, &[(1, true), (2, false)], &[Some(1)], &[], &[]),
            case(2, &[(2, false)], &[Some(1), None], &[], &["pod-0", "pod-1"]),
        ];
        for Case { attempt, jobs, pods, delete_jobs, delete_pods } in cases {
            let mut scene = Scene::new(GPU_SPEC).status(|s| s.attempt = attempt);
            for &(a, deleting) in jobs {
                scene = scene.job(a);
                if deleting {
                    let j = scene.obs.jobs.last_mut().unwrap();
                    j.metadata.deletion_timestamp = Some(Time(scene.now));
                }
            }
            for (i, owner) in pods.iter().enumerate() {
                let mut p = running(i as u32);
                p.metadata.name = Some(format!("pod-{i}"));
                scene.obs.pods.push(owned_by(p, owner.map(|a| format!("uid-a{a}"))));
            }
            let ctx = scene.ctx();
            let mut draft = super::super::context::Draft::start(&ctx);
            children(&ctx, &mut draft);
            assert_eq!(draft.d.delete_jobs, delete_jobs, "attempt {attempt}, jobs {jobs:?}");
            assert_eq!(draft.d.delete_pods, delete_pods, "attempt {attempt}, pods {pods:?}");
            let seen = jobs.iter().any(|&(a, _)| a == attempt);
            assert_eq!(draft.new.seen_job_attempt, seen.then_some(attempt));
        }
    }
}
