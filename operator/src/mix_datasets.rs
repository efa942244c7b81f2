//! A run whose mix names TrainingDatasets: held (phase Waiting, `Waiting=True` naming
//! each dataset with its progress) until every one is Ready, then trained on their
//! manifests. The judging is pure; [`look_up`] reads the datasets.

use std::collections::BTreeMap;

use crds::TrainingRun;
use crds::contract::RunReason;
use crds::types::{DatasetPhase, TrainingDataset, TrainingRunStatus};
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

use crate::status::{self, Cond};
use crate::{Error, Verb};

/// The condition on runs whose mix names datasets.
pub const WAITING: &str = "Waiting";

/// What the run trains on, or why it waits.
#[derive(Clone, Debug)]
pub enum Gate {
    /// Every dataset has a manifest: the run with their URIs in place of their names.
    Ready(TrainingRun),
    /// `run` carries placeholder URIs, only for checking the rest of its spec.
    Waiting { run: TrainingRun, message: String },
}

/// Each dataset the run names, `None` where it does not exist.
pub async fn look_up(
    client: &kube::Client,
    run: &TrainingRun,
) -> Result<BTreeMap<String, Option<TrainingDataset>>, Error> {
    let ns = run.namespace().unwrap_or_default();
    let api: Api<TrainingDataset> = Api::namespaced(client.clone(), &ns);
    let mut found = BTreeMap::new();
    for name in crds::resolve::named_datasets(run) {
        let ds = api.get_opt(&name).await.map_err(Error::kube(Verb::Get, "TrainingDataset", &ns, &name))?;
        found.insert(name, ds);
    }
    Ok(found)
}

/// The run as it trains, or why it waits. A run that has started keeps training on the
/// manifest it started on while its dataset prepares again (a changed spec).
pub fn judge(run: &TrainingRun, datasets: &BTreeMap<String, Option<TrainingDataset>>, started: bool) -> Gate {
    let uri_of = |name: &str| -> Option<String> {
        let ds = datasets.get(name)?.as_ref()?;
        if started {
            return ds.status.as_ref()?.manifest.as_ref().map(|m| m.uri.clone());
        }
        crds::resolve::ready_uri(ds).map(str::to_string)
    };
    match crds::resolve::with_datasets(run, uri_of) {
        Ok(ready) => Gate::Ready(ready),
        Err(missing) => {
            let placeholder = crds::resolve::with_datasets(run, |n| Some(format!("s3://dataset-pending/{n}")))
                .expect("every name has a placeholder");
            let each: Vec<String> =
                missing.iter().map(|n| describe(n, datasets.get(n).and_then(Option::as_ref))).collect();
            Gate::Waiting { run: placeholder, message: format!("waiting for TrainingDataset {}", each.join("; ")) }
        }
    }
}

/// "web (Preparing, 42.1%, 3 of 7 files, 1.2M tokens)".
fn describe(name: &str, ds: Option<&TrainingDataset>) -> String {
    let Some(ds) = ds else { return format!("{name} (not found)") };
    let Some(s) = &ds.status else { return format!("{name} (not prepared yet)") };
    let phase = match s.phase {
        Some(DatasetPhase::Failed) => format!("Failed: {}", s.reason.clone().unwrap_or_default()),
        Some(p) => format!("{p:?}"),
        None => "Pending".into(),
    };
    match &s.progress {
        Some(p) => format!(
            "{name} ({phase}, {}, {} of {} files, {} tokens)",
            p.display.clone().unwrap_or_default(),
            p.files_done,
            p.files_total,
            p.tokens_display.clone().unwrap_or_default()
        ),
        None => format!("{name} ({phase})"),
    }
}

