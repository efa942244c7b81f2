//! GRPO's sampler without a launch per kernel: after the prompts' prefill, every
//! decoding step is the same work on the same tensors ([`Model::decode_static`] at the
//! KV cache's device cursor, the Gumbel-max sampler, the finished rows masked to the stop
//! token rather than the batch reshaped), so on CUDA it is captured once per cache
//! bucket as a CUDA graph and replayed: one launch a step. The keys attended grow in
//! buckets of [`StaticDecoding::bucket`] slots, so early steps do not attend over the
//! whole cache. Elsewhere (and as the reference) the same step runs eagerly; the eager
//! [`super::generate_cached`] stays the fallback.

use tch::{Device, Kind, TchError, Tensor};

use super::{LeftPadded, Sampling, completions, sample_next_in_graph};
use crate::model::Model;

/// How the static decoder runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StaticDecoding {
    /// Cache slots a step attends to grow in steps of this many: one graph per bucket.
    pub bucket: i64,
    /// Capture and replay CUDA graphs (CUDA with the cuda feature); otherwise every step
    /// runs eagerly.
    pub graphs: bool,
    /// Steps between two checks whether every row has stopped (each check waits for the
    /// device).
    pub check_every: usize,
}

impl Default for StaticDecoding {
    fn default() -> Self {
        StaticDecoding { bucket: 256, graphs: true, check_every: 16 }
    }
}

/// The slots a step at `position` attends to: `position + 1` rounded up to a whole
/// bucket, at most `capacity`.
pub fn keys_for(position: i64, bucket: i64, capacity: i64) -> i64 {
    let bucket = bucket.max(1);
    (((position + 1) + bucket - 1) / bucket * bucket).min(capacity)
}

/// The tensors a decoding step reads and writes in place: what a captured graph holds.
struct StepState {
    /// (B, 1) the token each row feeds next.
    tokens: Tensor,
    /// (B) whether the row has produced the stop token.
    done: Tensor,
    /// (B, max_new) the tokens produced, the stop token after a row's end.
    out: Tensor,
    /// (1) int64: the next column of `out`.
    column: Tensor,
    /// 0-dim: the stop token (or −1 without one), for the finished rows.
    stop: Tensor,
}

impl StepState {
    /// Records `next` (B) as this step's tokens: a finished row's is the stop token.
    fn record(&mut self, next: &Tensor, stop: Option<i64>) -> Result<(), TchError> {
        let next = if stop.is_some() { self.stop.f_where_self(&self.done, next)? } else { next.shallow_clone() };
        let next = next.f_unsqueeze(1)?; // (B, 1)
        let _ = self.out.f_index_copy_(1, &self.column, &next)?;
        self.tokens.f_copy_(&next)?;
        if stop.is_some() {
            let _ = self.done.f_logical_or_(&next.f_squeeze_dim(1)?.f_eq_tensor(&self.stop)?)?;
        }
        let _ = self.column.f_add_scalar_(1)?;
        Ok(())
    }
}

