//! `trainer prepare`: tokenize text into shards, locally or staged to S3.

use std::path::PathBuf;

use crate::Error;
use crate::telemetry::progress::human_count;

#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// Input files or directories (repeatable); directories are read recursively.
    #[arg(long = "input", short, required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output directory of the prepared source, or an `s3://bucket/prefix` (staged
    /// locally, then uploaded with the manifest last).
    #[arg(long, short)]
    pub output: String,
    /// The source's name [default: the output directory's name].
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, value_enum, default_value = "auto")]
    pub format: crate::data::prepare::InputFormat,
    /// The jsonl field or Parquet column holding the text.
    #[arg(long, default_value = "text")]
    pub field: String,
    /// A Hugging Face tokenizer.json, or `embedded`.
    #[arg(long, conflicts_with = "train_tokenizer")]
    pub tokenizer: Option<String>,
    /// Train a byte-level BPE on the input first (with --vocab-size).
    #[arg(long, requires = "vocab_size")]
    pub train_tokenizer: bool,
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// How much input text the tokenizer is trained on.
    #[arg(long, default_value = "256M")]
    pub tokenizer_sample_bytes: String,
    /// Tokens per shard.
    #[arg(long, default_value = "100M")]
    pub shard_tokens: String,
    /// Share of documents held out for validation.
    #[arg(long, default_value_t = 0.005)]
    pub validation_fraction: f64,
    /// Seed of the validation split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn prepare(a: PrepareArgs) -> Result<(), Error> {
    use crate::data::prepare::{PrepareOptions, TokenizerChoice};
    let quantity = |flag: &str, v: &str| {
        crds::quantity::parse_tokens(v).map_err(|e| Error::InvalidSpec(format!("--{flag} {v}: {e}")))
    };
    let tokenizer = match (a.tokenizer.as_deref(), a.train_tokenizer, a.vocab_size) {
        (Some("embedded"), _, _) => TokenizerChoice::Embedded,
        (Some(path), _, _) => TokenizerChoice::File(path.into()),
        (None, true, Some(vocab_size)) => TokenizerChoice::Train {
            vocab_size,
            sample_bytes: quantity("tokenizer-sample-bytes", &a.tokenizer_sample_bytes)? as usize,
        },
        _ => {
            return Err(Error::InvalidSpec(
                "prepare needs a tokenizer: --tokenizer tokenizer.json, --tokenizer embedded, or --train-tokenizer --vocab-size N".into(),
            ));
        }
    };
    let s3 = crate::storage::parse_uri(&a.output);
    if a.output.starts_with("s3://") && s3.is_none() {
        return Err(Error::InvalidSpec(format!("--output {}: write s3://bucket/prefix", a.output)));
    }
    let output = match &s3 {
        Some((_, prefix)) => crate::data::cache_dir().join("prepare-staging").join(format!(
            "{}-{}",
            prefix.replace('/', "_"),
            std::process::id()
        )),
        None => PathBuf::from(&a.output),
    };
    let name = a
        .name
        .or_else(|| s3.as_ref().and_then(|(_, p)| p.rsplit('/').next().filter(|n| !n.is_empty()).map(str::to_string)));
    let opts = PrepareOptions {
        inputs: a.inputs,
        output: output.clone(),
        name,
        format: a.format,
        field: a.field,
        tokenizer,
        shard_tokens: quantity("shard-tokens", &a.shard_tokens)?,
        validation_fraction: a.validation_fraction,
        seed: a.seed,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let r = crate::data::prepare::prepare(&opts)?;
    if let Some((bucket, prefix)) = &s3 {
        let store = crate::storage::S3::from_env()?;
        let n = store.put_dir(&output, bucket, prefix, crate::data::shard::MANIFEST)?;
        let _ = std::fs::remove_dir_all(&output);
        eprintln!("uploaded {n} files to {}", a.output);
    }
    println!(
        "{}: {} documents ({} held out), {} train + {} validation tokens in {} shards; {:.1} MB in {:.1} s ({:.1} MB/s)",
        a.output,
        r.documents,
        r.validation_documents,
        human_count(r.train_tokens as f64),
        human_count(r.validation_tokens as f64),
        r.shards,
        r.input_bytes as f64 / 1e6,
        r.seconds,
        r.input_bytes as f64 / 1e6 / r.seconds.max(1e-9),
    );
    Ok(())
}
