//! Issue 44, part 1: the chart's alerts fire from live metrics. The chart's operator runs
//! as its Deployment's pod on a real node; Prometheus, built from the Go module proxy,
//! scrapes it and the rank-0 trainers through the scrape jobs translated from the
//! chart's own ServiceMonitor and PodMonitor (`e2e::monitoring`), discovering them
//! through the real API server, and evaluates the chart's PrometheusRule every second. Each drill reads
//! the alert's state from Prometheus' `/api/v1/alerts`. Part 3: Argo CD's own Lua engine
//! (`e2e::argocd`) judges the same live runs by `deploy/argocd/health.lua`.

use std::time::{Duration, Instant};

use e2e::prometheus::Prometheus;
use e2e::test_cluster::TestCluster;
use serde_json::Value;

use crate::harness::*;
use crate::scenario::MINUTES;
use crate::scenarios::{SPEC, memory_limited, paced};
use crate::slots::{ClusterSlot, cluster_slot};

const NS: &str = "ml";

/// The chart's monitoring objects, scraped every second, the stall alert's `for:`
/// (5 minutes) shortened to 5 s.
const MONITORING: [&str; 6] = [
    "metrics.serviceMonitor.enabled=true",
    "metrics.serviceMonitor.interval=1s",
    "trainerMetrics.podMonitor.enabled=true",
    "trainerMetrics.podMonitor.interval=1s",
    "prometheusRule.enabled=true",
    "prometheusRule.for.TrainingRunStalled=5s",
];

/// The dashboard's panels that a CPU pretraining run cannot fill, and why; each is
/// checked to be empty, so that the list stays true.
const EMPTY_BY_DESIGN: [(&str, &str); 2] = [
    ("MFU", "the trainer reports MFU against a GPU's peak FLOP rate, on CUDA only"),
    ("GRPO held-out accuracy", "a pretraining run evaluates no GRPO questions"),
];

/// Every query of `files/dashboard.json`, with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("charts/trainingrun-operator/files/dashboard.json"))
        .expect("the dashboard");
    let d: Value = serde_json::from_str(&text).expect("the dashboard's JSON");
    let mut out = Vec::new();
    for panel in d["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            if let (Some(title), Some(expr)) = (panel["title"].as_str(), t["expr"].as_str()) {
                out.push((title.to_string(), expr.to_string()));
            }
        }
    }
    out
}

struct Monitored {
    c: TestCluster,
    prom: Prometheus,
    _slot: ClusterSlot,
}

