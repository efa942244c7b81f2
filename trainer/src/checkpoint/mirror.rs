//! The S3 mirror of checkpoints (`spec.checkpoint.s3`): rank 0 hands each finished
//! checkpoint directory to a background thread that uploads it, `state.json` last, so
//! training never waits on the network and a reader never sees a half-mirrored step.
//! A run whose checkpoint directory holds no valid checkpoint resumes from the newest
//! complete one in S3. After each checkpoint the run's logs follow it, `metrics.jsonl`
//! and TensorBoard's `tensorboard/` under the same prefix, so `tensorboard --logdir
//! s3://<bucket>/<prefix>/tensorboard` watches a run without its volume.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;

use crds::config::ResolvedS3;

use crate::storage::{self, S3, S3Options};
use crate::{Error, io_err};

/// A checkpoint step is complete in S3 once this file is there.
const COMPLETE_MARKER: &str = "state.json";

fn client(cfg: &ResolvedS3) -> Result<Arc<S3>, Error> {
    storage::client(&S3Options::for_mirror(cfg))
}

/// Uploads checkpoints in the background, in order.
pub struct Mirror {
    tx: Option<Sender<PathBuf>>,
    thread: Option<JoinHandle<Result<Option<String>, Error>>>,
}

impl Mirror {
    pub fn start(cfg: &ResolvedS3) -> Result<Mirror, Error> {
        let s3 = client(cfg)?;
        let (bucket, prefix) = (cfg.bucket.clone(), cfg.prefix.clone());
        let (tx, rx) = channel::<PathBuf>();
        let thread = std::thread::Builder::new()
            .name("checkpoint-mirror".into())
            .spawn(move || {
                let mut last: Result<Option<String>, Error> = Ok(None);
                for dir in rx {
                    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                    let target = storage::join(&prefix, &name);
                    let started = std::time::Instant::now();
                    last = s3.put_dir(&dir, &bucket, &target, COMPLETE_MARKER).map(|n| {
                        let uri = storage::uri(&bucket, &target);
                        tracing::info!(
                            files = n,
                            seconds = started.elapsed().as_secs_f64(),
                            "checkpoint mirrored to {uri}"
                        );
                        Some(uri)
                    });
                    if let Err(e) = &last {
                        tracing::error!("mirroring {} failed: {e}", dir.display());
                    } else if let Some(run_dir) = dir.parent()
                        && let Err(e) = put_logs(&s3, run_dir, &bucket, &prefix)
                    {
                        // The logs are a convenience: the checkpoint is mirrored.
                        tracing::warn!("mirroring the logs of {} failed: {e}", run_dir.display());
                    }
                }
                last
            })
            .map_err(io_err(Path::new("checkpoint mirror thread")))?;
        Ok(Mirror { tx: Some(tx), thread: Some(thread) })
    }

    /// Queues a finished checkpoint directory; returns at once.
    pub fn push(&self, dir: &Path) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(dir.to_path_buf());
        }
    }

    /// Waits for every queued upload; the last one's S3 URI, or its error.
    pub fn finish(mut self) -> Result<Option<String>, Error> {
        self.join()
    }

    fn join(&mut self) -> Result<Option<String>, Error> {
        drop(self.tx.take());
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| Error::Checkpoint {
                path: "checkpoint mirror".into(),
                message: "the upload thread panicked".into(),
            })?,
            None => Ok(None),
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        if let Err(e) = self.join() {
            tracing::error!("checkpoint mirror: {e}");
        }
    }
}

/// Uploads `metrics.jsonl` and the TensorBoard event files of `run_dir` under
/// `prefix`, each file whole (they are small, and an event file rewritten by a resume
/// replaces the old one).
fn put_logs(s3: &S3, run_dir: &Path, bucket: &str, prefix: &str) -> Result<(), Error> {
    let log = run_dir.join(super::METRICS_LOG_FILE);
    if log.is_file() {
        s3.put_file(bucket, &storage::join(prefix, super::METRICS_LOG_FILE), &log)?;
    }
    let tb = run_dir.join(super::TENSORBOARD_DIR);
    if tb.is_dir() {
        s3.put_dir(&tb, bucket, &storage::join(prefix, super::TENSORBOARD_DIR), "")?;
    }
    Ok(())
}

/// Downloads the newest complete checkpoint under the mirror's prefix into `dir`
/// (as `dir/step-NNNNNNNN`, atomically); its step, or `None` when S3 holds none.
pub fn restore(cfg: &ResolvedS3, dir: &Path) -> Result<Option<u64>, Error> {
    let s3 = client(cfg)?;
    let prefix = if cfg.prefix.is_empty() { String::new() } else { format!("{}/", cfg.prefix) };
    let objects = s3.list(&cfg.bucket, &prefix)?;
    let newest = objects
        .iter()
        .filter_map(|(key, _)| {
            let rest = key.strip_prefix(&prefix)?;
            let (step_dir, file) = rest.split_once('/')?;
            let step = step_dir.strip_prefix(crate::checkpoint::STEP_PREFIX)?.parse::<u64>().ok()?;
            (file == COMPLETE_MARKER).then_some((step, step_dir.to_string()))
        })
        .max();
    let Some((step, step_dir)) = newest else { return Ok(None) };
    let tmp = dir.join(format!(".{step_dir}.s3-{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    let from = format!("{prefix}{step_dir}/");
    for (key, size) in objects.iter().filter(|(k, _)| k.starts_with(&from)) {
        let name = &key[from.len()..];
        if name.contains('/') {
            continue;
        }
        // A listing's names become local paths: only plain file names, each no larger
        // than the listing says.
        let name = crate::files::plain_name(name).map_err(|message| Error::Checkpoint {
            path: storage::uri(&cfg.bucket, key).into(),
            message: format!("the bucket lists a file this trainer will not write: {message}"),
        })?;
        s3.get_file(&cfg.bucket, key, &tmp.join(name), *size)?;
    }
    let target = dir.join(&step_dir);
    let _ = std::fs::remove_dir_all(&target);
    std::fs::rename(&tmp, &target).map_err(io_err(&target))?;
    tracing::info!("restored {} from {}", target.display(), storage::uri(&cfg.bucket, &from));
    Ok(Some(step))
}