/// Completions of `prompts` as [`super::generate_cached`] makes them (left-padded, a row
/// ends at `stop`, kept), the steps after the prefill decoded by the static step and, on
/// CUDA, replayed from CUDA graphs. With the same sampler and seed the tokens equal the
/// eager ones; greedy equals [`super::generate_cached`]'s.
pub fn generate_static(
    model: &Model,
    prompts: &[Vec<i64>],
    max_new: usize,
    s: &Sampling,
    stop: Option<i64>,
    device: Device,
    how: StaticDecoding,
) -> Result<Vec<Vec<i64>>, TchError> {
    let batch = LeftPadded::new(model, prompts, max_new, device)?;
    if max_new == 0 {
        return Ok(vec![Vec::new(); prompts.len()]);
    }
    tch::no_grad(|| {
        let mut cache = model.new_cache(batch.rows, batch.len + max_new as i64)?;
        let first = sample_next_in_graph(&model.decode(&batch.ids, &batch.real, &mut cache)?, s)?; // (B)
        let mut state = StepState {
            tokens: Tensor::f_zeros([batch.rows, 1], (Kind::Int64, device))?,
            done: Tensor::f_zeros([batch.rows], (Kind::Bool, device))?,
            out: Tensor::f_full([batch.rows, max_new as i64], stop.unwrap_or(0), (Kind::Int64, device))?,
            column: Tensor::f_zeros([1], (Kind::Int64, device))?,
            stop: Tensor::f_full([], stop.unwrap_or(-1), (Kind::Int64, device))?,
        };
        state.record(&first, stop)?;
        let mut steps = Steps::new(device, how);
        for i in 1..max_new {
            // The cache holds the prompt and i tokens; this step writes slot len + i − 1.
            let position = batch.len + i as i64 - 1;
            let keys = keys_for(position, how.bucket, cache.capacity());
            steps.run(keys, &mut || {
                let logits = model.decode_static(&state.tokens, &mut cache, position, keys)?;
                state.record(&sample_next_in_graph(&logits, s)?, stop)
            })?;
            if stop.is_some() && i % how.check_every.max(1) == 0 && state.done.f_all()?.int64_value(&[]) != 0 {
                break;
            }
        }
        completions(&state.out, stop)
    })
}

/// Runs a step: eagerly, or on CUDA from the graph of its bucket (the first step of a
/// bucket warms up on the graph's side stream, the second is captured, and every step
/// from then on replays).
struct Steps {
    #[cfg(feature = "cuda")]
    graphs: Option<(usize, std::collections::BTreeMap<i64, BucketGraph>)>,
}

#[cfg(feature = "cuda")]
struct BucketGraph {
    graph: crate::ffi::CudaGraph,
    captured: bool,
}

impl Steps {
    fn new(device: Device, how: StaticDecoding) -> Self {
        #[cfg(feature = "cuda")]
        {
            let graphs = match device {
                Device::Cuda(d) if how.graphs => Some((d, std::collections::BTreeMap::new())),
                _ => None,
            };
            Steps { graphs }
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (device, how);
            Steps {}
        }
    }

