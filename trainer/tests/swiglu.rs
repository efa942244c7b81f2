//! SwiGLU as one autograd node: what its graph keeps, and the kernel choice. One test in
//! its own process: the heap is measured process-wide, and the choice is process-wide.

use tch::{Device, Kind, Tensor};
use trainer::ffi;
use trainer::swiglu::{CUDA_CANDIDATES, Kernels, current, forward, set, tune};

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
fn one_node_keeps_one_activation_less_and_the_choice_is_measured() {
    // The graph of silu(a)·b as two nodes keeps a, silu(a) and b; as one, a and b.
    let (n, d, d_ff) = (4096, 64, 1024);
    let leaf = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)).requires_grad_(true);
    let (x, wg, wu) = (leaf(&[n, d]), leaf(&[d, d_ff]), leaf(&[d, d_ff]));
    let activation = n * d_ff * 4;
    // The first pass also allocates what libtorch sets up once (≈ 5 MB here).
    for pass in 0..3 {
        let [eager, one] = [Kernels::Eager, Kernels::Composed].map(|k| {
            set(k);
            held_by_graph(&x, &wg, &wu, |a, b| forward(a, b).unwrap())
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
    // the reason; the choice is what the model's MLP then runs.
    for kind in [Kind::Float, Kind::BFloat16] {
        set(Kernels::Fused);
        let choice = tune(300, 48, kind, Device::Cpu, &CUDA_CANDIDATES, None).unwrap();
        let [composed, fused] = &choice.trials[..] else { panic!("{choice:?}") };
        assert!(composed.rejected.is_none() && composed.ms.unwrap() > 0.0, "{kind:?}: {composed:?}");
        // f32 composed is the reference itself; bf16 is within bf16 rounding of it.
        let error = composed.error.unwrap();
        assert!(if kind == Kind::Float { error == 0.0 } else { error > 0.0 && error <= 1e-2 }, "{kind:?}: {error}");
        let why = fused.rejected.as_deref().unwrap();
        assert!(why.starts_with("failed: ") && why.contains("swiglu: the fused kernels"), "{why}");
        assert_eq!((choice.chosen, current()), (Kernels::Composed, Kernels::Composed));
    }
    // With nothing that runs, the composed kernels stay: they always can.
    set(Kernels::Fused);
    let none = tune(8, 4, Kind::Float, Device::Cpu, &[Kernels::Fused], None).unwrap();
    assert_eq!((none.chosen, current()), (Kernels::Composed, Kernels::Composed));
    assert_eq!(CUDA_CANDIDATES, [Kernels::Composed, Kernels::Fused]);
}
