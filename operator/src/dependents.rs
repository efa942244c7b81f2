//! Runs that start from another run (`initFrom.trainingRun`), indexed by that run, so a
//! change to a run wakes exactly the runs waiting on it. The index follows the
//! controller's own watch of TrainingRuns: no second watch of every run, and no scan of
//! all of them per event.

use std::collections::{BTreeSet, HashMap};

use crds::TrainingRun;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

/// (namespace, name) of a run.
type RunKey = (String, String);

#[derive(Debug, Default)]
struct Index {
    /// A source run → the runs of its namespace that start from it.
    by_source: HashMap<RunKey, BTreeSet<String>>,
    /// A run → the source it starts from.
    source_of: HashMap<RunKey, String>,
}

impl Index {
    fn key(run: &TrainingRun) -> RunKey {
        (run.namespace().unwrap_or_default(), run.name_any())
    }

    fn set(&mut self, run: &TrainingRun) {
        self.remove(run);
        let Some(source) = run.spec.init_from.as_ref().and_then(|i| i.training_run.clone()) else {
            return;
        };
        let (ns, name) = Self::key(run);
        self.by_source.entry((ns.clone(), source.clone())).or_default().insert(name.clone());
        self.source_of.insert((ns, name), source);
    }

    fn remove(&mut self, run: &TrainingRun) {
        let (ns, name) = Self::key(run);
        let Some(source) = self.source_of.remove(&(ns.clone(), name.clone())) else {
            return;
        };
        let key = (ns, source);
        if let Some(set) = self.by_source.get_mut(&key) {
            set.remove(&name);
            if set.is_empty() {
                self.by_source.remove(&key);
            }
        }
    }

    fn waiting_on(&self, run: &TrainingRun) -> Vec<ObjectRef<TrainingRun>> {
        let (ns, name) = Self::key(run);
        let Some(set) = self.by_source.get(&(ns.clone(), name)) else {
            return Vec::new();
        };
        set.iter().map(|dependent| ObjectRef::new(dependent).within(&ns)).collect()
    }
}

/// The index, kept up to date from watch events.
#[derive(Debug, Default)]
pub struct Dependents {
    index: Index,
    /// The index being rebuilt by a relist, between `Init` and `InitDone`; until then
    /// the old one answers.
    relisted: Option<Index>,
}

impl Dependents {
    /// Follows one event of the watch of TrainingRuns and returns the runs to wake: those
    /// waiting on a run that changed or went. A relist wakes none (the controller
    /// reconciles every listed run anyway).
    pub fn observe(&mut self, event: &Event<TrainingRun>) -> Vec<ObjectRef<TrainingRun>> {
        match event {
            Event::Apply(run) => {
                self.index.set(run);
                self.index.waiting_on(run)
            }
            Event::Delete(run) => {
                self.index.remove(run);
                self.index.waiting_on(run)
            }
            Event::Init => {
                self.relisted = Some(Index::default());
                Vec::new()
            }
            Event::InitApply(run) => {
                self.relisted.get_or_insert_default().set(run);
                Vec::new()
            }
            Event::InitDone => {
                if let Some(index) = self.relisted.take() {
                    self.index = index;
                }
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, GRPO_SPEC, run};

    /// A run named `name` in `ns`, starting from `source` when given.
    fn tr(ns: &str, name: &str, source: Option<&str>) -> TrainingRun {
        let mut r = match source {
            Some(source) => {
                let mut r = run(GRPO_SPEC);
                r.spec.init_from.as_mut().unwrap().training_run = Some(source.into());
                r
            }
            None => run(GPU_SPEC),
        };
        r.metadata.name = Some(name.into());
        r.metadata.namespace = Some(ns.into());
        r
    }

    fn woken(d: &mut Dependents, event: Event<TrainingRun>) -> Vec<String> {
        d.observe(&event).into_iter().map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name)).collect()
    }

    #[test]
    fn a_change_wakes_exactly_the_runs_waiting_on_it() {
        let mut d = Dependents::default();
        let table: Vec<(&str, Event<TrainingRun>, &[&str])> = vec![
            ("a run with no initFrom wakes nothing", Event::Apply(tr("ml", "base", None)), &[]),
            ("grpo starts from base", Event::Apply(tr("ml", "grpo", Some("base"))), &[]),
            ("so does sft", Event::Apply(tr("ml", "sft", Some("base"))), &[]),
            ("base changes: both wake", Event::Apply(tr("ml", "base", None)), &["ml/grpo", "ml/sft"]),
            ("a namesake elsewhere wakes nothing", Event::Apply(tr("other", "base", None)), &[]),
            ("sft now starts from grpo", Event::Apply(tr("ml", "sft", Some("grpo"))), &[]),
            ("base: grpo only", Event::Apply(tr("ml", "base", None)), &["ml/grpo"]),
            ("grpo: sft", Event::Apply(tr("ml", "grpo", Some("base"))), &["ml/sft"]),
            ("grpo is deleted: sft wakes", Event::Delete(tr("ml", "grpo", Some("base"))), &["ml/sft"]),
            ("base: nobody waits any more", Event::Apply(tr("ml", "base", None)), &[]),
        ];
        for (what, event, want) in table {
            assert_eq!(woken(&mut d, event), want, "{what}");
        }
        assert!(!d.index.by_source.contains_key(&("ml".into(), "base".into())), "emptied entries go");
    }

    #[test]
    fn a_relist_replaces_the_index_when_it_is_complete() {
        let mut d = Dependents::default();
        woken(&mut d, Event::Apply(tr("ml", "grpo", Some("base"))));
        woken(&mut d, Event::Apply(tr("ml", "gone", Some("base"))));
        assert!(woken(&mut d, Event::Init).is_empty());
        assert!(woken(&mut d, Event::InitApply(tr("ml", "grpo", Some("base")))).is_empty(), "a relist wakes none");
        woken(&mut d, Event::InitDone);
        assert_eq!(woken(&mut d, Event::Apply(tr("ml", "base", None))), ["ml/grpo"], "gone was not listed again");
    }
}
