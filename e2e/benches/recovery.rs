//! `make bench-recovery`: recovery from a dead rank, our TrainingRun against JobSet, on
//! one real control plane with the same two real nodes.
//!
//! The workload is the same for both: the trainer on 2 nodes (nano, f32, a checkpoint
//! every 8 steps on the run's claim, each step paced to 250 ms), in the pod template our
//! operator builds. JobSet (`sigs.k8s.io/jobset`, built from the Go module proxy, with
//! its webhooks) runs it as one replicated Job of the same spec (`backoffLimit: 0`, the
//! same pod failure policy) under `failurePolicy: {maxRestarts: 10, restartStrategy:
//! Recreate}`, from the ConfigMap and claim of a suspended TrainingRun; our operator
//! runs it as a TrainingRun with `maxRestarts: 10`.
//!
//! Each system, [`REPS`] times: two steps after a checkpoint, rank 1's worker process is
//! SIGKILLed; measured from the kill to the first step record of the attempt that
//! follows (the trainer's own clock on the claim), split where Kubernetes hands over to
//! the trainer (rank 0's new container start, as its runtime records it), and where the
//! trainer has loaded the checkpoint (its resume record); and the steps
//! lost (the last step recorded before the kill less the step resumed from). Median,
//! min and max of each. The last line printed is `BENCH_JSON {...}`. Needs root, the
//! node stack and the images (`scripts/setup-node.sh`, `scripts/setup-images.sh`).

#[path = "common/claim.rs"]
mod claim;
#[allow(dead_code)]
#[path = "../tests/real_cluster/harness.rs"]
mod harness;

use std::path::Path;
use std::time::Duration;

use claim::{claim_dir, records, unix_now, until};
use e2e::jobset::JobSetController;
use e2e::test_cluster::TestCluster;
use harness::*;
use operator::resources::{ATTEMPT_LABEL, RUN_LABEL};
use serde_json::{Value, json};

const NS: &str = "recovery";
/// Kills per system.
const REPS: usize = 5;
const CHECKPOINT_EVERY: u64 = 8;
/// The kill comes this many steps after a checkpoint.
const PAST_CHECKPOINT: u64 = 2;
const INDEX: &str = "batch.kubernetes.io/job-completion-index";

fn spec(name: &str, suspend: bool) -> String {
    format!(
        r#"apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: {name}}}
spec:
  suspend: {suspend}
  model: {{preset: nano, tokenizer: embedded}}
  tokens: 256K
  data:
    mix:
      - {{name: textbook, weight: 0.5, uri: "embedded:textbook"}}
      - {{name: arithmetic, weight: 0.3, uri: "embedded:arithmetic"}}
      - {{name: mcq, weight: 0.2, uri: "embedded:mcq"}}
    validation: {{tokens: 2K}}
  topology: {{nodes: 2, gpusPerNode: 0, collectiveTimeout: 5m}}
  batch: {{globalTokens: 1024, microBatch: 4, seqLength: 64}}
  optimizer: {{lr: 3.0e-3, warmupTokens: 1K}}
  precision: f32
  checkpoint: {{everySteps: {CHECKPOINT_EVERY}, keepLast: 3}}
  failurePolicy: {{maxRestarts: 10}}
  env:
    - {{name: TRAINER_INJECT_SLOW_STEP_MS, value: "250"}}
"#
    )
}

/// The records from the `n`th start or resume record on (0: the first attempt's).
fn segment(all: &[Value], n: usize) -> Option<&[Value]> {
    let begun: Vec<usize> =
        all.iter().enumerate().filter(|(_, r)| r["kind"] == "start" || r["kind"] == "resume").map(|(i, _)| i).collect();
    begun.get(n).map(|&i| &all[i..])
}

fn last_of(records: &[Value], kind: &str) -> Option<u64> {
    records.iter().filter(|r| r["kind"] == kind).filter_map(|r| r["step"].as_u64()).max()
}

/// The name of the pod of node rank `index` in restart `k` (0: the first attempt), once
/// it exists.
type PodOf<'a> = &'a dyn Fn(usize, u32) -> Option<String>;

fn pod_by(c: &TestCluster, selector: &str) -> Option<String> {
    let out = c.kubectl_out(&["-n", NS, "get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}"]);
    out.ok()?.split_whitespace().next().map(String::from)
}

/// When `pod`'s container started, as its node's runtime records it (the API's
/// `startedAt` is to the second).
fn container_started(c: &TestCluster, pod: &str) -> Result<f64, String> {
    c.container_started_at(NS, pod).map_err(|e| e.to_string())
}

