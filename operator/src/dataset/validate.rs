//! Validate, pure: a TrainingDataset's spec → what its pods run with: the inputs and
//! output as the pods see them (a `pvc://` claim mounted at its path under
//! [`PVC_MOUNT_ROOT`]), the claims to mount, and the tokenizer's flags.

use crds::config::Location;
use crds::contract::{PVC_MOUNT_ROOT, pvc_path};
use crds::resolve::parse_location_str;
use crds::types::{SourceFormat, TrainingDataset};
use kube::ResourceExt;

/// Longest dataset name: its Jobs are `<name>-<step>-g<generation>`, and a Job's name
/// is a label value of its pods (63 characters).
pub const MAX_NAME: usize = 40;

/// A claim the pods mount at `PVC_MOUNT_ROOT/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mount {
    pub claim: String,
    pub read_only: bool,
}

/// What every pod of the dataset runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// `--input` values: mount paths or `s3://` URIs, globs kept.
    pub inputs: Vec<String>,
    /// `--output`: a mount path or an `s3://` URI.
    pub output: String,
    /// The tokenizer's flags.
    pub tokenizer: Vec<String>,
    /// Whether a tokenizer pod trains the tokenizer first.
    pub train_tokenizer: bool,
    pub shard_tokens: u64,
    pub mounts: Vec<Mount>,
}

/// The paths a dataset's pods read and write, the claims they mount, and every field
/// that is wrong.
#[derive(Default)]
struct Paths {
    mounts: Vec<Mount>,
    errors: Vec<String>,
}

impl Paths {
    /// Where `uri` (of `field`) is in the pods: an S3 URI or (read only) an https URL as
    /// it is, a claim's path under its mount, the claim mounted read-only unless something
    /// is written to it.
    fn path(&mut self, field: &str, uri: &str, read_only: bool) -> Option<String> {
        // A URL is one file, fetched by `trainer prepare` itself.
        if uri.starts_with("https://") {
            if read_only {
                return Some(uri.to_string());
            }
            self.errors.push(format!("{field}: {uri:?}: an https:// URL is read, not written; give s3:// or pvc://"));
            return None;
        }
        match parse_location_str(uri) {
            Ok(Location::S3 { .. }) => Some(uri.to_string()),
            Ok(Location::Pvc { claim, path }) => {
                match self.mounts.iter_mut().find(|m| m.claim == claim) {
                    Some(m) => m.read_only &= read_only,
                    None => self.mounts.push(Mount { claim: claim.clone(), read_only }),
                }
                Some(pvc_path(&claim, &path))
            }
            Ok(_) => {
                self.errors.push(format!("{field}: {uri:?} must be s3://bucket/prefix or pvc://claim/path"));
                None
            }
            Err(e) => {
                self.errors.push(format!("{field}: {e}"));
                None
            }
        }
    }

    /// The tokenizer's flags, and whether a tokenizer pod trains it first.
    fn tokenizer(&mut self, t: &crds::types::DatasetTokenizer) -> (Option<Vec<String>>, bool) {
        match (&t.uri, t.embedded == Some(true), &t.train) {
            (Some(uri), false, None) => {
                (self.path("spec.tokenizer.uri", uri, true).map(|p| vec!["--tokenizer".into(), p]), false)
            }
            (None, true, None) => (Some(vec!["--tokenizer".into(), "embedded".into()]), false),
            (None, false, Some(train)) => {
                let sample =
                    parse_tokens_field("spec.tokenizer.train.sampleBytes", &train.sample_bytes, &mut self.errors);
                let flags = sample.map(|bytes| {
                    vec![
                        "--train-tokenizer".into(),
                        "--vocab-size".into(),
                        train.vocab_size.to_string(),
                        "--tokenizer-sample-bytes".into(),
                        bytes.to_string(),
                    ]
                });
                (flags, true)
            }
            _ => {
                self.errors.push("spec.tokenizer: set exactly one of uri, embedded and train".into());
                (None, false)
            }
        }
    }
}

