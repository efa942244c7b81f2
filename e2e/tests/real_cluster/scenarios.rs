//! A run's life on the real control plane and real nodes, as its user sees it: the
//! chart's operator as its Deployment, the real Job controller and scheduler, the
//! trainer image's containers under real kubelets. Each test is one cluster; each
//! scenario asserts status, conditions, events, the operator's metrics and the files on
//! the checkpoint claim: a run to Succeeded across an operator crash, a killed worker, a
//! resize and an out-of-memory (each resuming to the uninterrupted run's losses); NaN,
//! a kernel OOM kill and full-disk failures; a stall and a straggler; suspend and
//! resume; GRPO from a base run.

use std::time::{Duration, Instant};

use crds::types::RunPhase;
use serde_json::{Value, json};

use crate::harness::{kubectl, workspace_binary};
use crate::scenario::{MINUTES, NS, Scenario, checkpoint_step, step};

/// nano on the embedded corpus, 2 nodes × 1 process, 64-token sequences:
/// 40 steps of 1,024 tokens, a checkpoint every 8, and a final evaluation of 2K tokens
/// per source (the default, 1M, would take longer than the training).
pub(crate) const SPEC: &str = r#"  model: {preset: nano, tokenizer: embedded}
  tokens: 40960
  data:
    mix:
      - {name: textbook, weight: 0.5, uri: "embedded:textbook"}
      - {name: arithmetic, weight: 0.3, uri: "embedded:arithmetic"}
      - {name: mcq, weight: 0.2, uri: "embedded:mcq"}
    validation: {tokens: 2K}
  topology: {nodes: 2, gpusPerNode: 0, collectiveTimeout: 5m}
  batch: {globalTokens: 1024, microBatch: 4, seqLength: 64}
  optimizer: {lr: 3.0e-3, warmupTokens: 1K}
  precision: f32
  checkpoint: {everySteps: 8, keepLast: 3}
"#;

/// [`SPEC`] at a pace a test can act within: every step of every rank sleeps 250 ms
/// first, so the 40 steps take at least 10 s however fast the node's core. A test that
/// acts "mid-run" (kills a worker, pauses one, edits the spec) does it between a status
/// it has seen and the run's end; nano's own work is a few tens of milliseconds a step,
/// which a status read every few seconds can miss entirely.
pub(crate) fn paced(extra: &str) -> String {
    format!("{SPEC}{extra}  env:\n    - {{name: TRAINER_INJECT_SLOW_STEP_MS, value: \"250\"}}\n")
}

/// `spec` (a [`SPEC`] variant) with its pods limited to `limit` of memory.
pub(crate) fn memory_limited(spec: &str, limit: &str) -> String {
    let timeout = "collectiveTimeout: 5m}";
    assert!(spec.contains(timeout), "a spec whose topology ends with {timeout}: {spec}");
    spec.replacen(timeout, &format!("collectiveTimeout: 5m, resources: {{limits: {{memory: {limit}}}}}}}"), 1)
}

