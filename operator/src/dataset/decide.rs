//! Decide, pure: from the dataset, its validated plan and what was observed, the new
//! status, the Job to create, the stale Jobs to delete and the events.

use std::collections::BTreeMap;

use crds::contract::prepare::{DatasetReason, FailedInput, PrepareReport, PrepareStep};
use crds::contract::{TerminationMessage, clip};
use crds::quantity::format_tokens;
use crds::types::{
    DatasetManifest, DatasetPhase, DatasetProgress, FailedFile, TrainingDataset, TrainingDatasetStatus, bounds,
};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use kube::ResourceExt;

use super::build::{GENERATION_LABEL, job_name};
use super::validate::Prepared;
use crate::decide::Note;
use crate::failure::completion_index;
use crate::resources::JOB_NAME_LABEL;
use crate::status::{self, Cond};

/// What the observe step saw of a dataset's world.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Every Job of the dataset, all generations.
    pub jobs: Vec<Job>,
    /// Every pod of the dataset, all generations.
    pub pods: Vec<Pod>,
    /// The `/status` of running pods, by pod name.
    pub live: BTreeMap<String, PrepareReport>,
    /// The live TrainingRuns whose mix names the dataset.
    pub users: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub status: TrainingDatasetStatus,
    /// The Job of this step to create, for the current generation.
    pub create: Option<PrepareStep>,
    pub delete_jobs: Vec<String>,
    pub notes: Vec<Note>,
}

/// The condition types, in order.
pub const CONDITION_TYPES: [&str; 4] = ["Accepted", "Preparing", "Ready", "Failed"];

struct Outcome {
    phase: DatasetPhase,
    reason: DatasetReason,
    message: String,
}

impl Outcome {
    fn new(phase: DatasetPhase, reason: DatasetReason, message: impl Into<String>) -> Outcome {
        Outcome { phase, reason, message: message.into() }
    }
}

pub fn decide(ds: &TrainingDataset, plan: &Result<Prepared, Vec<String>>, obs: &Observed, now: Timestamp) -> Decision {
    let old = ds.status.clone().unwrap_or_default();
    let generation = ds.metadata.generation.unwrap_or_default();
    let mut d = Decision { status: old.clone(), ..Default::default() };
    d.status.observed_generation = Some(generation);
    d.status.used_by = obs.users.iter().take(bounds::DATASET_USERS).cloned().collect();
    let current = |j: &Job| j.labels().get(GENERATION_LABEL) == Some(&generation.to_string());
    d.delete_jobs = obs.jobs.iter().filter(|j| !current(j)).map(|j| j.name_any()).collect();
    let outcome = match plan {
        Err(errors) => Outcome::new(DatasetPhase::Failed, DatasetReason::InvalidSpec, errors.join("; ")),
        Ok(plan) => steps(ds, plan, obs, generation, &mut d),
    };
    let accepted = match outcome.reason {
        DatasetReason::InvalidSpec => Cond {
            type_: "Accepted",
            status: false,
            reason: DatasetReason::InvalidSpec.into(),
            message: outcome.message.clone(),
        },
        _ => Cond { type_: "Accepted", status: true, reason: DatasetReason::Accepted.into(), message: String::new() },
    };
    let is = |p: DatasetPhase| outcome.phase == p;
    let phase_cond = |type_: &'static str, phase: DatasetPhase| Cond {
        type_,
        status: is(phase),
        reason: if is(phase) { outcome.reason.as_str().into() } else { format!("Not{type_}") },
        message: if is(phase) { outcome.message.clone() } else { String::new() },
    };
    let conds = [
        accepted,
        phase_cond("Preparing", DatasetPhase::Preparing),
        phase_cond("Ready", DatasetPhase::Ready),
        phase_cond("Failed", DatasetPhase::Failed),
    ];
    d.status.conditions = status::conditions(&old.conditions, &conds, Some(generation), now);
    if outcome.phase == DatasetPhase::Failed {
        // The failure's own event says what the last pod did; nothing was retried.
        d.notes.retain(|n| n.reason != DatasetReason::Retried.as_str());
    }
    let changed = old.phase != Some(outcome.phase) || old.reason.as_deref() != Some(outcome.reason.as_str());
    if changed {
        d.notes.push(Note {
            warning: outcome.phase == DatasetPhase::Failed,
            reason: outcome.reason.into(),
            message: outcome.message.clone(),
        });
    }
    d.status.phase = Some(outcome.phase);
    d.status.reason = Some(outcome.reason.into());
    d
}

