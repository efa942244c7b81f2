//! ZeRO-1 and ZeRO-2: AdamW whose state is partitioned over the ranks. Each rank clips
//! the gradients by the global norm, runs the fused AdamW on the pieces of the
//! parameters it owns ([`crate::dist::shard`]), and the updated pieces are all-gathered
//! bucket by bucket, so every rank ends the step with the same parameters as
//! [`super::AdamW`] would give. Moments take 1/world of the memory per rank.
//!
//! Under ZeRO-1 the gradients arrive all-reduced in `.grad`, as under plain data
//! parallelism. Under ZeRO-2 the reducer from [`ShardedAdamW::gradient_reducer`]
//! reduce-scatters them into one shard per bucket, so no rank keeps whole gradients
//! between steps. Either way the global norm comes from the reducer
//! ([`GradReducer::grad_norm`]), which rounds the same under every strategy.
//!
//! The checkpointed state is the consolidated one, named as [`super::AdamW`] names it,
//! so a checkpoint does not depend on the strategy or the world size.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crds::config::ResolvedOptimizer;
use tch::{Kind, Tensor};

use super::adamw::{bytes, check_state, nonfinite};
use crate::Error;
use crate::dist::shard::{ShardLayout, cache_line_alignment};
use crate::dist::{GradReducer, ProcessGroup, ReduceOp};
use crate::ffi::{self, AdamWParams, Lr};

/// A piece of a parameter this rank owns, and its AdamW state.
struct OwnedSegment {
    param: usize,
    elements: Range<i64>,
    /// The bucket it lies in, and where it starts in this rank's shard of it.
    bucket: usize,
    shard_offset: i64,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// f32 0-dim, as the fused kernel keeps it.
    step: Tensor,
}

/// Which ZeRO stage: what is sharded besides the optimizer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroStage {
    /// Optimizer state only; gradients are all-reduced whole.
    One,
    /// Gradients too: each rank keeps its shard of them.
    Two,
    /// Parameters too (fsdp): the optimizer's masters are this rank's shards, which
    /// [`crate::dist::fsdp::ShardedParams`] gathers when the model needs them.
    Three,
}

/// Where the optimizer finds the gradients of the pieces it owns.
enum Gradients {
    /// Whole and averaged, in each parameter's `.grad`.
    Whole,
    /// This rank's shard of each bucket's averaged gradients, one tensor per bucket,
    /// written by the scattering reducer.
    Sharded(Vec<Tensor>),
}

/// AdamW with its state sharded over a process group (ZeRO stages 1 and 2).
pub struct ShardedAdamW {
    config: ResolvedOptimizer,
    group: Arc<ProcessGroup>,
    layout: ShardLayout,
    /// (name, parameter) in the order the layout indexes them.
    params: Vec<(String, Tensor)>,
    /// `params` indices in [`super::AdamW`]'s order (decayed then not, each by name):
    /// the global norm sums in it, so clipping rounds as the replicated optimizer's.
    norm_order: Vec<usize>,
    decay: Vec<OwnedSegment>,
    no_decay: Vec<OwnedSegment>,
    grads: Gradients,
    /// Stage three: this rank's shard of each bucket's parameters, stepped in place.
    masters: Option<Vec<Tensor>>,
    /// Each parameter's shape (under stage three the tensors are empty between uses).
    shapes: Vec<Vec<i64>>,
}