/// The dataset's pods' plan, or every field that is wrong, each named.
pub fn validate(ds: &TrainingDataset) -> Result<Prepared, Vec<String>> {
    let mut paths = Paths::default();
    let name = ds.name_any();
    if name.len() > MAX_NAME {
        paths.errors.push(format!(
            "metadata.name: {name:?} is longer than {MAX_NAME} characters (its Jobs' names add a suffix)"
        ));
    }
    let spec = &ds.spec;
    let inputs: Vec<String> = spec
        .source
        .uris
        .iter()
        .enumerate()
        .filter_map(|(i, u)| paths.path(&format!("spec.source.uris[{i}]"), u, true))
        .collect();
    let output = paths.path("spec.output", &spec.output, false).unwrap_or_default();
    let (tokenizer, train_tokenizer) = paths.tokenizer(&spec.tokenizer);
    let Paths { mut mounts, mut errors } = paths;
    let shard_tokens = parse_tokens_field("spec.shardTokens", &spec.shard_tokens, &mut errors);
    if shard_tokens.is_some_and(|n| n < 1024) {
        errors.push("spec.shardTokens: must be at least 1K".into());
    }
    if !(0.0..1.0).contains(&spec.validation_fraction) {
        errors.push(format!("spec.validationFraction: {} must be in [0, 1)", spec.validation_fraction));
    }
    if spec.source.format == SourceFormat::Medqa && spec.source.field != "text" {
        errors.push("spec.source.field: MedQA records have fixed fields; leave field unset".into());
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    mounts.sort();
    Ok(Prepared {
        inputs,
        output,
        tokenizer: tokenizer.unwrap_or_default(),
        train_tokenizer,
        shard_tokens: shard_tokens.unwrap_or_default(),
        mounts,
    })
}

fn parse_tokens_field(field: &str, q: &crds::quantity::TokenQuantity, errors: &mut Vec<String>) -> Option<u64> {
    q.value().map_err(|e| errors.push(format!("{field}: {e}"))).ok()
}

/// Where a claim is mounted in the pods.
pub fn mount_path(claim: &str) -> String {
    format!("{PVC_MOUNT_ROOT}/{claim}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(yaml: &str) -> TrainingDataset {
        serde_yaml_ng::from_str(&format!(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingDataset\nmetadata: {{name: web, namespace: ml}}\nspec:\n{yaml}"
        ))
        .unwrap()
    }

    #[test]
    fn claims_become_mounts_and_s3_stays_a_uri() {
        let p = validate(&dataset(
            "  source: {uris: ['pvc://raw/web/*.parquet', 's3://raw/pdf/**/*.parquet', 'pvc://raw/more']}\n  \
             tokenizer: {uri: 'pvc://models/gpt2/tokenizer.json'}\n  output: pvc://prepared/web\n  shardTokens: 64K\n",
        ))
        .unwrap();
        assert_eq!(p.inputs, ["/mnt/pvc/raw/web/*.parquet", "s3://raw/pdf/**/*.parquet", "/mnt/pvc/raw/more"]);
        assert_eq!(p.output, "/mnt/pvc/prepared/web");
        assert_eq!(p.tokenizer, ["--tokenizer", "/mnt/pvc/models/gpt2/tokenizer.json"]);
        assert_eq!(p.shard_tokens, 64_000);
        let mounts: Vec<_> = p.mounts.iter().map(|m| (m.claim.as_str(), m.read_only)).collect();
        assert_eq!(mounts, [("models", true), ("prepared", false), ("raw", true)]);
    }

    #[test]
    fn a_claim_read_and_written_is_mounted_writable_and_training_a_tokenizer_has_its_flags() {
        let p = validate(&dataset(
            "  source: {uris: ['pvc://data/raw']}\n  tokenizer: {train: {vocabSize: 4096, sampleBytes: 1M}}\n  output: pvc://data/prepared\n",
        ))
        .unwrap();
        assert_eq!(p.mounts, [Mount { claim: "data".into(), read_only: false }]);
        assert!(p.train_tokenizer);
        assert_eq!(p.tokenizer, ["--train-tokenizer", "--vocab-size", "4096", "--tokenizer-sample-bytes", "1000000"]);
    }

    #[test]
    fn https_urls_are_passed_to_the_trainer_as_they_are() {
        let p = validate(&dataset(
            "  source: {uris: ['https://huggingface.co/datasets/o/n/resolve/main/a.parquet', 'pvc://raw/b.jsonl']}\n  \
             tokenizer: {uri: 'https://huggingface.co/gpt2/resolve/main/tokenizer.json'}\n  output: s3://prepared/web\n",
        ))
        .unwrap();
        assert_eq!(p.inputs, ["https://huggingface.co/datasets/o/n/resolve/main/a.parquet", "/mnt/pvc/raw/b.jsonl"]);
        assert_eq!(p.tokenizer, ["--tokenizer", "https://huggingface.co/gpt2/resolve/main/tokenizer.json"]);
        assert_eq!(p.mounts, [Mount { claim: "raw".into(), read_only: true }]);
    }

    #[test]
    fn every_bad_field_is_named() {
        let mut ds = dataset(
            "  source: {uris: ['http://example.org/a.jsonl', 'pvc:///x', 'embedded:textbook']}\n  tokenizer: {embedded: true}\n  \
             output: 'https://example.org/out'\n  shardTokens: 12Q\n",
        );
        ds.metadata.name = Some("x".repeat(41));
        let e = validate(&ds).unwrap_err().join("\n");
        for needle in [
            "metadata.name",
            "spec.source.uris[0]: \"http://example.org/a.jsonl\": unsupported scheme \"http\"",
            "spec.source.uris[1]: ",
            "spec.source.uris[2]: \"embedded:textbook\" must be s3://",
            "spec.output: \"https://example.org/out\": an https:// URL is read, not written",
            "spec.shardTokens: ",
        ] {
            assert!(e.contains(needle), "{needle:?} in\n{e}");
        }
    }
}
