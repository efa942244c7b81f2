//! The decision, pure: from the run, its resolved config and what was observed, the
//! new status and the actions that get there (create or delete a Job, suspend or
//! resume it) plus the events to emit. Idempotent: deciding again on the result
//! asks for nothing new.
//!
//! [`admission()`] says which config a reconcile works under; [`decide`] tries one
//! handler per situation in order, the first that applies decides the outcome, and
//! `finish` turns it into status and events; [`plan()`] turns the decision into the
//! reconcile's writes, in the order they are made.

use crds::contract::RunReason;
use crds::types::RunPhase;
use crds::{InvalidSpec, TrainingRun};
use jiff::Timestamp;

use crate::status::Cond;

mod admission;
mod change;
mod context;
mod finish;
mod learning_signal;
#[cfg(test)]
mod learning_signal_tests;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod nan_rollback_tests;
mod no_job;
mod out_of_memory;
mod outcome;
pub mod outlier;
mod plan;
pub mod plausible;
mod poll;
mod restart;
#[cfg(test)]
mod restart_budget_tests;
mod rollback;
#[cfg(test)]
mod run_changes_tests;
mod running;
pub mod slow_link;
pub mod stall;
pub mod straggler;
#[cfg(test)]
mod straggler_run_tests;
mod suspension;
mod sweep;
mod terminal;
#[cfg(test)]
mod testing;
mod verdict;
#[cfg(test)]
mod world;

pub use admission::{admission, reads_accepted};
pub use context::Situation;
pub use outcome::{Decision, Note};
pub use plan::{Child, Plan, Step, plan};
pub use poll::{REFUSAL_EVENT_INTERVAL, STATUS_REFUSED, poll_due, refusal_event_due};

use context::{Ctx, Draft, Frame, Policies};
use outcome::Outcome;

/// A spec the resolver rejected: Failed/InvalidSpec, Accepted=False naming every field.
pub fn invalid(run: &TrainingRun, err: &InvalidSpec, now: Timestamp) -> Decision {
    let old = run.status.clone().unwrap_or_default();
    let mut new = old.clone();
    new.observed_generation = run.metadata.generation;
    let message = format!("spec is invalid: {err}");
    let outcome = Outcome::new(RunPhase::Failed, RunReason::InvalidSpec, message.clone());
    let accepted = Cond { type_: "Accepted", status: false, reason: RunReason::InvalidSpec.into(), message };
    let frame = Frame { run, old: &old, now, policies: Policies::default() };
    finish::finish(&frame, Draft { new, d: Decision::default(), stall: None }, outcome, accepted)
}

/// A run whose mix names TrainingDatasets that are not Ready: Waiting until they are.
pub fn waiting_for_datasets(run: &TrainingRun, message: &str, now: Timestamp) -> Decision {
    let old = run.status.clone().unwrap_or_default();
    let mut new = old.clone();
    new.observed_generation = run.metadata.generation;
    let outcome = Outcome::new(RunPhase::Waiting, RunReason::WaitingForDataset, message.to_string());
    let accepted = Cond { type_: "Accepted", status: true, reason: RunReason::Accepted.into(), message: String::new() };
    let frame = Frame { run, old: &old, now, policies: Policies::default() };
    finish::finish(&frame, Draft { new, d: Decision::default(), stall: None }, outcome, accepted)
}

pub fn decide(s: &Situation) -> Decision {
    let ctx = Ctx::new(s);
    let mut draft = Draft::start(&ctx);
    let accepted = change::accepted(&ctx, &mut draft.d);
    let outcome = outcome(&ctx, &mut draft);
    finish::finish(&ctx.frame(), draft, outcome, accepted)
}

/// The first handler that applies.
fn outcome(ctx: &Ctx, draft: &mut Draft) -> Outcome {
    if let Some(o) = change::train_on(ctx, draft) {
        return o;
    }
    if let Some(o) = terminal::stays(ctx) {
        return o;
    }
    sweep::children(ctx, draft);
    if let Some(o) = change::restart_gang(ctx, draft) {
        return o;
    }
    match ctx.current {
        None => no_job::outcome(ctx, draft),
        Some(job) => suspension::outcome(ctx, draft, job).unwrap_or_else(|| verdict::outcome(ctx, draft, job)),
    }
}

#[cfg(test)]
mod tests;
