//! What only one phase has: pretraining's data mix and loader, GRPO's questions,
//! reference policy and learning-signal streak.

use std::sync::Arc;

use crate::data::loader::Loader;
use crate::data::mix::Mix;
use crate::grpo::stats::GrpoStats;
use crate::grpo::step::Grpo;

pub(super) enum Phase {
    Pretrain(Pretrain),
    Grpo(Box<GrpoPhase>),
}

pub(super) struct Pretrain {
    pub(super) mix: Arc<Mix>,
    /// The prefetching loader, started at the first micro-batch.
    pub(super) loader: Option<Loader>,
    /// The epoch each training source is in (for the log line when one wraps).
    pub(super) source_epochs: Vec<u64>,
}

pub(super) struct GrpoPhase {
    /// The questions, the reference model and the generated batch.
    pub(super) grpo: Grpo,
    /// The last step's metrics, for its report.
    pub(super) last: Option<GrpoStats>,
    /// Steps in a row, up to the last, without learning signal.
    pub(super) no_signal_steps: u64,
}

impl Phase {
    pub(super) fn grpo(&self) -> Option<&Grpo> {
        match self {
            Phase::Grpo(g) => Some(&g.grpo),
            Phase::Pretrain(_) => None,
        }
    }

    pub(super) fn mix(&self) -> Option<&Arc<Mix>> {
        match self {
            Phase::Pretrain(p) => Some(&p.mix),
            Phase::Grpo(_) => None,
        }
    }

    /// The epoch of each source after it gave `counts` samples (pretraining).
    pub(super) fn epochs(&self, counts: &[u64]) -> Vec<u64> {
        let Some(mix) = self.mix() else { return Vec::new() };
        counts.iter().enumerate().map(|(s, &k)| if k == 0 { 0 } else { mix.epoch_of(s, k - 1) }).collect()
    }
}
