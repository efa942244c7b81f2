//! The `trainer` commands: [`Command`] and its dispatch. Each group of commands has
//! its file: training ([`train`]: run, launch, worker), inspecting checkpoints
//! ([`inspect`]: eval, generate, export), [`prepare`] and the benchmarks ([`bench`]).

pub mod bench;
pub mod inspect;
pub mod plan;
pub mod prepare;
pub mod train;
pub mod worker_spec;

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
    /// Plan a run's memory per rank before launching it: parameters, gradients,
    /// optimizer state, autocast copies, activations, the loss chunk, buffers and the
    /// CUDA allowance. With --gpu-memory (or the spec's topology.gpuMemory) it exits
    /// non-zero when the run does not fit, naming the changes that would make it fit.
    Plan {
        /// TrainingRun YAML file.
        manifest: PathBuf,
        /// Memory of each GPU, e.g. 48GiB or 80Gi [default: the spec's topology.gpuMemory].
        #[arg(long)]
        gpu_memory: Option<String>,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Report the libtorch build: CUDA, cuDNN, threads, and a bf16 matmul check per device.
    Info,
    /// Train a TrainingRun manifest locally: resolve it as the operator does, then
    /// train, checkpoint into the output directory and resume from it when rerun.
    Run(train::RunArgs),
    /// The pod's entrypoint, like torchrun: start this node's workers (one per GPU, or
    /// the run's processes per node on CPU) with RANK, LOCAL_RANK and WORLD_SIZE,
    /// forward SIGTERM, and exit with the first failed worker's code and message.
    Launch(train::LaunchArgs),
    /// One rank of a run, as `trainer launch` starts it (placement from RANK,
    /// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT).
    #[command(hide = true)]
    Worker(train::WorkerArgs),
    /// Tokenize text into shards for training: jsonl (`--field`), Parquet (a text
    /// column), plain text files and directories, or MedQA-USMLE jsonl. Writes
    /// train/validation shards, manifest.json and tokenizer.json to the output directory.
    Prepare(prepare::PrepareArgs),
    /// Validation loss and perplexity of a checkpoint per data source (`--task loss`), or
    /// its multiple-choice accuracy on held-out questions (`--task mcq`): greedy answer
    /// letter and log-likelihood of the four letters.
    Eval(inspect::EvalArgs),
    /// Sample text from a checkpoint.
    Generate(inspect::GenerateArgs),
    /// Write a checkpoint as a Hugging Face model directory.
    Export {
        /// A run's output directory or one checkpoint directory.
        checkpoint: PathBuf,
        /// Output directory for config.json and model.safetensors.
        #[arg(long)]
        hf: PathBuf,
        /// Export the run's checkpoint of lowest validation loss (`best`, kept by
        /// spec.checkpoint.keepBest) rather than its newest.
        #[arg(long)]
        best: bool,
    },
    /// Time the training step like `torch_reference.py` and print the same JSON fields.
    ///
    /// MFU = tokens/s × (6·N_matmul + 12·L·n_head·d_head·T) / 989e12, where N_matmul
    /// counts every Linear weight (lm_head included, input embedding excluded).
    Bench(bench::BenchArgs),
    /// One layer's SwiGLU and RoPE on each kernel set (eager, composed and, on CUDA,
    /// fused), forward and backward on the preset's shapes, each checked against f32 as a
    /// run's trial checks it, with its speed against eager measured in the same run.
    BenchKernels(bench::BenchShape),
    /// What data parallelism costs here: Gloo all-reduce bandwidth between local
    /// ranks, and the step time of N ranks over 1 at the same per-rank batch.
    BenchDdp(bench::BenchDdpArgs),
    /// The memory planner against the allocator: each case's planned step peak per rank
    /// and the peak libtorch's allocator handed out: the CPU's on local ranks, or CUDA's
    /// caching allocator on one GPU.
    BenchMemory(bench::BenchMemoryArgs),
    /// How fast one core serves training batches from mmap shards through the mix
    /// (synthetic 45/25/20/10 shards unless --data is given).
    BenchData(bench::BenchDataArgs),
    /// GRPO's sampler: batched decoding with the KV cache against the full-prefix loop,
    /// greedy, same model and prompts (random weights of the preset).
    BenchGenerate(bench::BenchGenerateArgs),
    /// What a periodic background checkpoint (model and AdamW state) costs the training
    /// loop on the CPU: steps without and with checkpoints, the save call, the snapshot
    /// wait before the next optimizer step, and a synchronous save for scale.
    BenchCheckpoint(bench::BenchCheckpointArgs),
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
        Command::Plan { manifest, gpu_memory, json } => plan::plan(&manifest, gpu_memory.as_deref(), json),
        Command::Info => {
            println!("{}", serde_json::to_string_pretty(&crate::torch_info::describe()?).expect("JSON"));
            Ok(())
        }
        Command::Run(args) => train::run(&args),
        Command::Launch(mut args) => {
            if args.node_rank.is_none() {
                args.node_rank =
                    std::env::var(crds::contract::env::JOB_COMPLETION_INDEX).ok().and_then(|v| v.parse().ok());
            }
            train::launch(&args)
        }
        Command::Worker(args) => train::worker(&args),
        Command::Prepare(args) => prepare::prepare(args),
        Command::Eval(args) => inspect::eval(&args),
        Command::Generate(args) => inspect::generate(&args),
        Command::Export { checkpoint, hf, best } => inspect::export(&checkpoint, &hf, best),
        Command::Bench(args) => bench::step(args),
        Command::BenchKernels(a) => bench::kernels(a),
        Command::BenchData(a) => bench::data(a),
        Command::BenchGenerate(a) => bench::generate(a),
        Command::BenchDdp(a) => bench::ddp(a),
        Command::BenchMemory(a) => bench::memory(a),
        Command::BenchCheckpoint(a) => bench::checkpoint(a),
        Command::Plot { log, output } => {
            let out = crate::plot::plot_file(&log, output.as_deref())?;
            println!("{}", out.display());
            Ok(())
        }
    }
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
