//! A run that failed out of memory, recreated with the remedies its hint names, resumes.
//!
//! A binary of its own: the test forces an SDPA backend (`attention: math`), and SDPA's
//! backend switches are process-wide, so trainers in other tests' threads would change
//! them under it, and it under them.

mod common;
use common::{SMALL_RUN, config, run_options, scratch, train_outcome};

/// What an out-of-memory failure's hint asks for: a smaller micro-batch (the same global
/// batch in more micro-steps), gradient checkpointing, another attention kernel. The
/// recreated run resumes from the last checkpoint and trains on as before; a change to
/// what is trained is still refused, naming the checkpoint.
#[test]
fn a_run_resumes_after_the_out_of_memory_remedies() {
    let cfg = config(SMALL_RUN);
    let full = train_outcome(&cfg, run_options(&scratch("oom-full"), None, None)).unwrap();
    let dir = scratch("oom-remedied");
    train_outcome(&cfg, run_options(&dir, Some(6), None)).unwrap();

    let lr_changed = config(&SMALL_RUN.replace("lr: 3.0e-3", "lr: 1.0e-3"));
    let refused = train_outcome(&lr_changed, run_options(&dir, None, None));
    let err = refused.expect_err("a different learning rate must not resume").to_string();
    assert!(err.contains("step 6") && err.contains("schedule.lr: 0.003 → 0.001"), "{err}");

    let remedied = config(&SMALL_RUN.replace("microBatch: 4", "microBatch: 2").replace(
        "precision: f32",
        "precision: f32\n  gradientCheckpointing: true\n  checkpointedBlocks: 1\n  attention: math",
    ));
    assert_eq!((remedied.batch.grad_accum, remedied.recomputed_blocks(), remedied.model.n_layer), (4, 1, 2));
    let second = train_outcome(&remedied, run_options(&dir, None, None)).unwrap();
    assert_eq!(second.resumed_from, Some(6));
    assert_eq!(second.losses.len(), 6);
    for ((step, a), (s, b)) in second.losses.iter().zip(&full.losses[6..]) {
        assert_eq!(step, s);
        // Only the summation order differs.
        assert!((a - b).abs() < 1e-4, "step {step}: {a} after the remedies, {b} uninterrupted");
    }
}
