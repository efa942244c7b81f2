//! `cargo bench -p e2e --bench operator` (run by `make bench-operator`): reconciles
//! `BENCH_RUNS` TrainingRuns (default 10,000; `BENCH_RUNS=50` is a seconds-long smoke
//! test) in one namespace of the in-memory fake API, and reports
//! - in process: p50/p99 of one call of the real `controller::reconcile`, over three
//!   rounds of every run (finalizer; children and Job; status once the Job is seen),
//!   against a baseline measured in the same run: one GET round trip through the same
//!   fake;
//! - in process: the write requests (POST/PUT/PATCH/DELETE, no-op writes, status
//!   patches and events included) the fake receives during one more round once every
//!   run has settled (a Job and `status.jobName`); a settled run should cost none;
//! - the real `operator` binary (release, or the one `OPERATOR_BIN` names) reconciling
//!   the same runs through its watches, over HTTP: seconds until every run has a Job
//!   and a status, its peak RSS (`VmHWM`), and the write requests it sends in a window
//!   of a few seconds once it has settled and gone quiet (requeues of early runs fall
//!   in that window);
//! - per measured round, which requests wrote, grouped by method and resource.
//!
//! Goals: peak RSS < 128 MiB, reconcile p99 < 50 ms, 0 writes in steady state. The
//! last line printed is `BENCH_JSON {...}` for the benchmark suite, with `runs`,
//! `reconcile_p50_ms`, `reconcile_p99_ms`, `get_baseline_p50_ms`, `binary_settle_s`,
//! `peak_rss_mib`, `steady_state_writes` (in process), `binary_steady_writes` (`null`
//! for the binary's figures when it is not built), the goals (`rss_goal_mib`,
//! `p99_goal_ms`, `writes_goal`) and details (`*_write_kinds`, the binary's window).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::TrainingRun;
use e2e::fake_api::FakeApi;
use kube::CustomResourceExt;
use kube::api::Api;
use operator::clock::SystemClock;
use operator::context::Context;
use operator::controller;
use operator::metrics::Metrics;
use operator::settings::Settings;
use serde_json::json;
use tower::Service;

const NS: &str = "bench";
const DEFAULT_RUNS: usize = 10_000;
const RSS_GOAL_MIB: u32 = 128;
const P99_GOAL_MS: u32 = 50;
const WRITES_GOAL: u64 = 0;
/// How long the binary must send no write before its steady-state window starts, and
/// the longest it may take to get there.
const QUIET: Duration = Duration::from_secs(2);
const QUIET_LIMIT: Duration = Duration::from_secs(60);
/// The binary's steady-state window.
const WINDOW: Duration = Duration::from_secs(5);
const WRITE_METHODS: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

fn bench_runs() -> usize {
    match std::env::var("BENCH_RUNS") {
        Ok(s) => s.trim().parse().ok().filter(|n| *n > 0).unwrap_or_else(|| {
            panic!("BENCH_RUNS must be a positive number of runs, not {s:?}");
        }),
        Err(_) => DEFAULT_RUNS,
    }
}

fn run_name(i: usize) -> String {
    format!("run-{i:05}")
}

