//! The questions GRPO trains on and the held-out ones it is evaluated on, and the
//! seeded order in which prompts are drawn.

use std::path::{Path, PathBuf};

use crds::config::{Location, ResolvedGrpo, RunConfig};

use crate::Error;
use crate::data::corpus::{self, McqRecord, Split};
use crate::data::prepare::parse_medqa;
use crate::data::shard::{MANIFEST, Manifest};
use crate::storage;

/// Embedded training questions never exceed this; longer runs repeat epochs.
const MAX_EMBEDDED_QUESTIONS: usize = 50_000;

/// Training questions and held-out questions.
pub struct Questions {
    pub train: Vec<McqRecord>,
    pub held_out: Vec<McqRecord>,
}

impl Questions {
    /// The `i`-th prompt of the run's stream: epoch `i / n` visits every training
    /// question once, in an order seeded by (seed, epoch).
    pub fn nth(&self, i: u64, seed: u64) -> &McqRecord {
        let n = self.train.len() as u64;
        let key = crate::rng::splitmix64(seed ^ 0x6772_706f ^ crate::rng::splitmix64(i / n));
        &self.train[crate::data::mix::permute(i % n, n, key) as usize]
    }
}

/// The run's questions (`spec.grpo.dataset`, `spec.grpo.evalDataset`).
pub fn load(cfg: &RunConfig, g: &ResolvedGrpo) -> Result<Questions, Error> {
    let needed = (cfg.data_size().steps.div_ceil(g.iterations.max(1) as u64) * g.prompts_per_step as u64) as usize;
    let (train, held_out) = match &g.dataset {
        Location::Embedded { name } if crds::contract::EMBEDDED_QUESTION_SETS.contains(&name.as_str()) => {
            let records = embedded(name);
            (
                records(cfg.seed, needed.clamp(1, MAX_EMBEDDED_QUESTIONS), Split::Train),
                records(cfg.seed, g.eval_questions as usize, Split::Validation),
            )
        }
        Location::Embedded { name } => {
            return Err(Error::Data {
                name: "spec.grpo.dataset".into(),
                message: format!(
                    "embedded:{name} is not a question set; the embedded ones are embedded:mcq-rules \
                     (questions a small model learns from reward) and embedded:mcq (those plus questions about the synthetic world)"
                ),
            });
        }
        other => {
            let (train, held_out) = read(cfg, other, g.eval_dataset.is_none())?;
            (train, held_out)
        }
    };
    let held_out = match &g.eval_dataset {
        None => held_out,
        Some(loc) => {
            let (all, _) = read(cfg, loc, false)?;
            all
        }
    };
    if train.is_empty() {
        return Err(Error::Data { name: "spec.grpo.dataset".into(), message: "has no training questions".into() });
    }
    Ok(Questions { train, held_out })
}

/// The generator of an embedded question set.
fn embedded(name: &str) -> fn(u64, usize, Split) -> Vec<McqRecord> {
    if name == "mcq" { corpus::mcq_records } else { corpus::mcq_rule_records }
}

/// Questions to evaluate on from `loc` (at most `n`): an embedded set's held-out
/// questions, a prepared directory's validation records, or every question of a file.
pub fn eval_set(cfg: &RunConfig, loc: &Location, n: usize) -> Result<Vec<McqRecord>, Error> {
    let mut all = match loc {
        Location::Embedded { name } if crds::contract::EMBEDDED_QUESTION_SETS.contains(&name.as_str()) => {
            embedded(name)(cfg.seed, n, Split::Validation)
        }
        _ => {
            let local = fetch(cfg, loc)?;
            if local.is_dir() { read_local(&local, true)?.1 } else { read_local(&local, false)?.0 }
        }
    };
    all.truncate(n);
    Ok(all)
}

/// A question set at `loc`: a MedQA jsonl file, or a `trainer prepare` directory with
/// record files. With `split`, a jsonl file's questions are divided by hash into
/// training and held-out ones; without, all are returned first.
fn read(cfg: &RunConfig, loc: &Location, split: bool) -> Result<(Vec<McqRecord>, Vec<McqRecord>), Error> {
    read_local(&fetch(cfg, loc)?, split)
}

