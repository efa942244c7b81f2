//! How one process takes part in a run, and where it writes.

use std::path::PathBuf;

use tch::Device;

use crate::dist::Placement;

/// How one process takes part in the run, and where it writes.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Checkpoints and `metrics.jsonl`.
    pub output_dir: PathBuf,
    /// Stop (with a checkpoint) after this many optimizer steps in total, before the budget.
    pub stop_after_steps: Option<u64>,
    /// Progress bar or log lines; `None` decides by whether stdout is a terminal.
    pub tty: Option<bool>,
    /// Print a sample generation at the end.
    pub sample: bool,
    /// Where `initFrom.trainingRun` runs are found (`/init` in a pod; their output
    /// directory locally).
    pub init_dir: PathBuf,
    /// This process's rank in the gang; a world size above 1 joins a c10d group.
    pub placement: Placement,
    /// Read losses and gradient norms back from the device once every this many
    /// steps (and at every checkpoint, evaluation and the last step); `None`:
    /// [`DEFAULT_CUDA_SYNC_EVERY`] on CUDA, 1 on CPU, always 1 for GRPO.
    pub sync_every: Option<u64>,
}

/// On CUDA, steps queued between host syncs by default: the device never waits for
/// the host between them, and status and the log lag by at most this many steps.
pub const DEFAULT_CUDA_SYNC_EVERY: u64 = 8;

impl RunOptions {
    /// Steps queued between host syncs on `device`.
    pub(super) fn sync_every(&self, grpo: bool, device: Device) -> u64 {
        match (grpo, self.sync_every) {
            // A GRPO step reads its rewards on the host anyway.
            (true, _) => 1,
            (false, Some(n)) => n.max(1),
            (false, None) if device.is_cuda() => DEFAULT_CUDA_SYNC_EVERY,
            (false, None) => 1,
        }
    }
}