impl ShardedAdamW {
    /// `params` in the order `bucket_of` assigns them (the gradient reducer's); like
    /// [`super::AdamW`], weight decay applies to parameters of two or more dimensions.
    pub fn new(
        params: Vec<(String, Tensor)>,
        bucket_of: &[i64],
        group: Arc<ProcessGroup>,
        config: &ResolvedOptimizer,
        stage: ZeroStage,
    ) -> Result<Self, Error> {
        if params.len() != bucket_of.len() {
            return Err(Error::Shim(format!(
                "sharded AdamW: {} parameters but {} bucket assignments",
                params.len(),
                bucket_of.len()
            )));
        }
        let numels: Vec<i64> = params.iter().map(|(_, p)| p.numel() as i64).collect();
        let align = cache_line_alignment(params.iter().map(|(_, p)| p.kind()));
        let layout = ShardLayout::new(&numels, bucket_of, group.world_size(), group.rank(), align);
        let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
        for (b, bucket) in layout.buckets.iter().enumerate() {
            for seg in bucket.segments() {
                let param = &params[seg.param].1;
                let len = seg.len();
                let state = OwnedSegment {
                    param: seg.param,
                    elements: seg.elements,
                    bucket: b,
                    shard_offset: seg.shard_offset,
                    exp_avg: Tensor::f_zeros([len], (param.kind(), param.device()))?,
                    exp_avg_sq: Tensor::f_zeros([len], (param.kind(), param.device()))?,
                    step: Tensor::f_zeros([], (Kind::Float, param.device()))?,
                };
                if param.dim() >= 2 { decay.push(state) } else { no_decay.push(state) }
            }
        }
        let mut norm_order: Vec<usize> = (0..params.len()).collect();
        norm_order.sort_by_key(|&i| (params[i].1.dim() < 2, params[i].0.clone()));
        let per_bucket = || -> Result<Vec<Tensor>, Error> {
            layout
                .buckets
                .iter()
                .map(|b| {
                    let like = b.members.first().map(|m| &params[m.param].1);
                    let (kind, device) = like.map_or((Kind::Float, tch::Device::Cpu), |p| (p.kind(), p.device()));
                    Ok(Tensor::f_zeros([b.shard_len()], (kind, device))?)
                })
                .collect()
        };
        let grads = match stage {
            ZeroStage::One => Gradients::Whole,
            ZeroStage::Two | ZeroStage::Three => Gradients::Sharded(per_bucket()?),
        };
        let masters = if stage == ZeroStage::Three { Some(per_bucket()?) } else { None };
        let shapes = params.iter().map(|(_, p)| p.size()).collect();
        Ok(ShardedAdamW {
            config: config.clone(),
            group,
            layout,
            params,
            norm_order,
            decay,
            no_decay,
            grads,
            masters,
            shapes,
        })
    }

    /// The layout of the shards (the buckets given at construction, cut per rank).
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// Stage three: the master shards, one per bucket, for
    /// [`crate::dist::fsdp::ShardedParams`] to fill and gather from.
    pub fn master_shards(&self) -> Option<Vec<Tensor>> {
        self.masters.as_ref().map(|m| m.iter().map(Tensor::shallow_clone).collect())
    }

    /// The reducer that fills this optimizer's gradient shards (ZeRO-2); `None` under
    /// ZeRO-1, whose gradients the ordinary all-reducing reducer averages.
    pub fn gradient_reducer(&self) -> Result<Option<GradReducer>, Error> {
        let Gradients::Sharded(shards) = &self.grads else { return Ok(None) };
        let params: Vec<Tensor> = self.params.iter().map(|(_, p)| p.shallow_clone()).collect();
        GradReducer::scattering(self.group.clone(), &params, &self.layout, shards).map(Some)
    }

    /// Bytes of gradient this rank keeps between steps: its shards under ZeRO-2,
    /// every parameter's `.grad` under ZeRO-1.
    pub fn gradient_bytes(&self) -> Result<usize, Error> {
        match &self.grads {
            Gradients::Sharded(shards) => Ok(shards.iter().map(bytes).sum()),
            Gradients::Whole => {
                let mut total = 0;
                for (_, p) in &self.params {
                    let g = p.f_grad()?;
                    if g.defined() {
                        total += bytes(&g);
                    }
                }
                Ok(total)
            }
        }
    }

    /// Bytes of state this rank holds (its pieces' moments and step counts).
    pub fn state_bytes(&self) -> usize {
        self.decay
            .iter()
            .chain(&self.no_decay)
            .map(|s| [&s.exp_avg, &s.exp_avg_sq, &s.step].iter().map(|t| bytes(t)).sum::<usize>())
            .sum()
    }

    fn piece(t: &Tensor, elements: &Range<i64>) -> Result<Tensor, Error> {
        Ok(t.f_view([-1])?.f_narrow(0, elements.start, elements.end - elements.start)?)
    }

