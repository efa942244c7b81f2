//! `make bench-operator`: the operator's binary, two replicas, against the real control
//! plane with kwok's nodes (`e2e::scale`): `BENCH_RUNS` TrainingRuns (10,000 unless
//! set) on `BENCH_NODES` nodes of 8 GPUs (1,000), training, failing, held by the
//! scheduler and suspended (`scale::load`). In phases:
//! - admission: every run created; seconds until each run's status shows its fate;
//! - settled: rank 0's steps frozen; seconds until a window of `BENCH_WINDOW_S` (30 s)
//!   passes with no write by the operator, then that window's requests per second by
//!   verb and resource (watches aside) and its writes (the goal: none);
//! - churn: edits of suspended runs (p50/p99 from the edit to its status written) and
//!   killed rank-0 pods of training runs (from the deletion to the next attempt in the
//!   status);
//! - failover: the leader SIGKILLed; seconds until the other holds the Lease, and until
//!   it has reconciled as many times as there are runs;
//! - the leader's RSS and CPU, etcd's size per run; what its stores hold by kind, whole
//!   and trimmed (`scale::stores`, counted by this binary's allocator);
//! - with `BENCH_PEER=jobset` (`make bench-operator` sets it), the peer: JobSet's
//!   controller on a cluster of its own given the same shapes as JobSets
//!   (`scale::jobset`), its time to show every fate, its requests once settled, its RSS
//!   and etcd's size per JobSet, each with ours over its.
//!
//! Needs root: it runs in a network namespace of its own, so that no address kwok gives
//! a pod is ever dialled off this machine. The last line is `BENCH_JSON {...}` for
//! `bench/suite.py`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crds::TrainingRun;
use e2e::control_plane::Error;
use e2e::scale::cluster::{Cluster, OPERATOR_NS, OPERATOR_USER, RUNS_NS, Replica};
use e2e::scale::jobset;
use e2e::scale::load::{self, Fate, Shape};
use e2e::scale::measure::{self, AuditTail};
use e2e::scale::seen::{self, Seen};
use e2e::scale::stores::{self, KindBytes};
use e2e::scale::stub::Stub;
use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: stores::Counting = stores::Counting;

const RSS_GOAL_MIB: f64 = 256.0;
const P99_GOAL_S: f64 = 1.0;
/// Requests per second per 10,000 settled runs, watches aside.
const SETTLED_GOAL_PER_10K: f64 = 1.0;

fn env_number(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(s) => s
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{name} must be a positive number, not {s:?}")),
        Err(_) => default,
    }
}

fn operator_binary() -> PathBuf {
    let bin = match std::env::var_os("OPERATOR_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => std::env::current_exe()
            .expect("the bench's path")
            .parent()
            .and_then(|p| p.parent())
            .expect("target/<profile>")
            .join("operator"),
    };
    assert!(
        bin.exists(),
        "the operator's binary {} does not exist: build it first (make bench-operator does), or set OPERATOR_BIN",
        bin.display()
    );
    bin
}

/// A network namespace with only loopback, for this process and all it starts.
fn own_network() {
    assert!(unsafe { libc::geteuid() } == 0, "the operator bench needs root (a network namespace of its own)");
    // SAFETY: called before any thread is started; unshare has no other precondition.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
    let up = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status().expect("ip link");
    assert!(up.success(), "ip link set lo up: {up}");
}

fn main() {
    own_network();
    let runs = env_number("BENCH_RUNS", 10_000);
    let nodes = env_number("BENCH_NODES", 1_000);
    let window = Duration::from_secs(env_number("BENCH_WINDOW_S", 30) as u64);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    if let Err(e) = rt.block_on(bench(runs, nodes, window)) {
        panic!("the operator bench: {e}");
    }
}

struct Figures {
    admission_s: f64,
    settle_s: f64,
    settled: BTreeMap<String, u64>,
    edit_s: Vec<f64>,
    restart_s: Vec<f64>,
    lease_s: f64,
    reconciled_again_s: f64,
    usage: measure::Usage,
    etcd_bytes: f64,
    stores: Vec<KindBytes>,
    /// Watch events the API server sent (to every watcher) by resource: during the
    /// admission, and a second in a settled window.
    watch_admission: BTreeMap<String, f64>,
    watch_settled: BTreeMap<String, f64>,
}

