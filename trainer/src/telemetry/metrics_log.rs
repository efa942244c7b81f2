//! The JSONL metrics log beside the checkpoints, `<checkpoint dir>/metrics.jsonl`:
//! one JSON object per line, tagged by `kind` (`start`, `resume`, `step`, `eval`,
//! `checkpoint`, `sample`). Every record carries the optimizer `step` it belongs to,
//! so a resumed run can cut away what the crashed attempt logged after its checkpoint.
//!
//! NaN and infinite numbers are written as `null` (JSON has no NaN) and read back as NaN.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crds::types::CheckpointRef;
use serde::{Deserialize, Serialize};

use crate::train::report::{Event, Sink, StepReport, unix_now};
use crate::{Error, io_err};

/// File name of the log inside the checkpoint directory.
pub const FILE_NAME: &str = crate::checkpoint::METRICS_LOG_FILE;

/// One line of the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// An attempt started training from step 0.
    Start(StartRecord),
    /// An attempt resumed from the checkpoint at `step`.
    Resume(ResumeRecord),
    /// A completed optimizer step.
    Step(StepRecord),
    /// A validation pass.
    Eval(EvalRecord),
    /// A complete checkpoint.
    Checkpoint(CheckpointRecord),
    /// Text generated from the model, to watch it learn.
    Sample(SampleRecord),
    /// Multiple-choice accuracy on held-out questions (GRPO).
    Accuracy(AccuracyRecord),
}

impl Record {
    /// The optimizer step the record belongs to.
    pub fn step(&self) -> u64 {
        match self {
            Record::Start(r) => r.step,
            Record::Resume(r) => r.step,
            Record::Step(r) => r.step,
            Record::Eval(r) => r.step,
            Record::Checkpoint(r) => r.step,
            Record::Sample(r) => r.step,
            Record::Accuracy(r) => r.step,
        }
    }
}

/// `kind: "start"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartRecord {
    /// Always 0.
    pub step: u64,
    /// The TrainingRun's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Gang attempt, 1-based.
    pub attempt: u32,
    /// Unix time, seconds.
    pub time: f64,
}

/// `kind: "resume"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeRecord {
    /// Step of the checkpoint resumed from.
    pub step: u64,
    /// Tokens trained on at that checkpoint.
    pub tokens: u64,
    /// The TrainingRun's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Gang attempt, 1-based.
    pub attempt: u32,
    /// Records of earlier attempts past `step` that were removed from the log.
    pub dropped_records: u64,
    /// Unix time, seconds.
    pub time: f64,
}

/// `kind: "step"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// Optimizer steps completed, counting this one.
    pub step: u64,
    /// Tokens trained on so far, all ranks together.
    pub tokens: u64,
    /// Mean training loss of the step.
    #[serde(with = "nonfinite")]
    pub loss: f64,
    /// Learning rate of the step.
    #[serde(with = "nonfinite")]
    pub lr: f64,
    /// Global gradient norm before clipping.
    #[serde(with = "nonfinite")]
    pub grad_norm: f64,
    /// Throughput, all ranks together.
    #[serde(with = "nonfinite")]
    pub tokens_per_second: f64,
    /// Model FLOPs utilization (0-1), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// Unix time the step completed, seconds.
    pub time: f64,
    /// Wall-clock seconds spent training, summed over attempts.
    pub elapsed_seconds: f64,
    /// GRPO's metrics of the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpo: Option<crate::grpo::stats::GrpoStats>,
    /// Peak GPU memory of rank 0's tensors so far, GiB (CUDA runs).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "gpuMemoryPeakGiB")]
    pub gpu_memory_peak_gib: Option<f64>,
}

/// `kind: "accuracy"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccuracyRecord {
    /// Step evaluated at (0: the initial policy).
    pub step: u64,
    pub tokens: u64,
    /// The question set: `held-out`, or one of `spec.grpo.evalDatasets`.
    #[serde(default = "held_out")]
    pub set: String,
    #[serde(flatten)]
    pub score: crate::eval::McqScore,
    /// Unix time, seconds.
    pub time: f64,
}

fn held_out() -> String {
    crate::train::HELD_OUT.into()
}

