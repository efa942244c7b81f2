//! Issue 45 on real storage: a TrainingDataset whose raw Parquet and shards are in S3
//! (s3s-fs on the host, behind a Service `store` whose endpoint is the router, as a
//! store outside the cluster is; credentials from a Secret through `spec.env`), trained on by a run
//! that reads the shards from S3; and a dataset whose output claim is a 16 KiB tmpfs,
//! which fills: StorageFull, not retried.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crds::types::{DatasetPhase, RunPhase};
use e2e::network::nodes::ROUTER;
use e2e::network::relay::Relay;
use sha2::{Digest, Sha256};

use crate::datasets::{claim, claim_dir, dataset, wait_ds};
// Parquet as Hugging Face datasets store text, the trainer's tests' own writer.
#[path = "../../../trainer/tests/common/parquet.rs"]
mod hf_parquet;
use crate::harness::*;
use crate::scenario::{MINUTES, NS, Scenario};

const KEY: &str = "AKIAE2EDATASETS00001";
const SECRET: &str = "e2e-datasets-secret-0123456789abcdef";
/// The store's port, at its Service and at the router.
const S3_PORT: u16 = 9000;

/// Service `store` in front of the router's port [`S3_PORT`]: a selector-less Service
/// with an EndpointSlice of our own, as for any endpoint outside the cluster.
const STORE_SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata: {name: store}
spec:
  ports: [{name: s3, port: 9000, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: store-router
  labels: {kubernetes.io/service-name: store, endpointslice.kubernetes.io/managed-by: e2e.puretransformer.dev}
addressType: IPv4
ports: [{name: s3, port: 9000, protocol: TCP}]
endpoints: [{addresses: ["172.18.0.1"]}]
"#;

/// s3s-fs serving `root` (a bucket a directory) on the host's loopback.
struct S3Server {
    child: Child,
    port: u16,
    root: PathBuf,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The s3s-fs binary scripts/setup-s3.sh installs: `$S3S_FS`, else ~/.cargo/bin's.
fn s3s_fs() -> PathBuf {
    if let Some(p) = std::env::var_os("S3S_FS") {
        return p.into();
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let p = home.join(".cargo/bin/s3s-fs");
    assert!(p.is_file(), "{} is missing: scripts/setup-s3.sh installs it", p.display());
    p
}

fn start_s3(root: &Path, buckets: &[&str]) -> S3Server {
    for b in buckets {
        std::fs::create_dir_all(root.join(b)).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(s3s_fs())
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", KEY, "--secret-key", SECRET])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("s3s-fs starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "s3s-fs did not listen on {port} within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    S3Server { child, port, root: root.to_path_buf() }
}

/// The licence texts' paragraphs.
fn paragraphs() -> Vec<String> {
    let mut names: Vec<PathBuf> = std::fs::read_dir("/usr/share/common-licenses")
        .expect("the licence corpus")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            text.split("\n\n").map(str::trim).filter(|t| t.len() > 40).map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

/// A tmpfs of `size` mounted over `dir` until dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        // The provisioner makes a volume's directory when a pod first mounts it.
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "pt-e2e-full"])
            .arg(dir)
            .output()
            .expect("mount(8)");
        assert!(o.status.success(), "mount tmpfs on {}: {}", dir.display(), String::from_utf8_lossy(&o.stderr));
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

const ENV: &str = "  env:\n    - {name: AWS_ENDPOINT_URL, value: 'http://store.ml.svc:9000'}\n    - {name: AWS_REGION, value: us-east-1}\n    \
                   - name: AWS_ACCESS_KEY_ID\n      valueFrom: {secretKeyRef: {name: store, key: AWS_ACCESS_KEY_ID}}\n    \
                   - name: AWS_SECRET_ACCESS_KEY\n      valueFrom: {secretKeyRef: {name: store, key: AWS_SECRET_ACCESS_KEY}}\n";

/// Dataset `lake`: 6 Parquet files in `s3://raw/lake/`, prepared by 2 workers into
/// `s3://prepared/lake`; its manifest's digest is the one in status, and run `reader`
/// trains on the shards in S3 to Succeeded. Dataset `full`: the same files into a claim
/// on a 16 KiB tmpfs: Failed with StorageFull at once (exit 89 fails the Job without a
/// retry), named in an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_dataset_is_trained_on_and_a_full_claim_is_storage_full() {
    let sim = Scenario::with_nodes(2).await;
    let store = start_s3(&sim.c.dir.join("s3"), &["raw", "prepared"]);
    let _relay = Relay::start(
        &sim.c.net.path(),
        SocketAddr::from((ROUTER, S3_PORT)),
        SocketAddr::from(([127, 0, 0, 1], store.port)),
    )
    .expect("the store's port at the router");
    assert!(STORE_SERVICE.contains(&format!("\"{ROUTER}\"")), "the store's endpoint is the router");
    apply(&sim.c, NS, STORE_SERVICE);
    let texts = paragraphs();
    assert!(texts.len() > 300, "{} paragraphs", texts.len());
    let raw = store.root.join("raw/lake");
    std::fs::create_dir_all(&raw).unwrap();
    for (i, chunk) in texts.chunks(texts.len() / 6 + 1).enumerate() {
        hf_parquet::write_texts(&raw.join(format!("train-{i:05}.parquet")), chunk);
    }
    apply(
        &sim.c,
        NS,
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: store}}\nstringData: {{AWS_ACCESS_KEY_ID: {KEY}, AWS_SECRET_ACCESS_KEY: {SECRET}}}\n"
        ),
    );
    apply(
        &sim.c,
        NS,
        &dataset(
            "lake",
            &format!(
                "  source: {{uris: ['s3://raw/lake/*.parquet']}}\n  tokenizer: {{embedded: true}}\n  output: s3://prepared/lake\n  \
                 workers: 2\n  shardTokens: 16K\n  validationFraction: 0.1\n{ENV}"
            ),
        ),
    );
    sim.apply(
        "reader",
        &format!(
            r#"  model: {{preset: nano}}
  tokens: 16K
  data:
    mix:
      - {{name: lake, weight: 1.0, dataset: lake}}
    validation: {{tokens: 2K}}
  topology: {{nodes: 1, gpusPerNode: 0}}
  batch: {{globalTokens: 1024, microBatch: 4, seqLength: 64}}
  optimizer: {{lr: 3.0e-3, warmupTokens: 1K}}
{ENV}"#
        ),
    );

    let ready = wait_ds(&sim, "lake", "Ready", MINUTES(4), |s| s.phase == Some(DatasetPhase::Ready)).await;
    let manifest = ready.manifest.clone().expect("a Ready dataset has its manifest");
    assert_eq!(manifest.uri, "s3://prepared/lake");
    let bytes = std::fs::read(store.root.join("prepared/lake/manifest.json")).expect("manifest.json in the bucket");
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(manifest.sha256, digest, "status names the manifest's digest");
    let written: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let files = written["input"]["files"].as_array().expect("the manifest lists its input files");
    assert_eq!(files.len(), 6, "{written:#}");
    assert!(files.iter().all(|f| f["key"].as_str().is_some_and(|k| k.ends_with(".parquet"))), "{written:#}");
    let p = ready.progress.clone().expect("progress");
    assert_eq!((p.files_done, p.files_total), (6, 6), "{p:?}");
    assert!(ready.shards.unwrap_or_default() >= 2, "{ready:#?}");
    let staged: Vec<String> = std::fs::read_dir(store.root.join("prepared/lake"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(staged.iter().any(|n| n.ends_with(".bin")), "shards in the bucket: {staged:?}");

    let done = sim.wait_phase("reader", RunPhase::Succeeded, MINUTES(4)).await;
    let trained = done.progress.expect("progress");
    assert!(trained.tokens > 0 && trained.tokens == trained.total_tokens, "{trained:?}");
    // The only copy of the shards is in the bucket: the run's config names it.
    let config = kubectl(&sim.c, &["-n", NS, "get", "configmaps", "-o", "yaml"]);
    assert!(config.contains("s3://prepared/lake"), "the run's config names the shards in S3:\n{config}");

    // --- A claim that fills up.
    apply(&sim.c, NS, &claim("small"));
    let small = claim_dir(&sim, "small").await;
    let _tmpfs = Tmpfs::mount(&small, "16k");
    apply(
        &sim.c,
        NS,
        &dataset(
            "full",
            &format!(
                "  source: {{uris: ['s3://raw/lake/*.parquet']}}\n  tokenizer: {{embedded: true}}\n  output: pvc://small/full\n  \
                 shardTokens: 1M\n{ENV}"
            ),
        ),
    );
    let full = wait_ds(&sim, "full", "Failed", MINUTES(3), |s| s.phase == Some(DatasetPhase::Failed)).await;
    assert_eq!(full.reason.as_deref(), Some("StorageFull"), "{full:#?}");
    assert_eq!(full.retries, 0, "a full disk is not retried: {full:#?}");
    let reasons = event_reasons(&sim.c, NS, "full");
    assert!(reasons.iter().any(|r| r == "StorageFull"), "{reasons:?}");
}
