//! `cargo bench -p e2e --bench operator` (run by `make bench-operator`): reconciles
//! 1,000 TrainingRuns against the fake API and reports
//! - p50/p99 of one reconcile, called in process on the real pipeline, against a
//!   baseline measured in the same run: one GET round trip through the same fake;
//! - the peak RSS of the real `operator` binary (release) reconciling the same
//!   1,000 runs through its watches, over HTTP, against the 64 MB goal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::TrainingRun;
use e2e::fake_api::FakeApi;
use kube::CustomResourceExt;
use kube::api::Api;
use operator::clock::SystemClock;
use operator::controller::{self, Context};
use operator::metrics::Metrics;
use operator::settings::Settings;
use serde_json::json;
use tower::Service;

const RUNS: usize = 1000;
const NS: &str = "bench";

fn populate(fake: &FakeApi) {
    fake.insert(serde_json::to_value(TrainingRun::crd()).unwrap());
    for i in 0..RUNS {
        fake.insert(json!({
            "apiVersion": "training.puretransformer.dev/v1alpha1", "kind": "TrainingRun",
            "metadata": {"name": format!("run-{i:04}"), "namespace": NS},
            "spec": {
                "model": {"preset": "tiny"}, "tokens": "1B",
                "data": {"mix": [
                    {"name": "fineweb-edu", "weight": 0.45, "uri": "s3://data/fineweb-edu"},
                    {"name": "cosmopedia", "weight": 0.25, "uri": "s3://data/cosmopedia"},
                    {"name": "finepdfs", "weight": 0.2, "uri": "s3://data/finepdfs"},
                    {"name": "usmle", "weight": 0.1, "uri": "s3://data/usmle"}]},
                "topology": {"nodes": 2, "gpusPerNode": 8},
                "batch": {"globalTokens": 1048576, "microBatch": 8, "seqLength": 2048}
            }
        }));
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn in_process() -> (f64, f64, f64) {
    let fake = FakeApi::new();
    populate(&fake);
    let client = fake.client();
    let ctx =
        Context::new(client.clone(), Settings::default(), Arc::new(Metrics::new().unwrap()), Arc::new(SystemClock));
    let api: Api<TrainingRun> = Api::namespaced(client, NS);
    let mut reconcile_ms = Vec::new();
    let mut get_ms = Vec::new();
    // Round 1 adds finalizers, round 2 creates every child, round 3 is the steady state.
    for _round in 0..3 {
        for i in 0..RUNS {
            let name = format!("run-{i:04}");
            let t = Instant::now();
            let run = api.get(&name).await.unwrap();
            get_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            controller::reconcile(Arc::new(run), ctx.clone()).await.unwrap();
            reconcile_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    reconcile_ms.sort_by(f64::total_cmp);
    get_ms.sort_by(f64::total_cmp);
    (percentile(&reconcile_ms, 0.5), percentile(&reconcile_ms, 0.99), percentile(&get_ms, 0.5))
}

/// Serves the fake over HTTP, so the operator binary can use it as its API server.
async fn serve(fake: FakeApi) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let fake = fake.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let mut inner = fake.service();
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes =
                            http_body_util::BodyExt::collect(body).await.map(|b| b.to_bytes()).unwrap_or_default();
                        inner.call(http::Request::from_parts(parts, kube::client::Body::from(bytes.to_vec()))).await
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            });
        }
    });
    port
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn binary() -> Option<(u64, f64)> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("operator");
    if !bin.exists() {
        eprintln!("skipping the RSS measurement: build {} first (make bench-operator does)", bin.display());
        return None;
    }
    let fake = FakeApi::new();
    populate(&fake);
    let port = serve(fake.clone()).await;
    let dir = std::env::temp_dir().join(format!("operator-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!("apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u, namespace: {NS}}}}}]\ncurrent-context: c\n"),
    )
    .unwrap();
    let started = Instant::now();
    let mut child = std::process::Command::new(&bin)
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .args(["--leader-elect=false", "--metrics-addr=127.0.0.1:0", "--namespace", NS])
        .spawn()
        .ok()?;
    let done = |fake: &FakeApi| {
        fake.list("training.puretransformer.dev/v1alpha1", "TrainingRun", Some(NS))
            .iter()
            .filter(|r| r["status"]["jobName"].is_string())
            .count()
            == RUNS
            && fake.list("batch/v1", "Job", Some(NS)).len() == RUNS
    };
    while !done(&fake) && started.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settled = started.elapsed().as_secs_f64();
    // Let it idle through a few resyncs, then read its high-water mark.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let hwm = rss_kib(child.id(), "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(done(&fake), "the operator did not reconcile all {RUNS} runs within 300 s");
    Some((hwm, settled))
}

#[tokio::main]
async fn main() {
    let (p50, p99, get) = in_process().await;
    println!("reconcile of {RUNS} TrainingRuns × 3 rounds against the fake API (in process):");
    println!("  p50 {p50:.3} ms, p99 {p99:.3} ms (goal < 50 ms: {:.3}× of the goal)", p99 / 50.0);
    println!(
        "  baseline: one GET round trip through the same fake, p50 {get:.3} ms; a reconcile costs {:.1}× that",
        p50 / get
    );
    if let Some((hwm_kib, secs)) = binary().await {
        let mb = hwm_kib as f64 / 1024.0;
        println!("operator binary (release) reconciling {RUNS} runs over HTTP through its watches:");
        println!(
            "  all runs with a Job and a status after {secs:.1} s; peak RSS {mb:.1} MiB (goal < 64 MB: {:.2}× of the goal)",
            hwm_kib as f64 * 1024.0 / 64e6
        );
    }
}