/// `status` with the Waiting condition of a run whose mix names datasets: True with
/// `waiting`'s message, else False once they are all Ready.
pub fn with_waiting_condition(
    old: &TrainingRunStatus,
    status: &mut TrainingRunStatus,
    waiting: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let cond = match waiting {
        Some(message) => {
            Cond { type_: WAITING, status: true, reason: RunReason::WaitingForDataset.into(), message: message.into() }
        }
        None => Cond {
            type_: WAITING,
            status: false,
            reason: RunReason::DatasetsReady.into(),
            message: "every TrainingDataset of the mix is Ready".into(),
        },
    };
    let old_waiting: Vec<_> = old.conditions.iter().filter(|c| c.type_ == WAITING).cloned().collect();
    let new = status::conditions(&old_waiting, &[cond], generation, now);
    status.conditions.retain(|c| c.type_ != WAITING);
    status.conditions.extend(new);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::types::{DatasetManifest, DatasetProgress, TrainingDatasetStatus};

    fn run() -> TrainingRun {
        crds::manifest::from_yaml(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {name: r, namespace: ml}\n\
             spec:\n  model: {preset: nano}\n  tokens: 1M\n  topology: {nodes: 1, gpusPerNode: 0}\n  \
             batch: {globalTokens: 8192, microBatch: 8, seqLength: 256}\n  data:\n    mix:\n      \
             - {name: web, weight: 0.5, dataset: web}\n      - {name: pdf, weight: 0.5, dataset: pdf}\n",
            "run.yaml",
        )
        .unwrap()
    }

    fn dataset(name: &str, phase: DatasetPhase, manifest: bool) -> Option<TrainingDataset> {
        let mut ds: TrainingDataset = serde_yaml_ng::from_str(&format!(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingDataset\nmetadata: {{name: {name}}}\n\
             spec: {{source: {{uris: ['pvc://raw/{name}']}}, tokenizer: {{embedded: true}}, output: 'pvc://prepared/{name}'}}\n"
        ))
        .unwrap();
        ds.status = Some(TrainingDatasetStatus {
            phase: Some(phase),
            progress: Some(DatasetProgress {
                files_done: 3,
                files_total: 7,
                display: Some("42.1%".into()),
                tokens_display: Some("1.2M".into()),
                ..Default::default()
            }),
            manifest: manifest.then(|| DatasetManifest { uri: format!("pvc://prepared/{name}"), ..Default::default() }),
            ..Default::default()
        });
        Some(ds)
    }

    fn uris(r: &TrainingRun) -> Vec<String> {
        r.spec.data.as_ref().unwrap().mix.iter().map(|m| m.uri.clone().unwrap()).collect()
    }

    #[test]
    fn a_run_waits_for_every_dataset_and_names_each_with_its_progress() {
        /// The datasets, whether the run started, and its URIs or what its message names.
        struct Case {
            what: &'static str,
            datasets: BTreeMap<String, Option<TrainingDataset>>,
            started: bool,
            expect: Result<Vec<&'static str>, Vec<&'static str>>,
        }
        let case = |what, datasets, started, expect| Case { what, datasets, started, expect };
        let cases = vec![
            case(
                "both ready",
                [
                    ("web".into(), dataset("web", DatasetPhase::Ready, true)),
                    ("pdf".into(), dataset("pdf", DatasetPhase::Ready, true)),
                ]
                .into(),
                false,
                Ok(vec!["pvc://prepared/web", "pvc://prepared/pdf"]),
            ),
            case(
                "one preparing, one missing",
                [("web".into(), dataset("web", DatasetPhase::Preparing, false)), ("pdf".into(), None)].into(),
                false,
                Err(vec!["web (Preparing, 42.1%, 3 of 7 files, 1.2M tokens)", "pdf (not found)"]),
            ),
            case(
                "preparing again after a change, before the run started",
                [
                    ("web".into(), dataset("web", DatasetPhase::Preparing, true)),
                    ("pdf".into(), dataset("pdf", DatasetPhase::Ready, true)),
                ]
                .into(),
                false,
                Err(vec!["web (Preparing"]),
            ),
            case(
                "preparing again after a change, the run started",
                [
                    ("web".into(), dataset("web", DatasetPhase::Preparing, true)),
                    ("pdf".into(), dataset("pdf", DatasetPhase::Ready, true)),
                ]
                .into(),
                true,
                Ok(vec!["pvc://prepared/web", "pvc://prepared/pdf"]),
            ),
            case(
                "failed",
                [
                    ("web".into(), dataset("web", DatasetPhase::Failed, false)),
                    ("pdf".into(), dataset("pdf", DatasetPhase::Ready, true)),
                ]
                .into(),
                false,
                Err(vec!["web (Failed: "]),
            ),
        ];
        for Case { what, datasets, started, expect } in cases {
            match (judge(&run(), &datasets, started), expect) {
                (Gate::Ready(r), Ok(want)) => assert_eq!(uris(&r), want, "{what}"),
                (Gate::Waiting { run, message }, Err(needles)) => {
                    for n in needles {
                        assert!(message.contains(n), "{what}: {n:?} in {message}");
                    }
                    assert!(crds::resolve(&run).is_ok(), "{what}: the placeholders resolve");
                }
                (g, e) => panic!("{what}: {g:?}, expected {e:?}"),
            }
        }
    }

    #[test]
    fn the_waiting_condition_flips_once_and_keeps_its_time() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut s = TrainingRunStatus::default();
        with_waiting_condition(
            &TrainingRunStatus::default(),
            &mut s,
            Some("waiting for TrainingDataset web"),
            Some(1),
            t0,
        );
        assert_eq!(s.conditions.len(), 1);
        let old = s.clone();
        let mut again = old.clone();
        with_waiting_condition(&old, &mut again, Some("waiting for TrainingDataset web (Preparing)"), Some(1), t1);
        assert_eq!(again.conditions[0].last_transition_time.0, t0, "still waiting");
        let mut ready = old.clone();
        with_waiting_condition(&old, &mut ready, None, Some(1), t1);
        let c = &ready.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str(), c.last_transition_time.0), ("False", "DatasetsReady", t1));
    }
}
