//! TensorBoard event files beside the checkpoints, `<checkpoint dir>/tensorboard/`,
//! written by rank 0 as the run goes: the training loss, learning rate and gradient
//! norm, throughput and MFU, GPU memory, tokens per source, the validation loss and
//! perplexity of the mix and of each source, every GRPO statistic, held-out accuracy,
//! and the resolved config and generated samples as text. Steps are optimizer steps.
//!
//! A resumed attempt first cuts what earlier attempts logged past its checkpoint (as
//! `metrics.jsonl` does), so every reader shows one continuous curve without relying
//! on TensorBoard's own purging of orphaned steps. A fresh start (step 0) replaces
//! the logs of an attempt that never checkpointed.

pub mod record;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use record::{Event, Value};

use crate::train::report::{self, RunStart, StepReport, unix_now};
use crate::{Error, io_err};

/// Directory of the event files inside the checkpoint directory.
pub const DIR_NAME: &str = crate::checkpoint::TENSORBOARD_DIR;

/// Tag of the resolved config, written at each attempt's first step.
pub const CONFIG_TAG: &str = "config";

/// The event file an attempt appends to.
#[derive(Debug)]
pub struct TensorBoard {
    path: PathBuf,
    file: File,
    /// A write failed: the event files are a convenience, so the run goes on without
    /// them (a full disk still ends it, at the next checkpoint, with its explanation).
    broken: bool,
}

/// Whether TensorBoard reads `name` as an event file.
fn is_event_file(name: &str) -> bool {
    name.contains("tfevents")
}

impl TensorBoard {
    /// Opens a new event file in `<dir>/tensorboard/` for an attempt that starts at
    /// `start_step`, after cutting what earlier files hold past it.
    pub fn open(dir: &Path, start_step: u64) -> Result<TensorBoard, Error> {
        let dir = dir.join(DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let mut newest_secs = 0;
        for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
            let path = entry.map_err(io_err(&dir))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).filter(|n| is_event_file(n)) else {
                continue;
            };
            newest_secs = newest_secs.max(file_secs(name).unwrap_or(0));
            cut_after(&path, start_step)?;
        }
        // Readers take a directory's files in name order: the new one sorts last.
        let secs = (unix_now() as u64).max(newest_secs + 1);
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
        let path = dir.join(format!("events.out.tfevents.{secs:010}.{host}.{}.0", std::process::id()));
        let file = OpenOptions::new().create_new(true).append(true).open(&path).map_err(io_err(&path))?;
        let mut tb = TensorBoard { path, file, broken: false };
        tb.write(&Event {
            wall_time: unix_now(),
            step: 0,
            file_version: Some(record::FILE_VERSION.into()),
            summary: None,
        })?;
        Ok(tb)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, event: &Event) -> Result<(), Error> {
        if self.broken {
            return Ok(());
        }
        // One write per record, flushed, so a reader follows the run live and a crash
        // tears at most the last record.
        let written = self.file.write_all(&record::frame(event)).and_then(|()| self.file.flush());
        if let Err(e) = written {
            tracing::warn!(file = %self.path.display(), "TensorBoard event files stop here: {e}");
            self.broken = true;
        }
        Ok(())
    }

    fn scalars(&mut self, step: u64, values: Vec<Value>) -> Result<(), Error> {
        if values.is_empty() {
            return Ok(());
        }
        self.write(&Event::summary(unix_now(), step, values))
    }

    fn started(&mut self, start: &RunStart) -> Result<(), Error> {
        let json = serde_json::to_string_pretty(start.cfg).expect("configs serialize");
        // The text dashboard renders markdown: an indented code block keeps the layout.
        let markdown = format!("{}\n\n    {}", start.data, json.replace('\n', "\n    "));
        self.scalars(start.step, vec![Value::text(CONFIG_TAG, &markdown)])
    }
}

