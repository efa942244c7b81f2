//! How the gang shares a step, behind the one trait the training loop calls
//! ([`DataParallel`]): one process alone ([`OneRank`]); whole parameters on every rank
//! ([`Replicated`]: DDP's all-reduced buckets, or the reduce-scatter of ZeRO-1/2,
//! whose optimizer shards the state); or parameters sharded over the ranks and
//! gathered a unit of the model at a time ([`FullyShard`]: fsdp).

use std::cell::RefCell;
use std::sync::Arc;

use tch::Tensor;

use crate::Error;
use crate::dist::fsdp::ShardedParams;
use crate::dist::{GradReducer, ProcessGroup};
use crate::ffi::StreamMark;
use crate::model::{Residency, Resident, Unit};

/// A parallelism strategy as the loop sees it. Every rank makes the same calls in the
/// same order, since most of them are collectives. The provided methods are those of
/// parameters that stay whole in the model's variables; fsdp overrides them.
pub trait DataParallel {
    /// The group, with more than one rank.
    fn group(&self) -> Option<&Arc<ProcessGroup>>;
    /// Before micro-step's backward passes; `last`: the accumulation's last.
    fn begin_micro_step(&self, last: bool) -> Result<(), Error>;
    /// After micro-step's backward passes: on the last, the gradients are averaged
    /// over the ranks (or this rank's shard of them is).
    fn end_micro_step(&self, last: bool) -> Result<(), Error>;
    /// The global norm of the averaged gradients, where the reducer measures it (a
    /// collective when gradients are sharded); `None` leaves it to the optimizer.
    fn grad_norm(&self) -> Result<Option<Tensor>, Error>;
    /// Where this rank's own work of the last step ended, before it waited for peers.
    fn take_compute_end(&self) -> Option<StreamMark>;

    /// Where the model's units find their parameters during a pass.
    fn residency(&self) -> &dyn Residency {
        &Resident
    }
    /// Every parameter whole, by name, when they are not whole in the model's
    /// variables (a collective); `None` when the variables are the parameters.
    fn gathered_parameters(&mut self) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        Ok(None)
    }
    /// Makes every parameter whole (evaluation, sampling) until [`Self::release_all`].
    fn gather_all(&mut self) -> Result<(), Error> {
        Ok(())
    }
    fn release_all(&mut self) -> Result<(), Error> {
        Ok(())
    }
    fn barrier(&self) -> Result<(), Error> {
        self.group().map_or(Ok(()), |g| g.barrier())
    }
}

/// One process: nothing to share.
pub struct OneRank;

impl DataParallel for OneRank {
    fn group(&self) -> Option<&Arc<ProcessGroup>> {
        None
    }
    fn begin_micro_step(&self, _: bool) -> Result<(), Error> {
        Ok(())
    }
    fn end_micro_step(&self, _: bool) -> Result<(), Error> {
        Ok(())
    }
    fn grad_norm(&self) -> Result<Option<Tensor>, Error> {
        Ok(None)
    }
    fn take_compute_end(&self) -> Option<StreamMark> {
        None
    }
}

/// Every rank holds the whole parameters; the reducer averages the gradients over
/// the ranks during backward (all-reduced whole, or reduce-scattered to shards).
pub struct Replicated {
    group: Arc<ProcessGroup>,
    reducer: GradReducer,
}

impl Replicated {
    pub fn new(group: Arc<ProcessGroup>, reducer: GradReducer) -> Replicated {
        Replicated { group, reducer }
    }
}

impl DataParallel for Replicated {
    fn group(&self) -> Option<&Arc<ProcessGroup>> {
        Some(&self.group)
    }
    fn begin_micro_step(&self, last: bool) -> Result<(), Error> {
        self.reducer.begin_micro_step(last)
    }
    fn end_micro_step(&self, last: bool) -> Result<(), Error> {
        self.reducer.end_micro_step(last)
    }
    fn grad_norm(&self) -> Result<Option<Tensor>, Error> {
        self.reducer.grad_norm().map(Some)
    }
    fn take_compute_end(&self) -> Option<StreamMark> {
        self.reducer.take_compute_end()
    }
}

/// fsdp: each rank keeps its shard of the parameters; a unit of the model is
/// all-gathered before it runs and freed after, and gradients are reduce-scattered.
pub struct FullyShard {
    replicated: Replicated,
    shards: RefCell<ShardedParams>,
    /// The model's blocks, to place a [`Unit`] among the shards' units.
    n_layer: usize,
}

impl FullyShard {
    pub fn new(group: Arc<ProcessGroup>, reducer: GradReducer, shards: ShardedParams, n_layer: usize) -> FullyShard {
        FullyShard { replicated: Replicated::new(group, reducer), shards: RefCell::new(shards), n_layer }
    }
}

impl Residency for FullyShard {
    fn gather(&self, unit: Unit) -> Result<(), Error> {
        self.shards.borrow_mut().gather(unit.backward_index(self.n_layer))
    }
    fn prefetch(&self, unit: Unit) -> Result<(), Error> {
        self.shards.borrow_mut().prefetch(unit.backward_index(self.n_layer))
    }
    fn release(&self, unit: Unit) -> Result<(), Error> {
        self.shards.borrow_mut().release(unit.backward_index(self.n_layer))
    }
}

