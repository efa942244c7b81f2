//! S3 against a real S3-compatible server (s3s-fs, started per test on 127.0.0.1 with a
//! fresh directory): objects, ranges, listing, multipart, errors, and `trainer prepare`
//! writing to an `s3://` prefix, from raw Parquet objects by workers and a merge.

use std::path::Path;
use std::process::Command;

mod common;
use common::s3::{KEY, SECRET, client, s3_env, start};

#[test]
fn objects_round_trip_with_ranges_listing_and_multipart() {
    let server = start(&["data"]);
    let s3 = client(&server, SECRET);
    s3.put_bytes("data", "a/small.bin", (0..=255u8).collect()).unwrap();
    assert_eq!(s3.get_range("data", "a/small.bin", 10, 5).unwrap(), vec![10, 11, 12, 13, 14]);
    assert_eq!(s3.size("data", "a/small.bin").unwrap(), Some(256));
    assert_eq!(s3.size("data", "a/none.bin").unwrap(), None);
    // 70 MiB: two parts of a multipart upload.
    let big: Vec<u8> = (0..70u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let file = server.root.join("big.bin");
    std::fs::write(&file, &big).unwrap();
    s3.put_file("data", "a/b/big.bin", &file).unwrap();
    assert!(s3.get_bytes("data", "a/b/big.bin", u64::MAX).unwrap() == big);
    // An object larger than its caller allows is refused from its Content-Length.
    let e = s3.get_bytes("data", "a/b/big.bin", 1 << 20).unwrap_err().to_string();
    assert!(e.contains("s3://data/a/b/big.bin") && e.contains("73400320 bytes, more than the 1048576"), "{e}");
    assert_eq!(s3.get_range("data", "a/b/big.bin", (64 << 20) - 3, 6).unwrap(), big[(64 << 20) - 3..(64 << 20) + 3]);
    let mut keys = s3.list("data", "a/").unwrap();
    keys.sort();
    assert_eq!(keys, vec![("a/b/big.bin".to_string(), 70 << 20), ("a/small.bin".to_string(), 256)]);
    let e = s3.get_range("data", "a/small.bin", 250, 10).unwrap_err().to_string();
    assert!(e.contains("s3://data/a/small.bin"), "{e}");
}

#[test]
fn wrong_credentials_a_missing_bucket_or_object_are_clear_permanent_errors() {
    let server = start(&["data"]);
    let bad = client(&server, "not-the-secret");
    let e = bad.put_bytes("data", "x", vec![1]).unwrap_err();
    assert!(e.to_string().contains("s3://data/x") && e.to_string().contains("access denied"), "{e}");
    assert_eq!(e.reason(), Some(crds::contract::FailureReason::DataError));
    assert!(!e.to_string().contains("not-the-secret"), "credentials must never be printed: {e}");
    let s3 = client(&server, SECRET);
    let e = s3.get_bytes("nope", "k", u64::MAX).unwrap_err().to_string();
    assert!(e.contains("s3://nope/k") && e.contains("does not exist"), "{e}");
    let e = s3.get_bytes("data", "missing/key", u64::MAX).unwrap_err().to_string();
    assert!(e.contains("s3://data/missing/key") && e.contains("no such object"), "{e}");
}

#[test]
fn prepare_writes_shards_and_the_manifest_to_an_s3_prefix() {
    let server = start(&["datasets"]);
    let input = server.root.join("in.jsonl");
    let lines: Vec<String> =
        (0..300).map(|i| format!("{{\"text\": \"document {i} about rivers and towns\"}}")).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["prepare", "--tokenizer", "embedded", "--shard-tokens", "1024", "--validation-fraction", "0.1"])
        .arg("--input")
        .arg(&input)
        .args(["--output", "s3://datasets/web/v1"])
        .env("TRAINER_CACHE", std::env::temp_dir().join("trainer-train-tests-cache"))
        .envs(s3_env(&server))
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s3 = client(&server, SECRET);
    let keys: Vec<String> = s3.list("datasets", "web/v1/").unwrap().into_iter().map(|(k, _)| k).collect();
    assert!(
        keys.contains(&"web/v1/manifest.json".to_string()) && keys.contains(&"web/v1/tokenizer.json".to_string()),
        "{keys:?}"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&s3.get_bytes("datasets", "web/v1/manifest.json", u64::MAX).unwrap()).unwrap();
    assert_eq!(manifest["name"], "v1");
    for entry in manifest["train"].as_array().unwrap().iter().chain(manifest["validation"].as_array().unwrap()) {
        let key = format!("web/v1/{}", entry["file"].as_str().unwrap());
        let size = s3.size("datasets", &key).unwrap().unwrap();
        assert_eq!(size, 128 + 2 * entry["tokens"].as_u64().unwrap(), "{key}");
    }
    let _ = Path::new("");
}