/// The API server's watch events so far, by resource.
async fn watch_events(c: &Cluster) -> Result<BTreeMap<String, f64>, Error> {
    let text = measure::apiserver_metrics(&c.client).await?;
    Ok(measure::metric_by(&text, "apiserver_watch_events_total", &["resource", "kind"]))
}

async fn bench(runs: usize, nodes: usize, window: Duration) -> Result<(), Error> {
    let dir = std::env::temp_dir().join(format!("operator-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    eprintln!("operator bench: {runs} runs on {nodes} kwok nodes, windows of {window:?}, under {}", dir.display());
    let cluster = Cluster::start(&dir, nodes, &[]).await?;
    let stub = Stub::start().await.map_err(|e| Error::Setup(format!("the status stub: {e}")))?;
    let shapes = load::plan(runs, nodes);
    for s in &shapes {
        let run: TrainingRun = serde_json::from_value(s.manifest(RUNS_NS)).expect("a TrainingRun");
        let run = TrainingRun { metadata: kube::api::ObjectMeta { uid: Some("bench".into()), ..run.metadata }, ..run };
        let cfg = operator::validate::validate(&run, 1).map_err(|e| Error::Setup(format!("{}: {e}", s.name)))?;
        stub.add(RUNS_NS, &s.name, cfg);
    }
    let env = vec![
        ("STATUS_URL", stub.status_url()),
        ("STATUS_POLL_INTERVAL", "10s".to_string()),
        ("STATUS_WRITE_INTERVAL", "10s".to_string()),
        ("CONCURRENCY", "32".to_string()),
        // The held runs' pods wait for a pool no node has: past the default 10 minutes
        // their status would change in the middle of the measurement.
        ("PENDING_TIMEOUT", "3h".to_string()),
    ];
    let bin = operator_binary();
    let mut replicas: Vec<Replica> = (0..2)
        .map(|i| cluster.operator(&bin, &format!("operator-{i}"), &env, &dir.join(format!("operator-{i}.log"))))
        .collect::<Result<_, _>>()?;
    let seen = seen::start(cluster.client.clone());
    let before = watch_events(&cluster).await?;
    let mut fig = admit(&cluster, &shapes, &seen).await?;
    fig.watch_admission = measure::delta(&before, &watch_events(&cluster).await?);
    settle(&cluster, &stub, &shapes, &seen, window, &mut fig).await?;
    let (before, from) = (watch_events(&cluster).await?, Instant::now());
    quiet_window(&cluster, OPERATOR_USER, window).await?;
    let seconds = from.elapsed().as_secs_f64();
    fig.watch_settled =
        measure::delta(&before, &watch_events(&cluster).await?).into_iter().map(|(k, n)| (k, n / seconds)).collect();
    let leader = leader(&cluster).await?;
    let at = replicas.iter().position(|r| r.name == leader).expect("the leader is a replica");
    fig.usage = measure::usage(replicas[at].child.id())?;
    let metrics = measure::apiserver_metrics(&cluster.client).await?;
    fig.etcd_bytes = measure::metric_sum(&metrics, "apiserver_storage_size_bytes");
    fig.stores = stores::measure(&cluster.client, RUNS_NS).await?;
    churn(&cluster, &shapes, &seen, &mut fig).await?;
    failover(&cluster, &mut replicas, at, runs, &mut fig).await?;
    drop(replicas);
    drop(cluster);
    let peer = match std::env::var("BENCH_PEER").as_deref() {
        Ok("jobset") => Some(jobset_peer(&dir.join("peer"), &shapes, nodes, window).await?),
        Ok("") | Err(_) => None,
        Ok(other) => return Err(Error::Setup(format!("BENCH_PEER={other:?}: the peer is jobset, or none when unset"))),
    };
    report(runs, nodes, window, &fig, peer.as_ref());
    Ok(())
}

/// How long the admission waits may go with no status changing, and at most: their
/// length is a figure, so no other deadline bounds them.
const STALL: Duration = Duration::from_secs(180);
const ADMISSION_LIMIT: Duration = Duration::from_secs(3 * 3600);

/// The peer's figures: JobSet's controller given the same shapes as JobSets.
struct Peer {
    admission_s: f64,
    settle_s: f64,
    settled: BTreeMap<String, u64>,
    usage: measure::Usage,
    etcd_bytes: f64,
}

/// JobSet's controller on a cluster of its own with as many kwok nodes, each shape
/// created as a JobSet ([`e2e::scale::jobset`]): until every JobSet's status shows its
/// fate, then a quiet window of its controller, its RSS and CPU, etcd's size.
async fn jobset_peer(dir: &std::path::Path, shapes: &[Shape], nodes: usize, window: Duration) -> Result<Peer, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let cluster = Cluster::start(dir, nodes, &[]).await?;
    let kubeconfig = jobset::identity(&cluster.cp, dir)?;
    let controller = e2e::jobset::JobSetController::start_on(&cluster.cp, &dir.join("jobset"), &kubeconfig).await?;
    let watched = jobset::watch(cluster.client.clone());
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(cluster.client.clone(), RUNS_NS, &jobset::resource());
    let start = Instant::now();
    create_all(&api, shapes, |s| jobset::manifest(s, RUNS_NS)).await?;
    watched
        .wait_fates(shapes, STALL, ADMISSION_LIMIT)
        .await
        .map_err(|e| Error::Setup(format!("{e}\n--- jobset:\n{}", controller.daemon.log_tail(20))))?;
    let admission_s = start.elapsed().as_secs_f64();
    eprintln!("operator bench: JobSet: every JobSet's fate shown {admission_s:.1} s after the first was created");
    let (settle_s, settled) = quiet_window(&cluster, jobset::PEER_USER, window).await?;
    let pid = controller.daemon.pid().ok_or_else(|| Error::Setup("JobSet's controller has exited".into()))?;
    let usage = measure::usage(pid)?;
    let etcd_bytes =
        measure::metric_sum(&measure::apiserver_metrics(&cluster.client).await?, "apiserver_storage_size_bytes");
    Ok(Peer { admission_s, settle_s, settled, usage, etcd_bytes })
}

/// Creates each shape's object (`manifest`), 32 requests at a time.
async fn create_all<K>(
    api: &Api<K>,
    shapes: &[Shape],
    manifest: impl Fn(&Shape) -> serde_json::Value,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(shapes.iter().map(|s| {
        let object: K = serde_json::from_value(manifest(s)).expect("a manifest of its kind");
        async move {
            api.create(&PostParams::default(), &object)
                .await
                .map_err(|e| Error::Setup(format!("creating {}: {e}", s.name)))
        }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await
    .map(drop)
}

/// Every run created, and how long until each run's status shows its fate.
async fn admit(c: &Cluster, shapes: &[Shape], seen: &Seen) -> Result<Figures, Error> {
    let api: Api<TrainingRun> = Api::namespaced(c.client.clone(), RUNS_NS);
    let start = Instant::now();
    create_all(&api, shapes, |s| s.manifest(RUNS_NS)).await?;
    eprintln!("operator bench: {} runs created in {:.1} s", shapes.len(), start.elapsed().as_secs_f64());
    let shown = seen
        .wait_progressing("every run's status shows its fate", STALL, ADMISSION_LIMIT, |runs| fates_shown(runs, shapes))
        .await;
    shown.map_err(|e| Error::Setup(format!("{e}\nthe first pending pods:\n{}", c.pending_pods())))?;
    let admission_s = start.elapsed().as_secs_f64();
    eprintln!("operator bench: every run's fate shown {admission_s:.1} s after the first was created");
    Ok(Figures {
        admission_s,
        settle_s: 0.0,
        settled: BTreeMap::new(),
        edit_s: Vec::new(),
        restart_s: Vec::new(),
        lease_s: 0.0,
        reconciled_again_s: 0.0,
        usage: Default::default(),
        etcd_bytes: 0.0,
        stores: Vec::new(),
        watch_admission: BTreeMap::new(),
        watch_settled: BTreeMap::new(),
    })
}

/// `Ok` once every run's phase is its fate's; else how many of each fate are where.
fn fates_shown(runs: &HashMap<String, seen::RunState>, shapes: &[Shape]) -> Result<(), String> {
    let mut off: BTreeMap<(Fate, String), usize> = BTreeMap::new();
    for s in shapes {
        let phase = runs.get(&s.name).map(|r| r.phase.clone()).unwrap_or_default();
        if phase != s.fate.settled_phase() {
            *off.entry((s.fate, phase)).or_insert(0) += 1;
        }
    }
    if off.is_empty() { Ok(()) } else { Err(format!("not yet (fate, phase): count: {off:?}")) }
}

/// Rank 0's steps frozen; a window with no write by the operator, and its requests.
async fn settle(
    c: &Cluster,
    stub: &Stub,
    shapes: &[Shape],
    seen: &Seen,
    window: Duration,
    fig: &mut Figures,
) -> Result<(), Error> {
    stub.freeze();
    let (settle_s, counts) = quiet_window(c, OPERATOR_USER, window).await?;
    seen.wait("every run still showing its fate", Duration::from_secs(10), |runs| fates_shown(runs, shapes)).await?;
    fig.settle_s = settle_s;
    fig.settled = counts;
    eprintln!("operator bench: quiet {:.1} s after the freeze; the window's requests {:?}", fig.settle_s, fig.settled);
    Ok(())
}

/// Seconds from now until a window of `window` passes with no write by `user`, and
/// that window's requests by verb and resource (watches aside), with its length under
/// `(window seconds)`.
async fn quiet_window(c: &Cluster, user: &str, window: Duration) -> Result<(f64, BTreeMap<String, u64>), Error> {
    let from = Instant::now();
    let mut tail = AuditTail::from_end(&c.cp.audit_log())?;
    let limit = Duration::from_secs(600) + window;
    let mut window_start = Instant::now();
    let mut counts = BTreeMap::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let batch = measure::by_verb(&tail.read_new()?, user);
        if measure::writes(&batch) > 0 {
            window_start = Instant::now();
            counts.clear();
            continue;
        }
        for (k, n) in batch {
            *counts.entry(k).or_insert(0) += n;
        }
        if window_start.elapsed() >= window {
            break;
        }
        if from.elapsed() > limit {
            return Err(Error::Setup(format!(
                "{user}: no quiet window of {window:?} within {limit:?}; last requests {counts:?}"
            )));
        }
    }
    counts.insert("(window seconds)".into(), window_start.elapsed().as_secs());
    Ok(((window_start - from).as_secs_f64(), counts))
}

/// The Lease's holder.
async fn leader(c: &Cluster) -> Result<String, Error> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(c.client.clone(), OPERATOR_NS);
    e2e::control_plane::wait_until("a leader", Duration::from_secs(60), || async {
        let lease = leases.get_opt("trainingrun-operator").await.map_err(|e| e.to_string())?;
        lease.and_then(|l| l.spec?.holder_identity).ok_or_else(|| "no holder".to_string())
    })
    .await
}

/// Edits of suspended runs and killed rank-0 pods of training runs, each timed to the
/// status that answers it.
async fn churn(c: &Cluster, shapes: &[Shape], seen: &Seen, fig: &mut Figures) -> Result<(), Error> {
    let api: Api<TrainingRun> = Api::namespaced(c.client.clone(), RUNS_NS);
    let suspended: Vec<&Shape> = shapes.iter().filter(|s| s.fate == Fate::Suspended).take(50).collect();
    for s in &suspended {
        let patch = json!({"spec": {"tokens": "11B"}});
        let edited = Instant::now();
        let run = api
            .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::Setup(format!("editing {}: {e}", s.name)))?;
        let generation = run.metadata.generation.unwrap_or_default();
        seen.wait(&format!("{}'s status of generation {generation}", s.name), Duration::from_secs(60), |runs| {
            let r = runs.get(&s.name).cloned().unwrap_or_default();
            if r.observed_generation >= generation { Ok(()) } else { Err(format!("{r:?}")) }
        })
        .await?;
        fig.edit_s.push(seen.when(&s.name).map_or(f64::NAN, |t| (t - edited).as_secs_f64()));
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), RUNS_NS);
    for s in shapes.iter().filter(|s| s.fate == Fate::Training).take(10) {
        let attempt = seen.get(&s.name).attempt;
        let lp = kube::api::ListParams::default().labels(&format!("job-name={}-a{attempt}", s.name));
        let pod = pods.list(&lp).await.map_err(|e| Error::Setup(format!("{}'s pods: {e}", s.name)))?;
        let Some(name) = pod.items.iter().filter_map(|p| p.metadata.name.clone()).min() else { continue };
        let killed = Instant::now();
        pods.delete(&name, &Default::default()).await.map_err(|e| Error::Setup(format!("deleting {name}: {e}")))?;
        seen.wait(&format!("{}'s attempt {}", s.name, attempt + 1), Duration::from_secs(120), |runs| {
            let r = runs.get(&s.name).cloned().unwrap_or_default();
            if r.attempt > attempt { Ok(()) } else { Err(format!("{r:?}")) }
        })
        .await?;
        fig.restart_s.push(seen.when(&s.name).map_or(f64::NAN, |t| (t - killed).as_secs_f64()));
    }
    eprintln!("operator bench: {} edits, {} killed pods timed", fig.edit_s.len(), fig.restart_s.len());
    Ok(())
}