fn populate(fake: &FakeApi, runs: usize) {
    fake.insert(serde_json::to_value(TrainingRun::crd()).unwrap());
    fake.insert(serde_json::to_value(crds::types::TrainingDataset::crd()).unwrap());
    for i in 0..runs {
        fake.insert(json!({
            "apiVersion": "training.puretransformer.dev/v1alpha1", "kind": "TrainingRun",
            "metadata": {"name": run_name(i), "namespace": NS},
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

/// Whether every run has a Job and `status.jobName`.
fn settled(fake: &FakeApi, runs: usize) -> bool {
    fake.count("batch/v1", "Job", Some(NS), |_| true) == runs
        && fake.count("training.puretransformer.dev/v1alpha1", "TrainingRun", Some(NS), |r| {
            r["status"]["jobName"].is_string()
        }) == runs
}

/// Requests received so far, and write requests among them.
fn counts(fake: &FakeApi) -> (u64, u64) {
    let by_method = fake.request_counts();
    let writes = WRITE_METHODS.iter().filter_map(|m| by_method.get(*m)).sum();
    (by_method.values().sum(), writes)
}

/// `METHOD plural[/subresource]` of a request line, e.g. `PATCH trainingruns/status`.
fn request_kind(line: &str) -> String {
    let (method, path) = line.split_once(' ').unwrap_or((line, ""));
    let segs: Vec<&str> = path.split('?').next().unwrap_or("").split('/').filter(|s| !s.is_empty()).collect();
    // Past `/api/{version}` or `/apis/{group}/{version}`, then `namespaces/{ns}`.
    let rest = match segs.first() {
        Some(&"api") => segs.get(2..),
        Some(&"apis") => segs.get(3..),
        _ => None,
    };
    let rest = match rest.unwrap_or_default() {
        ["namespaces", _, plural, rest @ ..] => [&[*plural][..], rest].concat(),
        other => other.to_vec(),
    };
    match rest.as_slice() {
        [plural, _name, sub] => format!("{method} {plural}/{sub}"),
        [plural, ..] => format!("{method} {plural}"),
        [] => format!("{method} {path}"),
    }
}

/// The write requests received since the `from`-th request, by [`request_kind`].
fn writes_since(fake: &FakeApi, from: u64) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    for line in fake.requests().iter().skip(from as usize) {
        if WRITE_METHODS.iter().any(|m| line.starts_with(&format!("{m} "))) {
            *kinds.entry(request_kind(line)).or_default() += 1;
        }
    }
    kinds
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

struct InProcess {
    p50: f64,
    p99: f64,
    get_p50: f64,
    /// Seconds per round, and the write requests of each round (the last is the steady one).
    round_secs: Vec<f64>,
    round_writes: Vec<u64>,
    round_kinds: Vec<BTreeMap<String, u64>>,
    settled: bool,
    steady_p50: f64,
    steady_p99: f64,
}

async fn in_process(runs: usize) -> InProcess {
    let fake = FakeApi::new();
    populate(&fake, runs);
    let client = fake.client();
    let ctx =
        Context::new(client.clone(), Settings::default(), Arc::new(Metrics::new().unwrap()), Arc::new(SystemClock));
    let api: Api<TrainingRun> = Api::namespaced(client, NS);
    let (mut reconcile_ms, mut get_ms, mut steady_ms) = (Vec::new(), Vec::new(), Vec::new());
    let (mut round_secs, mut round_writes, mut round_kinds) = (Vec::new(), Vec::new(), Vec::new());
    let mut settled_before_steady = false;
    // Round 1 adds finalizers, round 2 creates every child and the Job, round 3 records
    // the Job it now sees (p50/p99 are over these three, as in earlier versions of this
    // bench); round 4, once every run has settled, is the one whose writes count.
    for round in 0..4 {
        if round == 3 {
            settled_before_steady = settled(&fake, runs);
        }
        let (requests_before, writes_before) = counts(&fake);
        let started = Instant::now();
        for i in 0..runs {
            let t = Instant::now();
            let run = api.get(&run_name(i)).await.unwrap();
            let get = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            controller::reconcile(Arc::new(run), ctx.clone()).await.unwrap();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if round < 3 {
                get_ms.push(get);
                reconcile_ms.push(ms);
            } else {
                steady_ms.push(ms);
            }
        }
        round_secs.push(started.elapsed().as_secs_f64());
        let writes = counts(&fake).1 - writes_before;
        round_writes.push(writes);
        round_kinds.push(if writes > 0 { writes_since(&fake, requests_before) } else { BTreeMap::new() });
    }
    let (reconcile_ms, get_ms, steady_ms) = (sorted(reconcile_ms), sorted(get_ms), sorted(steady_ms));
    InProcess {
        p50: percentile(&reconcile_ms, 0.5),
        p99: percentile(&reconcile_ms, 0.99),
        get_p50: percentile(&get_ms, 0.5),
        round_secs,
        round_writes,
        round_kinds,
        settled: settled_before_steady,
        steady_p50: percentile(&steady_ms, 0.5),
        steady_p99: percentile(&steady_ms, 0.99),
    }
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

struct Binary {
    settle_s: f64,
    /// Seconds from start until no write for [`QUIET`], if that came within [`QUIET_LIMIT`].
    quiet_s: Option<f64>,
    hwm_kib: u64,
    window_s: f64,
    /// Write requests, and GETs of single runs (one per reconcile), in the window.
    window_writes: u64,
    window_reconciles: u64,
    window_kinds: BTreeMap<String, u64>,
}

/// Generous: 10,000 runs settled in 7-10 ms each on a busy 2-core VM.
fn settle_limit(runs: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(30) * runs as u32
}

async fn binary(runs: usize) -> Option<Binary> {
    let bin = match std::env::var_os("OPERATOR_BIN") {
        Some(bin) => {
            let bin = std::path::PathBuf::from(bin);
            assert!(bin.exists(), "OPERATOR_BIN={} does not exist", bin.display());
            bin
        }
        None => std::env::current_exe().ok()?.parent()?.parent()?.join("operator"),
    };
    if !bin.exists() {
        eprintln!("skipping the binary: build {} first (make bench-operator does)", bin.display());
        return None;
    }
    let fake = FakeApi::new();
    populate(&fake, runs);
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
    let limit = settle_limit(runs);
    let mut exited = None;
    while !settled(&fake, runs) && started.elapsed() < limit && exited.is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        exited = child.try_wait().ok().flatten();
    }
    let settle_s = started.elapsed().as_secs_f64();
    let all_settled = settled(&fake, runs);
    // Let the queue drain: the settling reconciles triggered by the children's events.
    let mut quiet_s = None;
    let (mut last_writes, mut last_change) = (counts(&fake).1, Instant::now());
    let quiet_started = Instant::now();
    while all_settled && quiet_started.elapsed() < QUIET_LIMIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let writes = counts(&fake).1;
        if writes != last_writes {
            (last_writes, last_change) = (writes, Instant::now());
        } else if last_change.elapsed() >= QUIET {
            quiet_s = Some(started.elapsed().as_secs_f64());
            break;
        }
    }
    let (requests_before, writes_before) = counts(&fake);
    let window_started = Instant::now();
    if all_settled {
        tokio::time::sleep(WINDOW).await;
    }
    let window_s = window_started.elapsed().as_secs_f64();
    let window_writes = counts(&fake).1 - writes_before;
    let hwm_kib = rss_kib(child.id(), "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(status) = exited {
        panic!("{} exited ({status}) before it reconciled all {runs} runs", bin.display());
    }
    assert!(all_settled, "the operator did not reconcile all {runs} runs within {limit:?}");
    // Every reconcile starts with a GET of its run, which no watch or list sends.
    let window = fake.requests().into_iter().skip(requests_before as usize);
    let window_reconciles =
        window.filter(|l| l.starts_with("GET ") && !l.contains('?') && l.contains("/trainingruns/")).count() as u64;
    let window_kinds = if window_writes > 0 { writes_since(&fake, requests_before) } else { BTreeMap::new() };
    Some(Binary { settle_s, quiet_s, hwm_kib, window_s, window_writes, window_reconciles, window_kinds })
}

fn kinds_line(kinds: &BTreeMap<String, u64>) -> String {
    kinds.iter().map(|(k, n)| format!("{n} × {k}")).collect::<Vec<_>>().join(", ")
}

#[tokio::main]
async fn main() {
    let runs = bench_runs();
    let ip = in_process(runs).await;
    println!("reconcile of {runs} TrainingRuns × 3 rounds against the fake API (in process):");
    println!(
        "  p50 {:.3} ms, p99 {:.3} ms (goal < {P99_GOAL_MS} ms: {:.3}× of the goal)",
        ip.p50,
        ip.p99,
        ip.p99 / f64::from(P99_GOAL_MS)
    );
    println!(
        "  baseline: one GET round trip through the same fake, p50 {:.3} ms; a reconcile costs {:.1}× that",
        ip.get_p50,
        ip.p50 / ip.get_p50
    );
    for (i, (secs, writes)) in ip.round_secs.iter().zip(&ip.round_writes).enumerate() {
        let which = if *writes > 0 { format!(": {}", kinds_line(&ip.round_kinds[i])) } else { String::new() };
        let round = if i == 3 { "steady round".to_string() } else { format!("round {}", i + 1) };
        println!("  {round}: {secs:.1} s, {writes} write requests{which}");
    }
    let steady_writes = ip.round_writes[3];
    println!(
        "steady state (in process): every run settled before the round: {}; one more round of {runs} reconciles \
         (p50 {:.3} ms, p99 {:.3} ms) sent {steady_writes} write requests (goal {WRITES_GOAL})",
        ip.settled, ip.steady_p50, ip.steady_p99
    );
    let bin = binary(runs).await;
    if let Some(b) = &bin {
        let mib = b.hwm_kib as f64 / 1024.0;
        println!("operator binary (release) reconciling {runs} runs over HTTP through its watches:");
        println!(
            "  all runs with a Job and a status after {:.1} s; peak RSS {mib:.1} MiB (goal < {RSS_GOAL_MIB} MiB: {:.2}× of the goal)",
            b.settle_s,
            mib / f64::from(RSS_GOAL_MIB)
        );
        match b.quiet_s {
            Some(q) => println!("  no write for {QUIET:?} by {q:.1} s"),
            None => println!("  still writing {QUIET_LIMIT:?} after settling"),
        }
        println!(
            "  steady window of {:.1} s: {} reconciles (GETs of a run), {} write requests (goal {WRITES_GOAL})",
            b.window_s, b.window_reconciles, b.window_writes
        );
        if b.window_writes > 0 {
            println!("  which: {}", kinds_line(&b.window_kinds));
        }
    }
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let report = json!({
        "runs": runs,
        "reconcile_p50_ms": round3(ip.p50),
        "reconcile_p99_ms": round3(ip.p99),
        "get_baseline_p50_ms": round3(ip.get_p50),
        "binary_settle_s": bin.as_ref().map(|b| round3(b.settle_s)),
        "peak_rss_mib": bin.as_ref().map(|b| round3(b.hwm_kib as f64 / 1024.0)),
        "steady_state_writes": steady_writes,
        "binary_steady_writes": bin.as_ref().map(|b| b.window_writes),
        "binary_steady_window_s": bin.as_ref().map(|b| round3(b.window_s)),
        "binary_steady_reconciles": bin.as_ref().map(|b| b.window_reconciles),
        "steady_state_write_kinds": ip.round_kinds[3],
        "binary_steady_write_kinds": bin.as_ref().map(|b| b.window_kinds.clone()).unwrap_or_default(),
        "rss_goal_mib": RSS_GOAL_MIB,
        "p99_goal_ms": P99_GOAL_MS,
        "writes_goal": WRITES_GOAL,
    });
    println!("BENCH_JSON {report}");
}
