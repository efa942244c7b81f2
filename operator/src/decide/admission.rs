//! The config a reconcile works under, pure: the spec resolved ([`validate`]), held
//! while its TrainingDatasets prepare, and compared with the accepted one
//! ([`change::admit`]); a spec that no longer resolves is refused while an accepted
//! config runs.

use crds::types::RunPhase;
use crds::{RunConfig, TrainingRun};
use kube::ResourceExt;

use crate::change::{self, Change, Claim};
use crate::observed::{Accepted, Admission, Datasets};
use crate::resources;
use crate::status::is_terminal;
use crate::validate::validate;

/// What `run` (with `datasets` in place) runs under, given what its attempts run under.
pub fn admission(run: &TrainingRun, datasets: &Datasets, accepted: &Accepted) -> Admission {
    let old = run.status.clone().unwrap_or_default();
    let wanted = validate(run, old.attempt);
    if let (Some(message), Ok(_)) = (datasets.waiting(), &wanted) {
        return Admission::Waiting(message.to_string());
    }
    let (wanted, change) = match (wanted, &accepted.config) {
        (Ok(wanted), _) => {
            let claim = accepted.claim.clone().map(|modes| Claim {
                name: resources::pvc_name(&run.name_any()),
                modes,
                wanted: resources::access_mode(&run.spec, &wanted),
            });
            let trained = old.progress.as_ref().map_or(0, |p| p.tokens);
            let change = change::admit(accepted.config.as_ref(), &wanted, claim.as_ref(), trained);
            (wanted, change)
        }
        // An edit that no longer resolves is refused while an accepted config runs.
        (Err(invalid), Some(config)) if !is_terminal(&old) => {
            (RunConfig { attempt: old.attempt.max(1), ..config.clone() }, change::unresolvable(&invalid, config))
        }
        (Err(invalid), _) => return Admission::Invalid(invalid),
    };
    // A refused change leaves the run under the accepted config.
    let cfg = match (&change, &accepted.config) {
        (Change::Refused { .. }, Some(config)) => RunConfig { attempt: wanted.attempt, ..config.clone() },
        _ => wanted,
    };
    Admission::Admitted { cfg: Box::new(cfg), change }
}

/// Whether what the run's attempts run under is read at all: not once it failed (a run
/// that succeeded may be given more tokens).
pub fn reads_accepted(run: &TrainingRun) -> bool {
    let old = run.status.clone().unwrap_or_default();
    !(is_terminal(&old) && old.phase != Some(RunPhase::Succeeded))
}
