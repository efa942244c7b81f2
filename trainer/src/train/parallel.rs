//! The gang, with more than one rank: the c10d group, the gradient reducer (DDP's
//! buckets, or ZeRO-2's and fsdp's reduce-scatter) and fsdp's sharded parameters.

use std::sync::Arc;

use crate::Error;
use crate::dist::fsdp::ShardedParams;
use crate::dist::{GradReducer, ProcessGroup};

pub(super) struct Parallel {
    pub(super) group: Arc<ProcessGroup>,
    pub(super) reducer: GradReducer,
    /// `parallelism: fsdp`: the parameters, sharded and gathered a unit at a time.
    pub(super) fsdp: Option<ShardedParams>,
}

impl Parallel {
    pub(super) fn barrier(&self) -> Result<(), Error> {
        self.group.barrier()
    }

    /// Gathers every fsdp parameter whole (every rank calls this).
    pub(super) fn gather_all(&mut self) -> Result<(), Error> {
        self.fsdp.as_mut().map_or(Ok(()), ShardedParams::gather_all)
    }

    pub(super) fn release_all(&mut self) -> Result<(), Error> {
        self.fsdp.as_mut().map_or(Ok(()), ShardedParams::release_all)
    }
}
