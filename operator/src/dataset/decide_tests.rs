use serde_json::json;

use super::*;
use crate::dataset::validate::validate;
use crds::contract::prepare::MergedManifest;

fn dataset(train: bool) -> TrainingDataset {
    let tokenizer = if train { "{train: {vocabSize: 512}}" } else { "{embedded: true}" };
    let mut ds: TrainingDataset = serde_yaml_ng::from_str(&format!(
        "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingDataset\n\
         metadata: {{name: web, namespace: ml, generation: 2}}\n\
         spec: {{source: {{uris: ['pvc://raw/web']}}, tokenizer: {tokenizer}, output: 'pvc://prepared/web', workers: 3, maxFailedFiles: 1}}\n"
    ))
    .unwrap();
    ds.metadata.uid = Some("u".into());
    ds
}

fn job(name: &str, generation: i64, condition: Option<(&str, &str)>, failed: i32) -> Job {
    let mut conditions = vec![];
    if let Some((type_, reason)) = condition {
        conditions.push(json!({"type": type_, "status": "True", "reason": reason, "message": reason}));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "labels": {GENERATION_LABEL: generation.to_string()}},
        "status": {"conditions": conditions, "failed": failed},
    }))
    .unwrap()
}

/// A pod of `job`: running (`exit` None) or terminated with `exit` and `message`.
fn pod(name: &str, job: &str, generation: i64, index: u32, exit: Option<(i32, String)>) -> Pod {
    let (phase, state) = match &exit {
        None => ("Running", json!({"running": {}})),
        Some((code, message)) => (
            if *code == 0 { "Succeeded" } else { "Failed" },
            json!({"terminated": {"exitCode": code, "message": message, "finishedAt": "2026-11-27T10:00:00Z"}}),
        ),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml",
            "labels": {"job-name": job, GENERATION_LABEL: generation.to_string()},
            "annotations": {"batch.kubernetes.io/job-completion-index": index.to_string()}},
        "status": {"phase": phase, "containerStatuses": [{"name": "prepare", "image": "t", "imageID": "",
            "ready": false, "restartCount": 0, "state": state}]},
    }))
    .unwrap()
}

fn report(files: u64, bytes: u64, tokens: u64, failed: &[&str], done: bool) -> PrepareReport {
    PrepareReport {
        step: PrepareStep::Work,
        files_total: files,
        files_done: if done { files } else { files / 2 },
        bytes_total: bytes,
        bytes_done: if done { bytes } else { bytes / 2 },
        tokens,
        tokens_encoded: tokens,
        seconds: 10.0,
        failed: failed
            .iter()
            .map(|f| FailedInput { file: f.to_string(), error: "missing column text".into() })
            .collect(),
        failed_count: failed.len() as u64,
        manifest: None,
        done,
    }
}

fn decided(ds: &TrainingDataset, obs: &Observed) -> Decision {
    decide(ds, &validate(ds), obs, Timestamp::from_second(1_000_000).unwrap())
}

fn summary(d: &Decision) -> (DatasetPhase, String, Option<PrepareStep>) {
    (d.status.phase.unwrap(), d.status.reason.clone().unwrap(), d.create)
}