/// The retries of the current generation's pods into status, with an event when there
/// are more. A running or complete Job's failed pods were all replaced; a failed Job's
/// last ones were not (the pod that failed it, and those it stopped), so its retries are
/// those counted while it ran: the status keeps the largest count seen.
fn count_retries(ds: &TrainingDataset, obs: &Observed, order: &[PrepareStep], generation: i64, d: &mut Decision) {
    let name = ds.name_any();
    let old = ds.status.as_ref().filter(|s| s.observed_generation == Some(generation));
    let replaced: u32 = order
        .iter()
        .filter_map(|s| job_of(obs, &job_name(&name, *s, generation)))
        .filter(|j| finished(j) != Some(false))
        .map(|j| j.status.as_ref().and_then(|s| s.failed).unwrap_or(0) as u32)
        .sum();
    d.status.retries = replaced.max(old.map_or(0, |s| s.retries));
    if d.status.retries > old.map_or(0, |s| s.retries) {
        let why = last_failure(obs, None).map(|(pod, why)| format!("pod {pod} failed: {why}")).unwrap_or_default();
        d.notes.push(Note {
            warning: true,
            reason: DatasetReason::Retried.into(),
            message: format!(
                "{why}; retried, skipping its files already prepared ({} of {} retries)",
                d.status.retries, ds.spec.max_retries
            ),
        });
    }
}

/// The first step of the current generation that is not done: created, waited for, or
/// its failure; Ready when the merge is done.
fn steps(ds: &TrainingDataset, plan: &Prepared, obs: &Observed, generation: i64, d: &mut Decision) -> Outcome {
    let name = ds.name_any();
    let mut order = vec![PrepareStep::Work, PrepareStep::Merge];
    if plan.train_tokenizer {
        order.insert(0, PrepareStep::Tokenizer);
    }
    count_retries(ds, obs, &order, generation, d);
    for step in order {
        let job_name = job_name(&name, step, generation);
        let (preparing, what) = match step {
            PrepareStep::Tokenizer => (DatasetReason::TrainingTokenizer, "training the tokenizer".to_string()),
            PrepareStep::Work => (DatasetReason::Preparing, format!("{} workers preparing the files", ds.spec.workers)),
            PrepareStep::Merge => (DatasetReason::Merging, "writing the manifest".to_string()),
        };
        if step == PrepareStep::Work {
            d.status.progress = Some(work_progress(obs, &job_name, &mut d.status.failed_files));
        }
        let Some(job) = job_of(obs, &job_name) else {
            if stale_pods(obs, generation) > 0 {
                return Outcome::new(
                    DatasetPhase::Preparing,
                    preparing,
                    format!("waiting for {} pod(s) of an earlier spec to stop", stale_pods(obs, generation)),
                );
            }
            d.create = Some(step);
            return Outcome::new(DatasetPhase::Preparing, preparing, format!("{what}: Job {job_name} created"));
        };
        match finished(job) {
            None => return Outcome::new(DatasetPhase::Preparing, preparing, format!("{what} (Job {job_name})")),
            Some(false) => return failure(ds, obs, job),
            Some(true) => {}
        }
        if step == PrepareStep::Work {
            let failed = failed_count(obs, &job_name);
            if failed > u64::from(ds.spec.max_failed_files) {
                let named: Vec<String> =
                    d.status.failed_files.iter().take(3).map(|f| format!("{}: {}", f.file, f.error)).collect();
                return Outcome::new(
                    DatasetPhase::Failed,
                    DatasetReason::FilesFailed,
                    format!(
                        "{failed} input files failed (spec.maxFailedFiles {}): {}",
                        ds.spec.max_failed_files,
                        named.join("; ")
                    ),
                );
            }
        }
        if step == PrepareStep::Merge {
            let Some(report) = pods_of(obs, &job_name).find_map(success_report) else {
                return Outcome::new(
                    DatasetPhase::Failed,
                    DatasetReason::PrepareFailed,
                    format!("Job {job_name} completed without a report in its pod's termination message"),
                );
            };
            return ready(ds, d, &report);
        }
    }
    unreachable!("the merge is the last step")
}

