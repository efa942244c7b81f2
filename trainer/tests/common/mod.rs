//! Helpers of the trainer's integration tests; each test binary uses some of them.
#![allow(dead_code)]

pub mod https;
pub mod parquet;
pub mod s3;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fresh directory for one test, unique to this test process. Those of earlier test
/// processes that have exited are removed, so reruns on one machine do not fill its disk.
pub fn scratch(name: &str) -> PathBuf {
    let prefix = format!("trainer-test-{name}-");
    for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let file_name = entry.file_name();
        let pid = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = std::env::temp_dir().join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The tokenizer and corpus cache every test shares.
pub fn cache() -> PathBuf {
    std::env::temp_dir().join("trainer-train-tests-cache")
}

/// The trainer binary, quiet, with the shared cache.
pub fn trainer_bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    cmd.env("TRAINER_CACHE", cache()).env("RUST_LOG", "warn");
    cmd
}

/// Step records in a run's metrics.jsonl so far (0 before it exists).
pub fn logged_steps(log: &Path) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches("\"kind\":\"step\"").count()
}

/// Waits (up to 5 minutes) until the run logging to `log` has recorded `n` steps.
pub fn wait_for_steps(log: &Path, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while logged_steps(log) < n {
        assert!(Instant::now() < deadline, "{what}: the run did not reach step {n}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `trainer run --no-sample <extra> -o <out> <manifest>` in the background, returned
/// once it has logged `steps` steps.
pub fn run_until_step(manifest: &Path, out: &Path, extra: &[&str], steps: usize, what: &str) -> Child {
    let child = trainer_bin()
        .args(["run", "--no-sample"])
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(manifest)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_steps(&out.join("metrics.jsonl"), steps, what);
    child
}

/// Sends SIGTERM to `child`.
pub fn sigterm(child: &Child) {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
}

/// nano, 64-token sequences; `{nodes}`, `{micro}` and `{tokens}` are filled in.
pub const MANIFEST: &str = r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {name: ddp-test}
spec:
  model: {preset: nano, tokenizer: embedded}
  tokens: "{tokens}"
  data:
    mix:
      - {name: textbook, weight: 0.5, uri: "embedded:textbook"}
      - {name: arithmetic, weight: 0.3, uri: "embedded:arithmetic"}
      - {name: mcq, weight: 0.2, uri: "embedded:mcq"}
    validation: {everySteps: 4, tokens: "1K"}
  topology: {nodes: {nodes}, gpusPerNode: 0, collectiveTimeout: 20s}
  batch: {globalTokens: {global}, microBatch: {micro}, seqLength: 64}
  optimizer: {lr: 3.0e-3, warmupTokens: "1K"}
  precision: f32
  checkpoint: {everySteps: 4, keepLast: 3}
"#;

pub fn manifest_yaml(nodes: u32, micro: u32, global: u32, tokens: &str) -> String {
    MANIFEST
        .replace("{nodes}", &nodes.to_string())
        .replace("{micro}", &micro.to_string())
        .replace("{global}", &global.to_string())
        .replace("{tokens}", tokens)
}

/// (step, loss) of every step record in a run's metrics.jsonl.
pub fn step_losses(log: &Path) -> Vec<(u64, f64)> {
    trainer::telemetry::metrics_log::read(log)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            trainer::telemetry::metrics_log::Record::Step(s) => Some((s.step, s.loss)),
            _ => None,
        })
        .collect()
}

/// `trainer run --no-sample -o <out> <manifest> <extra>`, to its end.
pub fn run(manifest: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    trainer_bin().args(["run", "--no-sample", "-o"]).arg(out).arg(manifest).args(extra).output().unwrap()
}

/// `trainer run --no-sample -o <dir>/out <dir>/run.yaml` of `yaml`, with `env`, to its
/// end: what it printed and the text of its termination log (`<dir>/termination-log`).
pub fn run_logged(dir: &Path, yaml: &str, env: &[(&str, &str)]) -> (std::process::Output, Option<String>) {
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, yaml).unwrap();
    let log = dir.join("termination-log");
    let out = trainer_bin()
        .args(["run", "--no-sample", "-o"])
        .arg(dir.join("out"))
        .arg(&manifest)
        .env("TRAINER_TERMINATION_LOG", &log)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (out, std::fs::read_to_string(&log).ok())
}

/// A manifest's text, resolved.
pub fn config(yaml: &str) -> crds::RunConfig {
    crds::resolve(&crds::manifest::from_yaml(yaml, "test manifest").unwrap()).unwrap()
}

/// A small run: nano preset, 64-token sequences, 4 × 2 accumulation, 12 steps.
pub const SMALL_RUN: &str = r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {name: resume-test}
spec:
  model: {preset: nano, tokenizer: embedded}
  tokens: "6144"
  data:
    mix:
      - {name: textbook, weight: 0.5, uri: "embedded:textbook"}
      - {name: arithmetic, weight: 0.3, uri: "embedded:arithmetic"}
      - {name: mcq, weight: 0.2, uri: "embedded:mcq"}
    validation: {everySteps: 4, tokens: "1K"}
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {globalTokens: 512, microBatch: 4, seqLength: 64}
  optimizer: {lr: 3.0e-3, warmupTokens: "1K"}
  precision: f32
  checkpoint: {everySteps: 4, keepLast: 3}
"#;

/// Options to train in this process into `dir` (resuming what is there), to its end or
/// `stop_after` steps, reading losses back every `sync_every` steps (default: each).
pub fn run_options(dir: &Path, stop_after: Option<u64>, sync_every: Option<u64>) -> trainer::train::RunOptions {
    trainer::train::RunOptions {
        output_dir: dir.to_path_buf(),
        stop_after_steps: stop_after,
        tty: Some(false),
        sample: false,
        init_dir: dir.parent().unwrap().to_path_buf(),
        placement: trainer::dist::Placement::single(),
        sync_every,
    }
}

