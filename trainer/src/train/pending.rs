//! An optimizer step queued on the device, and the scalars read back when it syncs.

use std::time::Instant;

use bytemuck::{Pod, Zeroable};
use tch::Tensor;

use crate::Error;
use crate::grpo::stats::GrpoStats;

/// An optimizer step queued on the device whose results are not read yet.
pub(super) struct PendingStep {
    pub step: u64,
    pub tokens: u64,
    pub lr: f64,
    /// [`StepScalars`] in f32, on the device.
    pub values: Tensor,
    pub grpo: Option<GrpoStats>,
    pub tokens_by_source: Vec<(String, u64)>,
    /// The samples it trained on ([`super::Trainer::step_window`]).
    pub samples: std::ops::Range<u64>,
    /// Its marks before the collectives (several ranks).
    pub timing: Option<super::timing::StepTiming>,
    pub started: Instant,
}

/// A step's scalars as read back from the device, in field order.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub(super) struct StepScalars {
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// Ranks asking to stop (0 with one rank: it decides alone).
    pub stop_votes: f64,
}

impl StepScalars {
    /// The device tensor a [`StepScalars`] is read from.
    pub fn on_device(loss: &Tensor, grad_norm: &Tensor, stop_votes: &Tensor) -> Result<Tensor, Error> {
        Ok(Tensor::f_stack(&[loss, grad_norm, stop_votes], 0)?)
    }
}
