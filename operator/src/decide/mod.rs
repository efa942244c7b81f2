//! The decision, pure: from the run, its resolved config and what was observed, the
//! new status and the actions that get there (create or delete a Job, suspend or
//! resume it) plus the events to emit. Idempotent: deciding again on the result
//! asks for nothing new.
//!
//! One handler per situation, tried in order; the first that applies decides the
//! outcome, and `finish` turns it into status and events.

use crds::contract::RunReason;
use crds::types::RunPhase;
use crds::{InvalidSpec, TrainingRun};
use jiff::Timestamp;

use crate::status::Cond;

mod change;
mod context;
mod finish;
mod learning_signal;
mod no_job;
mod out_of_memory;
mod outcome;
mod restart;
mod rollback;
mod running;
mod suspension;
mod sweep;
mod terminal;
#[cfg(test)]
mod testing;
mod verdict;

pub use context::Situation;
pub use outcome::{Decision, Note};

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
