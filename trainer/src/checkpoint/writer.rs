//! The checkpoint writer: synchronous saves, and background saves that take their
//! copy of the state on the writer thread while training computes the next step.
//!
//! A background save blocks the training loop only where the next optimizer step would
//! change a tensor the writer has not copied yet ([`Snapshot::wait`]). Forward and
//! backward only read the parameters and the optimizer state, so the copy overlaps
//! them; `docs/perf.md` has the stall against `torch.save`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crds::config::ResolvedCheckpoint;
use crds::types::CheckpointRef;
use tch::{Device, Tensor};

use super::{FileHook, Payload, Result, Retention, space, write_checkpoint};
use crate::{Error, io_err};

/// Writes checkpoints into one directory, synchronously or on a background thread, and
/// keeps the newest `keep_last` of them and the `keep_best` of lowest validation loss.
///
/// At most one write is in flight: a save waits for the previous background write
/// first. Dropping the checkpointer waits for a pending write (logging its error, as
/// there is no caller left to return it to); call [`Checkpointer::wait`] to get it.
pub struct Checkpointer {
    dir: PathBuf,
    keep: Retention,
    pending: Option<JoinHandle<Result<CheckpointRef>>>,
    after_file: Option<FileHook>,
}

/// The copy a background save takes of its payload's tensors. Until [`Snapshot::wait`]
/// returns, the writer may still be reading them: nothing may change them before
/// (the next optimizer step waits for it).
#[must_use = "the payload's tensors may not change until the snapshot is taken"]
#[derive(Debug)]
pub struct Snapshot {
    taken: Option<mpsc::Receiver<()>>,
}

impl Snapshot {
    /// A snapshot with nothing left to copy.
    pub fn taken() -> Self {
        Snapshot { taken: None }
    }

    /// Blocks until the writer holds its own copy (or has given up on the write, whose
    /// error [`Checkpointer::wait`] returns); returns how long it blocked.
    pub fn wait(self) -> Duration {
        let started = Instant::now();
        if let Some(rx) = self.taken {
            // Err: the writer dropped its sender, copied or failed; either way it is done reading.
            let _ = rx.recv();
        }
        started.elapsed()
    }
}

impl Checkpointer {
    /// A checkpointer for `dir`, which is created if missing. `keep_last` below 1
    /// counts as 1: the checkpoint just written is never deleted.
    pub fn new(dir: impl Into<PathBuf>, keep_last: u32) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let keep = Retention { last: keep_last.max(1) as usize, best: 0 };
        Ok(Checkpointer { dir, keep, pending: None, after_file: None })
    }

    /// Also keeps the `keep_best` checkpoints of lowest validation loss, and points
    /// [`super::BEST_FILE`] at the lowest.
    pub fn keeping_best(mut self, keep_best: u32) -> Self {
        self.keep.best = keep_best as usize;
        self
    }

    /// Calls `hook` after each tensor file a write puts on disk ([`FileHook`]).
    pub fn after_each_file(mut self, hook: FileHook) -> Self {
        self.after_file = Some(hook);
        self
    }

    /// A checkpointer for the run's resolved checkpoint settings.
    pub fn from_config(config: &ResolvedCheckpoint) -> Result<Self> {
        Ok(Self::new(&config.dir, config.keep_last)?.keeping_best(config.keep_best))
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a checkpoint on the calling thread, after any pending background write.
    /// An error of that pending write is returned instead, and nothing is written.
    pub fn save(&mut self, payload: Payload) -> Result<CheckpointRef> {
        self.wait()?;
        let model = to_cpu(&self.dir, &payload.model, false)?;
        let optimizer = to_cpu(&self.dir, &payload.optimizer, false)?;
        let bytes = payload_bytes(&model, &optimizer);
        write_checkpoint(&self.dir, self.keep, model, optimizer, payload.state, self.after_file.as_ref())
            .map_err(|e| space::explain(e, &self.dir, bytes))
    }

    /// Writes the payload on a background thread, which first copies its tensors to
    /// the CPU. The caller goes on at once, reading the tensors as it likes, and calls
    /// [`Snapshot::wait`] before it changes any of them.
    ///
    /// Waits for the previous background write first and returns its outcome:
    /// `Ok(Some(..))` when it succeeded, `Ok(None)` when there was none. When it failed,
    /// its error is returned and this payload is not written.
    pub fn save_async(&mut self, payload: Payload) -> Result<(Option<CheckpointRef>, Snapshot)> {
        // Waiting first keeps at most one CPU copy of the state in memory.
        let previous = self.wait()?;
        check_names(&self.dir, &payload.model)?;
        check_names(&self.dir, &payload.optimizer)?;
        let (dir, keep, after_file) = (self.dir.clone(), self.keep, self.after_file.clone());
        let (taken_tx, taken_rx) = mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || {
                let Payload { model, optimizer, state } = payload;
                let copies = to_cpu(&dir, &model, true).and_then(|m| Ok((m, to_cpu(&dir, &optimizer, true)?)));
                drop((model, optimizer));
                let _ = taken_tx.send(());
                let (model, optimizer) = copies?;
                let bytes = payload_bytes(&model, &optimizer);
                write_checkpoint(&dir, keep, model, optimizer, state, after_file.as_ref())
                    .map_err(|e| space::explain(e, &dir, bytes))
            })
            .map_err(io_err(&self.dir))?;
        self.pending = Some(handle);
        Ok((previous, Snapshot { taken: Some(taken_rx) }))
    }

    /// The pending background write's outcome once it has finished, without waiting
    /// for it; `Ok(None)` while it runs, or when none is pending.
    pub fn finished(&mut self) -> Result<Option<CheckpointRef>> {
        match &self.pending {
            Some(handle) if handle.is_finished() => self.wait(),
            _ => Ok(None),
        }
    }

    /// Waits for the pending background write and returns its outcome; `Ok(None)` when
    /// none is pending (its outcome was already returned).
    pub fn wait(&mut self) -> Result<Option<CheckpointRef>> {
        let Some(handle) = self.pending.take() else { return Ok(None) };
        match handle.join() {
            Ok(result) => result.map(Some),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Error::Checkpoint { path: self.dir.clone(), message: format!("writer thread panicked: {what}") })
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            tracing::error!(error = %e, "background checkpoint write failed");
        }
    }
}

