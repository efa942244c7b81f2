//! Fully sharded parameters (FSDP, ZeRO stage 3). The parameters are laid out in the
//! buckets of a [`ShardLayout`], the gradient reducer's, none spanning two units (the
//! embedding, each block, the head); a rank keeps only its shard of every bucket, which
//! the sharded optimizer steps in place. A unit's buckets are all-gathered into flat
//! buffers when the model needs it, each parameter's data pointed at its piece of them,
//! and pointed at an empty tensor again when the model is done with it. The parameter tensors themselves stay
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
    /// Per bucket.
    gathered: Vec<Option<Gathered>>,
    /// The buckets of each unit.
    buckets_of: Vec<Vec<usize>>,
}

impl ShardedParams {
    /// Takes over `params`, whole and equal on every rank, parameter `i` in unit
    /// `units[i]`, laid out by `layout` with this rank's `shards` of it: copies this
    /// rank's pieces into the shards, then frees every parameter.
    pub fn new(
        group: Arc<ProcessGroup>,
        params: Vec<(String, Tensor)>,
        units: &[usize],
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
        let mut buckets_of = vec![Vec::new(); units.iter().max().map_or(0, |u| u + 1)];
        for (b, bucket) in layout.buckets.iter().enumerate() {
            let unit = bucket.members.first().map_or(0, |m| units[m.param]);
            if bucket.members.iter().any(|m| units[m.param] != unit) {
                return Err(Error::Shim(format!("fsdp: bucket {b} spans two units")));
            }
            buckets_of[unit].push(b);
        }
        let mut me = ShardedParams {
            group,
            layout,
            params,
            shapes,
            shards,
            gathered: (0..n).map(|_| None).collect(),
            buckets_of,
        };
        {
            let _guard = tch::no_grad_guard();
            for (u, bucket) in me.layout.buckets.iter().enumerate() {
                for seg in bucket.segments() {
                    let piece = me.params[seg.param].1.f_view([-1])?.f_narrow(0, seg.elements.start, seg.len())?;
                    me.shards[u].f_narrow(0, seg.shard_offset, seg.len())?.f_copy_(&piece)?;
                }
            }
        }
        for b in 0..n {
            me.empty(b)?;
        }
        Ok(me)
    }

    pub fn units(&self) -> usize {
        self.buckets_of.len()
    }

    /// Starts all-gathering unit `u` unless it is gathered or on its way.
    pub fn prefetch(&mut self, u: usize) -> Result<(), Error> {
        self.buckets_of[u].clone().into_iter().try_for_each(|b| self.prefetch_bucket(b))
    }

    /// Makes unit `u`'s parameters whole, waiting for its gathers.
    pub fn gather(&mut self, u: usize) -> Result<(), Error> {
        self.prefetch(u)?;
        self.buckets_of[u].clone().into_iter().try_for_each(|b| self.gather_bucket(b))
    }

    /// Frees unit `u`'s whole parameters.
    pub fn release(&mut self, u: usize) -> Result<(), Error> {
        self.buckets_of[u].clone().into_iter().try_for_each(|b| self.release_bucket(b))
    }

    fn empty(&mut self, u: usize) -> Result<(), Error> {
        for m in &self.layout.buckets[u].members {
            let p = &mut self.params[m.param].1;
            let nothing = Tensor::f_empty([0], (p.kind(), p.device()))?;
            p.f_set_data(&nothing)?;
        }
        Ok(())
    }

