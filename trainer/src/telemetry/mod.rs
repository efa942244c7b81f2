//! What a run tells people and machines: the sinks of the training loop's events
//! ([`crate::train::report`]): the status endpoint ([`server`]), `metrics.jsonl`
//! ([`metrics_log`]), TensorBoard's event files ([`tensorboard`]) and the progress
//! display ([`progress`]); and the termination
//! message ([`termination`]).

pub mod metrics_log;
pub mod progress;
pub mod server;
pub mod tensorboard;
pub mod termination;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::Error;
use crate::train::report::Sinks;
use crate::train::{Outcome, Trainer};
use metrics_log::MetricsLog;
use progress::Progress;
use server::SharedStatus;
use tensorboard::TensorBoard;

/// Runs `trainer` to its end with the standard sinks: `status` on every rank and, on
/// rank 0, `metrics.jsonl` and TensorBoard's event files in the output directory and
/// the progress display.
pub fn run(trainer: Trainer, status: &SharedStatus, stop: Arc<AtomicBool>) -> Result<Outcome, Error> {
    let mut sinks = Sinks::new();
    sinks.push(status.clone());
    if trainer.options().placement.rank == 0 {
        let (cfg, opts) = (trainer.config(), trainer.options());
        let (step, tokens) = (trainer.step(), trainer.tokens());
        sinks.push(MetricsLog::open(&opts.output_dir, step, tokens, Some(&cfg.name), cfg.attempt)?);
        sinks.push(TensorBoard::open(&opts.output_dir, step)?);
        sinks.push(Progress::new(cfg.schedule.total_steps, cfg.schedule.total_tokens, step, opts.tty));
    }
    trainer.run(stop, &mut sinks)
}