/// A table row: the Jobs there are, and the phase, reason and Job to create.
struct Case {
    what: &'static str,
    train: bool,
    jobs: Vec<Job>,
    expect: (DatasetPhase, &'static str, Option<PrepareStep>),
}

#[test]
fn each_step_starts_when_the_one_before_completed() {
    use DatasetPhase::*;
    use PrepareStep::*;
    let done = |j: &str| job(j, 2, Some(("Complete", "Completed")), 0);
    let running = |j: &str| job(j, 2, None, 0);
    let cases = vec![
        Case { what: "nothing yet", train: false, jobs: vec![], expect: (Preparing, "Preparing", Some(Work)) },
        Case {
            what: "a tokenizer to train first",
            train: true,
            jobs: vec![],
            expect: (Preparing, "TrainingTokenizer", Some(Tokenizer)),
        },
        Case {
            what: "the tokenizer training",
            train: true,
            jobs: vec![running("web-tokenizer-g2")],
            expect: (Preparing, "TrainingTokenizer", None),
        },
        Case {
            what: "the tokenizer trained",
            train: true,
            jobs: vec![done("web-tokenizer-g2")],
            expect: (Preparing, "Preparing", Some(Work)),
        },
        Case {
            what: "the workers working",
            train: false,
            jobs: vec![running("web-work-g2")],
            expect: (Preparing, "Preparing", None),
        },
        Case {
            what: "the workers done",
            train: false,
            jobs: vec![done("web-work-g2")],
            expect: (Preparing, "Merging", Some(Merge)),
        },
        Case {
            what: "merging",
            train: false,
            jobs: vec![done("web-work-g2"), running("web-merge-g2")],
            expect: (Preparing, "Merging", None),
        },
    ];
    for Case { what, train, jobs, expect: (phase, reason, create) } in cases {
        let d = decided(&dataset(train), &Observed { jobs, ..Default::default() });
        assert_eq!(summary(&d), (phase, reason.to_string(), create), "{what}");
    }
}

#[test]
fn progress_sums_finished_and_running_workers_and_names_failed_files() {
    let ds = dataset(false);
    let finished = serde_json::to_string(&report(4, 4000, 900, &["b/bad.parquet"], true)).unwrap();
    let obs = Observed {
        jobs: vec![job("web-work-g2", 2, None, 1)],
        pods: vec![
            pod("w0", "web-work-g2", 2, 0, Some((0, finished))),
            pod("w1", "web-work-g2", 2, 1, None),
            pod("w2-killed", "web-work-g2", 2, 2, Some((137, "Killed".into()))),
            pod("w2", "web-work-g2", 2, 2, None),
        ],
        live: [("w1".into(), report(4, 2000, 300, &[], false)), ("w2".into(), report(2, 1000, 100, &[], false))].into(),
        ..Default::default()
    };
    let d = decided(&ds, &obs);
    let p = d.status.progress.clone().unwrap();
    assert_eq!((p.files_done, p.files_total), (4 + 2 + 1, 10));
    assert_eq!((p.bytes_done, p.bytes_total, p.tokens), (4000 + 1000 + 500, 7000, 1300));
    assert_eq!(p.tokens_per_second, Some(40.0), "the running workers' encoding rate");
    assert_eq!(p.eta_seconds, Some(10), "1500 bytes left at 150 B/s");
    assert_eq!(p.display.as_deref(), Some("78.6%"));
    assert_eq!(
        d.status.failed_files,
        [FailedFile { file: "b/bad.parquet".into(), error: "missing column text".into() }]
    );
    assert_eq!(d.status.retries, 1);
    assert!(d.notes.iter().any(|n| n.reason == "Retried" && n.message.contains("w2-killed")), "{:?}", d.notes);
}

#[test]
fn too_many_failed_files_fail_the_dataset_naming_them_and_the_merge_makes_it_ready() {
    let ds = dataset(false);
    let done = job("web-work-g2", 2, Some(("Complete", "Completed")), 0);
    let two_bad = serde_json::to_string(&report(3, 10, 10, &["a.parquet", "b.parquet"], true)).unwrap();
    let obs = Observed {
        jobs: vec![done.clone()],
        pods: vec![pod("w0", "web-work-g2", 2, 0, Some((0, two_bad)))],
        ..Default::default()
    };
    let d = decided(&ds, &obs);
    assert_eq!(summary(&d), (DatasetPhase::Failed, "FilesFailed".into(), None));
    let message = &d.notes[0].message;
    assert!(
        message.contains("2 input files failed (spec.maxFailedFiles 1)")
            && message.contains("a.parquet: missing column"),
        "{message}"
    );

    let merged = PrepareReport {
        step: PrepareStep::Merge,
        files_total: 9,
        files_done: 9,
        tokens: 5000,
        manifest: Some(MergedManifest {
            sha256: "ab".repeat(32),
            train_tokens: 4900,
            validation_tokens: 100,
            shards: 11,
            tokenizer_hash: "t".into(),
        }),
        done: true,
        ..Default::default()
    };
    let obs = Observed {
        jobs: vec![done, job("web-merge-g2", 2, Some(("Complete", "Completed")), 0)],
        pods: vec![pod("m", "web-merge-g2", 2, 0, Some((0, merged.to_json())))],
        users: vec!["llm".into()],
        ..Default::default()
    };
    let d = decided(&ds, &obs);
    assert_eq!(summary(&d), (DatasetPhase::Ready, "Ready".into(), None));
    let m = d.status.manifest.clone().unwrap();
    assert_eq!((m.uri.as_str(), m.train_tokens, m.validation_tokens), ("pvc://prepared/web", 4900, 100));
    assert_eq!((d.status.shards, d.status.used_by.clone()), (Some(11), vec!["llm".to_string()]));
    let ready = d.status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.observed_generation), ("True", Some(2)));
}