/// A 2-node cluster, the chart installed with its operator running as its pod, and
/// Prometheus scraping it.
async fn monitored() -> Monitored {
    let slot = cluster_slot().await;
    let c = cluster(2).await;
    helm_install_in_cluster(&c, &["replicas=1", "statusPollInterval=1s", "statusWriteInterval=1s"]);
    namespace(&c, NS).await;
    let objects = helm_template(&c, &MONITORING);
    let prom = Prometheus::start(&c, &objects, "1s").await.unwrap_or_else(|e| panic!("Prometheus: {e}"));
    let m = Monitored { c, prom, _slot: slot };
    m.until("the operator scraped", MINUTES(1), |p| {
        let up = p.query(r#"up{job="trainingrun-operator"}"#).map_err(|e| e.to_string())?;
        match up.first().and_then(|s| s["value"][1].as_str()) {
            Some("1") => Ok(()),
            _ => Err(format!("up: {up:?}")),
        }
    });
    m
}

impl Monitored {
    /// Polls Prometheus every 200 ms until `check` is `Ok`; on timeout panics with the
    /// last state, Prometheus' targets and the cluster.
    fn until<T>(&self, what: &str, timeout: Duration, mut check: impl FnMut(&Prometheus) -> Result<T, String>) -> T {
        let start = Instant::now();
        loop {
            match check(&self.prom) {
                Ok(v) => return v,
                Err(state) if start.elapsed() >= timeout => {
                    let targets = self.prom.api("targets").map(|t| t.to_string()).unwrap_or_else(|e| e.to_string());
                    panic!(
                        "{what}: not within {timeout:?}; last seen: {state}\n--- targets: {targets}\n--- prometheus:\n{}\n{}",
                        self.prom.daemon.log_tail(20),
                        self.c.dump(NS)
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn apply(&self, name: &str, spec: &str) {
        let manifest = format!(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: {name}}}\nspec:\n{spec}"
        );
        apply(&self.c, NS, &manifest);
    }

    /// The alerts about run `name`.
    fn alerts_of(&self, name: &str) -> Result<Vec<Value>, String> {
        let all = self.prom.alerts().map_err(|e| e.to_string())?;
        Ok(all.into_iter().filter(|a| a["labels"]["name"] == name && a["labels"]["namespace"] == NS).collect())
    }

    /// Waits for alert `alert` about run `name` to fire; its labels.
    fn firing(&self, alert: &str, name: &str, timeout: Duration) -> Value {
        self.until(&format!("{alert} firing for {NS}/{name}"), timeout, |_| {
            let alerts = self.alerts_of(name)?;
            alerts
                .iter()
                .find(|a| a["labels"]["alertname"] == alert && a["state"] == "firing")
                .map(|a| a["labels"].clone())
                .ok_or_else(|| format!("{alerts:?}"))
        })
    }
}

/// A NaN at step 5: the run fails as NaNLoss and `TrainingRunNaNLoss` fires with the
/// run's name and namespace, from the operator's `trainingrun_condition` as Prometheus
/// scraped it. A kernel OOM kill in a pod limited below a rank's needs:
/// `TrainingRunOutOfMemory`. A
/// trainer stopped (SIGSTOP) past `stallTimeout`: `TrainingRunStalled`, resolved once it
/// continues. A healthy run beside them raises no alert over its whole life, and every
/// query of the Grafana dashboard returns its data while it trains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_fire_from_live_metrics_and_the_dashboard_has_data() {
    let m = monitored().await;
    let one_node = SPEC.replace("nodes: 2", "nodes: 1");
    // Paced to 250 ms a step, so that its trainer lives through several scrapes, and
    // validated every 8 steps, so that the validation panel has a series to show. Its
    // two ranks share 2 cores with every other cluster of the suite, and rank 0 also
    // serves the scrapes: one rank's work per step has been seen at 1.33× the other's,
    // over the default factor (1.3), which is meant for GPUs that do the same work in
    // the same time. The straggler drills slow one rank 4× and more.
    let paced_healthy = paced("  failurePolicy: {stragglerFactor: 2.0}\n");
    let healthy = paced_healthy.replace("validation: {tokens: 2K}", "validation: {tokens: 2K, everySteps: 8}");
    assert_ne!(healthy, paced_healthy, "the healthy run validates every 8 steps");
    m.apply("healthy", &healthy);
    m.apply("nan", &format!("{one_node}  env:\n    - {{name: TRAINER_INJECT_NAN_AT_STEP, value: \"5\"}}\n"));
    m.apply("oom", &memory_limited(&one_node, "64Mi"));
    let labels = m.firing("TrainingRunNaNLoss", "nan", MINUTES(5));
    assert_eq!(labels["severity"], "critical", "{labels}");
    assert_eq!(run_field(&m.c, NS, "nan", "{.status.reason}"), "NaNLoss");

    let labels = m.firing("TrainingRunOutOfMemory", "oom", MINUTES(2));
    assert_eq!(labels["severity"], "critical", "{labels}");
    assert_eq!(run_field(&m.c, NS, "oom", "{.status.reason}"), "OutOfMemory");

    // The healthy run, from apply to Succeeded: never an alert about it, pending or
    // firing; and every dashboard query with data at some point of its life (the
    // conditions panel: the failed NaN run's).
    let mut empty: Vec<(String, String)> =
        dashboard_queries().into_iter().filter(|(title, _)| !EMPTY_BY_DESIGN.iter().any(|(t, _)| title == t)).collect();
    let mut judged_training = 0;
    m.until("the healthy run Succeeded without an alert", MINUTES(10), |p| {
        let alerts = m.alerts_of("healthy")?;
        assert!(alerts.is_empty(), "alerts about a healthy run: {alerts:?}");
        empty.retain(|(title, expr)| {
            let run = if title.starts_with("Failure and stall") { "nan" } else { "healthy" };
            let expr = expr.replace("$namespace", NS).replace("$run", run);
            p.query(&expr).unwrap_or_default().is_empty()
        });
        // The phase and Argo CD's health of the same read of the run.
        let (phase, health, message) = argo_cd_health(&m.c, NS, "healthy")?;
        if phase == "Running" {
            assert_eq!(health, "Progressing", "Argo CD's health of the healthy run while it trains: {message}");
            judged_training += 1;
        }
        if phase == "Succeeded" {
            assert_eq!(health, "Healthy", "{message}");
            Ok(())
        } else {
            Err(phase)
        }
    });
    assert!(judged_training > 0, "Argo CD never judged the healthy run while it trained");
    assert!(empty.is_empty(), "dashboard panels without data over the healthy run's life: {empty:#?}");
    for (title, why) in EMPTY_BY_DESIGN {
        for (_, expr) in dashboard_queries().iter().filter(|(t, _)| t == title) {
            let expr = expr.replace("$namespace", NS).replace("$run", "healthy");
            let got = m.prom.query(&expr).unwrap_or_default();
            assert!(got.is_empty(), "{title} is listed as empty ({why}) and has data: {got:?}");
        }
    }

    // The stopped trainer: Stalled after a minute without progress, the alert 5 s later;
    // resolved when it continues.
    // 400 paced steps: far more than the time to stop it, however loaded the machine.
    let stuck = paced("  failurePolicy: {stallTimeout: 1m}\n")
        .replace("nodes: 2", "nodes: 1")
        .replace("tokens: 40960", "tokens: 409600");
    assert!(stuck.contains("tokens: 409600"), "the stuck run is long");
    m.apply("stuck", &stuck);
    let pod = poll(&m.c, NS, "the stuck run's pod training", MINUTES(5), || {
        let step = run_field(&m.c, NS, "stuck", "{.status.progress.step}");
        if step.parse::<u64>().unwrap_or(0) < 2 {
            return Err(format!("step {step:?}"));
        }
        let selector = "job-name=stuck-a1,batch.kubernetes.io/job-completion-index=0";
        let name =
            kubectl(&m.c, &["-n", NS, "get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}"]);
        name.split_whitespace().next().map(String::from).ok_or_else(|| "no pod".to_string())
    });
    m.c.signal_pod(NS, &pod, libc::SIGSTOP).unwrap_or_else(|e| panic!("{e}"));
    m.firing("TrainingRunStalled", "stuck", MINUTES(3));
    // Argo CD's own Lua engine judges every run of the drills by deploy/argocd/health.lua.
    m.apply("parked", &format!("{one_node}  suspend: true\n"));
    let judged = poll(&m.c, NS, "Argo CD's health of every run", MINUTES(1), || {
        let list = kubectl(&m.c, &["-n", NS, "get", "trainingruns", "-o", "json"]);
        let items = serde_json::from_str::<Value>(&list).map_err(|e| e.to_string())?["items"].clone();
        let h = e2e::argocd::health(items.as_array().ok_or("no items")?).map_err(|e| e.to_string())?;
        let status = |n: &str| h.get(n).map(|(s, _)| s.as_str()).unwrap_or("");
        let want = [
            ("nan", "Degraded"),
            ("oom", "Degraded"),
            ("healthy", "Healthy"),
            ("stuck", "Degraded"),
            ("parked", "Suspended"),
        ];
        if want.iter().all(|(n, s)| status(n) == *s) { Ok(h) } else { Err(format!("{h:?}")) }
    });
    assert!(judged["nan"].1.contains("NaN"), "Degraded names the cause: {:?}", judged["nan"]);
    m.c.signal_pod(NS, &pod, libc::SIGCONT).unwrap_or_else(|e| panic!("{e}"));
    m.until("TrainingRunStalled resolved", MINUTES(2), |_| {
        let alerts = m.alerts_of("stuck")?;
        if alerts.iter().any(|a| a["labels"]["alertname"] == "TrainingRunStalled") {
            Err(format!("{alerts:?}"))
        } else {
            Ok(())
        }
    });
    let (phase, health, message) = argo_cd_health(&m.c, NS, "stuck").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (phase.as_str(), health.as_str()),
        ("Running", "Progressing"),
        "once the stuck run trains again: {message}"
    );
}
