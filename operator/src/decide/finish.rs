//! An outcome becomes status, pure: the phase and reason, every condition, and the
//! events for what changed since the old status.

use crds::contract::RunReason;
use crds::types::{RunPhase, TrainingRunStatus};
use kube::ResourceExt;

use super::context::{Draft, Frame};
use super::outcome::{Decision, Note, Outcome};
use super::stall::Stall;
use super::straggler;
use super::{learning_signal, rollback};
use crate::resources::job_name;
use crate::status::{self, Cond};

/// The decision: `o` and `accepted` written into the draft's status with every
/// condition, and the events for what changed.
pub(super) fn finish(frame: &Frame, draft: Draft, o: Outcome, accepted: Cond) -> Decision {
    let Draft { mut new, mut d, stall } = draft;
    new.phase = Some(o.phase);
    if new.attempt > 0 {
        new.job_name = Some(job_name(&frame.run.name_any(), new.attempt));
    }
    new.reason = Some(o.reason.clone());
    if o.phase != RunPhase::Running {
        new.straggler = None;
        new.slow_link = None;
    }
    let stalled = stall_condition(stall.as_ref(), &new);
    let mut conds = phase_conditions(&new, &o, accepted, stalled.clone());
    let policies = policy_conditions(frame, &new);
    conds.extend([policies.signal.clone(), policies.rolled_back.clone(), policies.slow.clone()].into_iter().flatten());
    conds.extend(queued_condition(frame, &o));
    new.conditions = status::conditions(&frame.old.conditions, &conds, frame.run.metadata.generation, frame.now);
    policy_notes(frame.old, &policies, o.phase, &mut d.notes);
    transition_notes(frame.old, &new, &o, &mut d.notes);
    stall_notes(frame.old, &stalled, o.phase, &mut d.notes);
    // A first attempt's phase change already says JobCreated; a second event with the
    // same reason would only add a write.
    let told = d.notes.iter().any(|n| n.reason == RunReason::JobCreated.as_str());
    if d.create_job && !told {
        d.notes.push(Note {
            warning: false,
            reason: RunReason::JobCreated.into(),
            message: format!("created Job {} (attempt {})", new.job_name.clone().unwrap_or_default(), new.attempt),
        });
    }
    d.status = new;
    d
}

fn cond(type_: &'static str, status: bool, reason: &str, message: &str) -> Cond {
    Cond { type_, status, reason: reason.into(), message: message.into() }
}

/// Accepted, one condition per phase (True for the outcome's, False otherwise), and
/// `stalled` in its place between Failed and Suspended.
fn phase_conditions(new: &TrainingRunStatus, o: &Outcome, accepted: Cond, stalled: Cond) -> Vec<Cond> {
    let is = |p: RunPhase| o.phase == p;
    let running_reason = if is(RunPhase::Running) { RunReason::Training.as_str() } else { o.reason.as_str() };
    let first = if new.attempt > 1 { RunReason::Resumed } else { RunReason::FirstAttempt };
    let or_else = |phase: RunPhase, type_: &'static str, reason: &str, message: &str| {
        if is(phase) { cond(type_, true, &o.reason, &o.message) } else { cond(type_, false, reason, message) }
    };
    vec![
        accepted,
        cond("Running", is(RunPhase::Running), running_reason, &o.message),
        or_else(RunPhase::Restarting, "Restarting", first.as_str(), &format!("attempt {}", new.attempt)),
        or_else(RunPhase::Succeeded, "Succeeded", RunReason::NotCompleted.as_str(), ""),
        or_else(RunPhase::Failed, "Failed", RunReason::NoFailure.as_str(), ""),
        stalled,
        or_else(RunPhase::Suspended, "Suspended", RunReason::NotSuspended.as_str(), ""),
    ]
}

/// Stalled: True while the step has not advanced for longer than the timeout.
fn stall_condition(stall: Option<&Stall>, new: &TrainingRunStatus) -> Cond {
    match stall {
        Some(Stall { stalled_for: Some(secs), .. }) => {
            let step = new.progress.as_ref().map_or(0, |p| p.step);
            let message = format!("step {step} has not advanced for {}", status::short_duration(*secs));
            cond("Stalled", true, RunReason::NoProgress.as_str(), &message)
        }
        Some(_) => cond("Stalled", false, RunReason::Progressing.as_str(), "the step is advancing"),
        None => cond("Stalled", false, RunReason::NotRunning.as_str(), ""),
    }
}

