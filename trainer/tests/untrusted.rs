//! Files and objects the trainer did not write, made hostile: manifests naming files
//! outside their directory, objects whose size contradicts their manifest, and S3
//! credentials that must never reach an output. Run through the binary, locally and
//! against a real S3 server (s3s-fs).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::s3::{KEY, SECRET, Server, client, s3_env, start};
use common::{scratch, trainer_bin};

/// Embedded tokenizer; the `web` source at `uri`.
fn run_yaml(uri: &str, extra: &str) -> String {
    format!(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: untrusted}}
spec:
  model: {{preset: nano, tokenizer: embedded}}
  tokens: "8192"
  data:
    mix:
      - {{name: web, weight: 0.7, uri: "{uri}"}}
      - {{name: mcq, weight: 0.3, uri: "embedded:mcq"}}
    validation: {{everySteps: 8, tokens: "1K"}}
  topology: {{nodes: 1, gpusPerNode: 0}}
  batch: {{globalTokens: 512, microBatch: 4, seqLength: 64}}
  optimizer: {{lr: 3.0e-3, warmupTokens: "1K"}}
  precision: f32
{extra}"#
    )
}

fn prepare(output: &str, env: &[(&'static str, String)], input: &Path) {
    let o = trainer_bin()
        .args(["prepare", "--tokenizer", "embedded", "--shard-tokens", "2048", "--validation-fraction", "0.1"])
        .arg("--input")
        .arg(input)
        .args(["--output", output])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn text_input(dir: &Path) -> PathBuf {
    let input = dir.join("in.jsonl");
    let lines: Vec<String> =
        (0..400).map(|i| format!("{{\"text\": \"Record {i}: the river Belmora passes {} towns.\"}}", i % 13)).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    input
}

/// `trainer run` of `yaml` into `dir/out` with the shared cache swapped for `cache`.
fn run(dir: &Path, name: &str, yaml: &str, cache: &Path, env: &[(&'static str, String)]) -> Output {
    let manifest = dir.join(format!("{name}.yaml"));
    std::fs::write(&manifest, yaml).unwrap();
    trainer_bin()
        .args(["run", "--no-sample", "-o"])
        .arg(dir.join(name))
        .arg(&manifest)
        .env("TRAINER_CACHE", cache)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap()
}

fn assert_data_error(o: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(crds::contract::FailureReason::DataError.exit_code()), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in: {stderr}");
    }
}

/// Every file under `dir` whose name is `name`.
fn find(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(find(&path, name));
        } else if entry.file_name() == name {
            found.push(path);
        }
    }
    found
}

#[test]
fn manifests_naming_files_outside_their_directory_are_refused_locally() {
    let dir = scratch("untrusted-local");
    let source = dir.join("web");
    prepare(source.to_str().unwrap(), &[], &text_input(&dir));
    // A shard the manifest must not reach: a valid one, one directory up.
    std::fs::copy(source.join("part-00000-train-00000.bin"), dir.join("outside.bin")).unwrap();
    let original = std::fs::read_to_string(source.join("manifest.json")).unwrap();
    let absolute = dir.join("outside.bin").display().to_string();
    for bad in ["../outside.bin", absolute.as_str()] {
        let mut m: serde_json::Value = serde_json::from_str(&original).unwrap();
        m["train"][0]["file"] = bad.into();
        std::fs::write(source.join("manifest.json"), m.to_string()).unwrap();
        let o = run(&dir, "local", &run_yaml(source.to_str().unwrap(), ""), &common::cache(), &[]);
        let manifest = source.join("manifest.json").display().to_string();
        assert_data_error(&o, &[&manifest, &format!("train[0].file: {bad:?} is not a plain file name")]);
        assert!(!dir.join("local/metrics.jsonl").exists(), "{bad}: nothing may train on a refused manifest");
    }
}

#[test]
fn s3_manifests_cannot_write_outside_the_cache_or_lie_about_sizes() {
    let server = start(&["datasets"]);
    let env = || {
        let mut e = s3_env(&server).to_vec();
        e.push(("AWS_REGION", "us-east-1".into()));
        e
    };
    prepare("s3://datasets/web/v1", &env(), &text_input(&server.root));
    let s3 = client(&server, SECRET);
    let manifest: serde_json::Value =
        serde_json::from_slice(&s3.get_bytes("datasets", "web/v1/manifest.json", u64::MAX).unwrap()).unwrap();
    let shard = manifest["train"][0]["file"].as_str().unwrap().to_string();
    let shard_bytes = s3.get_bytes("datasets", &format!("web/v1/{shard}"), u64::MAX).unwrap();
    let cache = server.root.join("cache");

    // Traversal: a manifest naming `../../../../escape.bin`, with that key really in the
    // bucket, so an unchecked trainer would download it and write it above its cache.
    let mut evil = manifest.clone();
    evil["train"][0]["file"] = "../../../../escape.bin".into();
    s3.put_bytes("datasets", "evil/manifest.json", evil.to_string().into_bytes()).unwrap();
    s3.put_bytes("datasets", "escape.bin", shard_bytes.clone()).unwrap();
    let o = run(&server.root, "evil", &run_yaml("s3://datasets/evil", ""), &cache, &env());
    assert_data_error(
        &o,
        &["s3://datasets/evil/manifest.json", "train[0].file: \"../../../../escape.bin\" is not a plain file name"],
    );
    assert_eq!(find(&server.root, "escape.bin"), [server.root.join("datasets/escape.bin")], "only the bucket's own");

    // Size lie: the manifest claims more tokens than the object holds. The object's
    // size is checked against the entry before any byte is downloaded.
    let mut liar = manifest.clone();
    let tokens = liar["train"][0]["tokens"].as_u64().unwrap();
    liar["train"][0]["tokens"] = (tokens + (1 << 40)).into();
    s3.put_bytes("datasets", "liar/manifest.json", liar.to_string().into_bytes()).unwrap();
    for entry in manifest["train"].as_array().unwrap().iter().chain(manifest["validation"].as_array().unwrap()) {
        let file = entry["file"].as_str().unwrap();
        let bytes = s3.get_bytes("datasets", &format!("web/v1/{file}"), u64::MAX).unwrap();
        s3.put_bytes("datasets", &format!("liar/{file}"), bytes).unwrap();
    }
    let o = run(&server.root, "liar", &run_yaml("s3://datasets/liar", ""), &cache, &env());
    let expected = 128 + 2 * (tokens + (1 << 40));
    assert_data_error(
        &o,
        &[
            &format!("s3://datasets/liar/{shard}"),
            &format!("{} bytes in the bucket, but its manifest entry", shard_bytes.len()),
            &format!("makes it {expected} bytes"),
        ],
    );
    assert!(find(&cache, &shard).iter().all(|p| !p.starts_with(cache.join("s3/datasets/liar"))), "nothing fetched");

    // A prefix that climbs out of the cache is refused before anything is fetched.
    let o = run(&server.root, "climb", &run_yaml("s3://datasets/web/../../../x", ""), &cache, &env());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("spec.data.mix[0].uri") && stderr.contains("a '.' or '..' segment"), "{stderr}");
    assert_eq!(o.status.code(), Some(crds::contract::FailureReason::InvalidConfig.exit_code()), "{stderr}");
}

/// Polls `GET /status` and `/metrics` at `addr` until `stop`, keeping every answer.
fn poll_status(addr: String, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut seen = String::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            for path in ["/status", "/metrics"] {
                if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                    let _ = s.read_to_string(&mut seen);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        seen
    })
}

