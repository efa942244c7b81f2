//! What the training loop tells its sinks: one [`Event`] at a time, each handed to
//! every [`Sink`] through one call ([`Sinks::emit`]). The loop does not know which
//! sinks exist: the status endpoint, the metrics log and the progress display
//! ([`crate::telemetry`]) are chosen by whoever runs it.

use std::time::{SystemTime, UNIX_EPOCH};

use crds::config::RunConfig;
use crds::contract::{FailureReason, TrainerPhase};
use crds::types::CheckpointRef;

use crate::Error;
use crate::eval::McqScore;
use crate::grpo::stats::GrpoStats;

/// Seconds since the Unix epoch, as a float.
pub fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One completed optimizer step, as the training loop reports it to the status
/// endpoint, the metrics log and the progress display.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// Optimizer steps completed, counting this one.
    pub step: u64,
    /// Tokens trained on so far, all ranks together, counting this step.
    pub tokens: u64,
    /// Mean training loss of the step.
    pub loss: f64,
    /// Learning rate the step used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Throughput, all ranks together.
    pub tokens_per_second: f64,
    /// Model FLOPs utilization (0-1), where a peak is known for the device.
    pub mfu: Option<f64>,
    /// GRPO's reward, accuracy, KL, clipping and throughput split.
    pub grpo: Option<GrpoStats>,
    /// This rank's GPU memory (CUDA runs).
    pub gpu_memory: Option<GpuMemory>,
    /// Tokens each training source has given so far (pretraining; empty for GRPO).
    pub tokens_by_source: Vec<(String, u64)>,
}

/// A GPU's memory in bytes: the most libtorch's caching allocator has held in tensors
/// since the trainer started, and the device's total.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuMemory {
    pub peak_bytes: i64,
    pub total_bytes: i64,
}

impl GpuMemory {
    pub fn peak_gib(&self) -> f64 {
        self.peak_bytes as f64 / (1u64 << 30) as f64
    }

    pub fn total_gib(&self) -> f64 {
        self.total_bytes as f64 / (1u64 << 30) as f64
    }
}

impl StepReport {
    /// Whether the loss or the gradient norm is NaN or infinite.
    pub fn is_nonfinite(&self) -> bool {
        !self.loss.is_finite() || !self.grad_norm.is_finite()
    }
}

/// Where a run starts (or resumes), and what it trains on.
#[derive(Clone, Copy, Debug)]
pub struct RunStart<'a> {
    pub step: u64,
    pub tokens: u64,
    pub cfg: &'a RunConfig,
    /// The training data in a few words (its unigram entropy, or GRPO's question count).
    pub data: &'a str,
}

/// Something the training loop reports.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    Started(RunStart<'a>),
    Phase(TrainerPhase),
    Step(&'a StepReport),
    /// The mean validation loss weighted by the mix, and each source's.
    Eval {
        step: u64,
        tokens: u64,
        val_loss: f64,
        per_source: &'a [(String, f64)],
    },
    /// GRPO's accuracy on a question set: [`crate::train::HELD_OUT`] or one of
    /// `evalDatasets`; `initial` before any step of this run.
    Accuracy {
        step: u64,
        tokens: u64,
        set: &'a str,
        score: &'a McqScore,
        initial: bool,
    },
    /// A checkpoint is complete on disk.
    Checkpoint(&'a CheckpointRef),
    /// The kept checkpoint of lowest validation loss (`checkpoint.keepBest`), after
    /// each checkpoint and at the start of an attempt that has one.
    Best(&'a CheckpointRef),
    /// A generated answer to a validation question.
    Sample {
        step: u64,
        tokens: u64,
        prompt: &'a str,
        text: &'a str,
    },
    /// Every rank's time per step before the collectives, over the last sync interval.
    Ranks(&'a [crds::contract::RankTiming]),
    /// A step's loss or gradient norm was NaN or infinite (the step is not reported).
    NonFinite {
        step: u64,
    },
    /// The run fails with this reason.
    Failure(FailureReason),
}

/// A consumer of the loop's events.
pub trait Sink {
    fn record(&mut self, event: &Event) -> Result<(), Error>;

    /// The run ended (successfully, or stopped by a signal).
    fn finish(&mut self) {}
}

/// Every sink of a run, in the order they are told.
#[derive(Default)]
pub struct Sinks(Vec<Box<dyn Sink>>);

impl Sinks {
    pub fn new() -> Sinks {
        Sinks::default()
    }

    pub fn push(&mut self, sink: impl Sink + 'static) {
        self.0.push(Box::new(sink));
    }

    /// Tells every sink; the first error is returned after all were told.
    pub fn emit(&mut self, event: Event) -> Result<(), Error> {
        let mut first = Ok(());
        for sink in &mut self.0 {
            let result = sink.record(&event);
            if first.is_ok() {
                first = result;
            }
        }
        first
    }

    pub fn finish(&mut self) {
        for sink in &mut self.0 {
            sink.finish();
        }
    }
}
