//! AdamW over ATen's fused kernel, global-norm gradient clipping and the handling of
//! non-finite gradients ([`AdamW`], golden tests against PyTorch in `adamw/tests.rs`); its ZeRO-1 form,
//! with the state sharded over ranks, is [`zero::ShardedAdamW`].

use std::collections::HashMap;

use tch::Tensor;

mod adamw;
pub mod zero;

use crate::Error;
use crate::dist::GradReducer;
pub use crate::ffi::Lr;
pub use adamw::{AdamW, nonfinite};

/// The run's optimizer: replicated on every rank (`parallelism: ddp`, and any run of
/// one rank) or sharded over them (`zero1`, `zero2`).
pub enum Optimizer {
    Replicated(AdamW),
    Sharded(zero::ShardedAdamW),
}

impl Optimizer {
    /// Clips, then steps unless the loss or the norm is not finite; see
    /// [`AdamW::clip_and_step`]. `norm`: the gradient reducer's
    /// [`GradReducer::grad_norm`] (needed when the gradients are sharded).
    pub fn clip_and_step(
        &mut self,
        loss: &Tensor,
        max_norm: f64,
        lr: Lr,
        norm: Option<Tensor>,
    ) -> Result<(Tensor, Tensor), Error> {
        match self {
            Optimizer::Replicated(o) => o.clip_and_step(loss, max_norm, lr, norm),
            Optimizer::Sharded(o) => o.clip_and_step(loss, max_norm, lr, norm),
        }
    }

    pub fn zero_grad(&mut self) -> Result<(), Error> {
        match self {
            Optimizer::Replicated(o) => o.zero_grad(),
            Optimizer::Sharded(o) => o.zero_grad(),
        }
    }

    /// The whole state, named by parameter, for a checkpoint. Sharded, it is gathered
    /// from every rank: every rank must call it at the same point.
    pub fn checkpoint_state(&self) -> Result<Vec<(String, Tensor)>, Error> {
        match self {
            Optimizer::Replicated(o) => Ok(o.state_tensors()),
            Optimizer::Sharded(o) => o.gather_state(),
        }
    }

    /// The reducer the optimizer needs in place of the all-reducing one (ZeRO-2's).
    pub fn gradient_reducer(&self) -> Result<Option<GradReducer>, Error> {
        match self {
            Optimizer::Replicated(_) => Ok(None),
            Optimizer::Sharded(o) => o.gradient_reducer(),
        }
    }

    /// Stage three (fsdp): the layout and this rank's master shards of the parameters.
    pub fn fsdp_shards(&self) -> Option<(crate::dist::shard::ShardLayout, Vec<Tensor>)> {
        match self {
            Optimizer::Sharded(o) => o.master_shards().map(|s| (o.layout().clone(), s)),
            Optimizer::Replicated(_) => None,
        }
    }

    /// Bytes of optimizer state this rank holds.
    pub fn state_bytes(&self) -> usize {
        match self {
            Optimizer::Replicated(o) => o.state_bytes(),
            Optimizer::Sharded(o) => o.state_bytes(),
        }
    }

    /// Loads a checkpoint's state, written under any strategy and world size.
    pub fn load_state(&mut self, named: &HashMap<String, Tensor>) -> Result<(), Error> {
        match self {
            Optimizer::Replicated(o) => o.load_state(named),
            Optimizer::Sharded(o) => o.load_state(named),
        }
    }
}