/// Queued, on a run with `spec.queueName`: True while its Job waits for Kueue, naming
/// the LocalQueue; False once Kueue admitted it (until an eviction puts it back), or
/// before it has waited at all.
fn queued_condition(frame: &Frame, o: &Outcome) -> Option<Cond> {
    let queue = frame.run.spec.queue_name.as_deref()?;
    if o.reason == RunReason::WaitingForQueue.as_str() {
        return Some(cond(status::QUEUED, true, &o.reason, &o.message));
    }
    let admitted = RunReason::Admitted.as_str();
    let was_admitted = status::condition(frame.old, status::QUEUED).is_some_and(|c| c.reason == admitted);
    Some(if was_admitted || matches!(o.phase, RunPhase::Running | RunPhase::Succeeded) {
        cond(status::QUEUED, false, admitted, &format!("admitted by Kueue from LocalQueue {queue}"))
    } else {
        cond(status::QUEUED, false, RunReason::NotQueued.as_str(), "")
    })
}

/// The conditions of the failure policies that apply to the run.
struct PolicyConditions {
    signal: Option<Cond>,
    rolled_back: Option<Cond>,
    slow: Option<Cond>,
}

fn policy_conditions(frame: &Frame, new: &TrainingRunStatus) -> PolicyConditions {
    let p = frame.policies;
    PolicyConditions {
        signal: p.no_signal_steps.map(|n| learning_signal::learning_signal(new, n)),
        rolled_back: p.max_rollbacks.map(|max| rollback::rolled_back(new, max)),
        slow: p.straggler_readings.map(|n| straggler::condition(new.straggler.as_ref(), new.slow_link.as_ref(), n)),
    }
}

/// Events when NoLearningSignal or Straggler turn True, and when they clear.
fn policy_notes(old: &TrainingRunStatus, p: &PolicyConditions, phase: RunPhase, notes: &mut Vec<Note>) {
    let was_silent = status::condition(old, status::NO_LEARNING_SIGNAL).is_some_and(|c| c.status == "True");
    match &p.signal {
        Some(c) if c.status && !was_silent => {
            notes.push(Note { warning: true, reason: c.reason.clone(), message: c.message.clone() })
        }
        Some(c) if !c.status && was_silent => notes.push(Note {
            warning: false,
            reason: c.reason.clone(),
            message: "the rewards vary within prompt groups again".into(),
        }),
        _ => {}
    }
    let was_slow = status::condition(old, status::STRAGGLER).filter(|c| c.status == "True");
    match (&p.slow, was_slow) {
        (Some(c), None) if c.status => {
            notes.push(Note { warning: true, reason: c.reason.clone(), message: c.message.clone() })
        }
        (Some(c), Some(was)) if !c.status && phase == RunPhase::Running => notes.push(Note {
            warning: false,
            reason: RunReason::NoStraggler.into(),
            message: format!("the ranks keep pace again (was: {})", was.message),
        }),
        _ => {}
    }
}

/// An event when the phase, the reason or the attempt changed: a warning for a
/// failure or a restart the user did not ask for, and for pods that cannot start.
fn transition_notes(old: &TrainingRunStatus, new: &TrainingRunStatus, o: &Outcome, notes: &mut Vec<Note>) {
    if old.phase == new.phase && old.reason == new.reason && (old.attempt == new.attempt || old.attempt == 0) {
        return;
    }
    let reason = RunReason::parse(&o.reason);
    let change = matches!(reason, Some(RunReason::Resized | RunReason::Reconfigured));
    let warning = (matches!(o.phase, RunPhase::Failed | RunPhase::Restarting) && !change)
        || matches!(
            reason,
            Some(RunReason::ImagePullBackOff | RunReason::Unschedulable | RunReason::CreateContainerConfigError)
        );
    notes.push(Note { warning, reason: o.reason.clone(), message: o.message.clone() });
}

/// Stalled when the stall begins, Progressing when a Running run's step moves again.
fn stall_notes(old: &TrainingRunStatus, stalled: &Cond, phase: RunPhase, notes: &mut Vec<Note>) {
    let was_stalled = status::condition(old, "Stalled").is_some_and(|c| c.status == "True");
    if stalled.status && !was_stalled {
        notes.push(Note { warning: true, reason: RunReason::Stalled.into(), message: stalled.message.clone() });
    } else if was_stalled && !stalled.status && phase == RunPhase::Running {
        notes.push(Note {
            warning: false,
            reason: RunReason::Progressing.into(),
            message: "the step advances again".into(),
        });
    }
}
