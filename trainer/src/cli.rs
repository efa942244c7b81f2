//! Command-line interface.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use crds::presets::{H100_PEAK_BF16_FLOPS, ModelConfig, PRESETS};

use crate::Error;

#[derive(Parser, Debug)]
#[command(name = "trainer", version, about = "libtorch LLM trainer for TrainingRuns")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print every model preset with its parameter counts (total, without norms, matmul)
    /// and training FLOPs per token at its context length.
    Presets {
        /// One JSON object per line, as `torch_reference.py --list` prints.
        #[arg(long)]
        json: bool,
    },
    /// Resolve a TrainingRun manifest into the RunConfig JSON the trainer executes,
    /// with the same code the operator uses.
    Resolve {
        /// TrainingRun YAML file.
        manifest: PathBuf,
    },
    /// Report the libtorch build: CUDA, cuDNN, threads, and a bf16 matmul check per device.
    Info,
    /// Train a TrainingRun manifest locally: resolve it as the operator does, then
    /// train, checkpoint into the output directory and resume from it when rerun.
    Run(RunArgs),
    /// The pod's entrypoint, like torchrun: start this node's workers (one per GPU, or
    /// the run's processes per node on CPU) with RANK, LOCAL_RANK and WORLD_SIZE,
    /// forward SIGTERM, and exit with the first failed worker's code and message.
    Launch(LaunchArgs),
    /// One rank of a run, as `trainer launch` starts it (placement from RANK,
    /// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Tokenize text into shards for training: jsonl (`--field`), Parquet (a text
    /// column), plain text files and directories, or MedQA-USMLE jsonl. Writes
    /// train/validation shards, manifest.json and tokenizer.json to the output directory.
    Prepare(PrepareArgs),
    /// Validation loss and perplexity of a checkpoint per data source (`--task loss`), or
    /// its multiple-choice accuracy on held-out questions (`--task mcq`): greedy answer
    /// letter and log-likelihood of the four letters.
    Eval(EvalArgs),
    /// Sample text from a checkpoint.
    Generate(GenerateArgs),
    /// Write a checkpoint as a Hugging Face model directory.
    Export {
        /// A run's output directory or one checkpoint directory.
        checkpoint: PathBuf,
        /// Output directory for config.json and model.safetensors.
        #[arg(long)]
        hf: PathBuf,
    },
    /// Time the training step like `torch_reference.py` and print the same JSON fields.
    ///
    /// MFU = tokens/s × (6·N_matmul + 12·L·n_head·d_head·T) / 989e12, where N_matmul
    /// counts every Linear weight (lm_head included, input embedding excluded).
    Bench(BenchArgs),
    /// One layer's SwiGLU and RoPE on each kernel set (eager, composed and, on CUDA,
    /// fused), forward and backward on the preset's shapes, each checked against f32 as a
    /// run's trial checks it, with its speed against eager measured in the same run.
    BenchKernels(BenchShape),
    /// What data parallelism costs here: Gloo all-reduce bandwidth between local
    /// ranks, and the step time of N ranks over 1 at the same per-rank batch.
    BenchDdp(BenchDdpArgs),
    /// How fast one core serves training batches from mmap shards through the mix
    /// (synthetic 45/25/20/10 shards unless --data is given).
    BenchData(BenchDataArgs),
    /// GRPO's sampler: batched decoding with the KV cache against the full-prefix loop,
    /// greedy, same model and prompts (random weights of the preset).
    BenchGenerate(BenchGenerateArgs),
    /// Plot a metrics log (metrics.jsonl beside the checkpoints) to a PNG: training and
    /// validation loss, and the learning rate, against tokens.
    Plot {
        /// The metrics.jsonl file.
        log: PathBuf,
        /// Output PNG [default: beside the log, <stem>.png].
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

/// What `trainer eval` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalTask {
    /// Validation loss and perplexity per data source (a pretraining run).
    Loss,
    /// Multiple-choice accuracy.
    Mcq,
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// A run's output directory or one checkpoint directory.
    pub checkpoint: PathBuf,
    #[arg(long, value_enum, default_value = "loss")]
    pub task: EvalTask,
    /// Questions for `--task mcq`: embedded:mcq-rules, embedded:mcq (their held-out
    /// questions), a MedQA jsonl file (all of it), or a prepared directory (its
    /// validation records), as a path, pvc:// or s3:// URI [default: the GRPO run's
    /// held-out questions, else embedded:mcq].
    #[arg(long)]
    pub dataset: Option<String>,
    /// Score at most this many questions.
    #[arg(long, default_value_t = 256)]
    pub questions: usize,
    /// Tokens generated for the greedy answer.
    #[arg(long, default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// TrainingRun YAML file.
    pub manifest: PathBuf,
    /// Checkpoints and metrics.jsonl go here [default: runs/<metadata.name>].
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Serve /status, /metrics and /healthz here (port 0 picks a free one).
    #[arg(long, env = "TRAINER_STATUS_ADDR", default_value = "127.0.0.1:0")]
    pub status_addr: std::net::SocketAddr,
    /// Stop after this many optimizer steps (with a checkpoint); rerun to resume.
    #[arg(long)]
    pub stop_after_steps: Option<u64>,
    /// Skip the sample generation at the end.
    #[arg(long)]
    pub no_sample: bool,
    /// Read the loss back from the GPU once every N steps (and at every checkpoint,
    /// evaluation and the last step), so the GPU never waits for the host between
    /// them [default: 8 on CUDA, 1 on CPU; always 1 for GRPO].
    #[arg(long, env = "TRAINER_SYNC_EVERY", value_parser = clap::value_parser!(u64).range(1..))]
    pub sync_every: Option<u64>,
}

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

