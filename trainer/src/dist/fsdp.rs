//! Fully sharded parameters (FSDP, ZeRO stage 3). The parameters are laid out in
//! units (the embedding, each block, the head), each a bucket of a [`ShardLayout`];
//! a rank keeps only its shard of every unit, which the sharded optimizer steps in
//! place. A unit is all-gathered into one flat buffer when the model needs it, each
//! parameter's data pointed at its piece of that buffer, and pointed at an empty
//! tensor again when the model is done with it. The parameter tensors themselves stay
//! the same objects throughout, so the model's layers, autograd's gradient
//! accumulators and the gradient reducer keep working on them.

use std::sync::Arc;

use tch::Tensor;

use super::group::{PendingWork, ProcessGroup};
use super::shard::ShardLayout;
use crate::Error;

/// A unit's full flat buffer: gathered, or on its way.
enum Gathered {
    Ready(Tensor),
    Coming(Tensor, PendingWork),
}

/// Parameters sharded over the ranks of a group.
pub struct ShardedParams {
    group: Arc<ProcessGroup>,
    layout: ShardLayout,
    /// In the layout's parameter order, with their full shapes.
    params: Vec<(String, Tensor)>,
    shapes: Vec<Vec<i64>>,
    /// This rank's shard of each unit: the master values.
    shards: Vec<Tensor>,
    gathered: Vec<Option<Gathered>>,
}

impl ShardedParams {
    /// Takes over `params`, whole and equal on every rank, laid out by `layout` (one
    /// bucket per unit) with this rank's `shards` of it: copies this rank's pieces into
    /// the shards, then frees every parameter.
    pub fn new(
        group: Arc<ProcessGroup>,
        params: Vec<(String, Tensor)>,
        layout: ShardLayout,
        shards: Vec<Tensor>,
    ) -> Result<ShardedParams, Error> {
        if shards.len() != layout.buckets.len() || layout.world != group.world_size() {
            return Err(Error::Shim(format!(
                "fsdp: {} shards for {} units of a {}-rank layout",
                shards.len(),
                layout.buckets.len(),
                layout.world
            )));
        }
        let shapes = params.iter().map(|(_, p)| p.size()).collect();
        let n = layout.buckets.len();
        let mut me = ShardedParams { group, layout, params, shapes, shards, gathered: (0..n).map(|_| None).collect() };
        {
            let _guard = tch::no_grad_guard();
            for (u, bucket) in me.layout.buckets.iter().enumerate() {
                for seg in bucket.segments() {
                    let piece = me.params[seg.param].1.f_view([-1])?.f_narrow(0, seg.elements.start, seg.len())?;
                    me.shards[u].f_narrow(0, seg.shard_offset, seg.len())?.f_copy_(&piece)?;
                }
            }
        }
        for u in 0..n {
            me.empty(u)?;
        }
        Ok(me)
    }

    pub fn units(&self) -> usize {
        self.layout.buckets.len()
    }

    fn empty(&mut self, u: usize) -> Result<(), Error> {
        for m in &self.layout.buckets[u].members {
            let p = &mut self.params[m.param].1;
            let nothing = Tensor::f_empty([0], (p.kind(), p.device()))?;
            p.f_set_data(&nothing)?;
        }
        Ok(())
    }

    /// Starts all-gathering unit `u` unless it is gathered or on its way.
    pub fn prefetch(&mut self, u: usize) -> Result<(), Error> {
        if self.gathered[u].is_some() {
            return Ok(());
        }
        let bucket = &self.layout.buckets[u];
        let shard = &self.shards[u];
        let flat = Tensor::f_empty([bucket.padded_len], (shard.kind(), shard.device()))?;
        let work = self.group.all_gather(&flat, shard)?.keep(&self.group);
        self.gathered[u] = Some(Gathered::Coming(flat, work));
        Ok(())
    }

    /// Makes unit `u`'s parameters whole, waiting for its gather.
    pub fn gather(&mut self, u: usize) -> Result<(), Error> {
        self.prefetch(u)?;
        let flat = match self.gathered[u].take() {
            Some(Gathered::Coming(flat, work)) => {
                work.wait()?;
                flat
            }
            Some(Gathered::Ready(flat)) => {
                self.gathered[u] = Some(Gathered::Ready(flat));
                return Ok(());
            }
            None => unreachable!("prefetched above"),
        };
        for m in &self.layout.buckets[u].members {
            let view = flat.f_narrow(0, m.offset, m.numel)?.f_view(self.shapes[m.param].as_slice())?;
            self.params[m.param].1.f_set_data(&view)?;
        }
        self.gathered[u] = Some(Gathered::Ready(flat));
        Ok(())
    }

    /// Frees unit `u`'s full parameters (a gather on its way is waited for first).
    pub fn release(&mut self, u: usize) -> Result<(), Error> {
        match self.gathered[u].take() {
            None => return Ok(()),
            Some(Gathered::Coming(_, work)) => work.wait()?,
            Some(Gathered::Ready(_)) => {}
        }
        self.empty(u)
    }

    /// Every parameter by name, whole (copies): a collective, every rank calls it.
    /// Units that were gathered stay so.
    pub fn full_parameters(&mut self) -> Result<Vec<(String, Tensor)>, Error> {
        let mut out = Vec::with_capacity(self.params.len());
        for u in 0..self.units() {
            let was = matches!(self.gathered[u], Some(Gathered::Ready(_)));
            self.gather(u)?;
            for m in &self.layout.buckets[u].members {
                let (name, p) = &self.params[m.param];
                out.push((name.clone(), p.f_detach_copy()?));
            }
            if !was {
                self.release(u)?;
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Gathers every unit (evaluation, sampling); [`Self::release_all`] undoes it.
    pub fn gather_all(&mut self) -> Result<(), Error> {
        for u in 0..self.units() {
            self.prefetch(u)?;
        }
        (0..self.units()).try_for_each(|u| self.gather(u))
    }

    pub fn release_all(&mut self) -> Result<(), Error> {
        (0..self.units()).try_for_each(|u| self.release(u))
    }

    /// Bytes of parameters this rank holds now: its shards and any gathered units.
    pub fn resident_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        let gathered: usize = self
            .gathered
            .iter()
            .flatten()
            .map(|g| match g {
                Gathered::Ready(flat) | Gathered::Coming(flat, _) => bytes(flat),
            })
            .sum();
        self.shards.iter().map(bytes).sum::<usize>() + gathered
    }
}