/// Every byte a run left behind: its stdout and stderr, its termination message, what
/// its status port answered, and every file of its output directory.
fn outputs(o: &Output, termination: &Path, status: String, out: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all = vec![
        ("stdout".to_string(), o.stdout.clone()),
        ("stderr".to_string(), o.stderr.clone()),
        ("termination message".to_string(), std::fs::read(termination).unwrap_or_default()),
        ("/status and /metrics".to_string(), status.into_bytes()),
    ];
    fn walk(dir: &Path, all: &mut Vec<(String, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, all);
            } else {
                all.push((path.display().to_string(), std::fs::read(&path).unwrap()));
            }
        }
    }
    walk(out, &mut all);
    all
}

fn assert_no_credentials(all: &[(String, Vec<u8>)], secrets: &[&str]) {
    for (what, bytes) in all {
        for secret in secrets {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "{secret:?} appears in {what}: {}", String::from_utf8_lossy(bytes));
        }
    }
}

/// A run whose S3 calls fail with credentials in its environment: at the start (the
/// checkpoint directory is empty, so it lists the mirror) and in the middle (a local
/// checkpoint to resume from, then uploads refused). Neither the access key nor the
/// secret may appear in anything it leaves: logs at debug level, the termination
/// message (which the operator turns into events and status), `/status`, `/metrics`,
/// `metrics.jsonl`, TensorBoard files or checkpoints.
#[test]
fn s3_credentials_never_reach_any_output() {
    let server: Server = start(&["ckpt"]);
    let wrong_secret = "wrong-secret-MUST-NOT-BE-PRINTED-7f3a9c";
    let mirror = format!(
        "  checkpoint:\n    everySteps: 4\n    keepLast: 2\n    s3: {{uri: \"s3://ckpt/runs/untrusted\", endpoint: \"{}\", \
         region: us-east-1, secretRef: {{name: s3-creds}}}}\n",
        server.endpoint
    );
    let yaml = run_yaml("embedded:textbook", &mirror);
    let manifest = server.root.join("run.yaml");
    std::fs::write(&manifest, &yaml).unwrap();
    let launch = |out: &Path, secret: &str, extra: &[&str]| {
        let termination = out.with_extension("termination-log");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args(["run", "--no-sample", "-o"])
            .arg(out)
            .arg(&manifest)
            .args(extra)
            .env("TRAINER_CACHE", common::cache())
            .env("TRAINER_STATUS_ADDR", format!("127.0.0.1:{port}"))
            .env("TRAINER_TERMINATION_LOG", &termination)
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let poller = poll_status(format!("127.0.0.1:{port}"), stop.clone());
        let o = child.wait_with_output().unwrap();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let status = poller.join().unwrap();
        (o, termination, status)
    };

    // At the start: nothing local, so the mirror is listed, and refused.
    let out = server.root.join("fresh");
    let (o, termination, status) = launch(&out, wrong_secret, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("access denied"), "{stderr}");
    assert!(std::fs::read_to_string(&termination).unwrap().contains("access denied"));
    assert_no_credentials(&outputs(&o, &termination, status, &out), &[wrong_secret, SECRET, KEY]);

    // In the middle: 4 steps with the right secret, then the rest with a wrong one.
    let out = server.root.join("resumed");
    let (o, _, _) = launch(&out, SECRET, &["--stop-after-steps", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, termination, status) = launch(&out, wrong_secret, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("mirroring") && stderr.contains("access denied"), "{stderr}");
    assert!(status.contains("\"step\""), "the status port answered during the run: {status}");
    let all = outputs(&o, &termination, status, &out);
    assert!(all.iter().any(|(name, _)| name.ends_with("metrics.jsonl")), "{:?}", all.iter().map(|a| &a.0));
    assert_no_credentials(&all, &[wrong_secret, SECRET, KEY]);
}
