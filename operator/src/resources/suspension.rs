//! A live Job's suspension, as a JSON merge patch of the few fields it changes.
//!
//! A patch rather than an apply: the pod template is immutable and may predate a change
//! of the spec or of the operator's settings, and server-side apply would remove the
//! fields the operator's field manager applied before and omits now. The patch leaves
//! the rest of the Job as it is, so the operator's cache need not hold the template.

use serde_json::{Value, json};

use super::meta::{APPLIED_HASH, SUSPENDED_BY_OPERATOR};

/// Job `job`'s `spec.suspend`, and whether the operator is the one suspending it.
#[derive(Clone, Debug, PartialEq)]
pub struct Suspension {
    pub job: String,
    pub suspend: bool,
    pub by_operator: bool,
}

/// Suspending sets `spec.suspend` and the operator's mark; resuming takes the mark off
/// and un-suspends the Job, except a queued one, which goes back to Kueue suspended for
/// Kueue to admit again.
pub fn suspension(job: &str, suspend: bool, queued: bool) -> Suspension {
    Suspension { job: job.into(), suspend: suspend || queued, by_operator: suspend }
}

impl Suspension {
    /// The merge patch. It drops the applied-hash too: the Job is no longer what was
    /// last applied.
    pub fn patch(&self) -> Value {
        let mark = self.by_operator.then_some("true");
        json!({
            "metadata": {"annotations": {SUSPENDED_BY_OPERATOR: mark, APPLIED_HASH: null}},
            "spec": {"suspend": self.suspend},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};
    use crate::resources::{Inputs, job};
    use k8s_openapi::api::batch::v1::Job;

    /// The Job as the API server returns it: server-set metadata, status, and a
    /// template that no longer matches what the run would build now.
    fn live(suspend: bool) -> Job {
        let r = run(GPU_SPEC);
        let mut cfg = crds::resolve(&r).unwrap_or_else(|e| panic!("{e}"));
        cfg.attempt = 1;
        let mut j = job(&Inputs { run: &r, cfg: &cfg, trainer_image: "registry/trainer:1" }, suspend);
        j.metadata.uid = Some("job-uid".into());
        j.metadata.resource_version = Some("42".into());
        j.metadata.annotations.get_or_insert_default().insert(APPLIED_HASH.into(), "0123".into());
        let spec = j.spec.as_mut().unwrap();
        spec.template.spec.as_mut().unwrap().containers[0].image = Some("registry/trainer:0".into());
        j.status = Some(Default::default());
        j
    }

    /// `live` merge-patched as the API server patches it (RFC 7386).
    fn patched(live: &Job, s: &Suspension) -> Job {
        let mut value = serde_json::to_value(live).unwrap();
        json_patch::merge(&mut value, &s.patch());
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_suspension_changes_the_suspension_and_the_mark_and_nothing_else() {
        let running = live(false);
        let s = suspension("llm-a1", true, false);
        let suspended = patched(&running, &s);
        let a = suspended.metadata.annotations.clone().unwrap();
        assert_eq!((a.get(SUSPENDED_BY_OPERATOR).map(String::as_str), a.get(APPLIED_HASH)), (Some("true"), None));
        let mut back = suspended.clone();
        back.spec.as_mut().unwrap().suspend = running.spec.as_ref().unwrap().suspend;
        back.metadata.annotations = running.metadata.annotations.clone();
        assert_eq!(back, running, "the live template and metadata, not the ones the run builds now");

        let r = suspension("llm-a1", false, false);
        let resumed = patched(&suspended, &r);
        assert_eq!(resumed.spec.as_ref().unwrap().suspend, Some(false));
        assert!(!resumed.metadata.annotations.unwrap().contains_key(SUSPENDED_BY_OPERATOR));
    }

    #[test]
    fn a_queued_job_is_resumed_suspended_for_kueue() {
        let suspended = patched(&live(true), &suspension("llm-a1", true, true));
        let s = suspension("llm-a1", false, true);
        let resumed = patched(&suspended, &s);
        assert_eq!(resumed.spec.as_ref().unwrap().suspend, Some(true));
        assert!(!resumed.metadata.annotations.as_ref().unwrap().contains_key(SUSPENDED_BY_OPERATOR));
        assert_eq!(
            suspension("llm-a1", true, true),
            Suspension { job: "llm-a1".into(), suspend: true, by_operator: true }
        );
    }
}
