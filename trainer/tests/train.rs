//! The training loop end to end on the embedded corpus, in process and through the
//! binary: exact resume, corrupt-checkpoint fallback, SIGTERM checkpoints and the
//! failure contract's exit codes.

use std::path::Path;

use crds::config::RunConfig;
use crds::contract::{FailureReason, TerminationMessage};
use trainer::train::Outcome;

mod common;
use common::{SMALL_RUN, config, run_options, run_until_step, scratch, sigterm, train_outcome, trainer_bin};

fn train(cfg: &RunConfig, dir: &Path, stop_after: Option<u64>) -> Outcome {
    train_syncing(cfg, dir, stop_after, None)
}

/// [`train`], reading losses back from the device every `sync_every` steps.
fn train_syncing(cfg: &RunConfig, dir: &Path, stop_after: Option<u64>, sync_every: Option<u64>) -> Outcome {
    train_outcome(cfg, run_options(dir, stop_after, sync_every)).unwrap()
}

#[test]
fn resume_reproduces_the_uninterrupted_loss_sequence_and_skips_a_corrupt_checkpoint() {
    let cfg = config(SMALL_RUN);
    assert_eq!((cfg.schedule.total_steps, cfg.batch.grad_accum), (12, 2));

    let full = train(&cfg, &scratch("full"), None);
    assert_eq!(full.losses.len(), 12);
    assert!(full.losses[11].1 < full.losses[0].1 - 1.0, "the loss must drop: {:?}", full.losses);

    // Stopped at step 6, with a checkpoint there, then resumed.
    let dir = scratch("resumed");
    let first = train(&cfg, &dir, Some(6));
    assert_eq!(first.losses, full.losses[..6]);
    assert_eq!(first.last_checkpoint.as_ref().map(|c| c.step), Some(6));
    let second = train(&cfg, &dir, None);
    assert_eq!(second.resumed_from, Some(6));
    assert_eq!(second.losses, full.losses[6..], "resumed losses must equal the uninterrupted run's");

    // A torn newest checkpoint is skipped: resume falls back to the one before.
    let dir = scratch("corrupt");
    train(&cfg, &dir, Some(8));
    let newest = dir.join("step-00000008").join("model.safetensors");
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&newest).unwrap().set_len(len / 2).unwrap();
    let after = train(&cfg, &dir, None);
    assert_eq!(after.resumed_from, Some(4));
    assert_eq!(after.losses, full.losses[4..]);
}

#[test]
fn reading_losses_back_every_few_steps_trains_exactly_as_every_step() {
    let cfg = config(SMALL_RUN);
    let every = train(&cfg, &scratch("sync1"), None);
    // 5 divides neither the checkpoint nor the evaluation interval (4), nor the 12 steps.
    let dir = scratch("sync5");
    let deferred = train_syncing(&cfg, &dir, None, Some(5));
    assert_eq!(deferred.losses, every.losses);
    assert_eq!(deferred.val_loss, every.val_loss);
    for step in [4, 8, 12] {
        assert!(dir.join(format!("step-{step:08}")).join("model.safetensors").exists(), "a checkpoint at step {step}");
    }
    let records = trainer::telemetry::metrics_log::read(&dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            trainer::telemetry::metrics_log::Record::Step(s) => Some(s.step),
            _ => None,
        })
        .collect();
    assert_eq!(steps, (1..=12).collect::<Vec<_>>());

    // A stop between reads still stops at its step, and resuming repeats the run.
    let dir = scratch("sync5-resumed");
    let first = train_syncing(&cfg, &dir, Some(6), Some(5));
    assert_eq!(first.last_checkpoint.as_ref().map(|c| c.step), Some(6));
    let second = train_syncing(&cfg, &dir, None, Some(5));
    assert_eq!([first.losses, second.losses].concat(), every.losses);
}

/// `spec.data.packing: documents` reaches the training step and the validation: the
/// same windows train to other losses than `concat` (each document alone), the run
/// learns, and it resumes exactly. (The numerics, against Hugging Face transformers run
/// on each document alone: tests/hf_parity.rs.)
#[test]
fn document_packing_trains_each_document_on_its_own() {
    let yaml = SMALL_RUN.replace(
        "    validation: {everySteps: 4, tokens: \"1K\"}",
        "    validation: {everySteps: 4, tokens: \"1K\"}\n    packing: documents",
    );
    assert!(yaml.contains("packing: documents"));
    let cfg = config(&yaml);
    let concat = train(&config(SMALL_RUN), &scratch("packing-concat"), None);
    let dir = scratch("packing-documents");
    let documents = train(&cfg, &dir, None);
    assert_eq!(documents.losses.len(), 12);
    assert!(documents.losses.iter().zip(&concat.losses).all(|(d, c)| d != c), "{documents:?} vs {concat:?}");
    assert!(documents.losses[11].1 < documents.losses[0].1 - 1.0, "it learns: {:?}", documents.losses);
    assert_ne!(documents.val_loss, concat.val_loss);
    let dir = scratch("packing-documents-resumed");
    let first = train(&cfg, &dir, Some(6));
    let second = train(&cfg, &dir, None);
    assert_eq!([first.losses, second.losses].concat(), documents.losses);
}