    fn prefetch_bucket(&mut self, u: usize) -> Result<(), Error> {
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

    fn gather_bucket(&mut self, u: usize) -> Result<(), Error> {
        self.prefetch_bucket(u)?;
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

    /// A gather on its way is waited for first.
    fn release_bucket(&mut self, u: usize) -> Result<(), Error> {
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
        for b in 0..self.layout.buckets.len() {
            let was = matches!(self.gathered[b], Some(Gathered::Ready(_)));
            self.gather_bucket(b)?;
            for m in &self.layout.buckets[b].members {
                let (name, p) = &self.params[m.param];
                out.push((name.clone(), p.f_detach_copy()?));
            }
            if !was {
                self.release_bucket(b)?;
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Gathers every unit (evaluation, sampling); [`Self::release_all`] undoes it.
    pub fn gather_all(&mut self) -> Result<(), Error> {
        let n = self.layout.buckets.len();
        (0..n).try_for_each(|b| self.prefetch_bucket(b))?;
        (0..n).try_for_each(|b| self.gather_bucket(b))
    }

    pub fn release_all(&mut self) -> Result<(), Error> {
        (0..self.layout.buckets.len()).try_for_each(|b| self.release_bucket(b))
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::dist::loopback::{gloo, on_ranks};
    use crate::dist::reducer::{BucketItem, assign_buckets};
    use crate::dist::shard::cache_line_alignment;

    /// Three units (as the head, one block, the embedding would be), five parameters.
    fn model() -> (Vec<(String, Tensor)>, Vec<usize>) {
        let shapes: [(&str, &[i64], usize); 5] =
            [("emb", &[7, 3], 2), ("b.w", &[5, 3], 1), ("b.v", &[4], 1), ("norm", &[3], 0), ("head", &[3, 7], 0)];
        let params = shapes
            .iter()
            .enumerate()
            .map(|(i, (name, shape, _))| {
                let n: i64 = shape.iter().product();
                (name.to_string(), (Tensor::arange(n, (Kind::Float, Device::Cpu)) + 10.0 * i as f64).reshape(*shape))
            })
            .collect();
        (params, shapes.iter().map(|s| s.2).collect())
    }

    #[test]
    fn a_unit_is_whole_only_between_its_gather_and_its_release() {
        for world in [1u32, 2, 3] {
            on_ranks(world, |rank, port| {
                let group = Arc::new(gloo(rank, world, port)?);
                let (params, units) = model();
                let want: Vec<Tensor> = params.iter().map(|(_, p)| p.copy()).collect();
                let items: Vec<BucketItem> =
                    params.iter().zip(&units).map(|((_, p), &u)| BucketItem::of(p, u)).collect();
                let bucket_of = assign_buckets(&items, 32);
                let numels: Vec<i64> = params.iter().map(|(_, p)| p.numel() as i64).collect();
                let layout = ShardLayout::new(&numels, &bucket_of, world, rank, cache_line_alignment([Kind::Float]));
                let shards =
                    layout.buckets.iter().map(|b| Tensor::zeros([b.shard_len()], (Kind::Float, Device::Cpu))).collect();
                let handles: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
                let mut sharded = ShardedParams::new(group, params, &units, layout, shards)?;
                assert_eq!(sharded.units(), 3);
                assert!(handles.iter().all(|p| p.numel() == 0), "every parameter is freed");
                sharded.prefetch(1)?;
                sharded.gather(1)?;
                for (i, p) in handles.iter().enumerate() {
                    let whole = units[i] == 1;
                    assert_eq!(p.numel() > 0, whole, "parameter {i}, world {world}");
                    if whole {
                        assert!(p.equal(&want[i]), "parameter {i} gathered, world {world}");
                    }
                }
                sharded.release(1)?;
                assert!(handles.iter().all(|p| p.numel() == 0));
                let full = sharded.full_parameters()?;
                let names: Vec<&str> = full.iter().map(|(n, _)| n.as_str()).collect();
                assert_eq!(names, ["b.v", "b.w", "emb", "head", "norm"]);
                for (name, t) in &full {
                    let i = ["emb", "b.w", "b.v", "norm", "head"].iter().position(|n| n == name).unwrap();
                    assert!(t.equal(&want[i]), "{name}, world {world}");
                }
                assert!(handles.iter().all(|p| p.numel() == 0), "full_parameters copies");
                Ok::<_, Error>(())
            })
            .unwrap();
        }
    }
}
