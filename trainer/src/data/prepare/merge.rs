//! The merge: every input file's part, in listing order, into the dataset's manifest,
//! published last. The parts depend on their files and the settings only, so the same
//! inputs give the same manifest whichever worker prepared each file, and however many.

use crds::contract::prepare::MergedManifest;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::listing::Unit;
use super::output::Output;
use super::part::{Part, PartSettings, part_name};
use crate::Error;
use crate::data::shard::{self, Dtype, MANIFEST, MANIFEST_FORMAT, Manifest, ManifestTokenizer, RecordFiles};
use crate::data::tokenizer::Tokenizer;

/// The tokenizer's file beside the manifest.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// How many failed files a merge's error names before "and N more".
const NAMED_FAILURES: usize = 10;

/// What the merge takes besides the parts.
pub struct MergeOptions<'a> {
    pub name: &'a str,
    pub settings: &'a PartSettings,
    pub tokenizer: &'a Tokenizer,
    /// Input files that may fail (their documents left out) before the merge fails.
    pub max_failed_files: usize,
}

/// Merges the parts of `units` published in `out` into the dataset's manifest, publishes
/// it with the tokenizer and the MedQA records, and returns its summary with the parts.
pub fn merge(units: &[Unit], out: &Output, o: &MergeOptions<'_>) -> Result<(MergedManifest, Vec<Part>), Error> {
    let fail = |message: String| Error::Data { name: out.uri(), message };
    let mut parts = Vec::with_capacity(units.len());
    let mut missing = Vec::new();
    for unit in units {
        match Part::published(out, unit, o.settings)? {
            Some(p) => parts.push(p),
            None => missing.push(format!("{} ({})", part_name(unit.index), unit.key)),
        }
    }
    if !missing.is_empty() {
        return Err(fail(format!(
            "{} of {} input files are not prepared (no part manifest under these settings): {}",
            missing.len(),
            units.len(),
            named(&missing)
        )));
    }
    let failed: Vec<String> =
        parts.iter().filter_map(|p| p.error.as_ref().map(|e| format!("{}: {e}", p.key))).collect();
    if failed.len() > o.max_failed_files {
        return Err(fail(format!(
            "{} of {} input files failed (maxFailedFiles {}): {}",
            failed.len(),
            units.len(),
            o.max_failed_files,
            named(&failed)
        )));
    }
    let documents: u64 = parts.iter().map(|p| p.documents).sum();
    if documents == 0 {
        return Err(fail("the inputs hold no documents".into()));
    }
    let mut files = vec![TOKENIZER_FILE.to_string()];
    let tok_path = out.work_dir().join(TOKENIZER_FILE);
    crate::files::write_atomic(&tok_path, o.tokenizer.to_json()?.as_bytes()).map_err(crate::io_err(&tok_path))?;
    let records = merge_records(out, &parts)?;
    if let Some(r) = &records {
        files.extend([r.train.clone(), r.validation.clone()]);
    }
    let manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        version: shard::VERSION,
        name: o.name.to_string(),
        tokenizer: ManifestTokenizer {
            hash: o.tokenizer.hash(),
            vocab_size: o.tokenizer.vocab_size(),
            eos_id: o.tokenizer.eos_id(),
            file: Some(TOKENIZER_FILE.into()),
        },
        dtype: Dtype::for_vocab(o.tokenizer.vocab_size()),
        train: parts.iter().flat_map(|p| p.train.iter().cloned()).collect(),
        validation: parts.iter().flat_map(|p| p.validation.iter().cloned()).collect(),
        records,
        input: input_summary(o.settings, &parts),
    };
    if manifest.validation.is_empty() && o.settings.validation_fraction > 0.0 {
        tracing::warn!(
            "{}: no document fell into the {} validation split; raise --validation-fraction",
            o.name,
            o.settings.validation_fraction
        );
    }
    let json = serde_json::to_string_pretty(&manifest).expect("Manifest serializes");
    out.publish(&files, MANIFEST, json.as_bytes())?;
    let merged = MergedManifest {
        sha256: Sha256::digest(json.as_bytes()).iter().map(|b| format!("{b:02x}")).collect(),
        train_tokens: Manifest::tokens(&manifest.train),
        validation_tokens: Manifest::tokens(&manifest.validation),
        shards: (manifest.train.len() + manifest.validation.len()) as u64,
        tokenizer_hash: manifest.tokenizer.hash,
    };
    Ok((merged, parts))
}

fn named(items: &[String]) -> String {
    let mut s = items.iter().take(NAMED_FAILURES).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > NAMED_FAILURES {
        s += &format!("; and {} more", items.len() - NAMED_FAILURES);
    }
    s
}

/// The parts' MedQA records concatenated per split in listing order, when any part has
/// records.
fn merge_records(out: &Output, parts: &[Part]) -> Result<Option<RecordFiles>, Error> {
    if parts.iter().all(|p| p.records.is_none()) {
        return Ok(None);
    }
    let files = RecordFiles { train: "records-train.jsonl".into(), validation: "records-validation.jsonl".into() };
    let mut merged: [Vec<String>; 2] = Default::default();
    for p in parts {
        let Some(r) = &p.records else { continue };
        for (name, into) in [&r.train, &r.validation].into_iter().zip(merged.iter_mut()) {
            let bytes = out.read(name)?.ok_or_else(|| Error::Data {
                name: out.uri(),
                message: format!("{}: its records file {name} is missing", part_name(p.index)),
            })?;
            let text = String::from_utf8(bytes)
                .map_err(|e| Error::Data { name: format!("{}/{name}", out.uri()), message: e.to_string() })?;
            into.extend(text.lines().filter(|l| !l.is_empty()).map(str::to_string));
        }
    }
    super::part::write_records(out, [&files.train, &files.validation], &merged)?;
    Ok(Some(files))
}

/// The manifest's record of the input: each file (by key, so it does not depend on where
/// the inputs were mounted) with its counts or its error, the settings, the totals.
fn input_summary(s: &PartSettings, parts: &[Part]) -> Value {
    let files: Vec<Value> = parts
        .iter()
        .map(|p| {
            let mut f = json!({
                "key": p.key,
                "format": p.input_format,
                "bytes": p.bytes,
                "documents": p.documents,
                "validationDocuments": p.validation_documents,
            });
            if let Some(e) = &p.error {
                f["error"] = json!(e);
            }
            f
        })
        .collect();
    json!({
        "files": files,
        "field": s.field,
        "documents": parts.iter().map(|p| p.documents).sum::<u64>(),
        "validationDocuments": parts.iter().map(|p| p.validation_documents).sum::<u64>(),
        "validationFraction": s.validation_fraction,
        "seed": s.seed,
        "shardTokens": s.shard_tokens,
        "bytes": parts.iter().map(|p| p.bytes).sum::<u64>(),
        "failedFiles": parts.iter().filter(|p| p.error.is_some()).count(),
    })
}
