//! `trainer eval --task mcq` on benchmark files as a user brings them: MMLU with
//! few-shot examples from its dev split and per-subject scores, ARC in Hugging Face's
//! and AI2's layouts, MedQA with five options; a table or JSON; and clear errors. The
//! fixtures under `tests/fixtures/mcq/` were written for these tests. (The scoring
//! itself is checked against hand-computed log-likelihoods in `eval::mcq`'s tests.)

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::{run_logged, scratch, trainer_bin};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcq").join(name)
}

/// A few steps of a 2-layer nano model with a context of 128 tokens.
const RUN: &str = r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {name: bench}
spec:
  model: {preset: nano, tokenizer: embedded, layers: 2, seqLength: 128}
  tokens: "2048"
  data:
    mix:
      - {name: mcq, weight: 1, uri: "embedded:mcq"}
    validation: {everySteps: 0}
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {globalTokens: 1024, microBatch: 8, seqLength: 128}
  optimizer: {lr: 3.0e-3, warmupTokens: "512"}
  precision: f32
"#;

fn eval(run: &Path, args: &[&str]) -> std::process::Output {
    trainer_bin().args(["eval", "--task", "mcq", "--max-new-tokens", "4"]).arg(run).args(args).output().unwrap()
}

fn json(run: &Path, args: &[&str]) -> Value {
    let out = eval(run, &[args, &["--json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A fraction of `n` 0/1 scores.
fn assert_fraction(v: &Value, n: u64) {
    let x = v.as_f64().unwrap();
    assert!((0.0..=1.0).contains(&x) && ((x * n as f64).round() - x * n as f64).abs() < 1e-9, "{x} of {n}");
}

#[test]
fn benchmark_files_are_scored_as_lm_eval_scores_them() {
    let dir = scratch("eval-bench");
    let (out, _) = run_logged(&dir, RUN, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = dir.join("out");

    // MMLU, 2-shot from the dev split: per subject and in all.
    let (test, dev) = (fixture("mmlu_test.jsonl"), fixture("mmlu_dev.jsonl"));
    let mmlu = ["--dataset", path(&test), "--fewshot", "2", "--fewshot-dataset", path(&dev)];
    let score = json(&run, &mmlu);
    assert_eq!(
        (score["format"].as_str(), score["fewshot"].as_u64(), score["questions"].as_u64()),
        (Some("mmlu"), Some(2), Some(5))
    );
    let subjects = score["subjects"].as_object().unwrap();
    let counts: Vec<(&str, u64)> =
        subjects.iter().map(|(s, v)| (s.as_str(), v["questions"].as_u64().unwrap())).collect();
    assert_eq!(counts, [("elementary_mathematics", 2), ("high_school_geography", 3)]);
    for field in ["acc", "accNorm", "greedy", "unparsed"] {
        assert_fraction(&score[field], 5);
    }
    assert!(score["accStderr"].as_f64().unwrap() >= 0.0);
    // MMLU scores the letters, so acc_norm (per character) is acc.
    assert_eq!(score["acc"], score["accNorm"]);
    assert_eq!(json(&run, &mmlu), score, "the few-shot examples are seeded");

    let table = eval(&run, &mmlu);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
    assert!(text.contains("mmlu, 2-shot") && text.contains("acc_norm"), "{text}");
    for row in ["high_school_geography", "elementary_mathematics", "all"] {
        assert!(text.lines().any(|l| l.starts_with(row)), "{row}: {text}");
    }

    // ARC in both layouts (3 to 5 options, letters or digits as labels), MedQA with five.
    for (file, format, n) in [("arc_easy.jsonl", "arc", 4), ("arc_ai2.jsonl", "arc", 2), ("medqa_5.jsonl", "medqa", 3)]
    {
        let score = json(&run, &["--dataset", path(&fixture(file))]);
        assert_eq!((score["format"].as_str(), score["questions"].as_u64()), (Some(format), Some(n)), "{file}");
        assert_fraction(&score["accNorm"], n);
        assert!(score.get("subjects").is_none(), "{file}: {score}");
    }
    let score = json(&run, &["--dataset", path(&fixture("arc_easy.jsonl")), "--questions", "2", "--format", "arc"]);
    assert_eq!(score["questions"], 2);

    // Bad input names the flag, the file, the line and the field.
    let fails = |args: &[&str], needles: &[&str]| {
        let out = eval(&run, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
        }
    };
    fails(&["--dataset", path(&test), "--format", "arc"], &["mmlu_test.jsonl", "line 1 (arc)", "choices.text"]);
    fails(&["--dataset", path(&test), "--fewshot", "2"], &["--fewshot-dataset"]);
    fails(&["--dataset", path(&test), "--format", "hellaswag"], &["hellaswag", "auto, medqa, mmlu or arc"]);
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 0}\n{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 5}\n").unwrap();
    fails(&["--dataset", path(&bad)], &["bad.jsonl", "line 2 (mmlu)", "`answer` points past the 2 options"]);
    fails(&["--dataset", path(&dir.join("missing.jsonl"))], &["missing.jsonl"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench-generate --checkpoint`: GRPO's cached sampler (eager and in static steps) and
/// the full-prefix loop decode a trained model's validation questions; in f32 on the CPU
/// every greedy row agrees, and a prompt length the questions cannot fill or an empty
/// bucket is refused naming the flag.
#[test]
fn the_sampler_decodes_a_trained_checkpoint_as_the_full_prefix_loop_does() {
    let dir = scratch("eval-bench-generate");
    let (out, _) = run_logged(&dir, RUN, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = dir.join("out");
    let bench_with = |prompt_tokens: &str, bucket: &str| {
        trainer_bin()
            .args(["bench-generate", "--device", "cpu", "--batch", "6", "--new-tokens", "24", "--checkpoint"])
            .arg(&run)
            .args(["--prompt-tokens", prompt_tokens, "--bucket", bucket])
            .output()
            .unwrap()
    };
    let bench = |prompt_tokens: &str| bench_with(prompt_tokens, "16");
    let out = bench("32");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(out.stdout.split(|&b| b == b'\n').rfind(|l| !l.is_empty()).unwrap()).unwrap();
    assert_eq!((v["preset"].as_str(), v["dtype"].as_str(), v["batch"].as_u64()), (Some("nano"), Some("f32"), Some(6)));
    assert_eq!(v["weights"].as_str(), run.to_str());
    assert_eq!(v["greedy_agreement"].as_f64(), Some(1.0), "{v}");
    assert_eq!(v["partings"], serde_json::json!([]));
    // The static step, eager on the CPU, over buckets of 16 slots: the same tokens.
    assert_eq!((v["static_decoder"].as_str(), v["static_bucket"].as_i64()), (Some("eager steps"), Some(16)), "{v}");
    assert_eq!(v["static_rows_identical_to_kv_cache"].as_str(), Some("6/6"), "{v}");
    assert!(v["static_tokens_per_s"].as_f64().unwrap() > 0.0, "{v}");

    let out = bench_with("32", "0");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--bucket 0: must be at least 1"), "{err}");

    let out = bench("100000");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--prompt-tokens 100000"), "{err}");
}
