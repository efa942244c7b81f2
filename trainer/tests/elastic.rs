//! Runs that change while they train: a resume on another world size, and a resume
//! with another token budget, against the runs planned that way from the start.

use crds::config::RunConfig;
use crds::contract::FailureReason;

mod common;
use common::{
    last_state, manifest_yaml, max_rel_loss_diff, run, scratch, step_losses, step_rates, train_in_process, trainer_bin,
};

/// One rank, 16 sequences of 64 tokens a step (accumulation 4), `steps` steps, under
/// `schedule`.
fn budget_config(schedule: &str, steps: u64) -> RunConfig {
    let yaml = manifest_yaml(1, 4, 1024, &(steps * 1024).to_string())
        .replace("warmupTokens: \"1K\"}", &format!("warmupTokens: \"1K\", schedule: {schedule}}}"))
        .replace("everySteps: 4, keepLast: 3", "everySteps: 2, keepLast: 3");
    crds::resolve(&crds::manifest::from_yaml(&yaml, "test manifest").unwrap()).unwrap()
}

/// A budget grown from 8 to 12 steps after step 5: constant and wsd (whose decay had
/// not begun) then train exactly as the run planned at 12 steps from the start, on the
/// same data (constant also when grown after its end); cosine goes on from the rate it had reached, never jumping, to minLr at
/// the new end. Shrunk to 6 steps, cosine ends at step 6 at minLr; below what was
/// trained, the resume is refused naming spec.tokens. The change is kept in the
/// checkpoints' history.
#[test]
fn a_changed_budget_continues_the_run() {
    for schedule in ["constant", "wsd", "cosine"] {
        let dir = scratch(&format!("budget-{schedule}"));
        let (small, large) = (budget_config(schedule, 8), budget_config(schedule, 12));
        train_in_process(&small, &dir.join("grown"), Some(5)).unwrap();
        train_in_process(&large, &dir.join("grown"), None).unwrap();
        let grown = step_rates(&dir.join("grown"));
        assert_eq!(grown.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=12).collect::<Vec<_>>(), "{schedule}");
        // Planned at 12 steps, on the data the grown run kept (sized for its 8 steps).
        let mut planned_cfg = large.clone();
        planned_cfg.data_sized_for = Some(small.data_size());
        train_in_process(&planned_cfg, &dir.join("planned"), None).unwrap();
        let planned = step_rates(&dir.join("planned"));
        let lrs = |s: &[(u64, f64, f64)]| s.iter().map(|s| s.2).collect::<Vec<f64>>();
        let losses = |s: &[(u64, f64, f64)]| s.iter().map(|s| s.1).collect::<Vec<f64>>();
        let state = last_state(&dir.join("grown"));
        assert_eq!(state.step, 12);
        let change = &state.history[..];
        assert_eq!(change.len(), 1, "{schedule}: {change:?}");
        assert_eq!((change[0].step, change[0].tokens), (5, 5 * 1024));
        assert!(change[0].changes.iter().any(|c| c == "schedule.totalSteps: 8 → 12"), "{:?}", change[0].changes);
        if schedule != "cosine" {
            assert_eq!(lrs(&grown), lrs(&planned), "{schedule}: the rates of the run planned at 12 steps");
            let diff = max_rel_loss_diff(&losses(&grown), &losses(&planned));
            assert!(
                diff < 1e-6,
                "{schedule}: losses differ from the planned run's by {diff:e}:\n{:?}\n{:?}",
                losses(&grown),
                losses(&planned)
            );
            assert!(state.config.unwrap().schedule.anchor.is_none());
            if schedule == "constant" {
                // Grown after it finished: it trains on as the planned run did.
                let after = dir.join("after");
                train_in_process(&small, &after, None).unwrap();
                train_in_process(&large, &after, None).unwrap();
                let diff = max_rel_loss_diff(&losses(&step_rates(&after)), &losses(&planned));
                assert!(diff < 1e-6, "grown after the end: losses differ from the planned run's by {diff:e}");
            }
            continue;
        }
        // Cosine: step 6 gets the rate the 8-step plan had there, and from there on
        // the rate falls, each step by no more than the steepest step of either plan,
        // to minLr at token 12 × 1024.
        let (rates, was) = (lrs(&grown), small.schedule.clone());
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert!(close(rates[5], was.lr_at(5 * 1024)), "{} vs {}", rates[5], was.lr_at(5 * 1024));
        let fall = |r: &[f64]| r.windows(2).skip(1).map(|w| w[0] - w[1]).fold(0.0, f64::max);
        let steepest = fall(&lrs(&planned)).max(fall(&(0..8).map(|s| was.lr_at(s * 1024)).collect::<Vec<_>>()));
        assert!(rates[4..].windows(2).all(|w| w[1] <= w[0] && w[0] - w[1] <= steepest * 1.0001), "{rates:?}");
        assert_ne!(rates[6..], lrs(&planned)[6..]);
        let schedule_now = state.config.unwrap().schedule;
        assert_eq!(schedule_now.anchor.map(|a| a.tokens), Some(5 * 1024));
        assert!(close(schedule_now.lr_at(12 * 1024), schedule_now.min_lr));

        // Shrunk to 6 steps at step 5; then below the 6 trained.
        let shrunk = dir.join("shrunk");
        train_in_process(&small, &shrunk, Some(5)).unwrap();
        train_in_process(&budget_config(schedule, 6), &shrunk, None).unwrap();
        let s = last_state(&shrunk);
        assert_eq!(s.step, 6);
        let rates = lrs(&step_rates(&shrunk));
        assert!(close(rates[5], was.lr_at(5 * 1024)));
        assert!(close(s.config.unwrap().schedule.lr_at(6 * 1024), small.schedule.min_lr));
        let err = train_in_process(&budget_config(schedule, 4), &shrunk, None).unwrap_err();
        assert_eq!(err.reason(), Some(FailureReason::InvalidConfig), "{err}");
        assert!(err.to_string().contains("spec.tokens") && err.to_string().contains("6144 already trained"), "{err}");
    }
}
/// A pretraining run resumes on another world size with the same global batch: 2
/// ranks, then 1 (accumulating 12 micro-batches where 2 ranks took 6 each), then 3 with
/// new checkpoint and validation cadences, and the losses follow the uninterrupted
/// 2-rank run within 1e-5. A resume that changes the global batch is refused, naming
/// the field.
#[test]
fn a_run_resumes_on_another_world_size_on_the_uninterrupted_curve() {
    let dir = scratch("resize");
    let manifest = dir.join("run.yaml");
    // 48 sequences of 64 tokens a step: accumulation 6 on 2 ranks, 12 on 1, 4 on 3.
    let write = |nodes: u32, global: u32| {
        let text = manifest_yaml(nodes, 4, global, &(8 * 3072).to_string());
        // The last part also checkpoints and evaluates on another cadence.
        let text = if nodes == 3 {
            text.replace("everySteps: 4, keepLast: 3", "everySteps: 2, keepLast: 5")
                .replace("validation: {everySteps: 4, tokens: \"1K\"}", "validation: {everySteps: 3, tokens: \"2K\"}")
        } else {
            text
        };
        std::fs::write(&manifest, text).unwrap();
    };
    write(2, 3072);
    let full = run(&manifest, &dir.join("full"), &[]);
    assert!(full.status.success(), "{}", String::from_utf8_lossy(&full.stderr));
    let full = step_losses(&dir.join("full/metrics.jsonl"));
    assert_eq!(full.len(), 8);

    let out = dir.join("resized");
    for (nodes, stop) in [(2, Some("3")), (1, Some("5")), (3, None)] {
        write(nodes, 3072);
        let extra: Vec<&str> = stop.map(|s| vec!["--stop-after-steps", s]).unwrap_or_default();
        let o = trainer_bin()
            .env("RUST_LOG", "info")
            .args(["run", "--no-sample", "-o"])
            .arg(&out)
            .arg(&manifest)
            .args(&extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{nodes} nodes: {}", String::from_utf8_lossy(&o.stderr));
        if nodes != 2 {
            let log = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            assert!(
                log.contains("world size 2 → 1") || log.contains("world size 1 → 3"),
                "the resize is logged:\n{log}"
            );
        }
    }
    let moved = step_losses(&out.join("metrics.jsonl"));
    assert_eq!(moved.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=8).collect::<Vec<_>>());
    let (a, b): (Vec<f64>, Vec<f64>) = (full.iter().map(|s| s.1).collect(), moved.iter().map(|s| s.1).collect());
    let diff = max_rel_loss_diff(&a, &b);
    assert!(diff < 1e-5, "losses differ by {diff:e}:\n{a:?}\n{b:?}");
    // The new cadence: checkpoints at steps 6 and 8 (2 apart) after the resume at 5.
    assert!(out.join("step-00000006").exists() && out.join("step-00000008").exists());

    // Another global batch is another run.
    write(1, 6144);
    let refused = run(&manifest, &out, &[]);
    assert_eq!(refused.status.code(), Some(FailureReason::InvalidConfig.exit_code()));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("batch.globalSequences") || stderr.contains("batch.tokensPerStep"), "{stderr}");
}
