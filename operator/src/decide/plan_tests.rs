//! The order of a reconcile's writes, and that a settled run writes nothing, on plans.

use crds::RunConfig;
use crds::contract::{CONFIG_KEY, RunReason};
use crds::types::RunPhase;

use super::*;
use crate::decide::admission;
use crate::decide::world::World;
use crate::resources::testing::GPU_SPEC;

fn t(s: &str) -> Timestamp {
    format!("2026-01-01T{s}Z").parse().unwrap()
}

/// Where the first step that `is` matches stands in the plan.
fn at(plan: &Plan, is: impl Fn(&Step) -> bool) -> usize {
    plan.steps.iter().position(is).unwrap_or_else(|| panic!("no such step in {:#?}", plan.steps))
}

fn is_status(s: &Step) -> bool {
    matches!(s, Step::Status { write: true, .. })
}
fn is_configmap(s: &Step) -> bool {
    matches!(s, Step::Apply(Child::ConfigMap(_)))
}
fn is_job(s: &Step) -> bool {
    matches!(s, Step::Apply(Child::Job(_)))
}

/// A new run: its children, its status (Pending, attempt 1), its events, then its Job,
/// whose ConfigMap was applied first; once settled, a reconcile writes nothing.
#[test]
fn a_new_run_is_built_in_order_and_once_settled_writes_nothing() {
    let mut w = World::new(GPU_SPEC);
    let first = w.reconcile();
    let kinds: Vec<&str> = first
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Apply(Child::ConfigMap(_)) => Some("ConfigMap"),
            Step::Apply(Child::Service(_)) => Some("Service"),
            Step::Apply(Child::Claim(_)) => Some("Claim"),
            Step::Apply(Child::NetworkPolicy(_)) => Some("NetworkPolicy"),
            Step::Apply(Child::Job(_)) => Some("Job"),
            Step::Status { .. } => Some("Status"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["ConfigMap", "Service", "Claim", "Status", "Job"], "{first:#?}");
    assert!(at(&first, is_configmap) < at(&first, is_job));
    let Step::Status { status, .. } = &first.steps[at(&first, is_status)] else { unreachable!() };
    assert_eq!((status.phase, status.attempt), (Some(RunPhase::Pending), 1));
    assert_eq!(first.memory.last_write, Some(w.now));

    w.settle();
    w.advance(std::time::Duration::from_secs(1));
    let again = w.reconcile();
    assert!(!again.writes(), "a settled run writes nothing: {:#?}", again.steps);
}

/// With a NetworkPolicy configured, it is applied with the other children, before the
/// status.
#[test]
fn the_network_policy_is_a_child_applied_before_the_status() {
    let mut w = World::new(GPU_SPEC);
    w.settings.network_policy = Some("ops".into());
    let first = w.reconcile();
    assert!(at(&first, |s| matches!(s, Step::Apply(Child::NetworkPolicy(_)))) < at(&first, is_status));
}

/// A change the gang restarts for: the status that records the restart (attempt 2)
/// first, then the ConfigMap of the new config, then the old attempt's Job goes; the new
/// Job waits for a later reconcile.
#[test]
fn a_restart_is_recorded_before_its_configmap_is_written_and_its_job_goes() {
    let mut w = World::new(GPU_SPEC);
    w.reconcile();
    w.edit_spec(|s| s["topology"]["nodes"] = serde_json::json!(1));
    w.o.admission = admission(&w.o.run, &w.o.datasets, &w.o.accepted);
    let Admission::Admitted { change: Change::Restart { reason, .. }, .. } = &w.o.admission else {
        panic!("a resize restarts the gang: {:?}", w.o.admission)
    };
    assert_eq!(*reason, RunReason::Resized);

    let p = w.reconcile();
    let (status, configmap) = (at(&p, is_status), at(&p, is_configmap));
    let deleted = at(&p, |s| matches!(s, Step::DeleteJob(name) if name == "llm-a1"));
    assert!(status < configmap && configmap < deleted, "{:#?}", p.steps);
    assert!(!p.steps.iter().any(is_job), "the new attempt's Job comes with a later reconcile: {:#?}", p.steps);
    let Step::Status { status, .. } = &p.steps[status] else { unreachable!() };
    assert_eq!((status.phase, status.attempt), (Some(RunPhase::Restarting), 2));
    let Step::Apply(Child::ConfigMap(c)) = &p.steps[configmap] else { unreachable!() };
    let cfg: RunConfig = serde_json::from_str(&c.data.as_ref().unwrap()[CONFIG_KEY]).unwrap();
    assert_eq!(cfg.topology.nodes, 1, "the new config, written once the restart is recorded");
}

/// A spec that does not resolve, and a run waiting for its datasets: a status and its
/// event, no child.
#[test]
fn an_invalid_or_waiting_run_writes_only_its_status_and_events() {
    let invalid = World::new(&GPU_SPEC.replace("preset: tiny", "preset: tinyy"));
    let mut waiting = World::new(GPU_SPEC);
    waiting.o.datasets = Datasets::Waiting("waiting for TrainingDataset web (not found)".into());
    for (mut w, phase) in [(invalid, RunPhase::Failed), (waiting, RunPhase::Waiting)] {
        let p = w.reconcile();
        assert!(p.steps.iter().all(|s| matches!(s, Step::Status { .. } | Step::Publish(_))), "{:#?}", p.steps);
        let Step::Status { status, write: true, .. } = &p.steps[0] else { panic!("{:#?}", p.steps) };
        assert_eq!(status.phase, Some(phase));
        assert!(p.steps.len() > 1, "an event says why: {:#?}", p.steps);
    }
}

/// A refused answer of rank 0's raises a Warning event after the status, at most every
/// ten minutes.
#[test]
fn a_refused_answer_raises_an_event_at_most_every_ten_minutes() {
    let mut w = World::new(GPU_SPEC);
    w.reconcile();
    w.o.poll = Poll::Failed(PollError::Refused("GET http://x/status: refused: not a trainer status document".into()));
    let refusals = |p: &Plan| {
        let told = |s: &&Step| matches!(s, Step::Publish(n) if n.reason == STATUS_REFUSED);
        (p.steps.iter().filter(told).count(), p.steps.iter().position(|s| told(&s)))
    };
    let p = plan(&w.o, &w.settings, t("00:01:00"));
    let (count, told_at) = refusals(&p);
    assert_eq!(count, 1, "{:#?}", p.steps);
    assert!(told_at > p.steps.iter().position(|s| matches!(s, Step::Status { .. })));
    assert_eq!(p.memory.last_refusal_event, Some(t("00:01:00")));
    w.o.memory = p.memory.clone();
    assert_eq!(refusals(&plan(&w.o, &w.settings, t("00:05:00"))).0, 0);
    assert_eq!(refusals(&plan(&w.o, &w.settings, t("00:11:00"))).0, 1);
}
