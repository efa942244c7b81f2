//! The trainer of one process: the parts it is assembled from ([`super::build`]) and
//! the state of the run in progress. Stepping is in [`super::step`], the loop in
//! [`super::run`], evaluation in [`super::evaluate`], resuming in [`super::restore`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crds::config::RunConfig;
use crds::types::Attention;
use tch::nn::VarStore;
use tch::{Device, Tensor};

use super::faults::Faults;
use super::options::RunOptions;
use super::pending::PendingStep;
use super::phase::Phase;
use super::timing;
use crate::checkpoint::ConfigChange;
use crate::checkpoint::writer::Snapshot;
use crate::data::mix::Mix;
use crate::data::tokenizer::Tokenizer;
use crate::model::Model;
use crate::optim::Optimizer;
use crate::parallel::DataParallel;

pub struct Trainer {
    pub(super) cfg: RunConfig,
    pub(super) opts: RunOptions,
    pub(super) device: Device,
    pub(super) autocast: bool,
    /// `spec.attention`, `auto` resolved on CUDA ([`crate::kernels::tune::choose_kernels`]).
    pub(super) attention: Attention,
    pub(super) vs: VarStore,
    pub(super) model: Model,
    pub(super) opt: Optimizer,
    pub(super) phase: Phase,
    /// One validation mix per source.
    pub(super) val: Vec<Mix>,
    pub(super) tokenizer: Tokenizer,
    /// How the gang shares each step: one rank alone, DDP or ZeRO, or fsdp.
    pub(super) parallel: Box<dyn DataParallel>,
    pub(super) progress: Progress,
    pub(super) data: DataCursor,
    pub(super) stop: Stop,
    /// Test-only fault injection.
    pub(super) faults: Faults,
    /// Steps queued since the last sync, oldest first.
    pub(super) pending: Vec<PendingStep>,
    pub(super) sync_every: u64,
    /// A background checkpoint's copy of the parameters and optimizer state, which the
    /// next optimizer step waits for before it changes them.
    pub(super) snapshot: Option<Snapshot>,
    pub(super) clock: StepClock,
}

/// How far the run is: what a checkpoint records of it and a resume restores.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) step: u64,
    pub(super) tokens: u64,
    pub(super) resumed_from: Option<u64>,
    /// Changes accepted on resume, carried into every checkpoint.
    pub(super) history: Vec<ConfigChange>,
}

/// Where the run is in its sample order (pretraining's sequences, or GRPO's
/// prompts): the data's piece of a checkpoint. The order itself is a pure function
/// of the seed, so the position is all the data state there is.
#[derive(Default)]
pub(super) struct DataCursor {
    /// Where the next step's samples start (before any a rollback skips).
    pub(super) position: u64,
    /// The samples of the step in progress (GRPO: of its generated batch).
    pub(super) window: Option<std::ops::Range<u64>>,
    /// The position of the newest checkpoint, for a rollback.
    pub(super) checkpoint_position: u64,
}

/// Whether to stop, and whether every rank agreed to.
#[derive(Default)]
pub(super) struct Stop {
    /// Raised by SIGTERM in this process.
    pub(super) signal: Arc<AtomicBool>,
    /// Whether any rank asked to stop, as of the last step read back (agreed with the loss).
    pub(super) agreed: bool,
    /// The number of ranks asking to stop at the last step (several ranks), on the device.
    pub(super) flags: Option<Tensor>,
}

/// Where each step's time went.
#[derive(Default)]
pub(super) struct StepClock {
    /// Seconds the step in progress has waited for the data loader.
    pub(super) data_wait: f64,
    /// The step in progress's marks before the collectives, until it is queued.
    pub(super) step_timing: Option<timing::StepTiming>,
    /// This rank's step times since the last sync (several ranks).
    pub(super) rank_totals: timing::RankTotals,
    /// Every rank's step times, gathered at the last sync, until they are reported.
    pub(super) rank_timings: Option<Vec<crds::contract::RankTiming>>,
}

impl Trainer {
    /// The resolved run this trainer executes.
    pub fn config(&self) -> &RunConfig {
        &self.cfg
    }

    pub fn options(&self) -> &RunOptions {
        &self.opts
    }

    /// Optimizer steps done (the checkpoint's step after a resume).
    pub fn step(&self) -> u64 {
        self.progress.step
    }

    /// Tokens trained on, all ranks together.
    pub fn tokens(&self) -> u64 {
        self.progress.tokens
    }

    pub(super) fn rank0(&self) -> bool {
        self.opts.placement.rank == 0
    }

    pub(super) fn group(&self) -> Option<&crate::dist::ProcessGroup> {
        self.parallel.group().map(|g| g.as_ref())
    }

    /// Whether other ranks share the run.
    pub(super) fn in_gang(&self) -> bool {
        self.parallel.group().is_some()
    }

    pub(super) fn barrier(&self) -> Result<(), crate::Error> {
        self.parallel.barrier()
    }

    /// Where checkpoints and the metrics log go.
    pub(super) fn checkpoint_dir(&self) -> &std::path::Path {
        &self.opts.output_dir
    }
}