/// A 2-node run from `kubectl apply` to Succeeded, with the operator killed and
/// restarted mid-run; then the same run with one trainer process killed, which the
/// operator gang-restarts from the last checkpoint to the same losses; then the same run
/// with rank 0 killed during a checkpoint write (issue 43's drill 4); then the same
/// run resized to one node mid-run, and the same run out of GPU memory with
/// `onOutOfMemory: reduceMicroBatch`, which both continue on the same losses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_trains_to_succeeded_and_a_killed_trainer_resumes_to_the_same_losses() {
    let mut sim = Scenario::new().await;

    // --- 2 × 1 to Succeeded, surviving an operator crash.
    sim.apply("base", &paced(""));
    let running = sim
        .wait("base", "Running with loss and tokens/s", MINUTES(5), |s| {
            s.phase == Some(RunPhase::Running)
                && s.metrics.as_ref().is_some_and(|m| m.loss.is_some() && m.tokens_per_second.is_some())
                && step(s) >= 1
        })
        .await;
    assert_eq!(sim.phases_through("base", RunPhase::Running).await, vec![RunPhase::Pending, RunPhase::Running]);
    let p = running.progress.clone().unwrap();
    assert_eq!((p.total_steps, p.total_tokens), (40, 40 * 1024));
    assert!(p.tokens >= 1024 && p.tokens == p.step * 1024, "{p:?}");
    assert_eq!(sim.condition("base", "Running").0, "True");
    sim.expect_metric(r#"trainingrun_phase{name="base",namespace="ml",phase="Running"} 1"#).await;
    // The gauges follow the status the operator has just written, a moment after the API
    // has it.
    sim.expect_series(r#"trainingrun_loss{name="base",namespace="ml"}"#).await;

    // Checkpoints land on the PVC while it runs; status names them.
    let s = sim.wait("base", "a checkpoint in status", MINUTES(5), |s| checkpoint_step(s) >= 8).await;
    let uri = s.last_checkpoint.unwrap().uri;
    assert!(
        sim.checkpoints("base").iter().any(|c| uri.ends_with(&format!("/checkpoints/{c}"))),
        "{uri} in {:?}",
        sim.checkpoints("base")
    );

    // The operator dies mid-run; the Job keeps running; its kubelet restarts it, and the
    // new process picks the run up.
    sim.kill_operator();
    let before = step(&sim.status("base"));
    sim.operator_restarted();
    sim.wait("base", "progress after the operator restart", MINUTES(5), |s| step(s) > before).await;
    let s = sim.wait_phase("base", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!(sim.jobs("base"), vec!["base-a1"], "no duplicate Job");
    assert_eq!(sim.events("base").iter().filter(|e| e.1 == "JobCreated").count(), 1, "{:?}", sim.events("base"));
    assert_eq!((s.attempt, s.restarts, s.reason.as_deref()), (1, 0, Some("Completed")));
    let p = s.progress.unwrap();
    assert_eq!((p.step, p.tokens, p.percent), (40, 40 * 1024, 100.0));
    assert_eq!(sim.condition("base", "Succeeded").0, "True");
    sim.expect_event("base", "Normal", "Completed").await;
    let phases = sim.phases_through("base", RunPhase::Succeeded).await;
    assert_eq!(phases, vec![RunPhase::Pending, RunPhase::Running, RunPhase::Succeeded]);
    assert_eq!(sim.checkpoints("base").last().map(String::as_str), Some("step-00000040"));
    let base = sim.step_losses("base");
    assert_eq!(base.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
    assert!(base[39].1 < base[0].1, "it learns: {:?} → {:?}", base[0], base[39]);

    // --- the same run; one trainer process is SIGKILLed after the second checkpoint.
    sim.apply("crash", &paced(""));
    let s = sim.wait("crash", "a checkpoint", MINUTES(5), |s| checkpoint_step(s) >= 16 && step(s) >= 18).await;
    let pod = sim.pod("crash-a1", 1).await;
    assert_eq!(sim.kill_workers(&pod), 1, "one worker per node");
    let restarting = sim.wait("crash", "a gang restart", MINUTES(2), |s| s.attempt == 2).await;
    assert_eq!(restarting.restarts, 1);
    let s2 = sim.wait_phase("crash", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s2.attempt, s2.restarts), (2, 1));
    assert_eq!(sim.jobs("crash"), vec!["crash-a2"], "the failed attempt's Job is gone");
    let phases = sim.phases_through("crash", RunPhase::Succeeded).await;
    assert!(phases.contains(&RunPhase::Restarting), "{phases:?}");
    let (_, reason, message) = sim.condition("crash", "Restarting");
    assert_eq!(reason, "Resumed", "{message}");
    let restart = sim
        .events("crash")
        .into_iter()
        .find(|e| e.0 == "Warning" && e.2.contains("restarting the gang"))
        .unwrap_or_else(|| panic!("{:?}", sim.events("crash")));
    // The killed node (137) and rank 0's failed all-reduce end within moments of each
    // other: the kill is the cause, and the operator waits for it to name it.
    let killed = restart.2.contains(&format!("pod {pod} (node rank 1) exited with code 137 (SIGKILL)"));
    assert!(killed && restart.2.contains("attempt 1 failed"), "{restart:?}");
    sim.expect_metric(r#"trainingrun_restarts{name="crash",namespace="ml"} 1"#).await;
    // Attempt 2 resumed from the checkpoint status named, and retrained to the same losses.
    let resumed: Vec<Value> = sim.records("crash").into_iter().filter(|r| r["kind"] == "resume").collect();
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["attempt"], 2);
    let from = resumed[0]["step"].as_u64().unwrap();
    assert!(from >= checkpoint_step(&s) && from.is_multiple_of(8), "resumed from step {from}");
    assert_eq!(sim.step_losses("crash"), base, "the loss sequence after the restart equals the uninterrupted run's");

    // --- the same run, rank 0 SIGKILLed in the middle of writing step 16's checkpoint
    // (its model file on disk, the rest not): attempt 2 resumes from step 8, the last
    // complete checkpoint, never reading the torn write, and retrains to the same losses.
    let torn = format!(
        "{SPEC}  env:\n    - {{name: TRAINER_INJECT_KILL_IN_CHECKPOINT_AT_STEP, value: \"16\"}}\n    - {{name: TRAINER_INJECT_RANK, value: \"0\"}}\n    - {{name: TRAINER_INJECT_ATTEMPT, value: \"1\"}}\n"
    );
    sim.apply("torn", &torn);
    let s = sim.wait_phase("torn", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s.attempt, s.restarts), (2, 1), "one restart, counted");
    let restart = sim
        .events("torn")
        .into_iter()
        .find(|e| e.0 == "Warning" && e.2.contains("restarting the gang"))
        .unwrap_or_else(|| panic!("{:?}", sim.events("torn")));
    assert!(restart.2.contains("(node rank 0) exited with code 137 (SIGKILL)"), "{restart:?}");
    let resumed: Vec<Value> = sim.records("torn").into_iter().filter(|r| r["kind"] == "resume").collect();
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!((resumed[0]["attempt"].as_u64(), resumed[0]["step"].as_u64()), (Some(2), Some(8)), "{resumed:?}");
    assert_eq!(sim.step_losses("torn"), base, "the losses after the torn write equal the uninterrupted run's");
    // The torn write is swept once attempt 2 writes its own checkpoints.
    let left: Vec<String> = std::fs::read_dir(sim.checkpoint_dir("torn"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(left.is_empty(), "unfinished writes left: {left:?}");
    assert_eq!(sim.checkpoints("torn").last().map(String::as_str), Some("step-00000040"));

    // --- the same run, resized to one node after its second checkpoint: the gang stops
    // (checkpointing where it is), resumes on one rank and trains on to the
    // uninterrupted run's losses.
    sim.apply("resize", &paced(""));
    sim.wait("resize", "a checkpoint", MINUTES(5), |s| checkpoint_step(s) >= 16).await;
    sim.edit_spec("resize", |s| s["topology"]["nodes"] = json!(1));
    let s = sim.wait_phase("resize", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s.attempt, s.restarts, s.topology.as_deref()), (2, 0, Some("1x0")));
    assert_eq!(sim.jobs("resize"), vec!["resize-a2"]);
    sim.expect_event("resize", "Normal", "Resized").await;
    let resized = sim.events("resize").into_iter().find(|e| e.1 == "Resized").unwrap();
    assert!(resized.2.starts_with("resized 2x0 → 1x0") && resized.2.contains("not counted"), "{resized:?}");
    let resumed: Vec<Value> = sim.records("resize").into_iter().filter(|r| r["kind"] == "resume").collect();
    assert_eq!((resumed.len(), resumed[0]["attempt"].as_u64()), (1, Some(2)), "{resumed:?}");
    assert!(resumed[0]["step"].as_u64().unwrap() >= 16, "{resumed:?}");
    let losses = sim.step_losses("resize");
    assert_eq!(losses.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
    let worst = losses.iter().zip(&base).map(|(a, b)| (a.1 - b.1).abs() / b.1.abs()).fold(0.0, f64::max);
    assert!(worst < 1e-5, "the resized run's losses differ from the uninterrupted run's by {worst:e}");

    // --- the same run out of memory at step 12 of attempt 1, with onOutOfMemory:
    // reduceMicroBatch: attempt 2 trains on at micro-batch 2 (accumulation 4 where it
    // was 2), on the uninterrupted run's losses.
    let oom = format!(
        "{SPEC}  failurePolicy: {{onOutOfMemory: reduceMicroBatch}}\n  env:\n    - {{name: TRAINER_INJECT_OOM_AT_STEP, value: \"12\"}}\n    - {{name: TRAINER_INJECT_ATTEMPT, value: \"1\"}}\n"
    );
    sim.apply("shrink", &oom);
    let s = sim.wait_phase("shrink", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s.attempt, s.restarts), (2, 0));
    assert_eq!(s.effective.and_then(|e| e.micro_batch), Some(2));
    sim.expect_event("shrink", "Warning", "MicroBatchReduced").await;
    let reduced = sim.events("shrink").into_iter().find(|e| e.1 == "MicroBatchReduced").unwrap();
    assert!(reduced.2.contains("OutOfMemory at step 12") && reduced.2.contains("micro-batch 2 (was 4"), "{reduced:?}");
    let losses = sim.step_losses("shrink");
    assert_eq!(losses.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
    let worst = losses.iter().zip(&base).map(|(a, b)| (a.1 - b.1).abs() / b.1.abs()).fold(0.0, f64::max);
    assert!(worst < 1e-5, "the run at the reduced micro-batch differs from the uninterrupted one by {worst:e}");
}

/// NaN loss, a kernel OOM kill in a pod whose memory limit is below what a rank needs,
/// and a full checkpoint claim end their runs at once with their own reasons; with
/// `onNaN: rollback` the NaN run rolls back past the failing step's samples and succeeds
/// as the run given that rollback from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_loss_a_host_oom_and_a_full_disk_fail_the_run_without_a_restart() {
    let sim = Scenario::new().await;
    let nan = format!("{SPEC}  env:\n    - {{name: TRAINER_INJECT_NAN_AT_STEP, value: \"3\"}}\n");
    sim.apply("nan", &nan);
    let rollback = format!(
        "{SPEC}  failurePolicy: {{onNaN: rollback}}\n  env:\n    - {{name: TRAINER_INJECT_NAN_AT_STEP, value: \"12\"}}\n    - {{name: TRAINER_INJECT_ATTEMPT, value: \"1\"}}\n"
    );
    sim.apply("rollback", &rollback);
    // A rank's worker holds about 100 MiB of its own memory (RssAnon of nano on CPU):
    // the kernel's OOM killer ends it inside the pod's 64 MiB.
    sim.apply("oom", &memory_limited(SPEC, "64Mi"));
    // Rank 0, which writes the checkpoints, finds the claim full at the checkpoint of step 8.
    let full = format!(
        "{SPEC}  env:\n    - {{name: TRAINER_INJECT_DISK_FULL_AT_STEP, value: \"8\"}}\n    - {{name: TRAINER_INJECT_RANK, value: \"0\"}}\n"
    );
    sim.apply("full", &full);

    let s = sim.wait_phase("nan", RunPhase::Failed, MINUTES(5)).await;
    assert_eq!(s.reason.as_deref(), Some("NaNLoss"));
    let (status, reason, message) = sim.condition("nan", "Failed");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NaNLoss"));
    assert!(message.contains("at step 3"), "{message}");
    sim.expect_event("nan", "Warning", "NaNLoss").await;
    sim.expect_metric(
        r#"trainingrun_condition{name="nan",namespace="ml",reason="NaNLoss",status="True",type="Failed"} 1"#,
    )
    .await;
    // The real Job controller failed the Job by its pod failure policy (the trainer's
    // NaN exit code), so no pod was retried.
    let start = Instant::now();
    while sim.job_condition("nan-a1", "Failed").is_none() {
        assert!(start.elapsed() < MINUTES(1), "Job nan-a1 never failed\n{}", sim.diagnose("nan"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(sim.job_condition("nan-a1", "Failed"), Some(("True".into(), "PodFailurePolicy".into())));

    let s = sim.wait_phase("oom", RunPhase::Failed, MINUTES(5)).await;
    assert_eq!(s.reason.as_deref(), Some("OutOfMemory"), "{}", sim.diagnose("oom"));
    let (_, _, message) = sim.condition("oom", "Failed");
    assert!(
        message.contains("was OOMKilled") && message.contains("(memory limit 64Mi)") && message.contains("oom-a1-"),
        "{message}"
    );
    // What each layer saw, for the record: the kubelet's container state and the
    // launcher's last words.
    for pod in sim.pod_names().into_iter().filter(|p| p.starts_with("oom-a1-")) {
        let state = kubectl(&sim.c, &["-n", NS, "get", "pod", &pod, "-o", "jsonpath={.status.containerStatuses[0]}"]);
        let log = sim.c.pod_log(NS, &pod).unwrap_or_else(|e| e.to_string());
        let tail: Vec<&str> = log.lines().rev().take(4).collect();
        eprintln!("{pod}: {state}\n  log: {tail:?}");
    }
    sim.expect_event("oom", "Warning", "OutOfMemory").await;
    sim.expect_metric(
        r#"trainingrun_condition{name="oom",namespace="ml",reason="OutOfMemory",status="True",type="Failed"} 1"#,
    )
    .await;

    let s = sim.wait_phase("full", RunPhase::Failed, MINUTES(5)).await;
    assert_eq!(s.reason.as_deref(), Some("StorageFull"));
    let (_, _, message) = sim.condition("full", "Failed");
    assert!(
        message.contains("StorageFull at step 8")
            && message.contains("No space left on device")
            && message.contains("lower spec.checkpoint.keepLast (now 3)"),
        "{message}"
    );
    sim.expect_event("full", "Warning", "StorageFull").await;
    sim.expect_metric(
        r#"trainingrun_condition{name="full",namespace="ml",reason="StorageFull",status="True",type="Failed"} 1"#,
    )
    .await;

    // No run starts a second attempt, even after more reconciles.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for run in ["nan", "oom", "full"] {
        let s = sim.status(run);
        assert_eq!((s.attempt, s.restarts), (1, 0), "{run}");
        assert_eq!(sim.jobs(run), vec![format!("{run}-a1")]);
        let phases = sim.phases_through(run, RunPhase::Failed).await;
        assert!(!phases.contains(&RunPhase::Restarting), "{run}: {phases:?}");
    }

    // NaN at step 12 of attempt 1 (16 sequences a step, a checkpoint every 8): attempt 2
    // resumes from step 8, never trains on 176..192, and trains steps 9-20 at half the rate.
    let s = sim.wait_phase("rollback", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s.attempt, s.restarts), (2, 0));
    let rollbacks = s.effective.map(|e| e.rollbacks).unwrap_or_default();
    assert_eq!(rollbacks.len(), 1, "{rollbacks:?}");
    let r = &rollbacks[0];
    assert_eq!((r.step, r.attempt, r.skip_from, r.skip_to, r.lr_factor, r.lr_until_step), (12, 1, 176, 192, 0.5, 20));
    sim.expect_event("rollback", "Warning", "NaNRollback").await;
    let (rolled, reason, _) = sim.condition("rollback", "RolledBack");
    assert_eq!((rolled.as_str(), reason.as_str()), ("True", "NaNRollback"));
    sim.expect_metric(r#"trainingrun_rollbacks{name="rollback",namespace="ml"} 1"#).await;
    let losses = sim.step_losses("rollback");
    assert_eq!(losses.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
    // The uninterrupted run given the same rollback (as its checkpoints record it, from
    // step 8), on one process: the losses agree.
    let dir = sim.checkpoint_dir("rollback");
    let latest = std::fs::read_to_string(dir.join("latest")).unwrap();
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(latest.trim()).join("state.json")).unwrap()).unwrap();
    let recorded: Vec<crds::types::Rollback> = serde_json::from_value(state["config"]["rollbacks"].clone()).unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].from_step, Some(8), "the trainer records the checkpoint it rolled back to");
    let one_node = SPEC.replace("nodes: 2", "nodes: 1");
    let manifest = format!(
        "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: rollback}}\nspec:\n{one_node}"
    );
    let mut cfg = crds::resolve(&crds::manifest::from_yaml(&manifest, "one node").unwrap()).unwrap();
    cfg.rollbacks = recorded;
    let reference = dir.parent().unwrap().join("rollback-reference");
    std::fs::create_dir_all(&reference).unwrap();
    // One worker process, described as `trainer run` and `trainer launch` describe theirs.
    let worker = serde_json::json!({"config": cfg, "output": reference, "initDir": reference, "sample": false});
    std::fs::write(reference.join("worker.json"), worker.to_string()).unwrap();
    let out = std::process::Command::new(workspace_binary("trainer"))
        .args(["worker", "--spec"])
        .arg(reference.join("worker.json"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(reference.join("metrics.jsonl")).unwrap();
    let expected: Vec<f64> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "step")
        .map(|r| r["loss"].as_f64().unwrap())
        .collect();
    assert_eq!(expected.len(), 40);
    let worst = losses.iter().zip(&expected).map(|(a, b)| (a.1 - b).abs() / b.abs()).fold(0.0, f64::max);
    assert!(worst < 1e-5, "the rolled-back run differs from the run that skipped from the start by {worst:e}");

    // The failed runs' surviving ranks learned of its peer's death at its next collective, then exits.
    let start = Instant::now();
    while !sim.running().is_empty() && start.elapsed() < MINUTES(1) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sim.running().is_empty(), "every trainer process has ended: {:?}", sim.running());
}

/// A trainer process that stops (SIGSTOP) stalls the run, and the operator says so;
/// when it continues, the condition clears and the run finishes. A trainer slowed by a
/// second a step is a straggler, named with its pod and node, and the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_trainer_is_reported_stalled_until_it_continues() {
    let sim = Scenario::new().await;
    let spec = paced("  failurePolicy: {stallTimeout: 1m}\n");
    sim.apply("stuck", &spec);
    sim.wait("stuck", "training", MINUTES(5), |s| s.phase == Some(RunPhase::Running) && step(s) >= 2).await;
    let pod = sim.pod("stuck-a1", 1).await;
    sim.pause(&pod);
    // While it is paused: rank 1 (node rank 1, one process a node) of another run of 16
    // steps sleeps 1.5 s a step before its forward pass, far more than the few tens of
    // milliseconds of nano's work.
    let slow = format!(
        "{}  env:\n    - {{name: TRAINER_INJECT_SLOW_STEP_MS, value: \"1500\"}}\n    - {{name: TRAINER_INJECT_RANK, value: \"1\"}}\n",
        SPEC.replace("tokens: 40960", "tokens: 16384")
    );
    sim.apply("slow", &slow);
    let s = sim
        .wait("slow", "Straggler", MINUTES(5), |s| {
            s.conditions.iter().any(|c| c.type_ == "Straggler" && c.status == "True")
        })
        .await;
    let straggler = s.straggler.expect("status.straggler");
    let slow_pod = sim.pod("slow-a1", 1).await;
    assert_eq!((straggler.rank, straggler.pod.as_deref()), (1, Some(slow_pod.as_str())));
    assert!(straggler.compute_seconds >= 1.5 && straggler.readings >= 3, "{straggler:?}");
    let (_, reason, message) = sim.condition("slow", "Straggler");
    assert_eq!(reason, "Straggler");
    let node = sim.node_of(&slow_pod);
    assert!(message.starts_with(&format!("rank 1 ({slow_pod} on node {node}) takes")), "{message}");
    sim.expect_event("slow", "Warning", "Straggler").await;
    sim.expect_metric(
        r#"trainingrun_condition{name="slow",namespace="ml",reason="Straggler",status="True",type="Straggler"} 1"#,
    )
    .await;
    let s = sim
        .wait("stuck", "Stalled", MINUTES(3), |s| {
            s.conditions.iter().any(|c| c.type_ == "Stalled" && c.status == "True")
        })
        .await;
    assert_eq!(s.phase, Some(RunPhase::Running), "onStall: Report keeps the run");
    let (_, reason, message) = sim.condition("stuck", "Stalled");
    assert_eq!(reason, "NoProgress");
    assert!(message.contains(&format!("step {} has not advanced", step(&s))), "{message}");
    sim.expect_event("stuck", "Warning", "Stalled").await;
    sim.expect_metric(
        r#"trainingrun_condition{name="stuck",namespace="ml",reason="NoProgress",status="True",type="Stalled"} 1"#,
    )
    .await;

    sim.resume(&pod);
    sim.wait("stuck", "Stalled to clear", MINUTES(2), |s| {
        s.conditions.iter().any(|c| c.type_ == "Stalled" && c.status == "False")
    })
    .await;
    sim.expect_event("stuck", "Normal", "Progressing").await;
    let s = sim.wait_phase("stuck", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s.attempt, s.restarts), (1, 0));

    let s = sim.wait_phase("slow", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s.attempt, s.restarts), (1, 0), "report only");
}

