//! SwiGLU, RoPE and the residual RMSNorm as one autograd node each, and the loss chunk:
//! what SwiGLU's graph keeps, and each op's kernel choice. One test in its own process: the heap is measured process-wide, and
//! the choices are process-wide.

use crds::presets::{ModelConfig, preset};
use crds::types::Precision;
use tch::{Device, Kind, Tensor};
use trainer::ffi;
use trainer::kernels::choice::{Kernels, Op, current, set};
use trainer::kernels::swiglu::swiglu;
use trainer::kernels::tune::{CUDA_CANDIDATES, RunKinds, tune};

/// Bytes malloc has handed out and not had back, every arena and mmapped block included.
fn heap_in_use() -> i64 {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as i64
}

/// Heap that the autograd graph of `f(x·Wg, x·Wu).sum()` holds after the forward pass.
fn held_by_graph(x: &Tensor, wg: &Tensor, wu: &Tensor, f: impl Fn(&Tensor, &Tensor) -> Tensor) -> i64 {
    let before = heap_in_use();
    let loss = f(&x.matmul(wg), &x.matmul(wu)).sum(Kind::Float);
    let held = heap_in_use() - before;
    loss.backward();
    held
}

#[test]
fn one_node_keeps_less_and_each_choice_is_measured() {
    // The graph of silu(a)·b as two nodes keeps a, silu(a) and b; as one, a and b.
    let (n, d, d_ff) = (4096, 64, 1024);
    let leaf = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)).requires_grad_(true);
    let (x, wg, wu) = (leaf(&[n, d]), leaf(&[d, d_ff]), leaf(&[d, d_ff]));
    let activation = n * d_ff * 4;
    // The first pass also allocates what libtorch sets up once (≈ 5 MB here).
    for pass in 0..3 {
        let [eager, one] = [Kernels::Eager, Kernels::Composed].map(|k| {
            set(Op::Swiglu, k);
            held_by_graph(&x, &wg, &wu, |a, b| swiglu(a, b).unwrap())
        });
        if pass > 0 {
            // The same graphs as written out (to a few bytes of bookkeeping).
            assert!((held_by_graph(&x, &wg, &wu, |a, b| a.silu() * b) - eager).abs() < 4096, "eager is silu(a) * b");
            assert!((held_by_graph(&x, &wg, &wu, |a, b| ffi::swiglu(a, b, false).unwrap()) - one).abs() < 4096);
            let (eager, one) = (eager as f64 / activation as f64, one as f64 / activation as f64);
            assert!((eager - 3.0).abs() < 0.05, "two nodes keep {eager:.3} activations");
            assert!((one - 2.0).abs() < 0.05, "one node keeps {one:.3} activations");
        }
    }

    // On CPU the composed kernels are timed and exact; the fused ones are rejected with
    // the reason; the choice is what the model then runs. RoPE on nano's q: 4 heads of 32.
    let mut m = ModelConfig::from(preset("nano").unwrap());
    m.d_ff = 48;
    let (f32, bf16) = (RunKinds::uniform(Kind::Float), RunKinds::uniform(Kind::BFloat16));
    // bf16-mixed: f32 weights and stream, bf16 matmuls under autocast.
    let mixed = RunKinds { weights: Kind::Float, matmuls: Kind::BFloat16, autocast: true };
    // Who refuses the fused kernels on the CPU, by op.
    let refused_by = |op: Op| match op {
        Op::Swiglu | Op::Rope => format!("{}: the fused kernels", op.name()),
        Op::Norm => "residual_rms_norm: the row kernels".to_string(),
        Op::Loss => "cross_entropy_chunk: the row kernels".to_string(),
    };
    for op in Op::ALL {
        for kinds in [f32, bf16, mixed] {
            set(op, Kernels::Fused);
            let choice = tune(op, &m, 3, 100, kinds, Device::Cpu, &CUDA_CANDIDATES, None).unwrap();
            let [composed, fused] = &choice.trials[..] else { panic!("{choice:?}") };
            assert!(composed.rejected.is_none() && composed.ms.unwrap() > 0.0, "{op:?} {kinds:?}: {composed:?}");
            // f32 composed is the reference itself; the others are within bf16 rounding of it.
            let error = composed.error.unwrap();
            assert!(if kinds == f32 { error == 0.0 } else { error <= 1e-2 }, "{op:?} {kinds:?}: {error}");
            let why = fused.rejected.as_deref().unwrap();
            assert!(why.starts_with("failed: ") && why.contains(&refused_by(op)), "{op:?}: {why}");
            assert_eq!((choice.chosen, current(op)), (Kernels::Composed, Kernels::Composed));
        }
        // With nothing that runs, the composed kernels stay: they always can.
        set(op, Kernels::Fused);
        let none = tune(op, &m, 1, 8, f32, Device::Cpu, &[Kernels::Fused], None).unwrap();
        assert_eq!((none.chosen, current(op)), (Kernels::Composed, Kernels::Composed));
    }
    // A bf16 add rounds where the f32 reference does not: that error is measured, not zero.
    let norm = tune(Op::Norm, &m, 3, 100, bf16, Device::Cpu, &CUDA_CANDIDATES, None).unwrap();
    assert!(norm.trials[0].error.unwrap() > 0.0, "{norm:?}");
    // `trainer bench-kernels`: every kernel set timed and checked, its speed-up over eager
    // from the same run; the fused ones rejected on CPU; GPT-2's loss alone.
    let report = trainer::bench::kernels::run(&m, 2, 64, Precision::F32, Device::Cpu).unwrap();
    assert_eq!(
        (report["dtype"].as_str(), report["micro_batch"].as_i64(), report["seq"].as_i64()),
        (Some("Float"), Some(2), Some(64))
    );
    for kind in Op::ALL {
        let (op, r) = (kind.name(), &report["ops"][kind.name()]);
        let trials = r["trials"].as_array().unwrap();
        let names: Vec<_> = trials.iter().map(|t| t["candidate"].as_str().unwrap()).collect();
        assert_eq!(names, ["eager", "composed", "fused"], "{op}");
        let ms = |i: usize| trials[i]["ms"].as_f64().unwrap();
        assert_eq!(trials[0]["error"].as_f64(), Some(0.0), "{op}: eager f32 is the reference's values");
        assert_eq!(trials[1]["error"].as_f64(), Some(0.0), "{op}");
        assert!(trials[2]["rejected"].as_str().unwrap().contains(&refused_by(kind)), "{op}: {r}");
        let speedup = &r["speedup_vs_eager"];
        assert_eq!(speedup["eager"].as_f64(), Some(1.0), "{op}");
        assert!((speedup["composed"].as_f64().unwrap() - ms(0) / ms(1)).abs() < 1e-12, "{op}: {r}");
        assert!(speedup["fused"].is_null(), "{op}");
        assert!(["eager", "composed"].contains(&r["chosen"].as_str().unwrap()), "{op}: {r}");
    }
    let mut gpt2 = ModelConfig::from(preset("gpt2-1b").unwrap());
    gpt2.vocab_size = 512;
    let report = trainer::bench::kernels::run(&gpt2, 1, 8, Precision::F32, Device::Cpu).unwrap();
    let ops: Vec<_> = report["ops"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(ops, ["loss"], "GPT-2 has no SwiGLU, RoPE or RMSNorm: {report}");

    // Choosing one op's kernels leaves the other's alone.
    set(Op::Swiglu, Kernels::Composed);
    set(Op::Rope, Kernels::Eager);
    assert_eq!((current(Op::Swiglu), current(Op::Rope)), (Kernels::Composed, Kernels::Eager));
    assert_eq!(CUDA_CANDIDATES, [Kernels::Composed, Kernels::Fused]);
}
