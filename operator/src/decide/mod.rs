//! The decision, pure: from the run, its resolved config and what was observed, the
//! new status and the actions that get there (create or delete a Job, suspend or
//! resume it) plus the events to emit. Idempotent: deciding again on the result
//! asks for nothing new.

use crds::config::ResolvedInit;
use crds::contract::RunReason;
use crds::types::{OnNaN, OnStall, RunPhase, TrainingRunStatus};
use crds::{InvalidSpec, RunConfig, TrainingRun};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::change::Change;
use crate::failure::{self, Verdict};
use crate::observe::{InitRun, Observed};
use crate::resources::{ATTEMPT_LABEL, SUSPENDED_BY_OPERATOR, job_name};
use crate::settings::Settings;
use crate::stall;
use crate::status::{self, Cond};
use crate::straggler;

mod learning_signal;
mod out_of_memory;
mod outcome;
mod rollback;

pub use outcome::{Decision, Note};
use outcome::{Outcome, next_attempt};

/// The conditions a run's failure policies add, when they apply to it.
#[derive(Clone, Copy, Debug, Default)]
struct Policies {
    /// GRPO: NoLearningSignal after this many steps without signal.
    no_signal_steps: Option<u32>,
    /// RolledBack, out of this many rollbacks (`onNaN: rollback`, or a run that has
    /// rolled back).
    max_rollbacks: Option<u32>,
    /// Several ranks: Straggler after this many readings in a row.
    straggler_readings: Option<u32>,
}

impl Policies {
    fn of(cfg: &RunConfig, status: &TrainingRunStatus) -> Policies {
        let rolled_back = status.effective.as_ref().is_some_and(|e| !e.rollbacks.is_empty());
        Policies {
            no_signal_steps: cfg.grpo.as_ref().map(|g| g.no_signal_steps),
            max_rollbacks: (cfg.failure.on_nan == OnNaN::Rollback || rolled_back).then_some(cfg.failure.max_rollbacks),
            straggler_readings: (cfg.topology.world_size > 1).then_some(cfg.failure.straggler_readings),
        }
    }
}

fn attempt_of<K: kube::Resource>(obj: &K) -> Option<u32> {
    obj.labels().get(ATTEMPT_LABEL)?.parse().ok()
}

/// A spec the resolver rejected: Failed/InvalidSpec, Accepted=False naming every field.
pub fn invalid(run: &TrainingRun, err: &InvalidSpec, now: Timestamp) -> Decision {
    let old = run.status.clone().unwrap_or_default();
    let mut new = old.clone();
    new.observed_generation = run.metadata.generation;
    let message = format!("spec is invalid: {err}");
    let outcome = Outcome::new(RunPhase::Failed, RunReason::InvalidSpec, message.clone());
    let accepted = Cond { type_: "Accepted", status: false, reason: RunReason::InvalidSpec.into(), message };
    finish(run, &old, new, outcome, accepted, None, Policies::default(), now, Decision::default())
}