/// `spec.suspend: true` stops the gang (rank 0 checkpoints on SIGTERM); `false`
/// resumes the same Job from that checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_stops_the_gang_and_resume_continues_from_its_checkpoint() {
    let sim = Scenario::new().await;
    sim.apply("pause", &paced(""));
    sim.wait("pause", "a checkpoint", MINUTES(5), |s| checkpoint_step(s) >= 8).await;
    sim.edit_spec("pause", |spec| spec["suspend"] = json!(true));
    sim.wait_phase("pause", RunPhase::Suspended, MINUTES(1)).await;
    assert_eq!(sim.condition("pause", "Suspended").0, "True");
    // The operator suspends the Job (after the status says so); the real Job controller
    // deletes its pods and says so; the trainer's final checkpoint is the step it
    // stopped at.
    let start = Instant::now();
    while !sim.job_suspended("pause-a1")
        || !sim.pod_names().is_empty()
        || sim.job_condition("pause-a1", "Suspended").map(|c| c.0) != Some("True".into())
    {
        assert!(start.elapsed() < MINUTES(1), "the Job is not suspended yet: {}", sim.diagnose("pause"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stopped_at = sim.step_losses("pause").last().unwrap().0;
    assert_eq!(
        sim.checkpoints("pause").last().cloned(),
        Some(format!("step-{stopped_at:08}")),
        "a checkpoint on SIGTERM"
    );
    assert!(stopped_at < 40, "suspended before the end ({stopped_at})");

    sim.edit_spec("pause", |spec| spec["suspend"] = json!(false));
    let s = sim.wait_phase("pause", RunPhase::Succeeded, MINUTES(10)).await;
    assert_eq!((s.attempt, s.restarts), (1, 0), "a resume is not a restart: {}", sim.diagnose("pause"));
    assert_eq!(sim.jobs("pause"), vec!["pause-a1"]);
    let phases = sim.phases_through("pause", RunPhase::Succeeded).await;
    let suspended = phases.iter().position(|p| *p == RunPhase::Suspended).unwrap();
    assert!(phases[suspended..].contains(&RunPhase::Running), "{phases:?}");
    let resumed: Vec<u64> =
        sim.records("pause").iter().filter(|r| r["kind"] == "resume").map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(resumed, vec![stopped_at]);
    assert_eq!(sim.step_losses("pause").iter().map(|s| s.0).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
}

/// A GRPO run with `initFrom` waits for its base run, starts from its final
/// weights and reports accuracy. Deleting both keeps only the retained checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpo_waits_for_its_base_run_and_retain_on_delete_keeps_checkpoints() {
    let sim = Scenario::new().await;
    let grpo = r#"  phase: grpo
  model: {preset: nano, tokenizer: embedded}
  tokens: 16K
  initFrom: {trainingRun: base}
  grpo:
    dataset: embedded:mcq-rules
    promptsPerStep: 4
    generationsPerPrompt: 4
    maxNewTokens: 8
    evalQuestions: 32
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {microBatch: 16, seqLength: 128}
  optimizer: {lr: 3.0e-4, schedule: constant, warmupTokens: 1K}
  precision: f32
  checkpoint: {everySteps: 2}
"#;
    sim.apply("tune", grpo);
    // The same run sampling at a temperature near 0: every completion of a prompt is
    // the same, so no group's rewards vary and the run has no learning signal.
    let cold =
        grpo.replace("    evalQuestions: 32", "    evalQuestions: 0\n    temperature: 1.0e-4\n    noSignalSteps: 2");
    assert_ne!(cold, grpo);
    sim.apply("cold", &cold);
    let s = sim.wait_phase("tune", RunPhase::Waiting, MINUTES(1)).await;
    assert_eq!(s.reason.as_deref(), Some("WaitingForInitRun"));
    let base = SPEC.replace("tokens: 40960", "tokens: 16384").replace(
        "checkpoint: {everySteps: 8, keepLast: 3}",
        "checkpoint: {everySteps: 8, keepLast: 3, retainOnDelete: true}",
    );
    sim.apply("base", &base);
    sim.wait_phase("base", RunPhase::Succeeded, MINUTES(10)).await;
    assert!(sim.jobs("tune").is_empty() || sim.status("tune").phase != Some(RunPhase::Waiting));
    let s = sim.wait_phase("tune", RunPhase::Succeeded, MINUTES(15)).await;
    let cold = sim.wait_phase("cold", RunPhase::Succeeded, MINUTES(15)).await;
    let (silent, reason, message) = sim.condition("cold", "NoLearningSignal");
    assert_eq!((silent.as_str(), reason.as_str()), ("True", "NoLearningSignal"), "{message}");
    assert_eq!(cold.metrics.and_then(|m| m.frac_reward_zero_std), Some(1.0));
    sim.expect_event("cold", "Warning", "NoLearningSignal").await;
    assert_eq!(sim.condition("tune", "NoLearningSignal").0, "False", "the rule task at its temperature learns");
    let m = s.metrics.clone().unwrap();
    let (before, after) =
        (m.initial_eval_accuracy.expect("initial accuracy"), m.eval_accuracy.expect("final accuracy"));
    assert!((0.0..=1.0).contains(&before) && (0.0..=1.0).contains(&after), "{before} {after}");
    assert!(m.reward.is_some() && m.kl.is_some(), "{m:?}");
    let phases = sim.phases_through("tune", RunPhase::Succeeded).await;
    assert_eq!(phases.first(), Some(&RunPhase::Waiting), "{phases:?}");
    let pod = sim.pod_names().into_iter().find(|n| n.starts_with("tune-a1-0")).expect("tune's pod");
    let log = sim.log(&pod);
    assert!(log.contains("initial weights from"), "the GRPO run starts from base's weights:\n{log}");
    assert!(sim.records("tune").iter().any(|r| r["kind"] == "accuracy"));

    // Delete both: base's checkpoints stay (retainOnDelete), tune's go with its PVC.
    let kept = sim.checkpoints("base");
    assert!(!kept.is_empty());
    sim.delete("tune");
    sim.delete("base");
    let start = Instant::now();
    while sim.exists("trainingrun", "tune")
        || sim.exists("trainingrun", "base")
        || sim.exists("pvc", "tune-checkpoints")
    {
        assert!(start.elapsed() < MINUTES(1), "deletion does not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(sim.exists("pvc", "base-checkpoints"), "retainOnDelete keeps the PVC");
    assert_eq!(sim.checkpoints("base"), kept, "and its checkpoints");
    // tune's volume is Released with its claim, and its reclaim policy deletes it.
    let start = Instant::now();
    while sim.checkpoint_dir("tune").exists() {
        assert!(start.elapsed() < MINUTES(1), "tune's checkpoints outlive its PVC\n{}", sim.diagnose("tune"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// etcd away for 10 s mid-run, then the API server away for 30 s (issue 43's drill 3):
/// each is stopped with SIGTERM and started again on the same state and port, as an
/// upgrade does. Training goes on meanwhile (the trainer's own records on the claim move
/// on), the operator's watches resume and status catches up, and no restart, second Job
/// or Warning other than a transient API error follows. The short outage comes first:
/// on a loaded machine the API server's restart alone has outlasted the rest of a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_rides_out_the_api_server_and_etcd_going_away() {
    let mut sim = Scenario::new().await;
    // 40 steps of at least 1.5 s: a minute of training for the outages to fall inside.
    let spec = format!("{SPEC}  env:\n    - {{name: TRAINER_INJECT_SLOW_STEP_MS, value: \"1500\"}}\n");
    sim.apply("away", &spec);
    sim.wait("away", "Running at step 2", MINUTES(5), |s| s.phase == Some(RunPhase::Running) && step(s) >= 2).await;
    let trained = |sim: &Scenario| sim.step_losses("away").last().map_or(0, |s| s.0);

    let before = trained(&sim);
    sim.c.cp.restart("etcd", Duration::from_secs(10)).await.unwrap();
    let during = trained(&sim);
    assert!(during > before, "training went on without etcd: step {before} → {during}");
    sim.wait("away", "status caught up after etcd's return", MINUTES(2), |s| step(s) >= during).await;

    let before = trained(&sim);
    sim.c.cp.restart("kube-apiserver", Duration::from_secs(30)).await.unwrap();
    let during = trained(&sim);
    assert!(during >= before + 10, "training went on without the API server: step {before} → {during}");
    sim.wait("away", "status caught up after the API server's return", MINUTES(2), |s| step(s) >= during).await;

    let s = sim.wait_phase("away", RunPhase::Succeeded, MINUTES(5)).await;
    assert_eq!((s.attempt, s.restarts, s.reason.as_deref()), (1, 0, Some("Completed")));
    assert_eq!(s.progress.map(|p| p.step), Some(40));
    assert_eq!(sim.jobs("away"), vec!["away-a1"], "no second Job");
    let phases = sim.phases_through("away", RunPhase::Succeeded).await;
    assert_eq!(phases, vec![RunPhase::Pending, RunPhase::Running, RunPhase::Succeeded]);
    // The Completed event follows the status that says so by a moment.
    sim.expect_event("away", "Normal", "Completed").await;
    let events = sim.events("away");
    let count = |reason: &str| events.iter().filter(|e| e.1 == reason).count();
    assert_eq!((count("JobCreated"), count("Completed")), (1, 1), "{events:?}");
    // A restarted API server may answer 403 until its RBAC cache has synced, and the
    // operator reports that as an `ApiError` Warning and retries; nothing else warns.
    assert!(events.iter().all(|e| e.0 != "Warning" || e.1 == "ApiError"), "{events:?}");
}