impl StepRecord {
    /// The record of a step report, at `time` after `elapsed_seconds` of training.
    pub fn new(report: &StepReport, time: f64, elapsed_seconds: f64) -> StepRecord {
        StepRecord {
            step: report.step,
            tokens: report.tokens,
            loss: report.loss,
            lr: report.lr,
            grad_norm: report.grad_norm,
            tokens_per_second: report.tokens_per_second,
            mfu: report.mfu,
            time,
            elapsed_seconds,
            grpo: report.grpo,
            gpu_memory_peak_gib: report.gpu_memory.map(|g| g.peak_gib()),
        }
    }
}

/// `kind: "eval"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvalRecord {
    /// Step evaluated at.
    pub step: u64,
    /// Tokens trained on at that step.
    pub tokens: u64,
    /// Mean validation loss over the sources.
    #[serde(with = "nonfinite")]
    pub val_loss: f64,
    /// exp(valLoss).
    #[serde(with = "nonfinite")]
    pub perplexity: f64,
    /// Validation loss of each source.
    #[serde(default)]
    pub per_source: BTreeMap<String, f64>,
    /// Unix time, seconds.
    pub time: f64,
}

/// `kind: "checkpoint"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointRecord {
    /// Step of the checkpoint.
    pub step: u64,
    /// Tokens trained on at the checkpoint.
    pub tokens: u64,
    /// Where the checkpoint is.
    pub uri: String,
    /// The mix's validation loss at its step, when validation ran there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Unix time, seconds.
    pub time: f64,
}

/// `kind: "sample"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SampleRecord {
    /// Step of the model that generated the text.
    pub step: u64,
    /// Tokens trained on at that step.
    pub tokens: u64,
    /// The prompt, if the sample continued one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The generated text.
    pub text: String,
    /// Unix time, seconds.
    pub time: f64,
}

/// NaN and infinities as `null`.
mod nonfinite {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() { s.serialize_f64(*v) } else { s.serialize_none() }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// The log's path in a checkpoint directory.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Reads every record of a log. A bad line is an error naming the file and line,
/// except an unterminated last line, which is a write torn by a crash and is skipped.
pub fn read(path: &Path) -> Result<Vec<Record>, Error> {
    let lines = read_lines(path)?;
    let mut records = Vec::with_capacity(lines.len());
    for (index, line) in lines.iter().enumerate() {
        if line.text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line.text) {
            Ok(record) => records.push(record),
            Err(_) if line.torn => {}
            Err(source) => return Err(Error::MetricsLog { path: path.to_path_buf(), line: index + 1, source }),
        }
    }
    Ok(records)
}

struct Line {
    text: String,
    /// The last line, without its newline.
    torn: bool,
}

fn read_lines(path: &Path) -> Result<Vec<Line>, Error> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut reader = BufReader::new(file);
    let mut lines = Vec::new();
    loop {
        let mut text = String::new();
        if reader.read_line(&mut text).map_err(io_err(path))? == 0 {
            return Ok(lines);
        }
        let torn = !text.ends_with('\n');
        if !torn {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        lines.push(Line { text, torn });
    }
}

/// Keeps only the lines whose `step` is at most `keep_through`, replacing the file
/// atomically (a filtered copy renamed over it). Lines of unknown kinds are kept by
/// their `step`. Returns the kept step records' last `elapsedSeconds` and the number
/// of lines dropped.
fn truncate_after(path: &Path, keep_through: u64) -> Result<(f64, u64), Error> {
    let lines = read_lines(path)?;
    let mut kept = String::new();
    let mut dropped = 0;
    let mut elapsed = 0.0;
    for (index, line) in lines.iter().enumerate() {
        if line.text.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = match serde_json::from_str(&line.text) {
            Ok(v) => v,
            Err(_) if line.torn => {
                dropped += 1;
                continue;
            }
            Err(source) => return Err(Error::MetricsLog { path: path.to_path_buf(), line: index + 1, source }),
        };
        if value.get("step").and_then(|s| s.as_u64()).is_some_and(|s| s > keep_through) {
            dropped += 1;
            continue;
        }
        if value.get("kind").and_then(|k| k.as_str()) == Some("step") {
            elapsed = value.get("elapsedSeconds").and_then(|e| e.as_f64()).unwrap_or(elapsed);
        }
        kept.push_str(&line.text);
        kept.push('\n');
    }
    // A torn last line that still parses lacks its newline; rewriting adds it.
    if dropped > 0 || lines.last().is_some_and(|l| l.torn) {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(kept.as_bytes()).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))?;
    }
    Ok((elapsed, dropped))
}