/// The leader SIGKILLed with the runs active: until the other holds the Lease, and
/// until it has reconciled once a run.
async fn failover(
    c: &Cluster,
    replicas: &mut [Replica],
    at: usize,
    runs: usize,
    fig: &mut Figures,
) -> Result<(), Error> {
    let killed = Instant::now();
    replicas[at].kill();
    let standby = &replicas[1 - at];
    let took = e2e::control_plane::wait_until("the standby takes the Lease", Duration::from_secs(60), || async {
        let holder = leader(c).await.map_err(|e| e.to_string())?;
        if holder == standby.name { Ok(killed.elapsed()) } else { Err(format!("held by {holder}")) }
    })
    .await?;
    fig.lease_s = took.as_secs_f64();
    let limit = Duration::from_secs(120 + runs as u64 / 20);
    let took = e2e::control_plane::wait_until("the new leader reconciles once a run", limit, || async {
        let text = standby.metrics().await.map_err(|e| e.to_string())?;
        let n = measure::metric_sum(&text, "trainingrun_reconcile_total") as usize;
        if n >= runs { Ok(killed.elapsed()) } else { Err(format!("{n} reconciles of {runs}")) }
    })
    .await?;
    fig.reconciled_again_s = took.as_secs_f64();
    Ok(())
}

