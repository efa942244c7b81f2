//! Real text end to end through the binary: `trainer prepare` on text files that
//! every Debian machine has, then `trainer run` on the shards.

use std::path::{Path, PathBuf};
use std::process::Command;

use crds::contract::TrainerStatus;

mod common;
use common::{cache, scratch};

fn trainer() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    cmd.env("TRAINER_CACHE", cache()).env("RUST_LOG", "warn");
    cmd
}

/// The licence texts of /usr/share/common-licenses: ~300 KB of real English prose.
const TEXT: &str = "/usr/share/common-licenses";

fn prepare(dir: &Path) -> PathBuf {
    let out = dir.join("licenses");
    let o = trainer()
        .args(["prepare", "--input", TEXT, "--train-tokenizer", "--vocab-size", "1024"])
        .args(["--shard-tokens", "16K", "--validation-fraction", "0.2", "--seed", "3", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("documents") && stdout.contains("MB/s"), "{stdout}");
    out
}

fn manifest(data: &Path, tokenizer: &str) -> String {
    format!(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: licenses}}
spec:
  model: {{preset: nano, tokenizer: "{tokenizer}", vocabSize: 1024}}
  tokens: 96K
  data:
    mix:
      - {{name: licenses, weight: 1, uri: "{}"}}
    validation: {{everySteps: 8, tokens: 4K}}
  topology: {{nodes: 1, gpusPerNode: 0}}
  batch: {{globalTokens: 4096, microBatch: 8, seqLength: 128}}
  optimizer: {{lr: 3.0e-3, warmupTokens: 8K}}
  precision: f32
"#,
        data.display()
    )
}

#[test]
fn real_text_prepares_into_shards_and_trains() {
    let dir = scratch("real");
    let data = prepare(&dir);
    let tokenizer = data.join("tokenizer.json");
    let run = dir.join("run.yaml");
    std::fs::write(&run, manifest(&data, tokenizer.to_str().unwrap())).unwrap();
    let log = dir.join("termination-log");
    let o = trainer()
        .args(["run", "--no-sample", "-o"])
        .arg(dir.join("out"))
        .arg(&run)
        .env("TRAINER_TERMINATION_LOG", &log)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let records = trainer::telemetry::metrics_log::read(&dir.join("out/metrics.jsonl")).unwrap();
    let losses: Vec<f64> = records
        .iter()
        .filter_map(|r| match r {
            trainer::telemetry::metrics_log::Record::Step(s) => Some(s.loss),
            _ => None,
        })
        .collect();
    assert_eq!(losses.len(), 23);
    assert!(losses[22] < losses[0] - 1.0, "the loss must fall on real text: {losses:?}");
    let status: TrainerStatus = serde_json::from_str(&std::fs::read_to_string(&log).unwrap()).unwrap();
    assert_eq!(status.tokens_by_source.get("licenses"), Some(&status.tokens), "{status:?}");
    assert!(status.metrics.val_loss.unwrap().is_finite());

    // Exported with the tokenizer `prepare` trained, transformers continues a prompt as
    // the trainer does.
    let hf = common::check_hf_export(&[&dir.join("out")], "This License", 16);
    assert_eq!(hf[0]["class"], "LlamaForCausalLM", "{hf:?}");

    // The same shards with another tokenizer are refused, naming the source.
    std::fs::write(&run, manifest(&data, "embedded").replace("vocabSize: 1024", "vocabSize: 8192")).unwrap();
    let o = trainer().args(["run", "--no-sample", "-o"]).arg(dir.join("other")).arg(&run).output().unwrap();
    assert_eq!(o.status.code(), Some(crds::contract::FailureReason::DataError.exit_code()));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("licenses") && stderr.contains("prepared with tokenizer"), "{stderr}");
}

#[test]
fn a_corrupt_shard_fails_the_run_with_a_data_error_naming_the_file() {
    let dir = scratch("corrupt");
    let data = prepare(&dir);
    let manifest_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("manifest.json")).unwrap()).unwrap();
    let name = manifest_json["train"][1]["file"].as_str().unwrap().to_string();
    let shard = data.join(&name);
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let run = dir.join("run.yaml");
    std::fs::write(&run, manifest(&data, data.join("tokenizer.json").to_str().unwrap())).unwrap();
    let o = trainer().args(["run", "--no-sample", "-o"]).arg(dir.join("out")).arg(&run).output().unwrap();
    assert_eq!(o.status.code(), Some(crds::contract::FailureReason::DataError.exit_code()));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains(&name) && stderr.contains("checksum mismatch"), "{stderr}");
}
