//! The questions GRPO trains on, the held-out ones and the extra sets it is evaluated
//! on, and the seeded order in which prompts are drawn.

use std::path::{Path, PathBuf};

use crds::config::{Location, ResolvedGrpo, RunConfig};

use crate::Error;
use crate::data::corpus::{self, Split};
use crate::data::mcq::{self, McqFormat, McqRecord, McqSet};
use crate::data::shard::{MANIFEST, Manifest};
use crate::storage;

/// Embedded training questions never exceed this; longer runs repeat epochs.
const MAX_EMBEDDED_QUESTIONS: usize = 50_000;

/// Training questions, the held-out ones, and the extra evaluation sets.
pub struct Questions {
    pub train: Vec<McqRecord>,
    /// Scored before and after training (`spec.grpo.evalDataset`, else the dataset's
    /// validation split).
    pub held_out: McqSet,
    /// `spec.grpo.evalDatasets`, each scored beside the held-out set.
    pub eval_sets: Vec<NamedSet>,
}

/// A question set and the name it was given by (its URI).
pub struct NamedSet {
    pub name: String,
    pub set: McqSet,
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

/// The run's questions (`spec.grpo.dataset`, `evalDataset`, `evalDatasets`); each
/// evaluation set keeps at most `evalQuestions`.
pub fn load(cfg: &RunConfig, g: &ResolvedGrpo) -> Result<Questions, Error> {
    let needed = (cfg.data_size().steps.div_ceil(g.iterations.max(1) as u64) * g.prompts_per_step as u64) as usize;
    let n_eval = g.eval_questions as usize;
    let (train, held_out) = match &g.dataset {
        Location::Embedded { name } => {
            let records = embedded(name, "spec.grpo.dataset")?;
            let held_out = McqSet { format: McqFormat::Medqa, records: records(cfg.seed, n_eval, Split::Validation) };
            (records(cfg.seed, needed.clamp(1, MAX_EMBEDDED_QUESTIONS), Split::Train), held_out)
        }
        other => {
            let (train, held_out) = read_local(&fetch(cfg, other)?, g.eval_dataset.is_none(), McqFormat::Auto)?;
            (train.records, held_out)
        }
    };
    let mut held_out = match &g.eval_dataset {
        None => held_out,
        Some(loc) => eval_set(cfg, loc, McqFormat::Auto, n_eval)?,
    };
    held_out.records.truncate(n_eval);
    if train.is_empty() {
        return Err(Error::Data { name: "spec.grpo.dataset".into(), message: "has no training questions".into() });
    }
    let eval_sets = g
        .eval_datasets
        .iter()
        .map(|loc| Ok(NamedSet { name: loc.to_string(), set: eval_set(cfg, loc, McqFormat::Auto, n_eval)? }))
        .collect::<Result<_, Error>>()?;
    Ok(Questions { train, held_out, eval_sets })
}

/// An embedded question set's first `n` questions of a split, for a seed.
type Generator = fn(u64, usize, Split) -> Vec<McqRecord>;

/// The generator of an embedded question set; `field` names where it was asked for.
fn embedded(name: &str, field: &str) -> Result<Generator, Error> {
    match name {
        "mcq" => Ok(corpus::mcq_records),
        "mcq-rules" => Ok(corpus::mcq_rule_records),
        _ => Err(Error::Data {
            name: field.into(),
            message: format!(
                "embedded:{name} is not a question set; the embedded ones are embedded:mcq-rules (questions a small \
                 model learns from reward) and embedded:mcq (those plus questions about the synthetic world)"
            ),
        }),
    }
}

/// Questions to evaluate on from `loc` (at most `n`): an embedded set's held-out
/// questions, a prepared directory's validation records, or every question of a file
/// (MedQA, MMLU or ARC in `format`; jsonl, JSON or Parquet).
pub fn eval_set(cfg: &RunConfig, loc: &Location, format: McqFormat, n: usize) -> Result<McqSet, Error> {
    let mut set = match loc {
        Location::Embedded { name } => {
            let records = embedded(name, &loc.to_string())?(cfg.seed, n, Split::Validation);
            McqSet { format: McqFormat::Medqa, records }
        }
        _ => {
            let local = fetch(cfg, loc)?;
            if local.is_dir() { read_local(&local, true, format)?.1 } else { read_local(&local, false, format)?.0 }
        }
    };
    set.records.truncate(n);
    Ok(set)
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

/// A question file in `format`, or a `trainer prepare` directory with record files:
/// its training and held-out questions. With `split`, a file's questions are divided by
/// hash into training and held-out ones; without, all are training questions.
fn read_local(local: &Path, split: bool, format: McqFormat) -> Result<(McqSet, McqSet), Error> {
    let local = local.to_path_buf();
    if local.is_dir() {
        if !matches!(format, McqFormat::Auto | McqFormat::Medqa) {
            return Err(Error::Data {
                name: local.display().to_string(),
                message: format!("a prepared dataset's records are MedQA jsonl, not {format}"),
            });
        }
        let manifest = Manifest::read(&local)?;
        let files = manifest.records.ok_or_else(|| Error::Data {
            name: local.display().to_string(),
            message: "this prepared dataset has no multiple-choice records; prepare MedQA jsonl with --format medqa"
                .into(),
        })?;
        // `trainer prepare` writes its records as MedQA jsonl.
        let train = mcq::read(&local.join(&files.train), McqFormat::Medqa)?.records;
        let held_out = mcq::read(&local.join(&files.validation), McqFormat::Medqa)?.records;
        let set = |records| McqSet { format: McqFormat::Medqa, records };
        return Ok(if split {
            (set(train), set(held_out))
        } else {
            (set([train, held_out].concat()), set(Vec::new()))
        });
    }
    let McqSet { format, records } = mcq::read(&local, format)?;
    if !split {
        return Ok((McqSet { format, records }, McqSet { format, records: Vec::new() }));
    }
    let (train, held_out) = records.into_iter().partition(|r| r.split() == Split::Train);
    Ok((McqSet { format, records: train }, McqSet { format, records: held_out }))
}

/// Downloads an S3 question set (a question file, or a prepared prefix's manifest and
/// record files) into the cache; returns the local file or directory.
fn fetch_s3(cfg: &RunConfig, bucket: &str, prefix: &str) -> Result<PathBuf, Error> {
    let s3 = storage::for_data(cfg)?;
    let local = crate::files::under(&crate::data::cache_dir().join("s3"), &format!("{bucket}/{prefix}"))
        .map_err(|message| Error::Data { name: storage::uri(bucket, prefix), message })?;
    if [".jsonl", ".json", ".parquet"].iter().any(|ext| prefix.ends_with(ext)) {
        s3.get_file(bucket, prefix, &local, u64::MAX)?;
        return Ok(local);
    }
    let manifest_key = storage::join(prefix, MANIFEST);
    s3.get_file(bucket, &manifest_key, &local.join(MANIFEST), crate::files::limits::MANIFEST_BYTES)?;
    // Manifest::read refuses record file names that are not plain names.
    if let Some(files) = Manifest::read(&local)?.records {
        for f in [files.train, files.validation] {
            s3.get_file(bucket, &storage::join(prefix, &f), &local.join(&f), u64::MAX)?;
        }
    }
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_order_visits_every_question_once_per_epoch() {
        let q = Questions {
            train: corpus::mcq_records(1, 37, Split::Train),
            held_out: McqSet { format: McqFormat::Medqa, records: Vec::new() },
            eval_sets: Vec::new(),
        };
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
}