    /// As [`super::AdamW::clip_and_step`]: clips by the global norm of the averaged
    /// gradients (`norm`, the reducer's; ZeRO-1 without it computes the replicated
    /// optimizer's) and, unless the loss or the norm is not finite, steps this rank's
    /// pieces and all-gathers every parameter.
    pub fn clip_and_step(
        &mut self,
        loss: &Tensor,
        max_norm: f64,
        lr: Lr,
        norm: Option<Tensor>,
    ) -> Result<(Tensor, Tensor), Error> {
        let norm = match (norm, &self.grads) {
            (Some(norm), _) => {
                let mut owned = Vec::new();
                for seg in self.decay.iter().chain(&self.no_decay) {
                    owned.extend(self.piece_grad(seg)?);
                }
                ffi::clip_grads_by_norm(&owned, &norm, max_norm)?;
                norm
            }
            (None, Gradients::Whole) => self.clip_whole(max_norm)?,
            (None, Gradients::Sharded(_)) => {
                return Err(Error::Shim("ZeRO-2's step needs the gradient reducer's global norm".into()));
            }
        };
        let skip = nonfinite(&[loss, &norm])?;
        self.step_owned(lr, &skip)?;
        if self.masters.is_none() {
            self.gather_parameters()?;
        }
        Ok((norm, skip))
    }

    fn device(&self) -> tch::Device {
        self.params.first().map_or(tch::Device::Cpu, |(_, p)| p.device())
    }

    /// Every rank holds every averaged gradient: the norm and the clipping are the
    /// replicated optimizer's.
    fn clip_whole(&self, max_norm: f64) -> Result<Tensor, Error> {
        let mut grads = Vec::with_capacity(self.params.len());
        for &i in &self.norm_order {
            let g = self.params[i].1.f_grad()?;
            if g.defined() {
                grads.push(g);
            }
        }
        if grads.is_empty() {
            return Ok(Tensor::f_zeros([], (Kind::Float, self.device()))?);
        }
        ffi::clip_grad_norm(&grads, max_norm)
    }

    /// The values an owned piece steps: a piece of the parameter, or of the shard.
    fn master(&self, seg: &OwnedSegment) -> Result<Tensor, Error> {
        match &self.masters {
            Some(shards) => {
                Ok(shards[seg.bucket].f_narrow(0, seg.shard_offset, seg.elements.end - seg.elements.start)?)
            }
            None => Self::piece(&self.params[seg.param].1, &seg.elements),
        }
    }

    /// The gradient of an owned piece.
    fn piece_grad(&self, seg: &OwnedSegment) -> Result<Option<Tensor>, Error> {
        match &self.grads {
            Gradients::Whole => {
                let grad = self.params[seg.param].1.f_grad()?;
                if !grad.defined() {
                    return Ok(None);
                }
                Self::piece(&grad, &seg.elements).map(Some)
            }
            Gradients::Sharded(shards) => {
                Ok(Some(shards[seg.bucket].f_narrow(0, seg.shard_offset, seg.elements.end - seg.elements.start)?))
            }
        }
    }

    fn step_owned(&mut self, lr: Lr, skip: &Tensor) -> Result<(), Error> {
        let c = &self.config;
        for (segments, weight_decay) in [(&self.decay, c.weight_decay), (&self.no_decay, 0.0)] {
            let (mut p, mut g, mut m, mut v, mut s) = (vec![], vec![], vec![], vec![], vec![]);
            for seg in segments {
                let Some(grad) = self.piece_grad(seg)? else { continue };
                p.push(self.master(seg)?);
                g.push(grad);
                m.push(seg.exp_avg.shallow_clone());
                v.push(seg.exp_avg_sq.shallow_clone());
                s.push(seg.step.shallow_clone());
            }
            let hp = AdamWParams { lr, beta1: c.beta1, beta2: c.beta2, weight_decay, eps: c.eps };
            ffi::fused_adamw(&p, &g, &m, &v, &s, &hp, Some(skip))?;
        }
        Ok(())
    }

    /// Every rank's pieces of bucket `b`, taken by `value(segment)`, gathered into the
    /// bucket's flat layout (padded).
    fn gather_bucket(
        &self,
        b: usize,
        like: &Tensor,
        value: impl Fn(&OwnedSegment) -> Result<Tensor, Error>,
    ) -> Result<Tensor, Error> {
        let bucket = &self.layout.buckets[b];
        let mine = Tensor::f_zeros([bucket.shard_len()], (like.kind(), like.device()))?;
        for seg in self.decay.iter().chain(&self.no_decay).filter(|s| s.bucket == b) {
            mine.f_narrow(0, seg.shard_offset, seg.elements.end - seg.elements.start)?.f_copy_(&value(seg)?)?;
        }
        let all = Tensor::f_empty([bucket.padded_len], (like.kind(), like.device()))?;
        self.group.all_gather(&all, &mine)?.wait()?;
        Ok(all)
    }