/// Stopped after step 5 (which checkpoints it) and resumed: metrics.jsonl and TensorBoard's
/// event files each show steps 1-12 once, and agree value for value.
#[test]
fn the_metrics_log_and_tensorboard_are_continuous_across_a_resume() {
    let cfg = config(SMALL_RUN);
    let dir = scratch("log");
    train(&cfg, &dir, Some(5));
    train(&cfg, &dir, None);
    let summary = common::check_tensorboard(&dir);
    assert_eq!(summary["configs"], serde_json::json!([0, 5]), "{summary}");
    let tags = summary["tags"].to_string();
    for tag in ["train/loss", "train/grad_norm", "val/loss/textbook", "val/perplexity/mcq", "data/tokens/arithmetic"] {
        assert!(tags.contains(tag), "{tag} missing from {tags}");
    }
    let records = trainer::telemetry::metrics_log::read(&dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            trainer::telemetry::metrics_log::Record::Step(s) => Some(s.step),
            _ => None,
        })
        .collect();
    assert_eq!(steps, (1..=12).collect::<Vec<_>>());
}

/// Runs `trainer run` on `yaml` with extra env; returns (exit code, termination message).
fn run_bin(name: &str, yaml: &str, env: &[(&str, &str)]) -> (i32, Option<TerminationMessage>, String) {
    let (out, log) = common::run_logged(&scratch(name), yaml, env);
    let msg = log.and_then(|t| TerminationMessage::parse(&t));
    (out.status.code().unwrap_or(-1), msg, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// (name, manifest, env, expected reason, expected step)
type FailureCase<'a> = (&'a str, String, &'a [(&'a str, &'a str)], FailureReason, Option<u64>);

#[test]
fn failures_exit_with_the_contract_code_and_termination_message() {
    let cases: [FailureCase; 5] = [
        ("nan", SMALL_RUN.to_string(), &[("TRAINER_INJECT_NAN_AT_STEP", "3")], FailureReason::NaNLoss, Some(3)),
        // Read back at step 3: the failure names the step the NaN came from.
        (
            "nan-deferred",
            SMALL_RUN.to_string(),
            &[("TRAINER_INJECT_NAN_AT_STEP", "1"), ("TRAINER_SYNC_EVERY", "3")],
            FailureReason::NaNLoss,
            Some(1),
        ),
        ("oom", SMALL_RUN.to_string(), &[("TRAINER_INJECT_OOM_AT_STEP", "2")], FailureReason::OutOfMemory, Some(2)),
        ("config", SMALL_RUN.replace("preset: nano", "preset: nanoo"), &[], FailureReason::InvalidConfig, None),
        ("data", SMALL_RUN.replace("\"embedded:mcq\"", "/no/such/shards"), &[], FailureReason::DataError, None),
    ];
    for (name, yaml, env, reason, step) in cases {
        let (code, msg, stderr) = run_bin(name, &yaml, env);
        assert_eq!(code, reason.exit_code(), "{name}: {stderr}");
        let msg = msg.unwrap_or_else(|| panic!("{name}: no termination message; {stderr}"));
        assert_eq!(msg.reason, reason, "{name}");
        assert_eq!(msg.step, step, "{name}: {msg:?}");
    }
}

#[test]
fn success_leaves_the_final_status_as_termination_message() {
    let (code, msg, stderr) = run_bin("success", SMALL_RUN, &[]);
    assert_eq!((code, msg), (0, None), "{stderr}");
    let text = std::fs::read_to_string(
        std::env::temp_dir().join(format!("trainer-test-success-{}", std::process::id())).join("termination-log"),
    )
    .expect("a final report");
    let Some(crds::contract::ExitReport::Success(report)) = crds::contract::ExitReport::parse(&text) else {
        panic!("{text}")
    };
    assert_eq!(report.phase, crds::contract::TrainerPhase::Done);
    assert_eq!(report.step, report.total_steps);
    assert!(report.metrics.loss.is_some() && report.last_checkpoint.is_some(), "{report:?}");
}

/// The body of `GET path` from 127.0.0.1:port.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

#[test]
fn sigterm_saves_a_checkpoint_and_exits_143() {
    let dir = scratch("sigterm");
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, SMALL_RUN.replace("\"6144\"", "\"200K\"")).unwrap();
    let out = dir.join("out");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = run_until_step(&manifest, &out, &["--status-addr", &format!("127.0.0.1:{port}")], 2, "sigterm");
    let log = out.join("metrics.jsonl");
    // Rank 0's status document, as the operator reads it, while the run trains.
    let status: serde_json::Value = serde_json::from_str(&http_get(port, "/status")).unwrap();
    // Mid-run, rank 0 may be training, evaluating or writing a checkpoint; all three are live.
    let phase: crds::contract::TrainerPhase = serde_json::from_value(status["phase"].clone()).unwrap();
    use crds::contract::TrainerPhase::{Checkpointing, Evaluating, Training};
    assert!(matches!(phase, Training | Evaluating | Checkpointing), "{status}");
    assert!(status["step"].as_u64().unwrap() >= 2, "{status}");
    assert_eq!(status["totalSteps"], 390, "{status}");
    assert!(status["loss"].as_f64().unwrap().is_finite(), "{status}");
    assert!(http_get(port, "/metrics").contains("trainer_step "));
    sigterm(&child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let records = trainer::telemetry::metrics_log::read(&log).unwrap();
    let last_step = records.iter().map(|r| r.step()).max().unwrap();
    assert!(last_step >= 2);
    let latest = std::fs::read_to_string(out.join("latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{last_step:08}"));
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join(latest.trim()).join("state.json")).unwrap()).unwrap();
    assert_eq!(state["step"], last_step);
}

