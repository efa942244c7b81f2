//! `trainer prepare`: tokenize text into shards, locally or staged to S3.

use crds::contract::prepare::PrepareStep;

use crate::data::prepare::{Live, Step};

use crate::Error;
use crate::telemetry::progress::human_count;

#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// Input files, directories (read recursively) or `s3://bucket/prefix`es, each
    /// optionally ending in a glob of the names below it (`raw/*.parquet`,
    /// `s3://raw/usmle/**/*.jsonl`), or `https://` URLs of single files; repeatable.
    #[arg(long = "input", short, required = true)]
    pub inputs: Vec<String>,
    /// Output directory of the prepared source, or an `s3://bucket/prefix` (each file's
    /// part staged locally and uploaded as it is done, the manifest last).
    #[arg(long, short)]
    pub output: String,
    /// The source's name [default: the output's last path segment].
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, value_enum, default_value = "auto")]
    pub format: crate::data::prepare::InputFormat,
    /// The jsonl field or Parquet column holding the text.
    #[arg(long, default_value = "text")]
    pub field: String,
    /// A Hugging Face tokenizer.json (a path, `s3://bucket/key` or an `https://` URL), or
    /// `embedded`.
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
    /// Input files that may fail (unreadable, a missing column, invalid UTF-8), their
    /// documents left out, before the preparation fails.
    #[arg(long, default_value_t = 0)]
    pub max_failed_files: usize,
    /// Which part of the preparation to run: `all`; `tokenizer` (train it and publish it);
    /// `work` (worker --worker of --workers: its share of the files); `merge` (the
    /// manifest, once every file is prepared).
    #[arg(long, value_enum, default_value = "all")]
    pub step: StepArg,
    /// Workers sharing the files (`--step work`).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// This worker's index, below --workers [default: $JOB_COMPLETION_INDEX, else 0].
    #[arg(long)]
    pub worker: Option<usize>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepArg {
    All,
    Tokenizer,
    Work,
    Merge,
}

/// `--worker`, or the Indexed Job's completion index.
fn worker_index(flag: Option<usize>) -> Result<usize, Error> {
    if let Some(i) = flag {
        return Ok(i);
    }
    let var = crds::contract::env::JOB_COMPLETION_INDEX;
    match std::env::var(var) {
        Ok(v) => v.parse().map_err(|_| Error::InvalidSpec(format!("{var}={v:?} is not a worker index; give --worker"))),
        Err(_) => Ok(0),
    }
}

/// The live report on `/status` at `TRAINER_STATUS_PORT`, when it is set.
fn serve_status(live: &Live) -> Result<Option<crate::telemetry::server::http::HttpServer>, Error> {
    use crate::telemetry::server::http::{HttpServer, Limits, Reply};
    let var = crds::contract::env::STATUS_PORT;
    let Ok(port) = std::env::var(var) else { return Ok(None) };
    let port: u16 = port.parse().map_err(|_| Error::InvalidSpec(format!("{var}={port:?} is not a port")))?;
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    let live = live.clone();
    let handler = move |_: &hyper::Method, path: &str| match path {
        "/status" => Reply {
            code: 200,
            content_type: "application/json",
            body: serde_json::to_string(&*live.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
                .expect("PrepareReport serializes")
                .into(),
        },
        "/healthz" => Reply { code: 200, content_type: "text/plain; charset=utf-8", body: "ok\n".into() },
        _ => Reply { code: 404, content_type: "text/plain; charset=utf-8", body: "not found\n".into() },
    };
    let server = HttpServer::start(addr, Limits::default(), std::sync::Arc::new(handler))
        .map_err(|e| Error::StatusServer { addr, message: e.to_string() })?;
    tracing::info!("preparation status on http://{}/status", server.addr());
    Ok(Some(server))
}

pub fn prepare(a: PrepareArgs) -> Result<(), Error> {
    use crate::data::prepare::{PrepareOptions, TokenizerChoice};
    let quantity = |flag: &str, v: &str| {
        crds::quantity::parse_tokens(v).map_err(|e| Error::InvalidSpec(format!("--{flag} {v}: {e}")))
    };
    let tokenizer = match (a.tokenizer.as_deref(), a.train_tokenizer, a.vocab_size) {
        (Some("embedded"), _, _) => TokenizerChoice::Embedded,
        (Some(uri), _, _) => TokenizerChoice::Uri(uri.into()),
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
    if a.output.starts_with("s3://") && crate::storage::parse_uri(&a.output).is_none() {
        return Err(Error::InvalidSpec(format!("--output {}: write s3://bucket/prefix", a.output)));
    }
    let live = Live::default();
    let step = match a.step {
        StepArg::All => Step::All,
        StepArg::Tokenizer => Step::Tokenizer,
        StepArg::Work => Step::Work { index: worker_index(a.worker)?, workers: a.workers },
        StepArg::Merge => Step::Merge,
    };
    live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).step = match step {
        Step::Tokenizer => PrepareStep::Tokenizer,
        Step::Merge => PrepareStep::Merge,
        Step::All | Step::Work { .. } => PrepareStep::Work,
    };
    let opts = PrepareOptions {
        inputs: a.inputs,
        output: a.output.clone(),
        name: a.name,
        format: a.format,
        field: a.field,
        tokenizer,
        shard_tokens: quantity("shard-tokens", &a.shard_tokens)?,
        validation_fraction: a.validation_fraction,
        seed: a.seed,
        max_failed_files: a.max_failed_files,
        step,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        live: Some(live.clone()),
    };
    // In a cluster the operator reads the worker's progress from `/status`, and its
    // final report from the termination message.
    let _server = serve_status(&live)?;
    let r = crate::data::prepare::prepare(&opts)?;
    if let Some(path) = crate::telemetry::termination::termination_log() {
        let json = live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).to_json();
        if let Err(e) = std::fs::write(&path, json) {
            tracing::warn!("writing the report to {}: {e}", path.display());
        }
    }
    for f in &r.failed {
        eprintln!("warning: failed and left out: {f}");
    }
    if step == Step::Tokenizer {
        println!("{}: tokenizer trained in {:.1} s", a.output, r.seconds);
        return Ok(());
    }
    let totals = format!(
        "{} documents ({} held out), {} train + {} validation tokens in {} shards",
        r.documents,
        r.validation_documents,
        human_count(r.train_tokens as f64),
        human_count(r.validation_tokens as f64),
        r.shards,
    );
    let (files, failed, output) = (r.files, r.failed.len(), &a.output);
    if step == Step::Merge {
        println!("{output}: merged {files} files ({failed} failed), {totals}, in {:.1} s", r.seconds);
    } else {
        let mb = r.input_bytes as f64 / 1e6;
        println!(
            "{output}: {files} files ({} prepared, {} already prepared, {failed} failed), {totals}; {mb:.1} MB in {:.1} s ({:.1} MB/s)",
            r.prepared,
            r.skipped,
            r.seconds,
            mb / r.seconds.max(1e-9),
        );
    }
    Ok(())
}