/// Bytes of the tensors of a checkpoint.
fn payload_bytes(model: &[(String, Tensor)], optimizer: &[(String, Tensor)]) -> u64 {
    model.iter().chain(optimizer).map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as u64).sum()
}

/// Refuses a payload that names a tensor twice.
fn check_names(dir: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let mut seen = BTreeSet::new();
    match tensors.iter().find(|(name, _)| !seen.insert(name.as_str())) {
        Some((name, _)) => {
            Err(Error::Checkpoint { path: dir.into(), message: format!("tensor {name} is given twice") })
        }
        None => Ok(()),
    }
}

/// Owned, contiguous CPU tensors. With `always_copy` false, tensors already on the CPU
/// and contiguous are shared instead, which is only safe while the caller is blocked.
pub(super) fn to_cpu(dir: &Path, tensors: &[(String, Tensor)], always_copy: bool) -> Result<Vec<(String, Tensor)>> {
    check_names(dir, tensors)?;
    tch::no_grad(|| {
        tensors
            .iter()
            .map(|(name, t)| {
                if !always_copy && t.device() == Device::Cpu && t.is_contiguous() {
                    return Ok((name.clone(), t.shallow_clone()));
                }
                Ok((name.clone(), copy_to_cpu(t)?))
            })
            .collect()
    })
}

/// A fresh CPU tensor with `t`'s values (`to_device(Cpu)` of a CPU tensor would return
/// the same storage, which training then overwrites). A contiguous CPU tensor is copied
/// by one `memcpy` on this thread: libtorch's `copy_` would start a second OpenMP team
/// beside training's.
fn copy_to_cpu(t: &Tensor) -> Result<Tensor> {
    let mut copy = Tensor::f_empty(t.size(), (t.kind(), Device::Cpu))?;
    if t.device() == Device::Cpu && t.is_contiguous() {
        let bytes = t.numel() * t.kind().elt_size_in_bytes();
        // SAFETY: both are contiguous CPU tensors of the same shape and kind, so each
        // holds `bytes` bytes from its data pointer; `copy` is fresh, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(t.data_ptr() as *const u8, copy.data_ptr() as *mut u8, bytes) };
    } else {
        copy.f_copy_(t)?;
    }
    Ok(copy)
}