/// `cfg` is the config the run's attempts run under: the spec's, or the accepted one
/// when `change` (from the accepted config to the spec's) is refused.
pub fn decide(
    run: &TrainingRun,
    cfg: &RunConfig,
    obs: &Observed,
    now: Timestamp,
    settings: &Settings,
    change: &Change,
) -> Decision {
    let old = run.status.clone().unwrap_or_default();
    let name = run.name_any();
    let mut new = old.clone();
    let attempt = old.attempt.max(1);
    new.attempt = attempt;
    new.observed_generation = run.metadata.generation;
    new.topology = Some(cfg.topology.display.clone());
    new.job_name = Some(job_name(&name, attempt));
    let p = new.progress.get_or_insert_with(|| status::initial_progress(cfg));
    p.total_tokens = cfg.schedule.total_tokens;
    p.total_steps = cfg.schedule.total_steps;
    let accepted = Cond {
        type_: "Accepted",
        status: true,
        reason: RunReason::Accepted.into(),
        message: format!(
            "{} on {}: {} steps of {} tokens",
            cfg.model.preset, cfg.topology.display, cfg.schedule.total_steps, cfg.batch.tokens_per_step
        ),
    };
    let mut d = Decision::default();
    let accepted = match change {
        Change::Refused { message } => {
            let was = status::condition(&old, "Accepted");
            if was.is_none_or(|c| c.reason != RunReason::ChangeRefused.as_str() || c.message != *message) {
                d.notes.push(Note { warning: true, reason: RunReason::ChangeRefused.into(), message: message.clone() });
            }
            Cond { type_: "Accepted", status: false, reason: RunReason::ChangeRefused.into(), message: message.clone() }
        }
        Change::Operator { changes } if !status::is_terminal(&old) => {
            let message = format!("{}; nothing restarts", changes.join(", "));
            d.notes.push(Note { warning: false, reason: RunReason::Reconfigured.into(), message });
            accepted
        }
        Change::Unchanged | Change::Operator { .. } | Change::Restart { .. } => accepted,
    };
    let policies = Policies::of(cfg, &old);
    let trained_steps = old.progress.as_ref().map_or(0, |p| p.step);
    if let Change::Restart { reason, summary, .. } = change
        && old.phase == Some(RunPhase::Succeeded)
        && cfg.schedule.total_steps > trained_steps
    {
        // More tokens for a finished run: it trains on from its final checkpoint.
        new.completion_time = None;
        next_attempt(&mut new, &mut d, &job_name(&name, attempt));
        let outcome = Outcome::new(
            RunPhase::Restarting,
            *reason,
            format!(
                "{summary}: training on from the final checkpoint (step {trained_steps} of {}) as attempt {} (not \
                 counted toward maxRestarts)",
                cfg.schedule.total_steps, new.attempt
            ),
        );
        return finish(run, &old, new, outcome, accepted, None, policies, now, d);
    }
    if status::is_terminal(&old) {
        let outcome = Outcome::new(
            old.phase.unwrap_or(RunPhase::Failed),
            old.reason.as_deref().unwrap_or(""),
            main_message(&old),
        );
        return finish(run, &old, new, outcome, accepted, None, policies, now, d);
    }

    let current_name = job_name(&name, attempt);
    let current = obs.jobs.iter().find(|j| j.name_any() == current_name);
    if current.is_some() {
        new.seen_job_attempt = Some(attempt);
    }
    d.delete_jobs = obs
        .jobs
        .iter()
        .filter(|j| j.name_any() != current_name && j.metadata.deletion_timestamp.is_none())
        .map(|j| j.name_any())
        .collect();
    let job_uids: Vec<&str> = obs.jobs.iter().filter_map(|j| j.metadata.uid.as_deref()).collect();
    d.delete_pods = obs
        .pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !p.owner_references().iter().any(|o| o.kind == "Job" && job_uids.contains(&o.uid.as_str())))
        .map(|p| p.name_any())
        .collect();
    let stale_pods = obs.pods.iter().filter(|p| attempt_of(*p) != Some(attempt)).count();
    let pods: Vec<Pod> = obs.pods.iter().filter(|p| attempt_of(*p) == Some(attempt)).cloned().collect();
    let spec = &run.spec;
    let mut stall = None;
    if let (Change::Restart { reason, summary, .. }, Some(_)) = (change, current) {
        next_attempt(&mut new, &mut d, &current_name);
        let outcome = Outcome::new(
            RunPhase::Restarting,
            *reason,
            format!(
                "{summary}: restarting the gang from the last checkpoint as attempt {} (not counted toward \
                 maxRestarts)",
                new.attempt
            ),
        );
        return finish(run, &old, new, outcome, accepted, None, policies, now, d);
    }

    let outcome = match current {
        None if old.seen_job_attempt == Some(attempt) => {
            let message = format!(
                "Job {current_name} was deleted before it finished (by hand, or by spec.ttlSecondsAfterFinished)"
            );
            restart(&mut new, &mut d, cfg, &current_name, RunReason::JobDeleted.as_str(), &message, true, now)
        }
        None if current_name_blocked(obs, &current_name, stale_pods) => Outcome::new(
            RunPhase::Restarting,
            old.reason.as_deref().unwrap_or(RunReason::Restarting.as_str()),
            restart_cause(&old).unwrap_or_else(|| {
                format!(
                    "waiting for {stale_pods} pod(s) of earlier attempts to terminate before attempt {attempt} starts"
                )
            }),
        ),
        None => match (&cfg.init_from, &obs.init_run) {
            (Some(ResolvedInit::TrainingRun { name: init }), Some(state))
                if *state != InitRun::Phase(Some(RunPhase::Succeeded)) =>
            {
                let now_is = match state {
                    InitRun::Missing => "does not exist".to_string(),
                    InitRun::Phase(Some(p)) => format!("is {p:?}"),
                    InitRun::Phase(None) => "has not started".to_string(),
                };
                Outcome::new(
                    RunPhase::Waiting,
                    RunReason::WaitingForInitRun,
                    format!("waiting for TrainingRun {init} to succeed; it {now_is}"),
                )
            }
            _ => {
                d.create_job = true;
                if new.start_time.is_none() {
                    new.start_time = Some(Time(now));
                }
                if spec.suspend {
                    Outcome::new(RunPhase::Suspended, RunReason::Suspended, "suspended by spec.suspend")
                } else if let Some(q) = &spec.queue_name {
                    Outcome::new(
                        RunPhase::Pending,
                        RunReason::WaitingForQueue,
                        format!("Job {current_name} waits for Kueue to admit it from LocalQueue {q}"),
                    )
                } else if attempt > 1 {
                    let message = restart_cause(&old)
                        .unwrap_or_else(|| format!("created Job {current_name} for attempt {attempt}"));
                    Outcome::new(
                        RunPhase::Restarting,
                        old.reason.as_deref().unwrap_or(RunReason::Restarting.as_str()),
                        message,
                    )
                } else {
                    Outcome::new(RunPhase::Pending, RunReason::JobCreated, format!("created Job {current_name}"))
                }
            }
        },
        Some(job) => {
            let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
            let ours = job.annotations().contains_key(SUSPENDED_BY_OPERATOR);
            if spec.suspend {
                if !suspended {
                    d.suspend_job = Some(true);
                }
                Outcome::new(
                    RunPhase::Suspended,
                    RunReason::Suspended,
                    "suspended by spec.suspend; resuming continues from the last checkpoint",
                )
            } else if suspended && ours {
                d.suspend_job = Some(false);
                Outcome::new(
                    RunPhase::Pending,
                    RunReason::Resuming,
                    format!("resuming Job {current_name} from the last checkpoint"),
                )
            } else if suspended {
                match &spec.queue_name {
                    Some(q) => Outcome::new(
                        RunPhase::Pending,
                        RunReason::WaitingForQueue,
                        format!("Job {current_name} is suspended until Kueue admits it from LocalQueue {q}"),
                    ),
                    None => Outcome::new(
                        RunPhase::Suspended,
                        RunReason::JobSuspended,
                        format!("Job {current_name} was suspended outside the operator"),
                    ),
                }
            } else {
                match failure::classify(job, &pods, cfg, now, settings) {
                    Verdict::Succeeded { report } => {
                        if let Some(r) = report {
                            status::apply_report(&mut new, cfg, &r);
                        }
                        status::complete_progress(&mut new, cfg);
                        new.completion_time = Some(Time(now));
                        let loss = new
                            .metrics
                            .as_ref()
                            .and_then(|m| m.loss)
                            .map_or(String::new(), |l| format!("; final loss {l:.4}"));
                        Outcome::new(
                            RunPhase::Succeeded,
                            RunReason::Completed,
                            format!(
                                "trained {} tokens in {} steps{loss}",
                                cfg.schedule.total_tokens, cfg.schedule.total_steps
                            ),
                        )
                    }
                    Verdict::Failed { reason, message } => {
                        new.completion_time = Some(Time(now));
                        Outcome::new(RunPhase::Failed, &reason, message)
                    }
                    Verdict::DeviceOutOfMemory { message } => {
                        out_of_memory::out_of_memory(&mut new, &mut d, cfg, &current_name, &message, now)
                    }
                    Verdict::NonFinite { message, at } => {
                        rollback::non_finite(&mut new, &mut d, cfg, &current_name, &message, &at, now)
                    }
                    Verdict::Restart { reason, message, counts } => {
                        restart(&mut new, &mut d, cfg, &current_name, &reason, &message, counts, now)
                    }
                    Verdict::AwaitingCause { message } => Outcome::new(RunPhase::Running, RunReason::Training, message),
                    Verdict::Running => {
                        let was_running = old.phase == Some(RunPhase::Running) && old.attempt == attempt;
                        let old_step = old.progress.as_ref().map_or(0, |p| p.step);
                        if let Some(t) = &obs.trainer {
                            status::apply_report(&mut new, cfg, t);
                            let f = cfg.failure.straggler_factor;
                            new.straggler = straggler::track(old.straggler.as_ref(), &t.ranks, t.step, f)
                                .map(|s| straggler::placed(s, &pods, cfg.topology.procs_per_node));
                        }
                        let p = new.progress.as_mut().expect("set above");
                        let last = old.progress.as_ref().and_then(|p| p.last_progress_time.as_ref()).map(|t| t.0);
                        let s =
                            stall::check(was_running, last, old_step, p.step, now, cfg.failure.stall_timeout_seconds);
                        p.last_progress_time = Some(Time(s.last_progress));
                        stall = Some(s.clone());
                        match s.stalled_for {
                            Some(secs) if cfg.failure.on_stall == OnStall::Restart => {
                                let message =
                                    format!("step {} has not advanced for {}", p.step, status::short_duration(secs));
                                stall = None;
                                restart(
                                    &mut new,
                                    &mut d,
                                    cfg,
                                    &current_name,
                                    RunReason::Stalled.as_str(),
                                    &message,
                                    true,
                                    now,
                                )
                            }
                            _ => Outcome::new(
                                RunPhase::Running,
                                RunReason::Training,
                                format!("{} pod(s) of Job {current_name} running", cfg.topology.nodes),
                            ),
                        }
                    }
                    Verdict::Pending { stuck: Some((reason, message)) } => {
                        Outcome::new(RunPhase::Pending, &reason, message)
                    }
                    Verdict::Pending { stuck: None } if attempt > 1 && old.phase == Some(RunPhase::Restarting) => {
                        let message = restart_cause(&old).unwrap_or_else(|| format!("attempt {attempt} is starting"));
                        Outcome::new(
                            RunPhase::Restarting,
                            old.reason.as_deref().unwrap_or(RunReason::Restarting.as_str()),
                            message,
                        )
                    }
                    Verdict::Pending { stuck: None } => Outcome::new(
                        RunPhase::Pending,
                        RunReason::PodsPending,
                        format!("waiting for the pods of Job {current_name} to run"),
                    ),
                }
            }
        }
    };
    finish(run, &old, new, outcome, accepted, stall, policies, now, d)
}