impl DataParallel for FullyShard {
    fn group(&self) -> Option<&Arc<ProcessGroup>> {
        self.replicated.group()
    }
    fn begin_micro_step(&self, last: bool) -> Result<(), Error> {
        self.replicated.begin_micro_step(last)
    }
    fn end_micro_step(&self, last: bool) -> Result<(), Error> {
        self.replicated.end_micro_step(last)
    }
    fn grad_norm(&self) -> Result<Option<Tensor>, Error> {
        self.replicated.grad_norm()
    }
    fn take_compute_end(&self) -> Option<StreamMark> {
        self.replicated.take_compute_end()
    }
    fn residency(&self) -> &dyn Residency {
        self
    }
    fn gathered_parameters(&mut self) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        self.shards.get_mut().full_parameters().map(Some)
    }
    fn gather_all(&mut self) -> Result<(), Error> {
        self.shards.get_mut().gather_all()
    }
    fn release_all(&mut self) -> Result<(), Error> {
        self.shards.get_mut().release_all()
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;
    use crate::dist::loopback::{gloo, on_ranks};
    use crate::dist::reducer::{BucketItem, assign_buckets};
    use crate::dist::shard::{ShardLayout, cache_line_alignment};

    /// A one-block model's parameters in definition order, each with its unit.
    fn model() -> Vec<(String, Tensor, Unit)> {
        let shapes: [(&str, &[i64], Unit); 5] = [
            ("embed", &[7, 3], Unit::Embedding),
            ("block.w", &[5, 3], Unit::Block(0)),
            ("block.v", &[4], Unit::Block(0)),
            ("norm", &[3], Unit::Head),
            ("head", &[3, 7], Unit::Head),
        ];
        let values = |i: usize, shape: &[i64]| {
            let n: i64 = shape.iter().product();
            (Tensor::arange(n, (Kind::Float, Device::Cpu)) + 10.0 * i as f64).reshape(shape).set_requires_grad(true)
        };
        shapes.iter().enumerate().map(|(i, (name, shape, unit))| (name.to_string(), values(i, shape), *unit)).collect()
    }

    #[test]
    fn fsdp_gathers_the_unit_the_model_names_and_only_it() {
        let world = 2;
        on_ranks(world, |rank, port| {
            let group = Arc::new(gloo(rank, world, port)?);
            let params = model();
            let want: Vec<Tensor> = params.iter().map(|(_, p, _)| p.detach().copy()).collect();
            let handles: Vec<Tensor> = params.iter().map(|(_, p, _)| p.shallow_clone()).collect();
            let units: Vec<usize> = params.iter().map(|(_, _, u)| u.backward_index(1)).collect();
            let reducer = GradReducer::new(group.clone(), &handles, &units, 32)?;
            let items: Vec<BucketItem> = handles.iter().zip(&units).map(|(p, &u)| BucketItem::of(p, u)).collect();
            let numels: Vec<i64> = handles.iter().map(|p| p.numel() as i64).collect();
            let align = cache_line_alignment([Kind::Float]);
            let layout = ShardLayout::new(&numels, &assign_buckets(&items, 32), world, rank, align);
            let shards: Vec<Tensor> =
                layout.buckets.iter().map(|b| Tensor::zeros([b.shard_len()], (Kind::Float, Device::Cpu))).collect();
            let named = params.iter().map(|(n, p, _)| (n.clone(), p.shallow_clone())).collect();
            let shards = ShardedParams::new(group.clone(), named, &units, layout, shards)?;
            let mut fsdp = FullyShard::new(group.clone(), reducer, shards, 1);
            let whole = || -> Vec<bool> { handles.iter().map(|p| p.numel() > 0).collect() };
            assert_eq!(whole(), [false; 5], "every parameter starts sharded");
            for (unit, expected) in [
                (Unit::Embedding, [true, false, false, false, false]),
                (Unit::Block(0), [false, true, true, false, false]),
                (Unit::Head, [false, false, false, true, true]),
            ] {
                fsdp.residency().prefetch(unit)?;
                fsdp.residency().gather(unit)?;
                assert_eq!(whole(), expected, "{unit:?} gathered on rank {rank}");
                for (i, p) in handles.iter().enumerate().filter(|(i, _)| expected[*i]) {
                    assert!(p.detach().equal(&want[i]), "{unit:?}'s parameter {i} is rank 0's value");
                }
                fsdp.residency().release(unit)?;
                assert_eq!(whole(), [false; 5], "{unit:?} released");
            }
            fsdp.gather_all()?;
            assert_eq!(whole(), [true; 5]);
            fsdp.release_all()?;
            let gathered = fsdp.gathered_parameters()?.expect("fsdp's parameters are not the variables");
            assert_eq!(gathered.len(), 5);
            assert_eq!(whole(), [false; 5], "the whole copies leave the shards sharded");
            assert!(!fsdp.residency().resident() && fsdp.group().is_some());
            let mut one = OneRank;
            assert!(one.residency().resident() && one.group().is_none() && one.grad_norm()?.is_none());
            assert!(one.gathered_parameters()?.is_none(), "one rank's variables are its parameters");
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}