#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// The resolved run (RunConfig JSON) from the run's ConfigMap.
    #[arg(long, env = "TRAINER_CONFIG", default_value = crds::contract::CONFIG_PATH)]
    pub config: PathBuf,
    /// Checkpoints and metrics.jsonl (the run's PVC).
    #[arg(long, default_value = crds::contract::CHECKPOINT_MOUNT)]
    pub output: PathBuf,
    /// Where `initFrom.trainingRun` runs are mounted.
    #[arg(long, default_value = crds::contract::INIT_MOUNT)]
    pub init_dir: PathBuf,
    /// Nodes in the gang [default: spec.topology.nodes].
    #[arg(long, env = "NNODES")]
    pub nnodes: Option<u32>,
    /// This node's index [default: JOB_COMPLETION_INDEX, else 0].
    #[arg(long, env = "NODE_RANK")]
    pub node_rank: Option<u32>,
    /// Workers on this node [default: the run's processes per node].
    #[arg(long, env = "NPROC_PER_NODE")]
    pub nproc_per_node: Option<u32>,
    /// Rank 0's host, where the rendezvous store listens.
    #[arg(long, env = "MASTER_ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,
    #[arg(long, env = "MASTER_PORT", default_value_t = crds::contract::RENDEZVOUS_PORT)]
    pub master_port: u16,
    /// Rank 0 serves /status, /metrics and /healthz here; other nodes serve /healthz.
    #[arg(long, env = "TRAINER_STATUS_PORT", default_value_t = crds::contract::STATUS_PORT)]
    pub status_port: u16,
}

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The resolved run (RunConfig JSON).
    #[arg(long)]
    pub config: PathBuf,
    #[arg(long)]
    pub output: PathBuf,
    #[arg(long)]
    pub init_dir: PathBuf,
    /// Rank 0 serves status here.
    #[arg(long)]
    pub status_addr: Option<std::net::SocketAddr>,
    #[arg(long)]
    pub stop_after_steps: Option<u64>,
    #[arg(long)]
    pub no_sample: bool,
    /// Read the loss back from the GPU once every N steps (and at every checkpoint,
    /// evaluation and the last step), so the GPU never waits for the host between
    /// them [default: 8 on CUDA, 1 on CPU; always 1 for GRPO].
    #[arg(long, env = "TRAINER_SYNC_EVERY", value_parser = clap::value_parser!(u64).range(1..))]
    pub sync_every: Option<u64>,
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A run's output directory or one checkpoint directory.
    pub checkpoint: PathBuf,
    /// Text to continue; defaults to a validation multiple-choice question.
    #[arg(long)]
    pub prompt: Option<String>,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: i64,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f64,
    /// Number of samples.
    #[arg(long, short, default_value_t = 1)]
    pub n: usize,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
}