/// Ready: the merge's manifest and totals into status.
fn ready(ds: &TrainingDataset, d: &mut Decision, r: &PrepareReport) -> Outcome {
    let Some(m) = &r.manifest else {
        return Outcome::new(DatasetPhase::Failed, DatasetReason::PrepareFailed, "the merge reported no manifest");
    };
    d.status.manifest = Some(DatasetManifest {
        uri: ds.spec.output.clone(),
        sha256: m.sha256.clone(),
        train_tokens: m.train_tokens,
        validation_tokens: m.validation_tokens,
        tokenizer_hash: m.tokenizer_hash.clone(),
    });
    d.status.shards = Some(m.shards);
    d.status.progress = Some(progress(r.files_done, r.files_total, r.bytes_done, r.bytes_total, r.tokens, None, None));
    d.status.failed_files = bounded_failures(&r.failed);
    let tokens = m.train_tokens + m.validation_tokens;
    Outcome::new(
        DatasetPhase::Ready,
        DatasetReason::Ready,
        format!(
            "{} tokens ({} validation) in {} shards from {} files ({} failed); manifest sha256 {}",
            format_tokens(tokens),
            format_tokens(m.validation_tokens),
            m.shards,
            r.files_total,
            r.failed_count,
            &m.sha256[..m.sha256.len().min(12)]
        ),
    )
}

/// A failed Job: why, from its Job condition and its last failed pod.
fn failure(ds: &TrainingDataset, obs: &Observed, job: &Job) -> Outcome {
    let job_name = job.name_any();
    let cond = job_condition(job, "Failed");
    let (pod, why, storage_full) = match last_failure(obs, Some(&job_name)) {
        Some((pod, why)) => {
            let full = why.starts_with(crds::contract::FailureReason::StorageFull.as_str());
            (pod, why, full)
        }
        None => (String::new(), cond.and_then(|c| c.message.clone()).unwrap_or_default(), false),
    };
    let by = if pod.is_empty() { String::new() } else { format!(" (pod {pod})") };
    if storage_full {
        return Outcome::new(
            DatasetPhase::Failed,
            DatasetReason::StorageFull,
            format!("Job {job_name}{by}: {why}; free space on spec.output or give it more"),
        );
    }
    if cond.and_then(|c| c.reason.as_deref()) == Some("BackoffLimitExceeded") {
        return Outcome::new(
            DatasetPhase::Failed,
            DatasetReason::RetriesExhausted,
            format!(
                "Job {job_name} failed {} times (spec.maxRetries {}){by}: {why}",
                ds.spec.max_retries + 1,
                ds.spec.max_retries
            ),
        );
    }
    Outcome::new(DatasetPhase::Failed, DatasetReason::PrepareFailed, format!("Job {job_name}{by}: {why}"))
}

/// The newest failed pod (of `job`, or of any Job) and why it failed.
fn last_failure(obs: &Observed, job: Option<&str>) -> Option<(String, String)> {
    let mut failed: Vec<(&Pod, &ContainerStateTerminated)> = obs
        .pods
        .iter()
        .filter(|p| job.is_none_or(|j| p.labels().get(JOB_NAME_LABEL).map(String::as_str) == Some(j)))
        .filter_map(|p| terminated(p).filter(|t| t.exit_code != 0).map(|t| (p, t)))
        .collect();
    failed.sort_by_key(|(_, t)| t.finished_at.as_ref().map(|f| f.0));
    let (pod, t) = failed.last()?;
    let text = t.message.clone().unwrap_or_default();
    let why = match TerminationMessage::parse(&text) {
        Some(m) => format!("{}: {}", m.reason.as_str(), m.detail),
        None => {
            let line = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no termination message");
            format!("exit code {}: {}", t.exit_code, line.trim().chars().take(300).collect::<String>())
        }
    };
    Some((pod.name_any(), why))
}