#[derive(Clone, Copy, Debug)]
struct Recovery {
    /// Kill → the next attempt's first step record.
    total: f64,
    /// Kill → rank 0's new container started.
    to_container: f64,
    /// Container start → the trainer's resume record (launch, rendezvous, checkpoint load).
    to_resume: f64,
    /// Resume record → the first step.
    to_step: f64,
    steps_lost: u64,
}

/// Kills rank 1's worker [`REPS`] times, each [`PAST_CHECKPOINT`] steps after a
/// checkpoint of the running attempt, and measures each recovery.
fn recoveries(c: &TestCluster, system: &str, dir: &Path, pod_of: PodOf) -> Vec<Recovery> {
    let mut out = Vec::new();
    for k in 0..REPS {
        // Checkpoint records trail their checkpoint (one is recorded once the next is
        // begun), so the kill is placed by step: the first step `PAST_CHECKPOINT` past a
        // checkpoint interval, a whole interval after the attempt began.
        let what = format!("{system}: attempt {} {PAST_CHECKPOINT} steps past a checkpoint", k + 1);
        until(&what, Duration::from_secs(300), || {
            let all = records(dir);
            let seg = segment(&all, k).ok_or_else(|| format!("{} records, no segment {k}", all.len()))?;
            let from = seg[0]["step"].as_u64().unwrap_or(0);
            let target = (from / CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY + PAST_CHECKPOINT;
            let step = last_of(seg, "step").unwrap_or(0);
            if step >= target { Ok(()) } else { Err(format!("began at step {from}, at step {step} of {target}")) }
        });
        let pod = pod_of(k, 1).unwrap_or_else(|| panic!("{system}: no rank-1 pod of attempt {}", k + 1));
        let killed = unix_now();
        let workers = c.kill_workers(NS, &pod).unwrap_or_else(|e| panic!("{e}"));
        assert!(workers > 0, "{system}: pod {pod} has no workers");
        let mut trained = 0;
        let (resumed_at, resumed, stepped) =
            until(&format!("{system}: the attempt after kill {k}"), Duration::from_secs(300), || {
                let all = records(dir);
                if let Some(old) = segment(&all, k) {
                    let end = segment(&all, k + 1).map_or(old.len(), |next| old.len() - next.len());
                    trained = trained.max(last_of(&old[..end], "step").unwrap_or(0));
                }
                let new = segment(&all, k + 1).ok_or("no resume record yet")?;
                let step = new.iter().find(|r| r["kind"] == "step").ok_or("resumed, no step yet")?;
                Ok((
                    new[0]["time"].as_f64().unwrap_or(0.0),
                    new[0]["step"].as_u64().unwrap_or(0),
                    step["time"].as_f64().unwrap_or(0.0),
                ))
            });
        let rank0 = pod_of(k + 1, 0).unwrap_or_else(|| panic!("{system}: no rank-0 pod of attempt {}", k + 2));
        let started = until("rank 0's startedAt", Duration::from_secs(30), || container_started(c, &rank0));
        let r = Recovery {
            total: stepped - killed,
            to_container: started - killed,
            to_resume: resumed_at - started,
            to_step: stepped - resumed_at,
            steps_lost: trained.saturating_sub(resumed),
        };
        eprintln!("{system} kill {}: {r:?} (trained to {trained}, resumed at {resumed})", k + 1);
        out.push(r);
    }
    out
}

/// Median, min and max (of at least one).
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    assert!(!v.is_empty(), "no measurement");
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    (median, v[0], v[n - 1])
}

fn summary(rs: &[Recovery]) -> Value {
    let of = |f: fn(&Recovery) -> f64| {
        let (median, min, max) = spread(rs.iter().map(f).collect());
        json!({"median": median, "min": min, "max": max})
    };
    json!({
        "kill_to_first_step_s": of(|r| r.total),
        "kill_to_container_start_s": of(|r| r.to_container),
        "container_start_to_resume_s": of(|r| r.to_resume),
        "resume_to_first_step_s": of(|r| r.to_step),
        "steps_lost": of(|r| r.steps_lost as f64),
        "runs": rs.len(),
    })
}