#[test]
fn a_failed_job_says_why_and_a_new_generation_replaces_the_old_jobs() {
    let ds = dataset(false);
    let full = TerminationMessage {
        reason: crds::contract::FailureReason::StorageFull,
        step: None,
        detail: "writing part-00003: No space left on device".into(),
        samples: None,
    };
    let cases = [
        (("FailJob", "PodFailurePolicy"), 89, full.to_json(), "StorageFull", "No space left on device"),
        (
            ("Failed", "BackoffLimitExceeded"),
            137,
            "Killed".to_string(),
            "RetriesExhausted",
            "failed 4 times (spec.maxRetries 3)",
        ),
    ];
    for ((_, reason), code, message, want, needle) in cases {
        let obs = Observed {
            jobs: vec![job("web-work-g2", 2, Some(("Failed", reason)), 1)],
            pods: vec![pod("w1", "web-work-g2", 2, 1, Some((code, message)))],
            ..Default::default()
        };
        let d = decided(&ds, &obs);
        assert_eq!(summary(&d), (DatasetPhase::Failed, want.into(), None));
        assert!(d.notes[0].warning && d.notes[0].message.contains(needle), "{want}: {:?}", d.notes);
    }
    // Generation 1's Jobs go; generation 2's work waits for their pods to stop.
    let obs = Observed {
        jobs: vec![job("web-work-g1", 1, None, 0)],
        pods: vec![pod("old", "web-work-g1", 1, 0, None)],
        ..Default::default()
    };
    let d = decided(&ds, &obs);
    assert_eq!(d.delete_jobs, ["web-work-g1"]);
    assert_eq!(summary(&d), (DatasetPhase::Preparing, "Preparing".into(), None));
    let d = decided(&ds, &Observed { jobs: vec![job("web-work-g1", 1, None, 0)], ..Default::default() });
    assert_eq!(d.create, Some(PrepareStep::Work), "no pod of generation 1 left");
}

#[test]
fn an_invalid_spec_fails_with_every_field_named() {
    let mut ds = dataset(false);
    ds.spec.source.uris = vec!["http://example.org/a.jsonl".into()];
    let d = decided(&ds, &Observed::default());
    assert_eq!(summary(&d), (DatasetPhase::Failed, "InvalidSpec".into(), None));
    let accepted = d.status.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
    assert!(accepted.status == "False" && accepted.message.contains("spec.source.uris[0]"), "{accepted:?}");
}

#[test]
fn retries_count_replaced_pods_not_the_last_ones_of_a_failed_job() {
    let retried = |d: &Decision| d.notes.iter().filter(|n| n.reason == "Retried").count();
    let mut ds = dataset(false);
    // Running, two pods failed and were replaced.
    let obs = Observed { jobs: vec![job("web-work-g2", 2, None, 2)], ..Default::default() };
    let d = decided(&ds, &obs);
    assert_eq!((d.status.retries, retried(&d)), (2, 1));
    // Failed at its first failure (exit 89, FailJob), its two siblings stopped with it: no retry.
    let obs =
        Observed { jobs: vec![job("web-work-g2", 2, Some(("Failed", "PodFailurePolicy")), 3)], ..Default::default() };
    let d = decided(&ds, &obs);
    assert_eq!((d.status.retries, retried(&d)), (0, 0));
    // Failed after its retries: the count seen while it ran stays, and says nothing new.
    ds.status = Some(TrainingDatasetStatus { observed_generation: Some(2), retries: 3, ..Default::default() });
    let obs = Observed {
        jobs: vec![job("web-work-g2", 2, Some(("Failed", "BackoffLimitExceeded")), 4)],
        ..Default::default()
    };
    let d = decided(&ds, &obs);
    assert_eq!((d.status.retries, retried(&d)), (3, 0));
}
