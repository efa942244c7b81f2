//! The checkpointer, one of the trainer's parts: rank 0 writes a checkpoint on a
//! background thread on schedule and in the foreground at the end, copies each to S3
//! and reports it; every rank takes part in gathering one, each part of the trainer
//! writing its own piece ([`super::state::Stateful`]).

use std::path::Path;

use crds::config::RunConfig;
use crds::contract::TrainerPhase;
use crds::types::CheckpointRef;

use super::faults::Faults;
use super::report::{Event, Sinks};
use super::trainer::Trainer;
use crate::Error;
use crate::checkpoint::mirror::Mirror;
use crate::checkpoint::writer::Checkpointer;
use crate::checkpoint::{self, Payload};
use crate::optim::Optimizer;

/// What the loop writes checkpoints with, and the newest it wrote.
pub(super) struct Checkpoints {
    writer: Checkpointer,
    /// Rank 0's copy of each checkpoint to S3.
    mirror: Option<Mirror>,
    keep_best: bool,
    /// The newest checkpoint written.
    pub(super) last: Option<CheckpointRef>,
}

impl Checkpoints {
    /// Rank 0 checks that the directory can hold the run's checkpoints of about
    /// `estimate` bytes (a run that cannot keep them fails now, not after an interval
    /// of training) and starts the S3 mirror.
    /// `faults` may kill the process during a write.
    pub(super) fn start(
        cfg: &RunConfig,
        dir: &Path,
        rank0: bool,
        estimate: u64,
        faults: &Faults,
    ) -> Result<Checkpoints, Error> {
        let keep = &cfg.checkpoint;
        let mut writer = Checkpointer::new(dir, keep.keep_last)?.keeping_best(keep.keep_best);
        if let Some(hook) = faults.checkpoint_hook() {
            writer = writer.after_each_file(hook);
        }
        if rank0 {
            checkpoint::space::preflight(dir, keep.keep_last, keep.keep_best, estimate)?;
        }
        let mirror = match &keep.s3 {
            Some(s3) if rank0 => Some(Mirror::start(s3)?),
            _ => None,
        };
        Ok(Checkpoints { writer, mirror, keep_best: keep.keep_best > 0, last: None })
    }

    /// Reports a checkpoint written (and the best one, when the run keeps the best)
    /// and queues its copy to S3.
    fn written(&mut self, done: CheckpointRef, sinks: &mut Sinks) -> Result<(), Error> {
        if let Some(m) = &self.mirror {
            m.push(Path::new(&done.uri));
        }
        sinks.emit(Event::Checkpoint(&done))?;
        self.last = Some(done);
        if !self.keep_best {
            return Ok(());
        }
        match checkpoint::best(self.writer.dir()) {
            Some(best) => sinks.emit(Event::Best(&best)),
            None => Ok(()),
        }
    }

    /// Waits until the last checkpoint is in S3: the run must not report success before.
    pub(super) fn finish(&mut self) -> Result<(), Error> {
        match self.mirror.take() {
            Some(m) => m.finish().map(drop),
            None => Ok(()),
        }
    }
}

impl Trainer {
    /// A scheduled checkpoint: rank 0 writes it on a background thread while training
    /// goes on; every rank takes part in gathering it.
    pub(super) fn checkpoint_in_background(
        &mut self,
        checkpoints: &mut Checkpoints,
        payload: Payload,
        sinks: &mut Sinks,
    ) -> Result<(), Error> {
        let step = self.progress.step;
        let saved = match self.faults.before_checkpoint(step, self.checkpoint_dir()) {
            Err(e) => Err(checkpoint::space::explain(e, self.checkpoint_dir(), self.checkpoint_estimate())),
            Ok(()) if self.rank0() => checkpoints.writer.save_async(payload).map(|(previous, snapshot)| {
                self.snapshot = Some(snapshot);
                previous
            }),
            Ok(()) => Ok(None),
        };
        if let Some(done) = saved.map_err(|e| self.failed(sinks, e.at_step(step)))? {
            checkpoints.written(done, sinks)?;
        }
        self.barrier()
    }

    /// Reports a background checkpoint once its write has finished, not when the next
    /// one starts: the status shows what is on disk within a sync of its writing.
    pub(super) fn report_finished_checkpoint(
        &mut self,
        checkpoints: &mut Checkpoints,
        sinks: &mut Sinks,
    ) -> Result<(), Error> {
        if !self.rank0() {
            return Ok(());
        }
        let step = self.progress.step;
        match checkpoints.writer.finished().map_err(|e| self.failed(sinks, e.at_step(step)))? {
            Some(done) => checkpoints.written(done, sinks),
            None => Ok(()),
        }
    }

    /// Waits for a background checkpoint and writes the last step's (`last`), unless
    /// it is already written. A sharded optimizer's state (and fsdp's parameters) were
    /// gathered by every rank, whether rank 0 then writes them or already has; nobody
    /// leaves before rank 0's last checkpoint is on disk.
    pub(super) fn last_checkpoint(
        &mut self,
        checkpoints: &mut Checkpoints,
        last: Option<Payload>,
        sinks: &mut Sinks,
    ) -> Result<(), Error> {
        let step = self.progress.step;
        if self.rank0() {
            if let Some(done) = checkpoints.writer.wait().map_err(|e| self.failed(sinks, e.at_step(step)))? {
                checkpoints.written(done, sinks)?;
            }
            if let Some(payload) = last
                && checkpoints.last.as_ref().map(|c| c.step) != Some(step)
            {
                sinks.emit(Event::Phase(TrainerPhase::Checkpointing))?;
                let done = checkpoints.writer.save(payload).map_err(|e| self.failed(sinks, e.at_step(step)))?;
                checkpoints.written(done, sinks)?;
            }
        }
        self.barrier()
    }

    /// About how many bytes one checkpoint takes: the weights in their kind and the
    /// whole (consolidated) optimizer state.
    pub(super) fn checkpoint_estimate(&self) -> u64 {
        let weight_bytes = self.vs.trainable_variables().first().map_or(4, |t| t.kind().elt_size_in_bytes()) as u64;
        let optimizer = match &self.opt {
            Optimizer::Sharded(o) => o.state_bytes() * self.cfg.topology.world_size as usize,
            Optimizer::Replicated(o) => o.state_bytes(),
        };
        self.cfg.params.total * weight_bytes + optimizer as u64
    }
}