#[test]
fn the_model_overfits_one_batch() {
    use crds::presets::{ModelConfig, preset};
    use tch::nn::VarStore;
    use tch::{Device, Kind, Tensor};
    use trainer::model::Model;
    use trainer::optim::AdamW;

    let cfg = ModelConfig { n_layer: 2, max_seq_len: 32, ..ModelConfig::from(preset("nano").unwrap()) };
    let _rng = trainer::rng::GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(11);
    let vs = VarStore::new(Device::Cpu);
    let model = Model::new(&vs.root(), &cfg, Device::Cpu).unwrap();
    let opt_cfg =
        crds::config::ResolvedOptimizer { weight_decay: 0.0, beta1: 0.9, beta2: 0.95, eps: 1e-8, grad_clip: 1.0 };
    let mut opt = AdamW::new(vs.variables(), &opt_cfg).unwrap();
    let batch = Tensor::randint(cfg.vocab_size as i64, [4, 33], (Kind::Int64, Device::Cpu));
    let (x, y) = (batch.narrow(1, 0, 32), batch.narrow(1, 1, 32));
    let mut losses = Vec::new();
    for _ in 0..150 {
        let loss = model.loss(&x, &y, None).unwrap();
        loss.backward();
        let _norm = opt.clip_grad_norm(1.0).unwrap();
        opt.step(3e-3).unwrap();
        opt.zero_grad().unwrap();
        losses.push(loss.double_value(&[]));
    }
    // Random tokens start near ln(2048) = 7.6; memorising 128 of them drives the loss to ~0.
    assert!(losses[0] > 7.0, "{:?}", &losses[..3]);
    assert!(*losses.last().unwrap() < 0.05, "did not overfit: {:?}", &losses[140..]);
}