/// An open log, appending one flushed line per record.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    file: File,
    opened: Instant,
    /// Training seconds of earlier attempts, from the log's last kept step record.
    elapsed_before: f64,
}

impl MetricsLog {
    /// Opens `<dir>/metrics.jsonl` for an attempt that starts at `start_step`
    /// (0 for a fresh run, the checkpoint's step on resume), creating the directory
    /// and file if needed. Records an earlier attempt logged past `start_step` are
    /// removed first, atomically, so the log never shows a crashed attempt's stale
    /// tail. Then appends a `start` record (step 0) or a `resume` record.
    pub fn open(
        dir: &Path,
        start_step: u64,
        start_tokens: u64,
        run: Option<&str>,
        attempt: u32,
    ) -> Result<MetricsLog, Error> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = path_in(dir);
        let (elapsed_before, dropped) = if path.exists() { truncate_after(&path, start_step)? } else { (0.0, 0) };
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io_err(&path))?;
        let mut log = MetricsLog { path, file, opened: Instant::now(), elapsed_before };
        let run = run.map(str::to_owned);
        let time = unix_now();
        log.append(&if start_step == 0 {
            Record::Start(StartRecord { step: 0, run, attempt, time })
        } else {
            Record::Resume(ResumeRecord {
                step: start_step,
                tokens: start_tokens,
                run,
                attempt,
                dropped_records: dropped,
                time,
            })
        })?;
        Ok(log)
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Training seconds so far, over every attempt.
    pub fn elapsed_seconds(&self) -> f64 {
        self.elapsed_before + self.opened.elapsed().as_secs_f64()
    }

    /// Appends one record as one line and flushes it to the file.
    pub fn append(&mut self, record: &Record) -> Result<(), Error> {
        let mut line = serde_json::to_string(record).expect("records serialize");
        line.push('\n');
        // One write per line, so a crash can tear at most the last line.
        self.file.write_all(line.as_bytes()).map_err(io_err(&self.path))?;
        self.file.flush().map_err(io_err(&self.path))
    }

    /// Appends a `step` record.
    pub fn step(&mut self, report: &StepReport) -> Result<(), Error> {
        let record = StepRecord::new(report, unix_now(), self.elapsed_seconds());
        self.append(&Record::Step(record))
    }

    /// Appends an `eval` record; the perplexity is exp(valLoss).
    pub fn eval(&mut self, step: u64, tokens: u64, val_loss: f64, per_source: &[(String, f64)]) -> Result<(), Error> {
        let record = EvalRecord {
            step,
            tokens,
            val_loss,
            perplexity: val_loss.exp(),
            per_source: per_source.iter().cloned().collect(),
            time: unix_now(),
        };
        self.append(&Record::Eval(record))
    }

    /// Appends a `checkpoint` record.
    pub fn checkpoint(&mut self, checkpoint: &CheckpointRef) -> Result<(), Error> {
        let record = CheckpointRecord {
            step: checkpoint.step,
            tokens: checkpoint.tokens,
            uri: checkpoint.uri.clone(),
            val_loss: checkpoint.val_loss,
            time: unix_now(),
        };
        self.append(&Record::Checkpoint(record))
    }

    /// Appends an `accuracy` record.
    pub fn accuracy(&mut self, step: u64, tokens: u64, set: &str, score: &crate::eval::McqScore) -> Result<(), Error> {
        let record = AccuracyRecord { step, tokens, set: set.into(), score: score.clone(), time: unix_now() };
        self.append(&Record::Accuracy(record))
    }

    /// Appends a `sample` record of generated text.
    pub fn sample(&mut self, step: u64, tokens: u64, prompt: Option<&str>, text: &str) -> Result<(), Error> {
        let record =
            SampleRecord { step, tokens, prompt: prompt.map(str::to_owned), text: text.to_owned(), time: unix_now() };
        self.append(&Record::Sample(record))
    }
}

