//! Issue 45: a TrainingDataset prepared by the chart's operator on the real control
//! plane, and a run that waits for it and trains on it. The raw text is the licence
//! corpus (/usr/share/common-licenses) and this repository's docs, one text file each,
//! three times over, on a claim of the cluster's hostPath provisioner.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crds::types::{DatasetPhase, RunPhase, TrainingDataset, TrainingDatasetStatus};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use sha2::{Digest, Sha256};

use crate::harness::*;
use crate::scenario::{MINUTES, NS, Scenario};

const TDS: &str = "training.puretransformer.dev/v1alpha1";

/// Milliseconds each worker sleeps before each file it prepares: a worker can be killed
/// between two of its files whatever the machine's speed.
const PACE_MS: &str = "400";

pub(crate) fn dataset(name: &str, spec: &str) -> String {
    format!("apiVersion: {TDS}\nkind: TrainingDataset\nmetadata: {{name: {name}}}\nspec:\n{spec}")
}

pub(crate) fn claim(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}}}\nspec:\n  storageClassName: standard\n  \
         accessModes: [ReadWriteMany]\n  resources: {{requests: {{storage: 1Gi}}}}\n"
    )
}

/// The directory behind claim `name`, once bound.
pub(crate) async fn claim_dir(sim: &Scenario, name: &str) -> PathBuf {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(sim.c.client.clone(), NS);
    let start = Instant::now();
    loop {
        let c = claims.get(name).await.unwrap_or_else(|e| panic!("claim {name}: {e}"));
        if let Some(volume) = c.spec.and_then(|s| s.volume_name).filter(|v| !v.is_empty()) {
            let pv = Api::<PersistentVolume>::all(sim.c.client.clone()).get(&volume).await.unwrap();
            let path = pv.spec.and_then(|s| s.host_path).map(|h| h.path).expect("a hostPath volume");
            return PathBuf::from(path);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "claim {name} never bound\n{}", sim.c.dump(NS));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The raw files: every licence text and doc, three times, as `copy-N/<name>.txt`.
fn write_raw(dir: &std::path::Path) -> usize {
    let mut sources: Vec<PathBuf> = std::fs::read_dir("/usr/share/common-licenses")
        .expect("the licence corpus")
        .chain(std::fs::read_dir(repo().join("docs")).expect("docs"))
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.is_file())
        .collect();
    sources.sort();
    let mut files = 0;
    for copy in 0..3 {
        let sub = dir.join(format!("copy-{copy}"));
        std::fs::create_dir_all(&sub).unwrap();
        for src in &sources {
            let text = std::fs::read_to_string(src).unwrap_or_default();
            if text.trim().is_empty() {
                continue;
            }
            let name = src.file_name().unwrap().to_string_lossy().replace('.', "_");
            std::fs::write(sub.join(format!("{name}.txt")), format!("copy {copy} of {name}\n\n{text}")).unwrap();
            files += 1;
        }
    }
    files
}

fn datasets(sim: &Scenario) -> Api<TrainingDataset> {
    Api::namespaced(sim.c.client.clone(), NS)
}

async fn ds_status(sim: &Scenario, name: &str) -> TrainingDatasetStatus {
    let ds = datasets(sim).get(name).await.unwrap_or_else(|e| panic!("TrainingDataset {name}: {e}"));
    ds.status.unwrap_or_default()
}

pub(crate) async fn wait_ds(
    sim: &Scenario,
    name: &str,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&TrainingDatasetStatus) -> bool,
) -> TrainingDatasetStatus {
    let start = Instant::now();
    loop {
        let s = ds_status(sim, name).await;
        if ok(&s) {
            return s;
        }
        if start.elapsed() > timeout {
            let events = kubectl(
                &sim.c,
                &["-n", NS, "get", "events", "--field-selector", &format!("involvedObject.name={name}")],
            );
            panic!(
                "TrainingDataset {name}: {what} not seen within {timeout:?}; status: {s:#?}\n{events}\n{}",
                sim.c.dump(NS)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Dataset `web` prepared by 3 workers after a trained tokenizer, one worker killed
/// midway and retried (its files already prepared are skipped) and the operator killed
/// and restarted, to the same manifest
/// one `trainer prepare` process writes from the same files; run `llm` waits for it
/// (phase Waiting, Waiting=True naming it with its progress), then trains on it to
/// Succeeded; deleting `web` while `llm` runs is refused with an event naming the run,
/// and done once the run ends. Dataset `bad`: a corrupt Parquet file is named in its
/// status and events, and fails it (maxFailedFiles 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_is_prepared_in_parallel_resumed_and_trained_on() {
    let mut sim = Scenario::with_nodes(2).await;
    apply(&sim.c, NS, &claim("raw"));
    apply(&sim.c, NS, &claim("prepared"));
    let raw = claim_dir(&sim, "raw").await;
    let files = write_raw(&raw.join("web"));
    assert!(files >= 30, "{files} raw files");
    std::fs::create_dir_all(raw.join("bad")).unwrap();
    std::fs::write(raw.join("bad/good.txt"), "a fine document\n\nand another").unwrap();
    std::fs::write(raw.join("bad/broken.parquet"), b"PAR1 this is not a parquet file").unwrap();

    let web = format!(
        "  source: {{uris: ['pvc://raw/web/**/*.txt'], format: text}}\n  tokenizer: {{train: {{vocabSize: 1024, sampleBytes: 256K}}}}\n  \
         output: pvc://prepared/web\n  workers: 3\n  shardTokens: 16K\n  validationFraction: 0.1\n  seed: 5\n  \
         env: [{{name: TRAINER_INJECT_SLOW_FILE_MS, value: '{PACE_MS}'}}]\n"
    );
    apply(&sim.c, NS, &dataset("web", &web));
    apply(
        &sim.c,
        NS,
        &dataset(
            "bad",
            "  source: {uris: ['pvc://raw/bad']}\n  tokenizer: {embedded: true}\n  output: pvc://prepared/bad\n",
        ),
    );
    sim.apply(
        "llm",
        r#"  model: {preset: nano, tokenizer: "pvc://prepared/web/tokenizer.json", vocabSize: 1024}
  tokens: 16K
  data:
    mix:
      - {name: web, weight: 1.0, dataset: web}
    validation: {tokens: 2K}
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {globalTokens: 1024, microBatch: 4, seqLength: 64}
  optimizer: {lr: 3.0e-3, warmupTokens: 1K}
  checkpoint: {everySteps: 8}
"#,
    );

    // --- The run waits, naming the dataset and its progress.
    let waiting = sim.wait("llm", "Waiting for its dataset", MINUTES(1), |s| s.phase == Some(RunPhase::Waiting)).await;
    assert_eq!(waiting.reason.as_deref(), Some("WaitingForDataset"));
    let (status, reason, message) = sim.condition("llm", "Waiting");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "WaitingForDataset"));
    assert!(message.contains("TrainingDataset web ("), "{message}");
    let columns = kubectl(&sim.c, &["-n", NS, "get", "trainingrun", "llm"]);
    assert!(columns.contains("Waiting"), "kubectl get tr shows it:\n{columns}");

    // --- The tokenizer first, then 3 workers; one is killed between two files.
    wait_ds(&sim, "web", "the tokenizer trained", MINUTES(2), |s| s.reason.as_deref() == Some("Preparing")).await;
    let worker = sim.pod("web-work-g1", 1).await;
    let before = wait_ds(&sim, "web", "a file prepared", MINUTES(2), |s| {
        s.progress.as_ref().is_some_and(|p| p.files_done >= 2 && p.files_done < p.files_total)
    })
    .await;
    let p = before.progress.clone().unwrap();
    assert!(p.tokens > 0 && p.bytes_done > 0 && p.display.is_some(), "{p:?}");
    sim.c.signal_pod(NS, &worker, libc::SIGKILL).unwrap_or_else(|e| panic!("{e}"));
    let waiting_message = sim.condition("llm", "Waiting").2;
    assert!(waiting_message.contains("web (Preparing, "), "progress in the run's condition: {waiting_message}");
    // The operator crashes mid-preparation: what it knows is in the Jobs and the status.
    sim.kill_operator();
    sim.operator_restarted();

    // --- Ready: the manifest of one process over the same files.
    let ready = wait_ds(&sim, "web", "Ready", MINUTES(4), |s| s.phase == Some(DatasetPhase::Ready)).await;
    assert_eq!(ready.retries, 1, "the killed worker was retried once: {ready:#?}");
    let reasons = event_reasons(&sim.c, NS, "web");
    assert!(reasons.iter().any(|r| r == "Retried"), "{reasons:?}");
    let manifest = ready.manifest.clone().expect("a Ready dataset has its manifest");
    assert_eq!(manifest.uri, "pvc://prepared/web");
    let prepared = claim_dir(&sim, "prepared").await.join("web");
    let bytes = std::fs::read(prepared.join("manifest.json")).expect("manifest.json on the claim");
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(manifest.sha256, digest, "status names the manifest's digest");
    let p = ready.progress.clone().unwrap();
    assert_eq!((p.files_done, p.files_total), (files as u64, files as u64));
    assert_eq!(p.display.as_deref(), Some("100.0%"));
    assert!(ready.shards.unwrap_or_default() >= 2 && ready.failed_files.is_empty(), "{ready:#?}");
    let one = tempfile_dir("one-process");
    let o = std::process::Command::new(workspace_binary("trainer"))
        .args(["prepare", "--input"])
        .arg(raw.join("web/**/*.txt"))
        .args(["--format", "text", "--name", "web", "--tokenizer"])
        .arg(prepared.join("tokenizer.json"))
        .args(["--shard-tokens", "16000", "--validation-fraction", "0.1", "--seed", "5", "--output"])
        .arg(&one)
        .env("RUST_LOG", "warn")
        .output()
        .expect("trainer prepare");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let alone = std::fs::read(one.join("manifest.json")).unwrap();
    let alone: serde_json::Value = serde_json::from_slice(&alone).unwrap();
    let cluster: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    for key in ["train", "validation", "tokenizer", "input"] {
        assert_eq!(alone[key], cluster[key], "{key}: 3 workers with a kill give what one process gives");
    }

    // --- The run trains on it; deleting the dataset meanwhile is refused.
    sim.wait_phase("llm", RunPhase::Running, MINUTES(2)).await;
    let (status, reason, _) = sim.condition("llm", "Waiting");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "DatasetsReady"));
    wait_ds(&sim, "web", "usedBy", MINUTES(1), |s| s.used_by == ["llm"]).await;
    kubectl(&sim.c, &["-n", NS, "delete", "trainingdataset", "web", "--wait=false"]);
    let start = Instant::now();
    while !event_reasons(&sim.c, NS, "web").iter().any(|r| r == "InUse") {
        assert!(start.elapsed() < Duration::from_secs(60), "no InUse event: {:?}", event_reasons(&sim.c, NS, "web"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let notes = kubectl(
        &sim.c,
        &[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=web,reason=InUse",
            "-o",
            "jsonpath={.items[*].message}",
        ],
    );
    assert!(notes.contains("llm"), "the event names the run: {notes}");
    assert!(sim.exists("trainingdataset", "web"), "deletion waits while llm uses it");
    let done = sim.wait_phase("llm", RunPhase::Succeeded, MINUTES(4)).await;
    let trained = done.progress.expect("progress");
    assert!(trained.tokens > 0 && trained.tokens == trained.total_tokens, "{trained:?}");
    let start = Instant::now();
    while sim.exists("trainingdataset", "web") {
        assert!(start.elapsed() < Duration::from_secs(60), "web is deleted once llm ended\n{}", sim.c.dump(NS));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(prepared.join("manifest.json").exists(), "the prepared shards outlive the resource");

    // --- The bad file, by name.
    let bad = wait_ds(&sim, "bad", "Failed", MINUTES(2), |s| s.phase == Some(DatasetPhase::Failed)).await;
    assert_eq!(bad.reason.as_deref(), Some("FilesFailed"), "{bad:#?}");
    assert_eq!(bad.failed_files.len(), 1, "{bad:#?}");
    assert_eq!(bad.failed_files[0].file, "broken.parquet");
    assert!(!bad.failed_files[0].error.is_empty());
    let reasons = event_reasons(&sim.c, NS, "bad");
    assert!(reasons.iter().any(|r| r == "FilesFailed"), "{reasons:?}");
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pt-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