/// Requests a second in a quiet window's counts, its `(window seconds)` aside.
fn rate(settled: &BTreeMap<String, u64>, seconds: f64) -> f64 {
    settled.iter().filter(|(k, _)| !k.starts_with('(')).map(|(_, n)| n).sum::<u64>() as f64 / seconds
}

fn report(runs: usize, nodes: usize, window: Duration, fig: &Figures, peer: Option<&Peer>) {
    let seconds = window.as_secs_f64().max(1.0);
    let per_second = rate(&fig.settled, seconds);
    // The goal is for 10,000 runs; fewer may cost as much (the Lease is most of it).
    let goal = SETTLED_GOAL_PER_10K * (runs as f64 / 10_000.0).max(1.0);
    let (mut edits, mut restarts) = (fig.edit_s.clone(), fig.restart_s.clone());
    let (edit_p50, edit_p99) = (measure::quantile(&mut edits, 0.5), measure::quantile(&mut edits, 0.99));
    let (restart_p50, restart_p99) = (measure::quantile(&mut restarts, 0.5), measure::quantile(&mut restarts, 0.99));
    let rss = fig.usage.peak_rss_mib;
    println!("operator on the real control plane: {runs} runs, {nodes} kwok nodes of 8 GPUs");
    println!("  admission: every run's fate in its status  {:>9.1} s", fig.admission_s);
    println!("  settle after the steps froze               {:>9.1} s (goal 120)", fig.settle_s);
    println!(
        "  settled: requests/s, watches aside         {per_second:>9.2}   (goal {goal:.2}); writes {}",
        measure::writes(&fig.settled)
    );
    for (k, n) in fig.settled.iter().filter(|(k, _)| !k.starts_with('(')) {
        println!("    {k:<40} {:>9.2}/s", *n as f64 / seconds);
    }
    println!("  edit → status p50 / p99                    {edit_p50:>9.2} / {edit_p99:.2} s (goal p99 {P99_GOAL_S})");
    println!("  killed pod → next attempt p50 / p99        {restart_p50:>9.2} / {restart_p99:.2} s");
    println!("  failover: Lease / every run reconciled     {:>9.1} / {:.1} s", fig.lease_s, fig.reconciled_again_s);
    println!(
        "  leader RSS peak                            {rss:>9.1} MiB (goal {RSS_GOAL_MIB}); CPU {:.1} s",
        fig.usage.cpu_seconds
    );
    println!("  etcd in use per run                        {:>9.1} KB", fig.etcd_bytes / runs as f64 / 1e3);
    report_stores(runs, &fig.stores);
    println!("  watch events sent, every watcher: in the admission (a run) / a second settled");
    for (k, n) in &fig.watch_admission {
        let settled = fig.watch_settled.get(k).copied().unwrap_or(0.0);
        println!("    {k:<40} {n:>9.0} ({:.2}) / {settled:.2}", n / runs as f64);
    }
    let out = json!({
        "runs": runs, "nodes": nodes, "window_s": seconds,
        "admission_s": fig.admission_s, "settle_s": fig.settle_s,
        "settled_requests_per_s": per_second, "settled_goal_per_s": goal, "settled_writes": measure::writes(&fig.settled),
        "settled_requests": fig.settled,
        "edit_p50_s": edit_p50, "edit_p99_s": edit_p99, "p99_goal_s": P99_GOAL_S,
        "restart_p50_s": restart_p50, "restart_p99_s": restart_p99,
        "failover_lease_s": fig.lease_s, "failover_reconciled_s": fig.reconciled_again_s,
        "peak_rss_mib": rss, "rss_goal_mib": RSS_GOAL_MIB, "cpu_s": fig.usage.cpu_seconds,
        "etcd_bytes_per_run": fig.etcd_bytes / runs as f64,
        "watch_events_admission": fig.watch_admission, "watch_events_settled_per_s": fig.watch_settled,
        "stores": fig.stores.iter().map(|k| json!({
            "kind": k.kind, "objects": k.objects, "whole_bytes": k.whole, "trimmed_bytes": k.trimmed,
        })).collect::<Vec<_>>(),
        "peer": peer.map(|p| report_peer(runs, seconds, fig, p)),
    });
    println!("BENCH_JSON {out}");
}

