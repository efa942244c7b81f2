//! What every handler of a decision reads (the situation, and what follows from it
//! before any policy applies) and the draft of the status they write.

use crds::contract::RunReason;
use crds::types::{OnNaN, RunPhase, TrainingRunStatus};
use crds::{RunConfig, TrainingRun};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::outcome::{Decision, Outcome};
use super::stall::Stall;
use crate::change::Change;
use crate::failure;
use crate::observed::Attempts;
use crate::resources::{ATTEMPT_LABEL, job_name};
use crate::settings::Settings;
use crate::status;

/// Everything a decision is made from.
#[derive(Clone, Copy)]
pub struct Situation<'a> {
    pub run: &'a TrainingRun,
    /// The config the run's attempts run under: the spec's, or the accepted one when
    /// `change` is refused.
    pub cfg: &'a RunConfig,
    pub obs: &'a Attempts,
    pub now: Timestamp,
    pub settings: &'a Settings,
    /// From the accepted config to the spec's.
    pub change: &'a Change,
}

/// The conditions a run's failure policies add, when they apply to it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Policies {
    /// GRPO: NoLearningSignal after this many steps without signal.
    pub(super) no_signal_steps: Option<u32>,
    /// RolledBack, out of this many rollbacks (`onNaN: rollback`, or a run that has
    /// rolled back).
    pub(super) max_rollbacks: Option<u32>,
    /// Several ranks: Straggler after this many readings in a row.
    pub(super) straggler_readings: Option<u32>,
}

impl Policies {
    pub(super) fn of(cfg: &RunConfig, status: &TrainingRunStatus) -> Policies {
        let rolled_back = status.effective.as_ref().is_some_and(|e| !e.rollbacks.is_empty());
        Policies {
            no_signal_steps: cfg.grpo.as_ref().map(|g| g.no_signal_steps),
            max_rollbacks: (cfg.failure.on_nan == OnNaN::Rollback || rolled_back).then_some(cfg.failure.max_rollbacks),
            straggler_readings: (cfg.topology.world_size > 1).then_some(cfg.failure.straggler_readings),
        }
    }
}

/// What turning an outcome into status reads: the run as it was, and when.
pub(super) struct Frame<'a> {
    pub(super) run: &'a TrainingRun,
    pub(super) old: &'a TrainingRunStatus,
    pub(super) now: Timestamp,
    pub(super) policies: Policies,
}

/// The situation of a run that resolved, with what follows from it: the attempt, its
/// Job (when observed) and its pods.
pub(super) struct Ctx<'a> {
    pub(super) run: &'a TrainingRun,
    pub(super) cfg: &'a RunConfig,
    pub(super) obs: &'a Attempts,
    pub(super) now: Timestamp,
    pub(super) settings: &'a Settings,
    pub(super) change: &'a Change,
    /// The status the reconcile started from.
    pub(super) old: TrainingRunStatus,
    pub(super) policies: Policies,
    /// The attempt the reconcile started with (at least 1).
    pub(super) attempt: u32,
    /// The name of that attempt's Job.
    pub(super) current_name: String,
    pub(super) current: Option<&'a Job>,
    /// The pods of the current attempt.
    pub(super) pods: Vec<Pod>,
    /// How many pods of earlier attempts are left, but for those left on a lost node.
    pub(super) stale_pods: usize,
}

fn attempt_of<K: kube::Resource>(obj: &K) -> Option<u32> {
    obj.labels().get(ATTEMPT_LABEL)?.parse().ok()
}

impl<'a> Ctx<'a> {
    pub(super) fn new(s: &Situation<'a>) -> Ctx<'a> {
        let old = s.run.status.clone().unwrap_or_default();
        let attempt = old.attempt.max(1);
        let current_name = job_name(&s.run.name_any(), attempt);
        let current = s.obs.jobs.iter().find(|j| j.name_any() == current_name);
        let stale_pods = s
            .obs
            .pods
            .iter()
            .filter(|p| attempt_of(*p) != Some(attempt) && !failure::left_on_lost_node(p, s.now, s.settings))
            .count();
        let pods = s.obs.pods.iter().filter(|p| attempt_of(*p) == Some(attempt)).cloned().collect();
        Ctx {
            run: s.run,
            cfg: s.cfg,
            obs: s.obs,
            now: s.now,
            settings: s.settings,
            change: s.change,
            policies: Policies::of(s.cfg, &old),
            old,
            attempt,
            current_name,
            current,
            pods,
            stale_pods,
        }
    }

    pub(super) fn frame(&self) -> Frame<'_> {
        Frame { run: self.run, old: &self.old, now: self.now, policies: self.policies }
    }

    /// Why the gang is restarting, kept until the new attempt runs.
    pub(super) fn restart_cause(&self) -> Option<String> {
        status::condition(&self.old, "Restarting").filter(|c| c.status == "True").map(|c| c.message.clone())
    }

    /// The run stays Restarting, for the cause it restarted for.
    pub(super) fn still_restarting(&self, otherwise: String) -> Outcome {
        Outcome::new(
            RunPhase::Restarting,
            self.old.reason.as_deref().unwrap_or(RunReason::Restarting.as_str()),
            self.restart_cause().unwrap_or(otherwise),
        )
    }
}

/// The status the handlers write and the actions they ask for.
pub(super) struct Draft {
    pub(super) new: TrainingRunStatus,
    pub(super) d: Decision,
    /// The stall check's reading, when the run was checked for one.
    pub(super) stall: Option<Stall>,
}

impl Draft {
    /// The old status with what every decision on `ctx` sets: the attempt, the
    /// generation, the topology, the Job's name and the totals of the progress.
    pub(super) fn start(ctx: &Ctx) -> Draft {
        let mut new = ctx.old.clone();
        new.attempt = ctx.attempt;
        new.observed_generation = ctx.run.metadata.generation;
        new.topology = Some(ctx.cfg.topology.display.clone());
        new.job_name = Some(ctx.current_name.clone());
        let p = new.progress.get_or_insert_with(|| status::initial_progress(ctx.cfg));
        p.total_tokens = ctx.cfg.schedule.total_tokens;
        p.total_steps = ctx.cfg.schedule.total_steps;
        Draft { new, d: Decision::default(), stall: None }
    }

    /// Starts the next attempt: the attempt goes up and `job`, the current one's Job,
    /// goes with its pods. Returns the new attempt.
    pub(super) fn next_attempt(&mut self, job: &str) -> u32 {
        self.new.attempt += 1;
        self.new.straggler = None;
        self.new.slow_link = None;
        self.d.delete_jobs.push(job.to_string());
        self.new.attempt
    }
}