/// Trains `cfg` as one process in this one, with `opts`.
pub fn train_outcome(
    cfg: &crds::RunConfig,
    opts: trainer::train::RunOptions,
) -> Result<trainer::train::Outcome, trainer::Error> {
    let trainer = trainer::train::Trainer::new(cfg, opts)?;
    let status = trainer::telemetry::server::SharedStatus::from_config(cfg);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    trainer::telemetry::run(trainer, &status, stop)
}

/// Trains `cfg` as one process in this one into `dir` (resuming what is there), to
/// its end or `stop_after` steps.
pub fn train_in_process(cfg: &crds::RunConfig, dir: &Path, stop_after: Option<u64>) -> Result<(), trainer::Error> {
    train_outcome(cfg, run_options(dir, stop_after, None)).map(|_| ())
}

/// (step, loss, lr) of every step in `dir`'s metrics.jsonl.
pub fn step_rates(dir: &Path) -> Vec<(u64, f64, f64)> {
    trainer::telemetry::metrics_log::read(&dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            trainer::telemetry::metrics_log::Record::Step(s) => Some((s.step, s.loss, s.lr)),
            _ => None,
        })
        .collect()
}

/// The `state.json` of the newest checkpoint in `dir`.
pub fn last_state(dir: &Path) -> trainer::checkpoint::TrainState {
    let latest = std::fs::read_to_string(dir.join(trainer::checkpoint::LATEST_FILE)).unwrap();
    serde_json::from_str(&std::fs::read_to_string(dir.join(latest.trim()).join("state.json")).unwrap()).unwrap()
}

/// Largest |a − b| / max(|a|, |b|) over two loss sequences of the same steps.
pub fn max_rel_loss_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-30)).fold(0.0, f64::max)
}

/// The Python with torch, transformers and tensorboard: `TRAINER_TEST_PYTHON`, else
/// the project's CUDA venv (`scripts/test.sh` installs both).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TRAINER_TEST_PYTHON") {
        return p.into();
    }
    let home = std::env::var("HOME").expect("HOME is set");
    let p = PathBuf::from(home).join(".cache/puretransformer/venv-cuda/bin/python");
    assert!(p.exists(), "{} is missing: run scripts/test.sh, or set TRAINER_TEST_PYTHON", p.display());
    p
}

/// Reads `run`'s TensorBoard event files with TensorBoard's own reader and checks
/// every scalar against its metrics.jsonl (`scripts/check-tensorboard.py`); returns
/// the checker's summary.
pub fn check_tensorboard(run: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-tensorboard.py");
    let out = Command::new(python()).arg(script).arg(run).output().expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "TensorBoard's reader disagrees with metrics.jsonl in {}:\n{stderr}", run.display());
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Exports each run directory with `trainer export --hf`, continues `prompt` greedily
/// with `trainer generate --temperature 0`, and checks with transformers
/// (`scripts/hf_export_check.py`) that the export loads with its tokenizer, runs in a
/// pipeline and continues the prompt the same way. Returns the checker's lines.
pub fn check_hf_export(runs: &[&Path], prompt: &str, max_new_tokens: usize) -> Vec<serde_json::Value> {
    let mut cases = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let hf = run.with_file_name(format!("hf-{i}"));
        let export = trainer_bin().arg("export").arg(run).arg("--hf").arg(&hf).output().unwrap();
        assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
        let generate = trainer_bin()
            .arg("generate")
            .arg(run)
            .args(["--temperature", "0", "-n", "1", "--prompt", prompt, "--max-new-tokens"])
            .arg(max_new_tokens.to_string())
            .output()
            .unwrap();
        assert!(generate.status.success(), "{}", String::from_utf8_lossy(&generate.stderr));
        let expected = String::from_utf8(generate.stdout).unwrap();
        let expected = expected.strip_suffix('\n').unwrap_or(&expected);
        cases.push(serde_json::json!({
            "dir": hf, "prompt": prompt, "max_new_tokens": max_new_tokens, "expected": expected
        }));
    }
    let file = runs[0].with_file_name("hf-cases.json");
    std::fs::write(&file, serde_json::to_string(&cases).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/hf_export_check.py");
    let out = Command::new(python()).arg(script).arg(&file).output().expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "transformers disagrees with the trainer:\n{stdout}\n{stderr}");
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A short pretraining run named `base` (the GRPO runs' initFrom): 32 steps on the
/// multiple-choice corpus, enough to answer with letters.
pub const GRPO_BASE: &str = r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {name: base}
spec:
  model: {preset: nano, tokenizer: embedded}
  tokens: "32K"
  data:
    mix:
      - {name: mcq, weight: 1.0, uri: "embedded:mcq"}
    validation: {everySteps: 100, tokens: "1K"}
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {globalTokens: 1024, microBatch: 8, seqLength: 128}
  optimizer: {lr: 3.0e-3, warmupTokens: "1K"}
  precision: f32
  checkpoint: {everySteps: 32, keepLast: 1}
"#;

/// A scratch directory holding the `base` run ([`GRPO_BASE`]), for GRPO runs to start
/// from (`initFrom: {trainingRun: base}`).
pub fn grpo_base(name: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::write(dir.join("base.yaml"), GRPO_BASE).unwrap();
    let out = trainer_bin()
        .args(["run", "--no-sample", "-o"])
        .arg(dir.join("base"))
        .arg(dir.join("base.yaml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir
}
