//! ZeRO-1 against the replicated AdamW on 1, 2 and 3 Gloo ranks (threads over
//! loopback): the same parameters after every step, the same consolidated state, and
//! state that moves between the two and between world sizes.

use std::collections::HashMap;
use std::sync::Arc;

use crds::config::ResolvedOptimizer;
use tch::{Device, Kind, Tensor};

use super::{ShardedAdamW, ZeroStage};
use crate::Error;
use crate::dist::loopback::{gloo, on_ranks};
use crate::dist::reducer::{BucketItem, assign_buckets};
use crate::optim::{AdamW, Lr};

const CONFIG: ResolvedOptimizer =
    ResolvedOptimizer { weight_decay: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, grad_clip: 1.0 };

/// Shapes of a small model: matrices (decayed), vectors (not), one of each that is
/// larger than a bucket, so shards cut across parameters and buckets.
const SHAPES: [&[i64]; 6] = [&[6, 4], &[4], &[9, 5], &[5], &[40], &[3, 3]];

/// The parameters, identical on every rank (seeded), in definition order.
fn initial_params() -> Named {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            let n: i64 = shape.iter().product();
            let t = (Tensor::arange(n, (Kind::Float, Device::Cpu)) * (0.37 + i as f64) + 0.5).sin().reshape(*shape);
            (format!("p{i}"), t.set_requires_grad(true))
        })
        .collect()
}

/// The all-reduced gradient of parameter `i` at `step`: the same on every rank.
fn grad(i: usize, step: usize, shape: &[i64]) -> Tensor {
    let n: i64 = shape.iter().product();
    let scale = if step == 2 { 40.0 } else { 1.0 }; // step 2 is clipped
    ((Tensor::arange(n, (Kind::Float, Device::Cpu)) * (1.3 + step as f64) + i as f64).cos() * scale).reshape(shape)
}

fn set_grads(params: &[(String, Tensor)], step: usize) {
    for (i, (_, p)) in params.iter().enumerate() {
        // Parameter 5 gets no gradient at step 1: its state must not advance.
        if i == 5 && step == 1 {
            continue;
        }
        (p * grad(i, step, &p.size())).sum(Kind::Float).backward();
    }
}

fn bucket_of(params: &[(String, Tensor)]) -> Vec<i64> {
    let items: Vec<BucketItem> = params.iter().map(|(_, p)| BucketItem::of(p, 0)).collect();
    assign_buckets(&items, 64 * 4)
}

fn loss() -> Tensor {
    Tensor::from(1.0f32)
}

/// Tensors by name.
type Named = Vec<(String, Tensor)>;

fn shallow(named: &[(String, Tensor)]) -> Named {
    named.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect()
}

/// The replicated optimizer's parameters after `steps` steps, and its state. Tensors
/// are not `Sync`, so each rank's thread computes its own reference.
fn replicated(steps: usize) -> (Named, Named) {
    replicated_with(steps, set_grads)
}

/// As [`replicated`], with the gradients `set(params, step)` gives.
fn replicated_with(steps: usize, set: fn(&[(String, Tensor)], usize)) -> (Named, Named) {
    let params = initial_params();
    let mut opt = AdamW::new(shallow(&params), &CONFIG).unwrap();
    for step in 0..steps {
        set(&params, step);
        let _ = opt.clip_and_step(&loss(), CONFIG.grad_clip, Lr::Value(1e-2), None).unwrap();
        opt.zero_grad().unwrap();
    }
    let state = opt.state_tensors().into_iter().map(|(n, t)| (n, t.detach_copy())).collect();
    (params.into_iter().map(|(n, p)| (n, p.detach_copy())).collect(), state)
}