/// The work's progress: per worker, its finished pod's report, else its running pod's
/// `/status`; and the files that failed, into `failed_files`.
fn work_progress(obs: &Observed, job_name: &str, failed_files: &mut Vec<FailedFile>) -> DatasetProgress {
    let mut per_worker: BTreeMap<u32, (PrepareReport, bool)> = BTreeMap::new();
    for pod in pods_of(obs, job_name) {
        let Some(index) = completion_index(pod) else { continue };
        if let Some(r) = success_report(pod) {
            per_worker.insert(index, (r, false));
        } else if let Some(r) = obs.live.get(&pod.name_any()) {
            per_worker.entry(index).or_insert((r.clone(), true));
        }
    }
    let reports: Vec<&(PrepareReport, bool)> = per_worker.values().collect();
    let sum = |f: fn(&PrepareReport) -> u64| reports.iter().map(|(r, _)| f(r)).sum::<u64>();
    let running: Vec<&PrepareReport> = reports.iter().filter(|(_, live)| *live).map(|(r, _)| r).collect();
    let rate = |f: fn(&PrepareReport) -> u64| -> f64 {
        running.iter().filter(|r| r.seconds > 0.0).map(|r| f(r) as f64 / r.seconds).sum()
    };
    let (tokens_per_second, bytes_per_second) = (rate(|r| r.tokens_encoded), rate(|r| r.bytes_done));
    let (bytes_done, bytes_total) = (sum(|r| r.bytes_done), sum(|r| r.bytes_total));
    let eta =
        (bytes_per_second > 0.0).then(|| (bytes_total.saturating_sub(bytes_done) as f64 / bytes_per_second) as u64);
    let failed: Vec<FailedInput> = reports.iter().flat_map(|(r, _)| r.failed.iter().cloned()).collect();
    *failed_files = bounded_failures(&failed);
    progress(
        sum(|r| r.files_done),
        sum(|r| r.files_total),
        bytes_done,
        bytes_total,
        sum(|r| r.tokens),
        (tokens_per_second > 0.0).then_some(tokens_per_second),
        eta,
    )
}

fn failed_count(obs: &Observed, job_name: &str) -> u64 {
    pods_of(obs, job_name).filter_map(success_report).map(|r| r.failed_count.max(r.failed.len() as u64)).sum()
}

fn bounded_failures(failed: &[FailedInput]) -> Vec<FailedFile> {
    let mut files: Vec<FailedFile> = failed
        .iter()
        .map(|f| FailedFile { file: clip(&f.file, bounds::URI - 3), error: clip(&f.error, bounds::REASON - 3) })
        .collect();
    files.sort_by(|a, b| a.file.cmp(&b.file));
    files.dedup_by(|a, b| a.file == b.file);
    files.truncate(bounds::FAILED_FILES);
    files
}

fn progress(
    files_done: u64,
    files_total: u64,
    bytes_done: u64,
    bytes_total: u64,
    tokens: u64,
    tokens_per_second: Option<f64>,
    eta_seconds: Option<u64>,
) -> DatasetProgress {
    let share = if bytes_total > 0 { bytes_done as f64 / bytes_total as f64 } else { 0.0 };
    DatasetProgress {
        files_done,
        files_total,
        bytes_done,
        bytes_total,
        tokens,
        tokens_per_second: tokens_per_second.map(|t| t.round()),
        eta_seconds,
        display: Some(format!("{:.1}%", 100.0 * share)),
        tokens_display: Some(format_tokens(tokens)),
    }
}

fn job_of<'a>(obs: &'a Observed, name: &str) -> Option<&'a Job> {
    obs.jobs.iter().find(|j| j.name_any() == name)
}

fn pods_of<'a>(obs: &'a Observed, job_name: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
    obs.pods.iter().filter(move |p| p.labels().get(JOB_NAME_LABEL).map(String::as_str) == Some(job_name))
}

/// Pods of earlier generations not yet terminated: they may still write parts.
fn stale_pods(obs: &Observed, generation: i64) -> usize {
    obs.pods
        .iter()
        .filter(|p| p.labels().get(GENERATION_LABEL) != Some(&generation.to_string()))
        .filter(|p| matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), None | Some("Pending" | "Running")))
        .count()
}

/// Whether the Job completed (`Some(true)`) or failed (`Some(false)`); `None` while it runs.
fn finished(job: &Job) -> Option<bool> {
    if job_condition(job, "Complete").is_some() {
        return Some(true);
    }
    job_condition(job, "Failed").map(|_| false)
}

fn job_condition<'a>(job: &'a Job, type_: &str) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_ && c.status == "True")
}

/// How the pod's container last terminated.
fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| status.last_state.as_ref()?.terminated.as_ref())
}

/// The report a pod that exited 0 left in its termination message.
fn success_report(pod: &Pod) -> Option<PrepareReport> {
    let t = terminated(pod).filter(|t| t.exit_code == 0)?;
    PrepareReport::parse(t.message.as_deref()?)
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