#[derive(clap::Args, Debug)]
pub struct BenchDataArgs {
    /// Prepared source directories (repeatable).
    #[arg(long)]
    pub data: Vec<PathBuf>,
    #[arg(long, default_value_t = 2048)]
    pub seq: usize,
    #[arg(long, default_value_t = 8)]
    pub micro_batch: usize,
    #[arg(long, default_value_t = 2000)]
    pub batches: usize,
    /// Tokens per synthetic source.
    #[arg(long, default_value = "32M")]
    pub synthetic_tokens: String,
}

#[derive(clap::Args, Debug)]
pub struct BenchGenerateArgs {
    #[arg(long, default_value = "nano")]
    pub preset: String,
    /// Rows decoded together (GRPO: prompts per rank × generationsPerPrompt).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    #[arg(long, default_value_t = 48)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 192)]
    pub new_tokens: usize,
    /// cpu or cuda [default: cuda when available].
    #[arg(long)]
    pub device: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct BenchDdpArgs {
    #[arg(long, default_value_t = 2)]
    pub ranks: u32,
    #[arg(long, default_value = "nano")]
    pub preset: String,
    #[arg(long, default_value_t = 8)]
    pub micro_batch: u32,
    #[arg(long, default_value_t = 256)]
    pub seq: u32,
    #[arg(long, default_value_t = 10)]
    pub steps: u32,
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// All-reduce message sizes, MiB.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub sizes_mib: Vec<f64>,
}

/// The model, batch, precision and device a benchmark runs.
#[derive(clap::Args, Debug)]
pub struct BenchShape {
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    #[arg(long, default_value_t = 8)]
    pub micro_batch: i64,
    #[arg(long, default_value_t = 2048)]
    pub seq: i64,
    /// bf16-mixed, bf16 or f32.
    #[arg(long, default_value = "bf16-mixed")]
    pub precision: String,
    /// cpu or cuda [default: cuda when available].
    #[arg(long)]
    pub device: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub shape: BenchShape,
    /// Timed steps.
    #[arg(long, default_value_t = 20)]
    pub steps: u32,
    #[arg(long, default_value_t = 5)]
    pub warmup: u32,
    /// auto, flash, cudnn or math.
    #[arg(long, default_value = "auto")]
    pub attention: String,
    /// SwiGLU's kernels: auto (on CUDA the faster exact of composed and fused, timed at
    /// start-up; composed elsewhere), composed (ATen's silu and mul as one autograd node),
    /// fused (jiterator, CUDA) or eager (two nodes, which keep silu(gate) too: the baseline).
    #[arg(long, default_value = "auto")]
    pub swiglu: String,
    /// RoPE's kernels: auto, composed (ATen's mul and add as one autograd node), fused
    /// (jiterator, CUDA) or eager (rotate-half as separate nodes: the baseline).
    #[arg(long, default_value = "auto")]
    pub rope: String,
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// With --gradient-checkpointing: recompute only this many leading blocks
    /// (spec.checkpointedBlocks) [default: all].
    #[arg(long)]
    pub checkpointed_blocks: Option<u32>,
    /// Through a world-size-1 c10d group (NCCL on CUDA, Gloo on CPU) and the
    /// data-parallel gradient reducer, after checking a bf16 all-reduce.
    #[arg(long)]
    pub ddp: bool,
    /// Tokens per chunk of the lm_head + cross-entropy; 0 computes the full logits at
    /// once (the reference's way), to measure what chunking costs or saves
    /// [default: training's, 1.6 GB of f32 logits: 8192 tokens at a 50K vocabulary].
    #[arg(long)]
    pub loss_chunk: Option<i64>,
    /// Capture the whole step (forward, backward, clip, AdamW) as one CUDA graph after
    /// the warm-up and replay it each step (CUDA, without --ddp).
    #[arg(long)]
    pub cuda_graph: bool,
    /// Cap the CUDA caching allocator at this many GiB (e.g. 80 on a larger GPU), so
    /// that the largest micro-batch found fits that GPU.
    #[arg(long)]
    pub memory_limit_gib: Option<f64>,
}

pub fn execute(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Presets { json } => {
            presets(json);
            Ok(())
        }
        Command::Resolve { manifest } => {
            let run = crds::manifest::from_file(&manifest)?;
            let config = crds::resolve(&run).map_err(|e| Error::InvalidSpec(format!("{}: {e}", manifest.display())))?;
            println!("{}", serde_json::to_string_pretty(&config).expect("RunConfig serializes"));
            Ok(())
        }
        Command::Info => {
            println!("{}", serde_json::to_string_pretty(&crate::torch_info::describe()?).expect("JSON"));
            Ok(())
        }
        Command::Run(args) => crate::local::run(&args),
        Command::Launch(mut args) => {
            if args.node_rank.is_none() {
                args.node_rank =
                    std::env::var(crds::contract::env::JOB_COMPLETION_INDEX).ok().and_then(|v| v.parse().ok());
            }
            crate::local::launch(&args)
        }
        Command::Worker(args) => crate::local::worker(&args),
        Command::Prepare(args) => prepare(args),
        Command::Eval(args) => crate::local::eval(&args),
        Command::Generate(args) => crate::local::generate(&args),
        Command::Export { checkpoint, hf } => crate::local::export(&checkpoint, &hf),
        Command::Bench(args) => {
            let model = preset_arg(&args.shape.preset)?;
            let device = bench_device(args.shape.device.as_deref())?;
            let opts = crate::bench::BenchOptions {
                model,
                micro_batch: args.shape.micro_batch,
                seq: args.shape.seq,
                steps: args.steps,
                warmup: args.warmup,
                precision: parse("precision", &args.shape.precision)?,
                kernels: crate::train::KernelRequest {
                    attention: parse("attention", &args.attention)?,
                    swiglu: if args.swiglu == "auto" { None } else { Some(parse("swiglu", &args.swiglu)?) },
                    rope: if args.rope == "auto" { None } else { Some(parse("rope", &args.rope)?) },
                },
                device,
                gradient_checkpointing: args.gradient_checkpointing,
                checkpointed_blocks: args.checkpointed_blocks,
                ddp: args.ddp,
                loss_chunk: args.loss_chunk,
                cuda_graph: args.cuda_graph,
                memory_limit_gib: args.memory_limit_gib,
            };
            println!("{}", crate::bench::run(&opts)?);
            Ok(())
        }
        Command::BenchKernels(a) => {
            let model = preset_arg(&a.preset)?;
            let device = bench_device(a.device.as_deref())?;
            println!(
                "{}",
                crate::bench::kernels(&model, a.micro_batch, a.seq, parse("precision", &a.precision)?, device)?
            );
            Ok(())
        }
        Command::BenchData(a) => {
            let opts = crate::data::bench::DataBenchOptions {
                data: a.data,
                seq: a.seq,
                micro_batch: a.micro_batch,
                batches: a.batches,
                synthetic_tokens: crds::quantity::parse_tokens(&a.synthetic_tokens)
                    .map_err(|e| Error::InvalidSpec(format!("--synthetic-tokens {}: {e}", a.synthetic_tokens)))?,
            };
            println!("{}", crate::data::bench::run(&opts)?);
            Ok(())
        }
        Command::BenchGenerate(a) => {
            let model = preset_arg(&a.preset)?;
            let device = bench_device(a.device.as_deref())?;
            let opts = crate::grpo::bench::GenerateBenchOptions {
                model,
                device,
                batch: a.batch,
                prompt_tokens: a.prompt_tokens,
                new_tokens: a.new_tokens,
                bf16: device.is_cuda(),
            };
            println!("{}", crate::grpo::bench::run(&opts)?);
            Ok(())
        }
        Command::BenchDdp(a) => {
            let opts = crate::dist::bench::DdpBenchOptions {
                ranks: a.ranks,
                preset: a.preset,
                micro_batch: a.micro_batch,
                seq: a.seq,
                steps: a.steps,
                warmup: a.warmup,
                sizes_mib: a.sizes_mib,
            };
            println!("{}", crate::dist::bench::run(&opts)?);
            Ok(())
        }
        Command::Plot { log, output } => {
            let out = crate::plot::plot_file(&log, output.as_deref())?;
            println!("{}", out.display());
            Ok(())
        }
    }
}