    fn run(&mut self, keys: i64, step: &mut dyn FnMut() -> Result<(), TchError>) -> Result<(), TchError> {
        #[cfg(feature = "cuda")]
        if let Some((device, graphs)) = &mut self.graphs {
            let err = |e: crate::Error| TchError::Torch(e.to_string());
            return match graphs.get_mut(&keys) {
                None => {
                    let mut graph = crate::ffi::CudaGraph::new(*device).map_err(err)?;
                    graph.on_side_stream(|| Ok(step()?)).map_err(err)?;
                    graphs.insert(keys, BucketGraph { graph, captured: false });
                    Ok(())
                }
                Some(b) => {
                    if !b.captured {
                        b.graph.capture(|| Ok(step()?)).map_err(err)?;
                        b.captured = true;
                    }
                    b.graph.replay().map_err(err)
                }
            };
        }
        let _ = keys;
        step()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::generate_cached;
    use crate::model::cache::KvCache;

    /// The KV cache of `prompts` after their prefill, with room for `max_new` more.
    fn prefilled(model: &Model, prompts: &[Vec<i64>], max_new: usize) -> Result<KvCache, TchError> {
        let batch = LeftPadded::new(model, prompts, max_new, Device::Cpu)?;
        let mut cache = model.new_cache(batch.rows, batch.len + max_new as i64)?;
        let _ = tch::no_grad(|| model.decode(&batch.ids, &batch.real, &mut cache))?;
        Ok(cache)
    }

    #[test]
    fn keys_grow_in_whole_buckets_up_to_the_capacity() {
        // (position, bucket, capacity, keys)
        let cases =
            [(0, 4, 10, 4), (3, 4, 10, 4), (4, 4, 10, 8), (7, 4, 10, 8), (8, 4, 10, 10), (9, 4, 10, 10), (5, 1, 10, 6)];
        for (position, bucket, capacity, want) in cases {
            assert_eq!(keys_for(position, bucket, capacity), want, "{position} {bucket} {capacity}");
        }
    }

    fn model(arch: crds::presets::Arch) -> Model {
        let cfg = crate::model::tests::small(arch, arch == crds::presets::Arch::Gpt2);
        tch::manual_seed(11);
        let vs = tch::nn::VarStore::new(Device::Cpu);
        Model::new(&vs.root(), &cfg, Device::Cpu).unwrap()
    }

    /// Greedy decoding by the static step, over several buckets, gives exactly the eager
    /// KV cache's tokens for every architecture, with a stop token and without.
    #[test]
    fn the_static_step_decodes_as_the_kv_cache() {
        use crds::presets::Arch;
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
        let prompts: Vec<Vec<i64>> = vec![vec![5, 17, 3], vec![9], vec![40, 41, 42, 43, 44, 45, 46], vec![2, 2]];
        for arch in [Arch::Llama, Arch::Qwen3, Arch::Gpt2] {
            let model = model(arch);
            let want = generate_cached(&model, &prompts, 12, &greedy, None, Device::Cpu).unwrap();
            for bucket in [1, 3, 64] {
                let how = StaticDecoding { bucket, graphs: false, check_every: 4 };
                let got = generate_static(&model, &prompts, 12, &greedy, None, Device::Cpu, how).unwrap();
                assert_eq!(got, want, "{arch:?}, bucket {bucket}");
            }
            // A stop token ends its row as in the eager decoder; the others go on.
            let stop = want[0][2];
            let cut = generate_cached(&model, &prompts, 12, &greedy, Some(stop), Device::Cpu).unwrap();
            let how = StaticDecoding { bucket: 3, graphs: false, check_every: 1 };
            let got = generate_static(&model, &prompts, 12, &greedy, Some(stop), Device::Cpu, how).unwrap();
            assert_eq!(got, cut, "{arch:?}, stop {stop}");
        }
    }

    /// The static step writes the cache where the eager step does: after the same tokens,
    /// keys, values and positions agree.
    #[test]
    fn the_static_step_fills_the_cache_as_the_eager_step() {
        let model = model(crds::presets::Arch::Llama);
        let prompts = vec![vec![1i64, 2, 3], vec![4]];
        let (mut eager, mut fixed) = (prefilled(&model, &prompts, 4).unwrap(), prefilled(&model, &prompts, 4).unwrap());
        let next = Tensor::from_slice(&[7i64, 8]).view([2, 1]);
        let ones = Tensor::ones([2, 1], (Kind::Bool, Device::Cpu));
        let a = tch::no_grad(|| model.decode(&next, &ones, &mut eager)).unwrap();
        let b = tch::no_grad(|| model.decode_static(&next, &mut fixed, 3, 4)).unwrap();
        assert!(f64::try_from(a.f_sub(&b).unwrap().abs().max()).unwrap() < 1e-5);
        assert!(eager.same_as(&fixed).unwrap());
        // Eager decoding does not go on after a static step, whose count is on the device.
        let err = tch::no_grad(|| model.decode(&next, &ones, &mut fixed)).unwrap_err().to_string();
        assert!(err.contains("advanced by static steps"), "{err}");
        // A step past the capacity, or before what was written, is refused.
        let mut full = prefilled(&model, &prompts, 1).unwrap();
        let _ = tch::no_grad(|| model.decode_static(&next, &mut full, 3, 4)).unwrap();
        let err = tch::no_grad(|| model.decode_static(&next, &mut full, 4, 5)).unwrap_err().to_string();
        assert!(err.contains("cannot write slot 4 of a KV cache of 4 tokens"), "{err}");
        let err = tch::no_grad(|| model.decode_static(&next, &mut full, 2, 4)).unwrap_err().to_string();
        assert!(err.contains("(3 written eagerly)"), "{err}");
    }
}