/// Why the gang is restarting, kept until the new attempt runs.
fn restart_cause(old: &TrainingRunStatus) -> Option<String> {
    status::condition(old, "Restarting").filter(|c| c.status == "True").map(|c| c.message.clone())
}

/// Whether the current attempt's Job must wait: pods of earlier attempts still hold
/// the hostnames and GPUs.
fn current_name_blocked(obs: &Observed, current: &str, stale_pods: usize) -> bool {
    stale_pods > 0 || obs.jobs.iter().any(|j| j.name_any() != current)
}

#[allow(clippy::too_many_arguments)]
fn restart(
    new: &mut TrainingRunStatus,
    d: &mut Decision,
    cfg: &RunConfig,
    job: &str,
    reason: &str,
    message: &str,
    counts: bool,
    now: Timestamp,
) -> Outcome {
    let max = cfg.failure.max_restarts;
    if counts && new.restarts >= max {
        new.completion_time = Some(Time(now));
        return Outcome::new(
            RunPhase::Failed,
            RunReason::MaxRestartsExceeded,
            format!("{reason}: {message}; no restarts left after {} (failurePolicy.maxRestarts {max})", new.restarts),
        );
    }
    let failed_attempt = next_attempt(new, d, job) - 1;
    if counts {
        new.restarts += 1;
    }
    let budget =
        if counts { format!("restart {} of {max}", new.restarts) } else { "not counted toward maxRestarts".into() };
    Outcome::new(
        RunPhase::Restarting,
        reason,
        format!(
            "attempt {failed_attempt} failed: {message}; restarting the gang from the last checkpoint as attempt {} ({budget})",
            new.attempt
        ),
    )
}