fn run_manifest(endpoint: &str) -> String {
    format!(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: mirrored}}
spec:
  model: {{preset: nano, tokenizer: embedded}}
  tokens: "6144"
  data:
    mix:
      - {{name: textbook, weight: 0.6, uri: "embedded:textbook"}}
      - {{name: mcq, weight: 0.4, uri: "embedded:mcq"}}
    validation: {{tokens: "1K"}}
  topology: {{nodes: 1, gpusPerNode: 0}}
  batch: {{globalTokens: 512, microBatch: 4, seqLength: 64}}
  optimizer: {{lr: 3.0e-3, warmupTokens: "1K"}}
  precision: f32
  checkpoint:
    everySteps: 4
    keepLast: 2
    s3: {{uri: "s3://ckpt/runs/mirrored", endpoint: "{endpoint}", region: us-east-1, secretRef: {{name: s3-creds}}}}
"#
    )
}

fn train(manifest: &Path, out: &Path, extra: &[&str]) -> (std::process::Output, Vec<(u64, f64)>) {
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["run", "--no-sample", "-o"])
        .arg(out)
        .arg(manifest)
        .args(extra)
        .env("TRAINER_CACHE", std::env::temp_dir().join("trainer-train-tests-cache"))
        .env("AWS_ACCESS_KEY_ID", KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let losses = trainer::telemetry::metrics_log::read(&out.join("metrics.jsonl"))
        .map(|records| {
            records
                .into_iter()
                .filter_map(|r| match r {
                    trainer::telemetry::metrics_log::Record::Step(s) => Some((s.step, s.loss)),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    (o, losses)
}

#[test]
fn checkpoints_are_mirrored_and_an_empty_directory_resumes_from_s3() {
    let server = start(&["ckpt"]);
    let manifest = server.root.join("run.yaml");
    std::fs::write(&manifest, run_manifest(&server.endpoint)).unwrap();
    // The uninterrupted run, for the loss sequence.
    let (o, full) = train(&manifest, &server.root.join("full"), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(full.len(), 12);
    let s3 = client(&server, SECRET);
    let keys: Vec<String> = s3.list("ckpt", "runs/mirrored/").unwrap().into_iter().map(|(k, _)| k).collect();
    for step in ["step-00000004", "step-00000008", "step-00000012"] {
        for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
            assert!(keys.contains(&format!("runs/mirrored/{step}/{file}")), "{step}/{file} not mirrored: {keys:?}");
        }
    }
    // The logs follow the checkpoints: after the last one, every step is in S3.
    let log = String::from_utf8(s3.get_bytes("ckpt", "runs/mirrored/metrics.jsonl", u64::MAX).unwrap()).unwrap();
    assert_eq!(log.matches("\"kind\":\"step\"").count(), 12, "{log}");
    let events: Vec<&String> =
        keys.iter().filter(|k| k.starts_with("runs/mirrored/tensorboard/events.out.tfevents.")).collect();
    assert_eq!(events.len(), 1, "{keys:?}");
    let local = std::fs::read_dir(server.root.join("full/tensorboard")).unwrap().next().unwrap().unwrap().path();
    let mirrored = s3.get_bytes("ckpt", events[0], u64::MAX).unwrap();
    let (local_events, _) = trainer::telemetry::tensorboard::record::read(&std::fs::read(local).unwrap());
    let (mirrored_events, _) = trainer::telemetry::tensorboard::record::read(&mirrored);
    assert!(
        mirrored_events.len() > 12 && local_events.starts_with(&mirrored_events),
        "{} events",
        mirrored_events.len()
    );
    // A fresh bucket prefix: stop at step 6 (mirrored checkpoints 4 and 6), then resume
    // on an empty directory: the run restores step 6 from S3 and repeats the losses.
    for (k, _) in s3.list("ckpt", "runs/mirrored/").unwrap() {
        std::fs::remove_file(server.root.join("ckpt").join(&k)).unwrap();
    }
    let (o, first) = train(&manifest, &server.root.join("pod-a"), &["--stop-after-steps", "6"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(first, full[..6]);
    let (o, second) = train(&manifest, &server.root.join("pod-b"), &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("resuming from the S3 mirror's step 6"), "{stderr}");
    assert_eq!(second, full[6..], "the run resumed from S3 must repeat the uninterrupted losses");
}

fn data_manifest(data_uri: &str, tokenizer: &str) -> String {
    format!(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: from-s3}}
spec:
  model: {{preset: nano, tokenizer: "{tokenizer}"}}
  tokens: "8192"
  data:
    mix:
      - {{name: web, weight: 0.7, uri: "{data_uri}"}}
      - {{name: mcq, weight: 0.3, uri: "embedded:mcq"}}
    validation: {{everySteps: 8, tokens: "1K"}}
  topology: {{nodes: 1, gpusPerNode: 0}}
  batch: {{globalTokens: 512, microBatch: 4, seqLength: 64}}
  optimizer: {{lr: 3.0e-3, warmupTokens: "1K"}}
  precision: f32
"#
    )
}

#[test]
fn training_reads_s3_shards_through_a_bounded_cache_like_local_ones() {
    let server = start(&["datasets"]);
    let input = server.root.join("in.jsonl");
    let lines: Vec<String> = (0..600)
        .map(|i| {
            format!("{{\"text\": \"Record {i}: the river Belmora passes {} towns and {} bridges.\"}}", i % 17, i % 5)
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let cache = server.root.join("cache");
    let prepare = |output: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args(["prepare", "--tokenizer", "embedded", "--shard-tokens", "2048", "--validation-fraction", "0.1"])
            .arg("--input")
            .arg(&input)
            .args(["--output", output])
            .env("TRAINER_CACHE", std::env::temp_dir().join("trainer-train-tests-cache"))
            .envs(s3_env(&server))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    prepare("s3://datasets/web/v1");
    let local = server.root.join("local-web");
    prepare(local.to_str().unwrap());
    let shards = std::fs::read_dir(&local)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("part-00000-train-"))
        .count();
    assert!(shards >= 4, "{shards} shards");

    let run = |name: &str, yaml: String, cache_dir: &Path| {
        let manifest = server.root.join(format!("{name}.yaml"));
        std::fs::write(&manifest, yaml).unwrap();
        let out = server.root.join(name);
        let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args(["run", "--no-sample", "-o"])
            .arg(&out)
            .arg(&manifest)
            .env("TRAINER_CACHE", cache_dir)
            .env("TRAINER_S3_CACHE_BYTES", "5000")
            .envs(s3_env(&server))
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        trainer::telemetry::metrics_log::read(&out.join("metrics.jsonl"))
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                trainer::telemetry::metrics_log::Record::Step(s) => Some((s.step, s.loss)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let from_local = run("local", data_manifest(local.to_str().unwrap(), "embedded"), &cache);
    let from_s3 = run("s3", data_manifest("s3://datasets/web/v1", "s3://datasets/web/v1/tokenizer.json"), &cache);
    assert_eq!(from_local.len(), 16);
    assert_eq!(from_s3, from_local, "S3 shards must train exactly like the same shards on disk");
    // The cache never held the whole source: at most the shard in use and the newest.
    let cached = std::fs::read_dir(cache.join("s3/datasets/web/v1"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("part-00000-train-"))
        .count();
    assert!(cached <= 2, "{cached} shards cached of {shards}");

    // A missing prefix names the object.
    let manifest = server.root.join("missing.yaml");
    std::fs::write(&manifest, data_manifest("s3://datasets/nope", "embedded")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["run", "--no-sample", "-o"])
        .arg(server.root.join("missing"))
        .arg(&manifest)
        .env("TRAINER_CACHE", &cache)
        .envs(s3_env(&server))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(crds::contract::FailureReason::DataError.exit_code()));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("s3://datasets/nope/manifest.json") && stderr.contains("no such object"), "{stderr}");
}

/// GRPO's questions from S3: a MedQA jsonl object and a `trainer prepare --format medqa`
/// prefix (its validation records), scored by `trainer eval --task mcq`, and a GRPO run
/// that trains on the object.
#[test]
fn grpo_reads_medqa_questions_from_an_s3_object_and_a_prepared_prefix() {
    use trainer::data::corpus::{Split, mcq_rule_records};
    let server = start(&["datasets"]);
    // 100 questions that hash to training and 20 that hash to the held-out split.
    let records = [mcq_rule_records(11, 100, Split::Train), mcq_rule_records(11, 20, Split::Validation)].concat();
    let lines: Vec<String> = records.iter().map(|r| trainer::data::mcq::medqa_json(r).to_string()).collect();
    std::fs::create_dir_all(server.root.join("datasets/medqa")).unwrap();
    std::fs::write(server.root.join("datasets/medqa/train.jsonl"), lines.join("\n")).unwrap();
    let bin = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_trainer"));
        c.env("TRAINER_CACHE", std::env::temp_dir().join(format!("trainer-s3-grpo-cache-{}", std::process::id())))
            .envs(s3_env(&server))
            .env("AWS_REGION", "us-east-1")
            .env("RUST_LOG", "warn");
        c
    };
    let ok = |out: std::process::Output| {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let prep = bin()
        .args(["prepare", "--format", "medqa", "--tokenizer", "embedded", "--validation-fraction", "0.25", "--input"])
        .arg(server.root.join("datasets/medqa/train.jsonl"))
        .args(["--output", "s3://datasets/medqa-prepared"])
        .output()
        .unwrap();
    ok(prep);

    // A checkpoint to evaluate and start from.
    let dir = server.root.join("runs");
    std::fs::create_dir_all(&dir).unwrap();
    let base = "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {name: base}\nspec:\n  model: {preset: nano, tokenizer: embedded}\n  tokens: \"2048\"\n  data:\n    mix: [{name: mcq, weight: 1.0, uri: \"embedded:mcq\"}]\n    validation: {everySteps: 100, tokens: \"1K\"}\n  topology: {nodes: 1, gpusPerNode: 0}\n  batch: {globalTokens: 1024, microBatch: 8, seqLength: 128}\n  optimizer: {lr: 3.0e-3, warmupTokens: \"1K\"}\n  precision: f32\n  checkpoint: {everySteps: 2, keepLast: 1}\n";
    std::fs::write(dir.join("base.yaml"), base).unwrap();
    ok(bin().args(["run", "--no-sample", "-o"]).arg(dir.join("base")).arg(dir.join("base.yaml")).output().unwrap());

    let score = |dataset: &str| -> serde_json::Value {
        let out = bin()
            .args(["eval", "--task", "mcq", "--json", "--questions", "500", "--dataset", dataset])
            .arg(dir.join("base"))
            .output()
            .unwrap();
        serde_json::from_str(&ok(out)).unwrap()
    };
    assert_eq!(score("s3://datasets/medqa/train.jsonl")["questions"], 120, "a jsonl file is scored whole");
    let manifest: serde_json::Value = serde_json::from_slice(
        &client(&server, SECRET).get_bytes("datasets", "medqa-prepared/manifest.json", u64::MAX).unwrap(),
    )
    .unwrap();
    let file = manifest["records"]["validation"].as_str().unwrap();
    let held_out =
        std::fs::read_to_string(server.root.join("datasets/medqa-prepared").join(file)).unwrap().lines().count();
    assert!(held_out > 10 && held_out < 60, "{held_out}");
    assert_eq!(
        score("s3://datasets/medqa-prepared")["questions"],
        held_out as u64,
        "a prepared prefix gives its validation records"
    );
    let missing = bin()
        .args(["eval", "--task", "mcq", "--dataset", "s3://datasets/none.jsonl"])
        .arg(dir.join("base"))
        .output()
        .unwrap();
    assert!(!missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("none.jsonl"));

    // GRPO on the object: one in 8 questions by hash is held out and scored before and after.
    let grpo = "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {name: g}\nspec:\n  phase: grpo\n  model: {preset: nano, tokenizer: embedded}\n  tokens: \"4096\"\n  initFrom: {trainingRun: base}\n  grpo: {dataset: \"s3://datasets/medqa/train.jsonl\", promptsPerStep: 4, generationsPerPrompt: 4, maxNewTokens: 8}\n  topology: {nodes: 1, gpusPerNode: 0}\n  batch: {microBatch: 8, seqLength: 128}\n  optimizer: {lr: 1.0e-3, schedule: constant, warmupTokens: \"1\"}\n  precision: f32\n  checkpoint: {everySteps: 2, keepLast: 1}\n";
    std::fs::write(dir.join("g.yaml"), grpo).unwrap();
    ok(bin().args(["run", "--no-sample", "-o"]).arg(dir.join("g")).arg(dir.join("g.yaml")).output().unwrap());
    let log = trainer::telemetry::metrics_log::read(&dir.join("g/metrics.jsonl")).unwrap();
    let evals: Vec<u64> = log
        .iter()
        .filter_map(|r| {
            if let trainer::telemetry::metrics_log::Record::Accuracy(a) = r {
                Some(a.score.all.questions)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(evals, vec![20, 20]);
}

/// Raw Parquet objects in a bucket, prepared by two workers and a merge into another
/// prefix (the way the operator runs `trainer prepare`), give the manifest one process
/// gives, and a run trains on it.
#[test]
fn raw_parquet_in_s3_is_prepared_by_workers_and_trained_on() {
    let server = start(&["raw", "datasets"]);
    let s3 = client(&server, SECRET);
    for f in 0..5 {
        let texts: Vec<String> = (0..(40 + 30 * f))
            .map(|i| format!("Page {f}.{i}: the river Belmora passes {} towns and {} mills.", i % 11, (i + f) % 7))
            .collect();
        let local = server.root.join(format!("shard-{f}.parquet"));
        common::parquet::write_texts(&local, &texts);
        s3.put_file("raw", &format!("web/2024/shard-{f}.parquet"), &local).unwrap();
    }
    s3.put_bytes("raw", "web/2024/README.md", b"not an input".to_vec()).unwrap();
    let prepare = |output: &str, step: &[&str], tokenizer: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args(["prepare", "--tokenizer", tokenizer, "--shard-tokens", "2048", "--validation-fraction", "0.1"])
            .args(["--input", "s3://raw/web/**/*.parquet", "--name", "web", "--output", output])
            .args(step)
            .env("TRAINER_CACHE", server.root.join("cache"))
            .envs(s3_env(&server))
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap();
        assert!(o.status.success(), "{step:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let w0 = prepare("s3://datasets/web-workers", &["--step", "work", "--workers", "2", "--worker", "0"], "embedded");
    let w1 = prepare("s3://datasets/web-workers", &["--step", "work", "--workers", "2", "--worker", "1"], "embedded");
    let files = |out: &str| -> u32 { out.split_once(": ").unwrap().1.split(' ').next().unwrap().parse().unwrap() };
    assert_eq!(files(&w0) + files(&w1), 5, "every file by one worker:\n{w0}\n{w1}");
    assert!(files(&w0) > 0 && files(&w1) > 0, "{w0}\n{w1}");
    assert_eq!(s3.size("datasets", "web-workers/manifest.json").unwrap(), None, "the workers do not merge");
    let merged = prepare("s3://datasets/web-workers", &["--step", "merge"], "embedded");
    assert!(merged.contains("merged 5 files (0 failed)"), "{merged}");
    // The one process reads the same tokenizer as a tokenizer.json in S3: the merge's copy.
    prepare("s3://datasets/web-one", &[], "s3://datasets/web-workers/tokenizer.json");
    let manifest = |prefix: &str| -> serde_json::Value {
        serde_json::from_slice(&s3.get_bytes("datasets", &format!("{prefix}/manifest.json"), u64::MAX).unwrap())
            .unwrap()
    };
    let (workers, one) = (manifest("web-workers"), manifest("web-one"));
    assert_eq!(workers, one, "two workers and a merge give the manifest one process gives");
    let keys: Vec<&str> =
        one["input"]["files"].as_array().unwrap().iter().map(|f| f["key"].as_str().unwrap()).collect();
    assert_eq!(keys, (0..5).map(|f| format!("2024/shard-{f}.parquet")).collect::<Vec<_>>());
    assert_eq!(one["input"]["documents"], 40 + 70 + 100 + 130 + 160);
    // Nothing is left staged or downloaded.
    let staged = std::fs::read_dir(server.root.join("cache/prepare-staging")).map_or(0, |d| d.count());
    assert_eq!(staged, 0);

    let dir = server.root.join("run");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.yaml"), data_manifest("s3://datasets/web-workers", "embedded")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["run", "--no-sample", "-o"])
        .arg(dir.join("out"))
        .arg(dir.join("run.yaml"))
        .env("TRAINER_CACHE", server.root.join("cache"))
        .envs(s3_env(&server))
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let steps = trainer::telemetry::metrics_log::read(&dir.join("out/metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| matches!(r, trainer::telemetry::metrics_log::Record::Step(_)))
        .count();
    assert_eq!(steps, 16);
}
