//! Which samples a rank trains on ([`BatchPlan`], pure) and a background thread that
//! assembles them ahead of the training loop ([`Loader`]), into pinned memory when the
//! model is on CUDA so the host-to-device copy can run asynchronously.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crds::rollback::skip_past;
use crds::types::Rollback;
use tch::{Device, Tensor};

use super::mix::Mix;
use crate::Error;

/// The global batch layout: every optimizer step consumes `global_sequences` samples
/// starting at the data position; micro-step `m` of rank `r` reads the `micro_batch`
/// samples starting at `position + (m·world + r)·micro_batch`, so the ranks' slices of
/// every global batch are disjoint and together complete. A step never starts inside
/// the samples a rollback skips ([`crds::rollback::skip_past`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    pub micro_batch: u64,
    pub grad_accum: u32,
    pub world_size: u32,
    pub rank: u32,
}

impl BatchPlan {
    /// Samples per optimizer step, all ranks.
    pub fn global_sequences(&self) -> u64 {
        self.micro_batch * self.grad_accum as u64 * self.world_size as u64
    }

    /// First global sample of micro-step `m` at data position `position`.
    pub fn first_sample(&self, position: u64, m: u32) -> u64 {
        position + (m as u64 * self.world_size as u64 + self.rank as u64) * self.micro_batch
    }
}

/// Inputs and targets of one micro-step, `(B, T)` int64 on the CPU (pinned for CUDA).
#[derive(Debug)]
pub struct MicroBatch {
    pub first_sample: u64,
    pub inputs: Tensor,
    pub targets: Tensor,
}

/// Prefetches this rank's micro-batches from a data position on.
pub struct Loader {
    rx: Option<Receiver<Result<MicroBatch, Error>>>,
    thread: Option<JoinHandle<()>>,
    plan: BatchPlan,
    rollbacks: Arc<[Rollback]>,
    /// The next micro-batch the trainer will ask for: (position, m).
    next: (u64, u32),
}

impl Loader {
    /// Starts the thread at the first step at or after `position` (past the samples
    /// `rollbacks` skip), keeping up to `depth` micro-batches ready.
    pub fn start(
        mix: Arc<Mix>,
        plan: BatchPlan,
        rollbacks: &[Rollback],
        position: u64,
        device: Device,
        depth: usize,
    ) -> Result<Loader, Error> {
        let (tx, rx) = sync_channel(depth.max(1));
        let rollbacks: Arc<[Rollback]> = rollbacks.into();
        let position = skip_past(&rollbacks, position);
        let skips = rollbacks.clone();
        let thread = std::thread::Builder::new()
            .name(format!("loader-rank{}", plan.rank))
            .spawn(move || fill(&mix, plan, &skips, position, device, &tx))
            .map_err(|e| Error::Io { path: "loader thread".into(), source: e })?;
        Ok(Loader { rx: Some(rx), thread: Some(thread), plan, rollbacks, next: (position, 0) })
    }

    /// The next micro-batch, in order: micro-step `m` of the step at `position`.
    pub fn next(&mut self, position: u64, m: u32) -> Result<MicroBatch, Error> {
        if (position, m) != self.next {
            return Err(Error::Data {
                name: "loader".into(),
                message: format!(
                    "asked for micro-step {m} at position {position}, but the next prefetched is {:?}",
                    self.next
                ),
            });
        }
        let batch = self
            .rx
            .as_ref()
            .expect("open until dropped")
            .recv()
            .map_err(|_| Error::Data { name: "loader".into(), message: "the loader thread stopped".into() })??;
        debug_assert_eq!(batch.first_sample, self.plan.first_sample(position, m));
        self.next = if m + 1 == self.plan.grad_accum {
            (skip_past(&self.rollbacks, position + self.plan.global_sequences()), 0)
        } else {
            (position, m + 1)
        };
        Ok(batch)
    }
}

fn fill(
    mix: &Mix,
    plan: BatchPlan,
    rollbacks: &[Rollback],
    mut position: u64,
    device: Device,
    tx: &SyncSender<Result<MicroBatch, Error>>,
) {
    loop {
        position = skip_past(rollbacks, position);
        for m in 0..plan.grad_accum {
            let first = plan.first_sample(position, m);
            let batch = (|| -> Result<MicroBatch, Error> {
                let (x, y, _) = mix.batch_tensors(first, plan.micro_batch as usize)?;
                let (x, y) =
                    if device.is_cuda() { (crate::ffi::pin_memory(&x)?, crate::ffi::pin_memory(&y)?) } else { (x, y) };
                Ok(MicroBatch { first_sample: first, inputs: x, targets: y })
            })();
            // A closed channel means the trainer is done with us.
            if tx.send(batch).is_err() {
                return;
            }
        }
        position += plan.global_sequences();
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        drop(self.rx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::mix::SourceTokens;

    #[test]
    fn ranks_take_disjoint_slices_that_complete_every_global_batch() {
        for (world, accum, micro) in [(1, 1, 4), (2, 3, 2), (3, 2, 5), (8, 4, 1)] {
            let position = 1000;
            let mut seen = Vec::new();
            for rank in 0..world {
                let plan = BatchPlan { micro_batch: micro, grad_accum: accum, world_size: world, rank };
                for m in 0..accum {
                    let first = plan.first_sample(position, m);
                    seen.extend(first..first + micro);
                }
            }
            seen.sort();
            let global = micro * accum as u64 * world as u64;
            assert_eq!(
                seen,
                (position..position + global).collect::<Vec<_>>(),
                "world {world} accum {accum} micro {micro}"
            );
        }
    }

    #[test]
    fn prefetched_batches_equal_direct_ones_across_steps() {
        let tokens: Vec<u32> = (0..20_000).collect();
        let mix = Arc::new(
            Mix::new(vec![SourceTokens { name: "a".into(), weight: 1.0, tokens: tokens.into() }], 16, 7).unwrap(),
        );
        let plan = BatchPlan { micro_batch: 3, grad_accum: 2, world_size: 2, rank: 1 };
        // A rollback skipped the third step's global batch: the loader passes over it.
        let skipped = Rollback {
            step: 3,
            attempt: 1,
            skip_from: 84,
            skip_to: 96,
            lr_factor: 0.5,
            lr_until_step: 5,
            from_step: Some(2),
        };
        let mut loader = Loader::start(mix.clone(), plan, &[skipped], 60, Device::Cpu, 3).unwrap();
        for position in [60, 72, 96, 108, 120] {
            for m in 0..2 {
                let b = loader.next(position, m).unwrap();
                let (x, y, _) = mix.batch_tensors(plan.first_sample(position, m), 3).unwrap();
                assert_eq!(b.first_sample, plan.first_sample(position, m));
                assert!(b.inputs.equal(&x) && b.targets.equal(&y));
            }
        }
        assert!(loader.next(0, 0).unwrap_err().to_string().contains("asked for micro-step 0 at position 0"));
    }
}