fn main_message(s: &TrainingRunStatus) -> String {
    let main = match s.phase {
        Some(RunPhase::Succeeded) => "Succeeded",
        Some(RunPhase::Failed) => "Failed",
        Some(RunPhase::Restarting) => "Restarting",
        Some(RunPhase::Suspended) => "Suspended",
        _ => "Running",
    };
    status::condition(s, main).map(|c| c.message.clone()).unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn finish(
    run: &TrainingRun,
    old: &TrainingRunStatus,
    mut new: TrainingRunStatus,
    o: Outcome,
    accepted: Cond,
    stall: Option<stall::Stall>,
    policies: Policies,
    now: Timestamp,
    mut d: Decision,
) -> Decision {
    let phase = o.phase;
    new.phase = Some(phase);
    if new.attempt > 0 {
        new.job_name = Some(job_name(&run.name_any(), new.attempt));
    }
    new.reason = Some(o.reason.clone());
    let is = |p: RunPhase| phase == p;
    let cond = |type_: &'static str, status: bool, reason: &str, message: &str| Cond {
        type_,
        status,
        reason: reason.into(),
        message: message.into(),
    };
    let attempt_note = format!("attempt {}", new.attempt);
    let (stalled, stall_reason, stall_message) = match &stall {
        Some(s) if s.stalled_for.is_some() => {
            let step = new.progress.as_ref().map_or(0, |p| p.step);
            (
                true,
                RunReason::NoProgress.as_str(),
                format!("step {step} has not advanced for {}", status::short_duration(s.stalled_for.unwrap_or(0))),
            )
        }
        Some(_) => (false, RunReason::Progressing.as_str(), "the step is advancing".to_string()),
        None => (false, RunReason::NotRunning.as_str(), String::new()),
    };
    let running_reason = if is(RunPhase::Running) { RunReason::Training.as_str() } else { o.reason.as_str() };
    let conds = [
        accepted,
        cond("Running", is(RunPhase::Running), running_reason, &o.message),
        if is(RunPhase::Restarting) {
            cond("Restarting", true, &o.reason, &o.message)
        } else {
            cond(
                "Restarting",
                false,
                if new.attempt > 1 { RunReason::Resumed.as_str() } else { RunReason::FirstAttempt.as_str() },
                &attempt_note,
            )
        },
        if is(RunPhase::Succeeded) {
            cond("Succeeded", true, &o.reason, &o.message)
        } else {
            cond("Succeeded", false, RunReason::NotCompleted.as_str(), "")
        },
        if is(RunPhase::Failed) {
            cond("Failed", true, &o.reason, &o.message)
        } else {
            cond("Failed", false, RunReason::NoFailure.as_str(), "")
        },
        cond("Stalled", stalled, stall_reason, &stall_message),
        if is(RunPhase::Suspended) {
            cond("Suspended", true, &o.reason, &o.message)
        } else {
            cond("Suspended", false, RunReason::NotSuspended.as_str(), "")
        },
    ];
    let signal = policies.no_signal_steps.map(|n| learning_signal::learning_signal(&new, n));
    let rolled_back = policies.max_rollbacks.map(|max| rollback::rolled_back(&new, max));
    if !is(RunPhase::Running) {
        new.straggler = None;
    }
    let slow = policies.straggler_readings.map(|n| straggler::condition(new.straggler.as_ref(), n));
    let conds: Vec<Cond> = conds.into_iter().chain(signal.clone()).chain(rolled_back).chain(slow.clone()).collect();
    new.conditions = status::conditions(&old.conditions, &conds, run.metadata.generation, now);
    let was_silent = status::condition(old, status::NO_LEARNING_SIGNAL).is_some_and(|c| c.status == "True");
    match signal {
        Some(c) if c.status && !was_silent => {
            d.notes.push(Note { warning: true, reason: c.reason.clone(), message: c.message.clone() })
        }
        Some(c) if !c.status && was_silent => d.notes.push(Note {
            warning: false,
            reason: c.reason.clone(),
            message: "the rewards vary within prompt groups again".into(),
        }),
        _ => {}
    }

    let was_slow = status::condition(old, status::STRAGGLER).filter(|c| c.status == "True");
    match (&slow, was_slow) {
        (Some(c), None) if c.status => {
            d.notes.push(Note { warning: true, reason: c.reason.clone(), message: c.message.clone() })
        }
        (Some(c), Some(was)) if !c.status && is(RunPhase::Running) => d.notes.push(Note {
            warning: false,
            reason: RunReason::NoStraggler.into(),
            message: format!("the ranks keep pace again (was: {})", was.message),
        }),
        _ => {}
    }

    if old.phase != new.phase || old.reason != new.reason || (old.attempt != new.attempt && old.attempt > 0) {
        let change = matches!(RunReason::parse(&o.reason), Some(RunReason::Resized | RunReason::Reconfigured));
        let warning = (matches!(phase, RunPhase::Failed | RunPhase::Restarting) && !change)
            || matches!(
                RunReason::parse(&o.reason),
                Some(RunReason::ImagePullBackOff | RunReason::Unschedulable | RunReason::CreateContainerConfigError)
            );
        d.notes.push(Note { warning, reason: o.reason.clone(), message: o.message.clone() });
    }
    let was_stalled = status::condition(old, "Stalled").is_some_and(|c| c.status == "True");
    if stalled && !was_stalled {
        d.notes.push(Note { warning: true, reason: RunReason::Stalled.into(), message: stall_message });
    } else if was_stalled && !stalled && is(RunPhase::Running) {
        d.notes.push(Note {
            warning: false,
            reason: RunReason::Progressing.into(),
            message: "the step advances again".into(),
        });
    }
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

#[cfg(test)]
mod tests;