/// The scalars of a step: the tags a user finds under `train/`, `gpu/`, `data/` and
/// `grpo/`.
pub fn step_values(r: &StepReport) -> Vec<Value> {
    let mut values = vec![
        Value::scalar("train/loss", r.loss),
        Value::scalar("train/learning_rate", r.lr),
        Value::scalar("train/grad_norm", r.grad_norm),
        Value::scalar("train/tokens_per_second", r.tokens_per_second),
        Value::scalar("train/tokens", r.tokens as f64),
    ];
    if let Some(mfu) = r.mfu {
        values.push(Value::scalar("train/mfu", mfu));
    }
    if let Some(m) = r.gpu_memory {
        values.push(Value::scalar("gpu/peak_memory_gib", m.peak_gib()));
    }
    values
        .extend(r.tokens_by_source.iter().map(|(source, n)| Value::scalar(format!("data/tokens/{source}"), *n as f64)));
    if let Some(g) = &r.grpo {
        values.extend(numbers("grpo", &serde_json::to_value(g).expect("stats serialize")));
    }
    values
}

/// The scalars of a validation pass: `val/loss` and `val/perplexity` of the mix and
/// of each source.
pub fn eval_values(val_loss: f64, per_source: &[(String, f64)]) -> Vec<Value> {
    let mut values = vec![Value::scalar("val/loss", val_loss), Value::scalar("val/perplexity", val_loss.exp())];
    for (source, loss) in per_source {
        values.push(Value::scalar(format!("val/loss/{source}"), *loss));
        values.push(Value::scalar(format!("val/perplexity/{source}"), loss.exp()));
    }
    values
}

/// Every number of a serialized statistics struct as `<prefix>/<field>`, so a new
/// statistic is logged without a new line here.
fn numbers(prefix: &str, stats: &serde_json::Value) -> Vec<Value> {
    let Some(fields) = stats.as_object() else { return Vec::new() };
    fields.iter().filter_map(|(k, v)| Some(Value::scalar(format!("{prefix}/{k}"), v.as_f64()?))).collect()
}

/// Where a question set's accuracy goes: `heldout/…`, or `eval/<set>/…` for one of
/// `evalDatasets` (a URI's `://` as `/`).
fn accuracy_prefix(set: &str) -> String {
    if set == crate::train::HELD_OUT { "heldout".into() } else { format!("eval/{}", set.replace("://", "/")) }
}

/// `events.out.tfevents.<secs>.…` → secs.
fn file_secs(name: &str) -> Option<u64> {
    name.strip_prefix("events.out.tfevents.")?.split('.').next()?.parse().ok()
}

/// Rewrites `path` without the events an attempt starting at `start_step` writes
/// again: every summary past `start_step` (all of them on a fresh start) and the
/// config at `start_step`. A torn or damaged tail goes too. Atomic: a crash leaves
/// the old file or the new one.
fn cut_after(path: &Path, start_step: u64) -> Result<(), Error> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let (events, readable) = record::read(&bytes);
    let keep = |e: &Event| {
        let step = e.step.max(0) as u64;
        e.summary.is_none()
            || (start_step > 0 && step < start_step)
            || (start_step > 0 && step == start_step && !e.tags().any(|t| t == CONFIG_TAG))
    };
    let kept: Vec<&Event> = events.iter().filter(|e| keep(e)).collect();
    if kept.len() == events.len() && readable == bytes.len() {
        return Ok(());
    }
    if readable < bytes.len() {
        tracing::warn!(file = %path.display(), offset = readable, bytes = bytes.len() - readable, "dropping the unreadable tail of an event file");
    }
    // A name TensorBoard does not read, in the same directory, for the rename.
    let tmp = path.with_file_name(".rewrite.tmp");
    let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
    let out: Vec<u8> = kept.into_iter().flat_map(record::frame).collect();
    file.write_all(&out).map_err(io_err(&tmp))?;
    file.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