/// Where `loc` is on this machine (S3 objects are downloaded into the cache).
fn fetch(cfg: &RunConfig, loc: &Location) -> Result<PathBuf, Error> {
    Ok(match loc {
        Location::Path { path } => PathBuf::from(path),
        Location::Pvc { claim, path } => PathBuf::from(crds::contract::pvc_path(claim, path)),
        Location::S3 { bucket, prefix } => fetch_s3(cfg, bucket, prefix)?,
        Location::Embedded { name } => {
            return Err(Error::Data {
                name: format!("embedded:{name}"),
                message: format!(
                    "not a question set; the embedded ones are {}",
                    crds::contract::EMBEDDED_QUESTION_SETS.join(", ")
                ),
            });
        }
    })
}

fn read_local(local: &Path, split: bool) -> Result<(Vec<McqRecord>, Vec<McqRecord>), Error> {
    let local = local.to_path_buf();
    if local.is_dir() {
        let manifest = Manifest::read(&local)?;
        let files = manifest.records.ok_or_else(|| Error::Data {
            name: local.display().to_string(),
            message: "this prepared dataset has no multiple-choice records; prepare MedQA jsonl with --format medqa"
                .into(),
        })?;
        let train = read_jsonl(&local.join(&files.train))?;
        let held_out = read_jsonl(&local.join(&files.validation))?;
        return Ok(if split { (train, held_out) } else { ([train, held_out].concat(), Vec::new()) });
    }
    let all = read_jsonl(&local)?;
    if !split {
        return Ok((all, Vec::new()));
    }
    Ok(all.into_iter().partition(|r| r.split() == Split::Train))
}

/// Downloads an S3 question set (a `.jsonl` object, or a prepared prefix's manifest and
/// record files) into the cache; returns the local file or directory.
fn fetch_s3(cfg: &RunConfig, bucket: &str, prefix: &str) -> Result<PathBuf, Error> {
    let s3 = crate::data::sources::data_store(cfg)?;
    let root = crate::data::cache_dir().join("s3").join(bucket);
    if prefix.ends_with(".jsonl") || prefix.ends_with(".json") {
        let local = root.join(prefix);
        s3.get_file(bucket, prefix, &local)?;
        return Ok(local);
    }
    let dir = root.join(prefix);
    let manifest_key = storage::join(prefix, MANIFEST);
    s3.get_file(bucket, &manifest_key, &dir.join(MANIFEST))?;
    if let Some(files) = Manifest::read(&dir)?.records {
        for f in [files.train, files.validation] {
            s3.get_file(bucket, &storage::join(prefix, &f), &dir.join(&f))?;
        }
    }
    Ok(dir)
}

/// MedQA jsonl (GBaker format); errors name the file and line.
pub fn read_jsonl(path: &Path) -> Result<Vec<McqRecord>, Error> {
    let text = std::fs::read_to_string(path).map_err(crate::io_err(path))?;
    let bad = |line: usize, message: String| Error::Data {
        name: path.display().to_string(),
        message: format!("line {line}: {message}"),
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v: serde_json::Value = serde_json::from_str(l).map_err(|e| bad(i + 1, format!("not JSON: {e}")))?;
            parse_medqa(&v).map_err(|m| bad(i + 1, m))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_order_visits_every_question_once_per_epoch() {
        let q = Questions { train: corpus::mcq_records(1, 37, Split::Train), held_out: Vec::new() };
        for epoch in 0..2u64 {
            let mut seen: Vec<&str> = (0..37).map(|i| q.nth(epoch * 37 + i, 5).question.as_str()).collect();
            seen.sort();
            let mut all: Vec<&str> = q.train.iter().map(|r| r.question.as_str()).collect();
            all.sort();
            assert_eq!(seen, all);
        }
        let first: Vec<&str> = (0..37).map(|i| q.nth(i, 5).question.as_str()).collect();
        let second: Vec<&str> = (37..74).map(|i| q.nth(i, 5).question.as_str()).collect();
        assert_ne!(first, second, "each epoch has its own order");
        assert_eq!(q.nth(3, 5), q.nth(3, 5));
    }

    #[test]
    fn jsonl_errors_name_the_file_and_line() {
        let dir = std::env::temp_dir().join(format!("grpo-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("q.jsonl");
        let good = crate::data::prepare::medqa_json(&corpus::mcq_records(0, 1, Split::Train)[0]).to_string();
        std::fs::write(&path, format!("{good}\n\n{{\"question\": \"x\"}}\n")).unwrap();
        let err = read_jsonl(&path).unwrap_err().to_string();
        assert!(err.contains("q.jsonl") && err.contains("line 3") && err.contains("options"), "{err}");
        std::fs::write(&path, format!("{good}\n{good}\n")).unwrap();
        assert_eq!(read_jsonl(&path).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