    /// All-gathers the updated pieces so every rank holds every parameter.
    fn gather_parameters(&mut self) -> Result<(), Error> {
        let _guard = tch::no_grad_guard();
        for (b, bucket) in self.layout.buckets.iter().enumerate() {
            let Some(first) = bucket.members.first() else { continue };
            let like = self.params[first.param].1.shallow_clone();
            let all = self.gather_bucket(b, &like, |seg| Self::piece(&self.params[seg.param].1, &seg.elements))?;
            for m in &bucket.members {
                let param = &self.params[m.param].1;
                param.f_view([-1])?.f_copy_(&all.f_narrow(0, m.offset, m.numel)?)?;
            }
        }
        Ok(())
    }

    /// Drops every gradient, as [`super::AdamW::zero_grad`] (ZeRO-2's shards are
    /// overwritten by the next step's last micro-step).
    pub fn zero_grad(&mut self) -> Result<(), Error> {
        let params: Vec<Tensor> = self.params.iter().map(|(_, p)| p.shallow_clone()).collect();
        ffi::clear_grads(&params)
    }

    /// The consolidated state, named and sorted as [`super::AdamW::state_tensors`]
    /// names it: a collective, so every rank calls it; every rank gets the whole state.
    pub fn gather_state(&self) -> Result<Vec<(String, Tensor)>, Error> {
        let _guard = tch::no_grad_guard();
        let mut out: Vec<(String, Tensor)> = Vec::with_capacity(3 * self.params.len());
        for (b, bucket) in self.layout.buckets.iter().enumerate() {
            let Some(first) = bucket.members.first() else { continue };
            let like = self.params[first.param].1.shallow_clone();
            let exp_avg = self.gather_bucket(b, &like, |s| Ok(s.exp_avg.shallow_clone()))?;
            let exp_avg_sq = self.gather_bucket(b, &like, |s| Ok(s.exp_avg_sq.shallow_clone()))?;
            for m in &bucket.members {
                let name = &self.params[m.param].0;
                let shape = self.shapes[m.param].as_slice();
                let full = |t: &Tensor| -> Result<Tensor, Error> {
                    Ok(t.f_narrow(0, m.offset, m.numel)?.f_view(shape)?.f_detach_copy()?)
                };
                out.push((format!("{name}.exp_avg"), full(&exp_avg)?));
                out.push((format!("{name}.exp_avg_sq"), full(&exp_avg_sq)?));
            }
        }
        // Each parameter's step count, from whichever rank owns a piece of it.
        let steps = Tensor::f_zeros([self.params.len() as i64], (Kind::Float, self.device()))?;
        for seg in self.decay.iter().chain(&self.no_decay) {
            steps.f_narrow(0, seg.param as i64, 1)?.f_copy_(&seg.step.f_view([1])?)?;
        }
        self.group.allreduce(&steps, ReduceOp::Max)?.wait()?;
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("{name}.step"), steps.f_select(0, i as i64)?.f_detach_copy()?));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Loads consolidated state (as from [`Self::gather_state`] or
    /// [`super::AdamW::state_tensors`], of any world size): each rank keeps its pieces.
    /// Every name must be present with the parameter's shape and dtype; otherwise
    /// nothing is loaded and the error names the first mismatch.
    pub fn load_state(&mut self, named: &HashMap<String, Tensor>) -> Result<(), Error> {
        let want = self.params.iter().zip(&self.shapes).flat_map(|((name, p), shape)| {
            [
                (format!("{name}.exp_avg"), shape.clone(), p.kind()),
                (format!("{name}.exp_avg_sq"), shape.clone(), p.kind()),
                (format!("{name}.step"), vec![], Kind::Float),
            ]
        });
        check_state(want, named)?;
        let _guard = tch::no_grad_guard();
        for seg in self.decay.iter_mut().chain(self.no_decay.iter_mut()) {
            let name = &self.params[seg.param].0;
            let piece = |suffix: &str| -> Result<Tensor, Error> {
                let saved = &named[&format!("{name}.{suffix}")];
                Self::piece(&saved.f_contiguous()?, &seg.elements)
            };
            seg.exp_avg.f_copy_(&piece("exp_avg")?)?;
            seg.exp_avg_sq.f_copy_(&piece("exp_avg_sq")?)?;
            seg.step.f_copy_(&named[&format!("{name}.step")])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