impl report::Sink for TensorBoard {
    fn record(&mut self, event: &report::Event) -> Result<(), Error> {
        use report::Event as E;
        match *event {
            E::Started(start) => self.started(&start),
            E::Step(r) => self.scalars(r.step, step_values(r)),
            E::Eval { step, val_loss, per_source, .. } => self.scalars(step, eval_values(val_loss, per_source)),
            E::Accuracy { step, set, score, .. } => {
                let prefix = accuracy_prefix(set);
                self.scalars(step, numbers(&prefix, &serde_json::to_value(score).expect("scores serialize")))
            }
            E::Sample { step, prompt, text, .. } => {
                let markdown = format!("**{}**\n\n{}", prompt.trim(), text.trim());
                self.scalars(step, vec![Value::text("samples", &markdown)])
            }
            E::Phase(_) | E::Checkpoint(_) | E::Best(_) | E::Ranks(_) | E::NonFinite { .. } | E::Failure(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("trainer-tensorboard-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Every (step, tag) the directory's files hold, in file order.
    fn logged(dir: &Path) -> Vec<(i64, String)> {
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(dir.join(DIR_NAME)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files
            .iter()
            .flat_map(|f| record::read(&std::fs::read(f).unwrap()).0)
            .flat_map(|e| e.tags().map(|t| (e.step, t.to_owned())).collect::<Vec<_>>())
            .collect()
    }

    fn write_steps(tb: &mut TensorBoard, steps: std::ops::RangeInclusive<i64>) {
        for s in steps {
            tb.scalars(s as u64, vec![Value::scalar("train/loss", 1.0 / s as f64)]).unwrap();
        }
    }

    #[test]
    fn a_resume_cuts_what_the_crashed_attempt_logged_past_its_checkpoint() {
        let dir = tempdir("resume");
        let loss = |s: i64| (s, "train/loss".to_string());
        let config = |s: i64| (s, CONFIG_TAG.to_string());
        // Attempt 1 never checkpoints: attempt 2 starts over and replaces its steps.
        let mut tb = TensorBoard::open(&dir, 0).unwrap();
        tb.scalars(0, vec![Value::text(CONFIG_TAG, "a1")]).unwrap();
        write_steps(&mut tb, 1..=3);
        let mut tb = TensorBoard::open(&dir, 0).unwrap();
        assert_eq!(logged(&dir), vec![]);
        tb.scalars(0, vec![Value::text(CONFIG_TAG, "a2")]).unwrap();
        write_steps(&mut tb, 1..=7);
        // Attempt 3 resumes from step 4 (a checkpoint) and then crashes at step 6,
        // with a record half written.
        let mut tb = TensorBoard::open(&dir, 4).unwrap();
        tb.scalars(4, vec![Value::text(CONFIG_TAG, "a3")]).unwrap();
        write_steps(&mut tb, 5..=6);
        let torn = record::frame(&Event::summary(1.0, 7, vec![Value::scalar("train/loss", 0.5)]));
        tb.file.write_all(&torn[..torn.len() - 3]).unwrap();
        // Attempt 4 resumes from step 4 again.
        let mut tb = TensorBoard::open(&dir, 4).unwrap();
        tb.scalars(4, vec![Value::text(CONFIG_TAG, "a4")]).unwrap();
        write_steps(&mut tb, 5..=8);
        let want: Vec<_> =
            [config(0)].into_iter().chain((1..=4).map(loss)).chain([config(4)]).chain((5..=8).map(loss)).collect();
        assert_eq!(logged(&dir), want);
        let files = std::fs::read_dir(dir.join(DIR_NAME)).unwrap().count();
        assert_eq!(files, 4, "one file per attempt, no temporary left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn statistics_structs_become_one_tag_per_field() {
        let stats = crate::grpo::stats::GrpoStats { reward: 0.5, kl: 0.01, ..Default::default() };
        let tags: Vec<String> =
            numbers("grpo", &serde_json::to_value(stats).unwrap()).into_iter().map(|v| v.tag).collect();
        assert!(tags.contains(&"grpo/reward".into()) && tags.contains(&"grpo/clipFraction".into()), "{tags:?}");
        assert_eq!(tags.len(), 12);
    }
}