fn prepare(a: PrepareArgs) -> Result<(), Error> {
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
        crate::progress::human_count(r.train_tokens as f64),
        crate::progress::human_count(r.validation_tokens as f64),
        r.shards,
        r.input_bytes as f64 / 1e6,
        r.seconds,
        r.input_bytes as f64 / 1e6 / r.seconds.max(1e-9),
    );
    Ok(())
}

/// A flag value parsed as the manifest spells it (`bf16-mixed`, `flash`, …).
fn parse<T: serde::de::DeserializeOwned>(field: &str, v: &str) -> Result<T, Error> {
    serde_json::from_value(serde_json::Value::String(v.into()))
        .map_err(|_| Error::InvalidSpec(format!("--{field} {v}: not a valid value")))
}

fn presets(json: bool) {
    if !json {
        println!(
            "{:<14} {:<6} {:>6} {:>6} {:>5} {:>4} {:>7} {:>6} {:>14} {:>14} {:>14} {:>10}",
            "preset",
            "arch",
            "layers",
            "dModel",
            "heads",
            "kv",
            "vocab",
            "ctx",
            "params",
            "w/o norms",
            "matmul",
            "GFLOP/tok"
        );
    }
    for p in PRESETS {
        let m = ModelConfig::from(p);
        let c = m.param_counts();
        if json {
            println!(
                "{}",
                serde_json::json!({"preset": p.name, "params": c.total, "params_without_norms": c.without_norms, "matmul_params": c.matmul})
            );
        } else {
            println!(
                "{:<14} {:<6} {:>6} {:>6} {:>5} {:>4} {:>7} {:>6} {:>14} {:>14} {:>14} {:>10.3}",
                p.name,
                format!("{:?}", p.arch).to_lowercase(),
                p.n_layer,
                p.d_model,
                p.n_head,
                p.n_kv_head,
                p.vocab_size,
                p.seq_len,
                c.total,
                c.without_norms,
                c.matmul,
                m.flops_per_token(p.seq_len) / 1e9,
            );
        }
    }
    if !json {
        println!(
            "\nGFLOP/tok = 6·N_matmul + 12·L·H·d_head·T at the preset's context T.\nMFU = tokens/s × FLOP/tok / {:.0} TFLOP/s (H100 bf16 dense peak), as torch_reference.py computes it.",
            H100_PEAK_BF16_FLOPS / 1e12
        );
    }
}

/// `--preset` of the benchmarks.
fn preset_arg(name: &str) -> Result<ModelConfig, Error> {
    crds::presets::preset(name).map(ModelConfig::from).ok_or_else(|| {
        Error::InvalidSpec(format!("--preset {name}: unknown; one of {}", crds::presets::preset_names().join(", ")))
    })
}

/// `--device` of the benchmarks: cpu or cuda, by default cuda when there is one.
fn bench_device(arg: Option<&str>) -> Result<tch::Device, Error> {
    Ok(match arg {
        None if tch::Cuda::is_available() => tch::Device::Cuda(0),
        None | Some("cpu") => tch::Device::Cpu,
        Some("cuda") if tch::Cuda::is_available() => tch::Device::Cuda(0),
        Some("cuda") => {
            return Err(Error::InvalidSpec(
                "--device cuda: no CUDA device is visible (or this trainer was built without the `cuda` feature)"
                    .into(),
            ));
        }
        Some(other) => return Err(Error::InvalidSpec(format!("--device {other}: cpu or cuda"))),
    })
}