/// The stores' bytes a run by kind, as a plain reflector would hold them and as the
/// operator's trimmed ones do.
fn report_stores(runs: usize, kinds: &[KindBytes]) {
    let per_run = |b: usize| b as f64 / runs as f64 / 1e3;
    println!("  stores, KB a run (objects): whole → trimmed (trimmed / whole)");
    for k in kinds {
        let ratio = if k.whole > 0 { k.trimmed as f64 / k.whole as f64 } else { 0.0 };
        println!(
            "    {:<24} {:>7}  {:>7.2} → {:>6.2}  ({ratio:.2})",
            k.kind,
            k.objects,
            per_run(k.whole),
            per_run(k.trimmed)
        );
    }
    let (whole, trimmed) = kinds.iter().fold((0, 0), |(w, t), k| (w + k.whole, t + k.trimmed));
    println!("    {:<24} {:>7}  {:>7.2} → {:>6.2}", "all", "", per_run(whole), per_run(trimmed));
}

/// The peer's lines, each with ours over its; and its figures for `BENCH_JSON`.
fn report_peer(runs: usize, seconds: f64, fig: &Figures, p: &Peer) -> serde_json::Value {
    // Leases aside: JobSet's controller runs here without leader election, ours with.
    let beyond_lease = |counts: &BTreeMap<String, u64>| {
        let lease = counts.iter().filter(|(k, _)| k.ends_with(" leases")).map(|(_, n)| n).sum::<u64>();
        rate(counts, seconds) - lease as f64 / seconds
    };
    let (ours, theirs) = (beyond_lease(&fig.settled), beyond_lease(&p.settled));
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}×", a / b) } else { "—".to_string() };
    let etcd = (fig.etcd_bytes / runs as f64, p.etcd_bytes / runs as f64);
    println!("JobSet's controller, the same shapes as JobSets on a cluster of its own (ours / JobSet's)");
    println!(
        "  admission: every JobSet's fate in its status {:>7.1} s   {}",
        p.admission_s,
        ratio(fig.admission_s, p.admission_s)
    );
    println!("  settle after the last create                 {:>7.1} s", p.settle_s);
    println!("  settled: requests/s, watches and Lease aside {theirs:>7.2}     {}", ratio(ours, theirs));
    for (k, n) in p.settled.iter().filter(|(k, _)| !k.starts_with('(')) {
        println!("    {k:<40} {:>9.2}/s", *n as f64 / seconds);
    }
    println!(
        "  controller RSS peak                          {:>7.1} MiB {}; CPU {:.1} s",
        p.usage.peak_rss_mib,
        ratio(fig.usage.peak_rss_mib, p.usage.peak_rss_mib),
        p.usage.cpu_seconds
    );
    println!("  etcd in use per JobSet                       {:>7.1} KB  {}", etcd.1 / 1e3, ratio(etcd.0, etcd.1));
    json!({
        "admission_s": p.admission_s, "settle_s": p.settle_s,
        "settled_requests_per_s": theirs, "settled_requests": p.settled,
        "peak_rss_mib": p.usage.peak_rss_mib, "cpu_s": p.usage.cpu_seconds,
        "etcd_bytes_per_run": etcd.1,
    })
}