/// JobSet `name` running the pod template of `job` (the suspended TrainingRun's Job) as
/// one replicated Job of the same spec.
fn jobset(name: &str, job: &Value) -> Value {
    let mut spec = job["spec"].clone();
    let s = spec.as_object_mut().expect("a Job spec");
    for field in ["selector", "manualSelector", "suspend", "ttlSecondsAfterFinished"] {
        s.remove(field);
    }
    let template = &mut spec["template"];
    if let Some(labels) = template["metadata"]["labels"].as_object_mut() {
        labels.retain(|k, _| {
            k != RUN_LABEL
                && k != ATTEMPT_LABEL
                && !k.starts_with("batch.kubernetes.io/")
                && k != "job-name"
                && k != "controller-uid"
        });
    }
    // JobSet's pods are `<jobset>-<replicated job>-<job index>-<pod index>` under the
    // JobSet's own headless Service.
    template["spec"]["subdomain"] = json!(name);
    let env = template["spec"]["containers"][0]["env"].as_array_mut().expect("the trainer's env");
    for var in env.iter_mut().filter(|v| v["name"] == "MASTER_ADDR") {
        var["value"] = json!(format!("{name}-node-0-0.{name}"));
    }
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "failurePolicy": {"maxRestarts": 10, "restartStrategy": "Recreate"},
            "network": {"enableDNSHostnames": true, "subdomain": name},
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": spec}}],
        },
    })
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let c = runtime.block_on(cluster(2));
    helm_install_in_cluster(&c, &["replicas=1"]);
    let jobset_controller = runtime.block_on(JobSetController::start(&c)).unwrap_or_else(|e| panic!("JobSet: {e}"));
    runtime.block_on(namespace(&c, NS));

    let systems = std::env::var("BENCH_RECOVERY_SYSTEMS").unwrap_or_else(|_| "trainingrun,jobset".into());
    let mut ours = Vec::new();
    if systems.contains("trainingrun") {
        apply(&c, NS, &spec("tr", false));
        let dir = claim_dir(&c, NS, "tr-checkpoints");
        ours = recoveries(&c, "TrainingRun", &dir, &|k, index| {
            pod_by(&c, &format!("job-name=tr-a{},{INDEX}={index}", k + 1))
        });
        kubectl(&c, &["-n", NS, "delete", "trainingrun", "tr", "--wait=false"]);
    }
    if !systems.contains("jobset") {
        println!("BENCH_JSON {}", json!({"trainingrun": summary(&ours), "reps": REPS}));
        return;
    }

    // JobSet, from a suspended run's ConfigMap, claim and Job template.
    apply(&c, NS, &spec("jsrun", true));
    let job = until("the suspended run's Job", Duration::from_secs(120), || {
        c.kubectl_out(&["-n", NS, "get", "job", "jsrun-a1", "-o", "json"])
    });
    let job: Value = serde_json::from_str(&job).expect("a Job");
    let manifest = jobset("js", &job);
    let (ok, _, err) = kubectl_stdin(&c, &["-n", NS, "apply", "-f", "-"], &manifest.to_string());
    assert!(ok, "kubectl apply of the JobSet: {err}\n--- jobset:\n{}", jobset_controller.daemon.log_tail(30));
    let dir = claim_dir(&c, NS, "jsrun-checkpoints");
    let theirs = recoveries(&c, "JobSet", &dir, &|k, index| {
        pod_by(&c, &format!("jobset.sigs.k8s.io/jobset-name=js,jobset.sigs.k8s.io/restart-attempt={k},{INDEX}={index}"))
    });
    let restarts = kubectl(&c, &["-n", NS, "get", "jobset", "js", "-o", "jsonpath={.status.restarts}"]);
    assert_eq!(restarts, REPS.to_string(), "JobSet counted every restart");

    if ours.is_empty() {
        println!("BENCH_JSON {}", json!({"jobset": summary(&theirs), "reps": REPS}));
        return;
    }
    let (ours_s, theirs_s) = (summary(&ours), summary(&theirs));
    let median = |s: &Value, k: &str| s[k]["median"].as_f64().unwrap_or(f64::NAN);
    println!("| recovery from a killed rank (median of {REPS}; min–max) | TrainingRun | JobSet (Recreate) |");
    println!("|---|---|---|");
    for (label, key) in [
        ("kill → the next attempt's first step, s", "kill_to_first_step_s"),
        ("kill → rank 0's new container started, s", "kill_to_container_start_s"),
        ("container → checkpoint loaded (resume record), s", "container_start_to_resume_s"),
        ("resume → first step, s", "resume_to_first_step_s"),
        ("steps lost", "steps_lost"),
    ] {
        let cell = |s: &Value| {
            let v = &s[key];
            format!(
                "{:.2} ({:.2}–{:.2})",
                v["median"].as_f64().unwrap_or(f64::NAN),
                v["min"].as_f64().unwrap_or(f64::NAN),
                v["max"].as_f64().unwrap_or(f64::NAN)
            )
        };
        println!("| {label} | {} | {} |", cell(&ours_s), cell(&theirs_s));
    }
    let ratio = median(&ours_s, "kill_to_first_step_s") / median(&theirs_s, "kill_to_first_step_s");
    println!("TrainingRun / JobSet, kill → first step (medians): {ratio:.2} (goal ≤ 1.0)");
    println!("BENCH_JSON {}", json!({"trainingrun": ours_s, "jobset": theirs_s, "ratio": ratio, "reps": REPS}));
    drop(jobset_controller);
}