impl Sink for MetricsLog {
    fn record(&mut self, event: &Event) -> Result<(), Error> {
        match *event {
            Event::Step(report) => self.step(report),
            Event::Eval { step, tokens, val_loss, per_source } => self.eval(step, tokens, val_loss, per_source),
            Event::Accuracy { step, tokens, set, score, .. } => self.accuracy(step, tokens, set, score),
            Event::Checkpoint(checkpoint) => self.checkpoint(checkpoint),
            Event::Sample { step, tokens, prompt, text } => self.sample(step, tokens, Some(prompt), text),
            Event::Started(_)
            | Event::Phase(_)
            | Event::Best(_)
            | Event::Ranks(_)
            | Event::NonFinite { .. }
            | Event::Failure(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("trainer-metrics-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn report(step: u64) -> StepReport {
        StepReport {
            step,
            tokens: step * 1024,
            loss: 10.0 / (step as f64 + 1.0),
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_second: 2048.0,
            mfu: None,
            grpo: None,
            gpu_memory: None,
            tokens_by_source: Vec::new(),
        }
    }

    /// Writes steps 1..=steps with an eval and checkpoint every 5 steps.
    fn train(log: &mut MetricsLog, from: u64, steps: u64) {
        for s in from + 1..=steps {
            log.step(&report(s)).unwrap();
            if s % 5 == 0 {
                log.eval(s, s * 1024, 2.0, &[("web".into(), 1.5), ("code".into(), 2.5)]).unwrap();
                log.checkpoint(&CheckpointRef {
                    step: s,
                    tokens: s * 1024,
                    uri: format!("/ckpt/step-{s}"),
                    time: None,
                    val_loss: Some(2.0),
                })
                .unwrap();
            }
        }
    }

    #[test]
    fn records_round_trip() {
        let dir = tempdir("round-trip");
        let mut log = MetricsLog::open(&dir, 0, 0, Some("demo"), 1).unwrap();
        assert_eq!(log.path(), dir.join("metrics.jsonl"));
        train(&mut log, 0, 5);
        log.step(&StepReport { loss: f64::NAN, grad_norm: f64::INFINITY, mfu: Some(0.25), ..report(6) }).unwrap();
        log.sample(6, 6144, Some("Once"), "Once upon a \"time\"\n").unwrap();
        drop(log);

        let records = read(&dir.join(FILE_NAME)).unwrap();
        let kinds: Vec<&str> = records
            .iter()
            .map(|r| match r {
                Record::Start(_) => "start",
                Record::Resume(_) => "resume",
                Record::Step(_) => "step",
                Record::Eval(_) => "eval",
                Record::Checkpoint(_) => "checkpoint",
                Record::Sample(_) => "sample",
                Record::Accuracy(_) => "accuracy",
            })
            .collect();
        assert_eq!(kinds, ["start", "step", "step", "step", "step", "step", "eval", "checkpoint", "step", "sample"]);
        let Record::Start(start) = &records[0] else { unreachable!() };
        assert_eq!((start.run.as_deref(), start.attempt), (Some("demo"), 1));
        let Record::Step(s3) = &records[3] else { unreachable!() };
        assert_eq!((s3.step, s3.tokens, s3.loss, s3.lr), (3, 3072, 2.5, 1e-3));
        assert!(s3.elapsed_seconds >= 0.0 && s3.time > 1.6e9);
        let Record::Eval(eval) = &records[6] else { unreachable!() };
        assert_eq!(eval.per_source.get("code"), Some(&2.5));
        assert!((eval.perplexity - 2f64.exp()).abs() < 1e-12);
        let Record::Step(nan) = &records[8] else { unreachable!() };
        assert!(nan.loss.is_nan() && nan.grad_norm.is_nan());
        assert_eq!(nan.mfu, Some(0.25));
        let Record::Sample(sample) = &records[9] else { unreachable!() };
        assert_eq!(sample.text, "Once upon a \"time\"\n");

        // The wire format: camelCase, a `kind` tag, null for NaN.
        let text = std::fs::read_to_string(dir.join(FILE_NAME)).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.lines().nth(8).unwrap()).unwrap();
        assert_eq!(line["kind"], "step");
        assert_eq!(line["loss"], serde_json::Value::Null);
        assert!(
            line.get("gradNorm").is_some()
                && line.get("tokensPerSecond").is_some()
                && line.get("elapsedSeconds").is_some()
        );
        let eval_line: serde_json::Value = serde_json::from_str(text.lines().nth(6).unwrap()).unwrap();
        assert_eq!(eval_line["valLoss"], 2.0);
        assert_eq!(eval_line["perSource"]["web"], 1.5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn resume_drops_the_stale_tail_of_the_crashed_attempt() {
        let dir = tempdir("resume");
        let mut log = MetricsLog::open(&dir, 0, 0, Some("demo"), 1).unwrap();
        train(&mut log, 0, 13);
        drop(log);
        // The crash tore the last line mid-write.
        let path = dir.join(FILE_NAME);
        OpenOptions::new().append(true).open(&path).unwrap().write_all(br#"{"kind":"step","step":14,"tok"#).unwrap();

        // Resume from the checkpoint at step 10 as attempt 2.
        let mut log = MetricsLog::open(&dir, 10, 10240, Some("demo"), 2).unwrap();
        assert!(!dir.join("metrics.jsonl.tmp").exists());
        let records = read(&path).unwrap();
        assert!(records.iter().all(|r| r.step() <= 10), "{records:?}");
        let Some(Record::Resume(resume)) = records.last() else { panic!("{records:?}") };
        // Steps 11-13 and the torn line.
        assert_eq!((resume.step, resume.tokens, resume.attempt, resume.dropped_records), (10, 10240, 2, 4));
        let steps: Vec<u64> = records.iter().filter(|r| matches!(r, Record::Step(_))).map(Record::step).collect();
        assert_eq!(steps, (1..=10).collect::<Vec<_>>());
        assert_eq!(records.iter().filter(|r| matches!(r, Record::Checkpoint(_))).count(), 2);

        // Training time carries over from the last kept step record.
        let Some(Record::Step(step10)) = records.iter().rev().find(|r| matches!(r, Record::Step(_))) else {
            unreachable!()
        };
        assert!(log.elapsed_seconds() >= step10.elapsed_seconds);

        train(&mut log, 10, 12);
        drop(log);
        let records = read(&path).unwrap();
        let steps: Vec<u64> = records.iter().filter(|r| matches!(r, Record::Step(_))).map(Record::step).collect();
        assert_eq!(steps, (1..=12).collect::<Vec<_>>());

        // A fresh restart (no checkpoint) keeps only step-0 records.
        MetricsLog::open(&dir, 0, 0, None, 3).unwrap();
        let records = read(&path).unwrap();
        assert!(records.iter().all(|r| matches!(r, Record::Start(_))), "{records:?}");
        assert_eq!(records.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_lines_name_the_file_and_line() {
        let dir = tempdir("bad");
        let path = dir.join(FILE_NAME);
        let good = serde_json::to_string(&Record::Step(StepRecord::new(&report(1), 0.0, 0.0))).unwrap();
        std::fs::write(&path, format!("{good}\n{good}\n{{\"kind\":\"step\",\"step\":\n{good}\n")).unwrap();
        let err = read(&path).unwrap_err();
        assert!(matches!(err, Error::MetricsLog { line: 3, .. }), "{err:?}");
        assert!(err.to_string().starts_with(&format!("{}:3: ", path.display())), "{err}");
        // Resuming over a corrupt middle line fails the same way rather than losing data.
        let err = MetricsLog::open(&dir, 1, 1024, None, 2).unwrap_err();
        assert!(matches!(err, Error::MetricsLog { line: 3, .. }), "{err:?}");

        // An unknown kind is an error to the reader.
        std::fs::write(&path, format!("{good}\n{{\"kind\":\"party\",\"step\":1}}\n")).unwrap();
        assert!(matches!(read(&path).unwrap_err(), Error::MetricsLog { line: 2, .. }));

        let missing = dir.join("missing.jsonl");
        let err = read(&missing).unwrap_err();
        assert!(matches!(err, Error::Io { .. }) && err.to_string().contains("missing.jsonl"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