#[test]
fn eval_generate_export_and_plot_read_a_run_directory() {
    let dir = scratch("commands");
    let manifest = dir.join("run.yaml");
    std::fs::write(&manifest, SMALL_RUN.replace("\"6144\"", "\"2048\"")).unwrap();
    let out = dir.join("out");
    let run = trainer_bin().args(["run", "--no-sample", "-o"]).arg(&out).arg(&manifest).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    let eval = trainer_bin().arg("eval").arg(&out).output().unwrap();
    let text = String::from_utf8_lossy(&eval.stdout);
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    for source in ["textbook", "arithmetic", "mcq", "mix"] {
        assert!(text.lines().any(|l| l.starts_with(source) && l.contains("perplexity")), "{source} missing:\n{text}");
    }

    let generate = trainer_bin()
        .arg("generate")
        .arg(&out)
        .args(["--prompt", "The", "-n", "2", "--max-new-tokens", "8", "--temperature", "1.0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&generate.stdout);
    assert!(generate.status.success(), "{}", String::from_utf8_lossy(&generate.stderr));
    assert_eq!(text.matches("---").count(), 1, "two samples:\n{text}");
    assert!(text.starts_with("The"), "{text}");

    let hf = dir.join("hf");
    let export = trainer_bin().arg("export").arg(&out).arg("--hf").arg(&hf).output().unwrap();
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert!(std::fs::metadata(hf.join("model.safetensors")).unwrap().len() > 3_000_000);

    let plot = trainer_bin().arg("plot").arg(out.join("metrics.jsonl")).output().unwrap();
    assert!(plot.status.success(), "{}", String::from_utf8_lossy(&plot.stderr));
    assert!(std::fs::read(out.join("metrics.png")).unwrap().starts_with(b"\x89PNG"));

    let missing = trainer_bin().arg("eval").arg(dir.join("nope")).output().unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nope"));
}

/// `checkpoint.keepBest`: the checkpoint of lowest validation loss is kept beside the
/// newest, named by `best`, in the final status, and exported by `--best`.
#[test]
fn keep_best_is_reported_and_exported() {
    let dir = scratch("best");
    let yaml = SMALL_RUN
        .replace("checkpoint: {everySteps: 4, keepLast: 3}", "checkpoint: {everySteps: 4, keepLast: 1, keepBest: 1}");
    let (run, log) = common::run_logged(&dir, &yaml, &[]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let out = dir.join("out");
    let records = trainer::telemetry::metrics_log::read(&out.join("metrics.jsonl")).unwrap();
    let evals: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            trainer::telemetry::metrics_log::Record::Eval(e) if e.step % 4 == 0 => Some((e.step, e.val_loss)),
            _ => None,
        })
        .collect();
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), [4, 8, 12]);
    let (best_step, best_loss) = evals.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let best = trainer::checkpoint::best(&out).expect("a best pointer");
    assert_eq!((best.step, best.val_loss), (best_step, Some(best_loss)));
    let kept: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    let mut want = vec![format!("step-{best_step:08}"), "step-00000012".to_string()];
    want.dedup();
    let mut kept_sorted = kept.clone();
    kept_sorted.sort();
    assert_eq!(kept_sorted, want, "the newest and the best");
    let Some(crds::contract::ExitReport::Success(status)) = crds::contract::ExitReport::parse(&log.unwrap()) else {
        panic!("the final status")
    };
    assert_eq!(status.best_checkpoint.map(|b| b.step), Some(best_step));

    let hf = dir.join("hf");
    let export = trainer_bin().arg("export").arg(&out).arg("--best").arg("--hf").arg(&hf).output().unwrap();
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    assert!(String::from_utf8_lossy(&export.stdout).contains(&format!("the best checkpoint: step {best_step}")));
    let exported = tch::Tensor::read_safetensors(hf.join("model.safetensors")).unwrap();
    let saved = tch::Tensor::read_safetensors(out.join(format!("step-{best_step:08}/model.safetensors"))).unwrap();
    assert_eq!(exported.len(), saved.len());
    for (name, t) in &saved {
        let e = &exported.iter().find(|(n, _)| n == name).unwrap().1;
        assert!(e.equal(t), "{name} differs from the best checkpoint's");
    }

    // A run without keepBest has no best to export, and says how to get one.
    let plain = scratch("no-best");
    let (run, _) = common::run_logged(&plain, &SMALL_RUN.replace("\"6144\"", "\"1024\""), &[]);
    assert!(run.status.success());
    let export =
        trainer_bin().arg("export").arg(plain.join("out")).arg("--best").arg("--hf").arg(&hf).output().unwrap();
    assert!(!export.status.success());
    assert!(String::from_utf8_lossy(&export.stderr).contains("spec.checkpoint.keepBest"));
}

#[test]
fn the_bench_refuses_flags_it_cannot_honour_naming_the_flag() {
    for (flag, message) in [
        (&["--cuda-graph"][..], "--cuda-graph needs"),
        (&["--memory-limit-gib", "80"][..], "--memory-limit-gib needs"),
        (&["--checkpointed-blocks", "1"][..], "--checkpointed-blocks 1: needs --gradient-checkpointing"),
        (&["--gradient-checkpointing", "--checkpointed-blocks", "3"][..], "the model's 2 blocks"),
    ] {
        let out = trainer_bin()
            .args(["bench", "--preset", "nano", "--device", "cpu", "--precision", "f32"])
            .args(["--micro-batch", "2", "--seq", "64", "--steps", "1", "--warmup", "1"])
            .args(flag)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(FailureReason::InvalidConfig.exit_code()), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    // No GPU here (CI): asking for one is the same clear error, not a crash.
    if !tch::Cuda::is_available() {
        let out =
            trainer_bin().args(["bench", "--preset", "nano", "--device", "cuda", "--steps", "1"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(FailureReason::InvalidConfig.exit_code()), "{stderr}");
        assert!(stderr.contains("--device cuda: no CUDA device is visible"), "{stderr}");
    }
}