/// The largest elementwise difference relative to the larger magnitude (1e-30 floor).
/// Not exactly 0: the CPU kernel's vector body and scalar tail round differently, and
/// shards move the boundary between them.
fn max_rel_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.iter().map(|x| &x.0).collect::<Vec<_>>(), b.iter().map(|x| &x.0).collect::<Vec<_>>());
    a.iter()
        .zip(b)
        .map(|((_, x), (_, y))| {
            let (x, y) = (x.to_kind(Kind::Double), y.to_kind(Kind::Double));
            ((&x - &y).abs() / x.abs().maximum(&y.abs()).clamp_min(1e-30)).max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

const TOLERANCE: f64 = 1e-6;

#[test]
fn sharded_steps_equal_the_replicated_ones_and_consolidate_to_the_same_state() {
    let steps = 4;
    for world in [1u32, 2, 3] {
        on_ranks(world, |rank, port| {
            let (want_params, want_state) = replicated(steps);
            let group = Arc::new(gloo(rank, world, port)?);
            let params = initial_params();
            let buckets = bucket_of(&params);
            assert!(buckets.iter().max().unwrap() >= &2, "several buckets: {buckets:?}");
            let mut opt = ShardedAdamW::new(shallow(&params), &buckets, group, &CONFIG, ZeroStage::One)?;
            // Two f32 moments of this rank's shard, a step count per piece, the padding.
            let total: usize = params.iter().map(|(_, p)| p.numel()).sum();
            assert!(
                opt.state_bytes() <= 8 * (total / world as usize + 16 * SHAPES.len()) + 4 * SHAPES.len(),
                "world {world}"
            );
            for step in 0..steps {
                set_grads(&params, step);
                let _ = opt.clip_and_step(&loss(), CONFIG.grad_clip, Lr::Value(1e-2), None)?;
                opt.zero_grad()?;
            }
            let got: Vec<(String, Tensor)> = params.iter().map(|(n, p)| (n.clone(), p.detach())).collect();
            assert!(max_rel_diff(&got, &want_params) < TOLERANCE, "parameters, world {world} rank {rank}");
            let state = opt.gather_state()?;
            assert!(max_rel_diff(&state, &want_state) < TOLERANCE, "state, world {world} rank {rank}");
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}

#[test]
fn state_moves_between_replicated_and_sharded_and_across_world_sizes() {
    // Two replicated steps, then the state loaded by 3 sharded ranks, two more steps:
    // the same as four replicated steps. Then back: that state gathered and loaded by
    // the replicated optimizer matches too.
    on_ranks(3, |rank, port| {
        let (two_params, after_two) = replicated(2);
        let (want_params, want_state) = replicated(4);
        let saved: HashMap<String, Tensor> = after_two.into_iter().collect();
        let group = Arc::new(gloo(rank, 3, port)?);
        let params = initial_params();
        tch::no_grad(|| {
            for ((_, p), (_, w)) in params.iter().zip(&two_params) {
                p.detach().copy_(w);
            }
        });
        let mut opt = ShardedAdamW::new(shallow(&params), &bucket_of(&params), group, &CONFIG, ZeroStage::One)?;
        opt.load_state(&saved)?;
        for step in 2..4 {
            set_grads(&params, step);
            let _ = opt.clip_and_step(&loss(), CONFIG.grad_clip, Lr::Value(1e-2), None)?;
            opt.zero_grad()?;
        }
        let got: Vec<(String, Tensor)> = params.iter().map(|(n, p)| (n.clone(), p.detach())).collect();
        assert!(max_rel_diff(&got, &want_params) < TOLERANCE, "rank {rank}");
        let state = opt.gather_state()?;
        assert!(max_rel_diff(&state, &want_state) < TOLERANCE, "rank {rank}");
        let mut back = AdamW::new(initial_params(), &CONFIG)?;
        back.load_state(&state.into_iter().collect())?;
        assert!(max_rel_diff(&back.state_tensors(), &want_state) < TOLERANCE);
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn state_that_does_not_fit_the_model_is_refused_naming_the_tensor() {
    on_ranks(2, |rank, port| {
        let (_, state) = replicated(1);
        let group = Arc::new(gloo(rank, 2, port)?);
        let params = initial_params();
        let mut opt = ShardedAdamW::new(shallow(&params), &bucket_of(&params), group, &CONFIG, ZeroStage::One)?;
        let mut missing: HashMap<String, Tensor> = state.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        missing.remove("p2.exp_avg_sq");
        let err = opt.load_state(&missing).expect_err("refused").to_string();
        assert!(err.contains("p2.exp_avg_sq is missing"), "{err}");
        let mut reshaped = missing;
        reshaped.insert("p2.exp_avg_sq".into(), Tensor::zeros([5, 9], (Kind::Float, Device::Cpu)));
        let err = opt.load_state(&reshaped).expect_err("refused").to_string();
        assert!(err.contains("p2.exp_avg_sq has shape [5, 9]"), "{err}");
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// The largest elementwise difference relative to the larger tensor's largest magnitude.
fn max_scaled_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.iter().map(|x| &x.0).collect::<Vec<_>>(), b.iter().map(|x| &x.0).collect::<Vec<_>>());
    a.iter()
        .zip(b)
        .map(|((_, x), (_, y))| {
            let (x, y) = (x.to_kind(Kind::Double), y.to_kind(Kind::Double));
            let scale = x.abs().max().maximum(&y.abs().max()).double_value(&[]).max(1e-30);
            (&x - &y).abs().max().double_value(&[]) / scale
        })
        .fold(0.0, f64::max)
}

/// Every parameter gets [`grad`] at every step.
fn set_every_grad(params: &[(String, Tensor)], step: usize) {
    for (i, (_, p)) in params.iter().enumerate() {
        (p * grad(i, step, &p.size())).sum(Kind::Float).backward();
    }
}

/// ZeRO-2: ranks backpropagate different gradients over two micro-steps; the reducer
/// reduce-scatters each from the backward hooks. The parameters step as the replicated
/// optimizer steps on the average, and no rank keeps a whole gradient: only its shard.
#[test]
fn zero2_steps_on_the_average_of_the_ranks_gradients_keeping_a_shard_of_them() {
    let steps = 4;
    for world in [2u32, 3] {
        on_ranks(world, |rank, port| {
            let (want_params, want_state) = replicated_with(steps, set_every_grad);
            let group = Arc::new(gloo(rank, world, port)?);
            let params = initial_params();
            let mut opt = ShardedAdamW::new(shallow(&params), &bucket_of(&params), group, &CONFIG, ZeroStage::Two)?;
            let reducer = opt.gradient_reducer()?.expect("zero2 brings its reducer");
            // Zero over the ranks: their average is grad(i, step).
            let spread = f64::from(rank) - f64::from(world - 1) / 2.0;
            for step in 0..steps {
                for micro in 0..2 {
                    let last = micro == 1;
                    reducer.begin_micro_step(last)?;
                    for (i, (_, p)) in params.iter().enumerate() {
                        let g = grad(i, step, &p.size()) * 0.5 + grad(i + 7, step, &p.size()) * (0.25 * spread);
                        (p * g).sum(Kind::Float).backward();
                    }
                    reducer.end_micro_step(last)?;
                    for (name, p) in &params {
                        assert!(!p.grad().defined(), "{name} keeps a whole gradient after micro-step {micro}");
                    }
                }
                let norm = reducer.grad_norm()?;
                let _ = opt.clip_and_step(&loss(), CONFIG.grad_clip, Lr::Value(1e-2), Some(norm))?;
                opt.zero_grad()?;
            }
            let total: i64 = params.iter().map(|(_, p)| p.numel() as i64).sum();
            let shard = opt.layout.shard_elements();
            assert_eq!(opt.gradient_bytes()?, 4 * shard as usize);
            assert!(shard <= total / i64::from(world) + 16 * opt.layout.buckets.len() as i64, "world {world}");
            let got: Vec<(String, Tensor)> = params.iter().map(|(n, p)| (n.clone(), p.detach())).collect();
            let diff = max_rel_diff(&got, &want_params);
            assert!(diff < TOLERANCE, "parameters differ by {diff:e}, world {world} rank {rank}");
            // The ranks' gradients cancel in part, so an element's average carries the
            // rounding of its larger summands: compare each moment to its tensor's scale.
            let state = opt.gather_state()?;
            let diff = max_scaled_diff(&state, &want_state);
            assert!(diff < TOLERANCE, "state differs by {diff:e} of its scale, world {world} rank {rank}");
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}
