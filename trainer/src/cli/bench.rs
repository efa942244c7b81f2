//! The benchmark commands: `trainer bench`, `bench-kernels`, `bench-ddp`,
//! `bench-memory`, `bench-data`, `bench-generate` and `bench-checkpoint`.

use std::path::PathBuf;

use crds::presets::ModelConfig;

use crate::Error;

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
    /// Time the KV-cache decoder this many times; the median counts.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Skip the full-prefix loop (the KV cache's baseline) and its comparison.
    #[arg(long)]
    pub no_full_prefix: bool,
    /// The static decoder's cache buckets: a step attends to the cache's slots up to the
    /// next multiple of this, and CUDA graphs are captured once per bucket.
    #[arg(long, default_value_t = 256)]
    pub bucket: i64,
    /// Also write the model as a Hugging Face directory (config.json,
    /// model.safetensors) with generate.json: the prompts and the greedy tokens
    /// decoded, for Hugging Face's `generate` to decode the same.
    #[arg(long)]
    pub hf_dir: Option<PathBuf>,
    /// A `trainer run` checkpoint (or run directory) to decode with, in place of
    /// --preset's random initialisation; the prompts are then the last
    /// --prompt-tokens tokens of the run's validation questions, as GRPO samples them,
    /// and each row where the decoders part reports the top-2 margin there.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct BenchCheckpointArgs {
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    #[arg(long, default_value_t = 1)]
    pub micro_batch: i64,
    #[arg(long, default_value_t = 256)]
    pub seq: i64,
    /// Steps without checkpoints, then as many with.
    #[arg(long, default_value_t = 12)]
    pub steps: u32,
    /// A checkpoint every this many steps.
    #[arg(long, default_value_t = 4)]
    pub every: u32,
    /// A directory on the disk being measured: the checkpoints go to a scratch
    /// directory inside it, removed afterwards.
    #[arg(long)]
    pub dir: PathBuf,
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
    /// Sharded strategies to compare with ddp.
    #[arg(long, value_delimiter = ',', default_value = "zero1,zero2,fsdp")]
    pub parallelism: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct BenchMemoryArgs {
    #[arg(long, value_delimiter = ',', default_value = "nano,micro,tiny")]
    pub presets: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    pub micro_batches: Vec<u32>,
    #[arg(long, default_value_t = 256)]
    pub seq: u32,
    /// Ranks (threads over Gloo) on the CPU; CUDA measures one rank on GPU 0
    /// [default: 2 on the CPU, 1 on CUDA].
    #[arg(long)]
    pub ranks: Option<u32>,
    /// Strategies to measure.
    #[arg(long, value_delimiter = ',', default_value = "ddp,zero1")]
    pub parallelism: Vec<String>,
    /// Measure without and with gradient checkpointing, or only one of them.
    #[arg(long, value_delimiter = ',', default_value = "false,true")]
    pub checkpointing: Vec<bool>,
    /// cpu (f32, the CPU allocator) or cuda (bf16-mixed, the caching allocator).
    #[arg(long, default_value = "cpu")]
    pub device: String,
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
    /// The residual RMSNorm's kernels: auto, composed (eager's add and rms_norm, also
    /// what eager means here) or fused (the row kernels, CUDA).
    #[arg(long, default_value = "auto")]
    pub norm: String,
    /// The loss chunk's kernels: auto, composed (ATen's ops on an f32 copy, in place, also
    /// what eager means here) or fused (one row kernel, CUDA).
    #[arg(long, default_value = "auto")]
    pub loss: String,
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
    /// Count host tensor memory at the CPU allocator, from before the model is built:
    /// `host_peak_bytes` is the most the timed steps hold (parameters, gradients,
    /// optimizer state and activations), `host_resident_bytes` what stays between steps.
    #[arg(long)]
    pub host_memory: bool,
    /// With --host-memory: fail as out of memory when the host tensors would hold more
    /// than this many GiB, as on a machine with that much.
    #[arg(long)]
    pub host_memory_limit_gib: Option<f64>,
    /// Pack documents of about this many tokens into each window, each attending only
    /// within itself (`spec.data.packing: documents`): the step's cost against one
    /// sequence a window. The packed logits are first checked against each document's
    /// alone (`documents_max_rel_diff`).
    #[arg(long)]
    pub documents: Option<i64>,
}

/// `trainer bench`.
pub fn step(args: BenchArgs) -> Result<(), Error> {
    let model = preset_arg(&args.shape.preset)?;
    let device = bench_device(args.shape.device.as_deref())?;
    let opts = crate::bench::step::BenchOptions {
        model,
        micro_batch: args.shape.micro_batch,
        seq: args.shape.seq,
        steps: args.steps,
        warmup: args.warmup,
        precision: parse("precision", &args.shape.precision)?,
        kernels: crate::kernels::choice::KernelRequest {
            attention: parse("attention", &args.attention)?,
            swiglu: if args.swiglu == "auto" { None } else { Some(parse("swiglu", &args.swiglu)?) },
            rope: if args.rope == "auto" { None } else { Some(parse("rope", &args.rope)?) },
            norm: if args.norm == "auto" { None } else { Some(parse("norm", &args.norm)?) },
            loss: if args.loss == "auto" { None } else { Some(parse("loss", &args.loss)?) },
        },
        device,
        gradient_checkpointing: args.gradient_checkpointing,
        checkpointed_blocks: args.checkpointed_blocks,
        ddp: args.ddp,
        loss_chunk: args.loss_chunk,
        cuda_graph: args.cuda_graph,
        memory_limit_gib: args.memory_limit_gib,
        host_memory: args.host_memory,
        host_memory_limit: args.host_memory_limit_gib.map(|g| (g * (1u64 << 30) as f64) as u64),
        documents: args.documents,
    };
    println!("{}", crate::bench::step::run(&opts)?);
    Ok(())
}

/// `trainer bench-kernels`.
pub fn kernels(a: BenchShape) -> Result<(), Error> {
    let model = preset_arg(&a.preset)?;
    let device = bench_device(a.device.as_deref())?;
    println!(
        "{}",
        crate::bench::kernels::run(&model, a.micro_batch, a.seq, parse("precision", &a.precision)?, device)?
    );
    Ok(())
}

/// `trainer bench-data`.
pub fn data(a: BenchDataArgs) -> Result<(), Error> {
    let opts = crate::bench::data::DataBenchOptions {
        data: a.data,
        seq: a.seq,
        micro_batch: a.micro_batch,
        batches: a.batches,
        synthetic_tokens: crds::quantity::parse_tokens(&a.synthetic_tokens)
            .map_err(|e| Error::InvalidSpec(format!("--synthetic-tokens {}: {e}", a.synthetic_tokens)))?,
    };
    println!("{}", crate::bench::data::run(&opts)?);
    Ok(())
}

/// `trainer bench-generate`.
pub fn generate(a: BenchGenerateArgs) -> Result<(), Error> {
    let (model, trained) = match &a.checkpoint {
        Some(dir) => {
            let (cfg, trained) = super::inspect::trained_prompts(dir, a.batch, a.prompt_tokens)?;
            (cfg.model, Some(trained))
        }
        None => (preset_arg(&a.preset)?, None),
    };
    let device = bench_device(a.device.as_deref())?;
    let opts = crate::bench::generate::GenerateBenchOptions {
        model,
        trained,
        device,
        batch: a.batch,
        prompt_tokens: a.prompt_tokens,
        new_tokens: a.new_tokens,
        bf16: device.is_cuda(),
        repeats: a.repeats,
        bucket: a.bucket,
        full_prefix: !a.no_full_prefix,
        hf_dir: a.hf_dir,
    };
    println!("{}", crate::bench::generate::run(&opts)?);
    Ok(())
}

/// `trainer bench-checkpoint`.
pub fn checkpoint(a: BenchCheckpointArgs) -> Result<(), Error> {
    let opts = crate::bench::checkpoint::CheckpointBenchOptions {
        model: preset_arg(&a.preset)?,
        micro_batch: a.micro_batch,
        seq: a.seq,
        steps: a.steps,
        every: a.every,
        dir: a.dir,
    };
    println!("{}", crate::bench::checkpoint::run(&opts)?);
    Ok(())
}

/// `trainer bench-ddp`.
pub fn ddp(a: BenchDdpArgs) -> Result<(), Error> {
    let strategies = parallelism_args(&a.parallelism)?;
    let opts = crate::bench::ddp::DdpBenchOptions {
        strategies,
        ranks: a.ranks,
        preset: a.preset,
        micro_batch: a.micro_batch,
        seq: a.seq,
        steps: a.steps,
        warmup: a.warmup,
        sizes_mib: a.sizes_mib,
    };
    println!("{}", crate::bench::ddp::run(&opts)?);
    Ok(())
}

/// `--parallelism` of the benchmarks: spec.parallelism values.
fn parallelism_args(names: &[String]) -> Result<Vec<crds::types::Parallelism>, Error> {
    names
        .iter()
        .map(|p| {
            serde_json::from_value(serde_json::Value::String(p.clone()))
                .map_err(|_| Error::InvalidSpec(format!("--parallelism {p}: one of ddp, zero1, zero2, fsdp")))
        })
        .collect()
}

/// `trainer bench-memory`.
pub fn memory(a: BenchMemoryArgs) -> Result<(), Error> {
    use crate::bench::memory::{Grid, run};
    let strategies = parallelism_args(&a.parallelism)?;
    let hardware = match bench_device(Some(&a.device))? {
        tch::Device::Cpu => crate::bench::ddp::Hardware::Cpu,
        _ => crate::bench::ddp::Hardware::Gpu,
    };
    let ranks = a.ranks.unwrap_or(if hardware == crate::bench::ddp::Hardware::Cpu { 2 } else { 1 });
    let grid = Grid {
        presets: &a.presets,
        micro_batches: &a.micro_batches,
        seq: a.seq,
        ranks,
        strategies: &strategies,
        checkpointing: &a.checkpointing,
        hardware,
    };
    println!("{}", run(&grid)?);
    Ok(())
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

/// A flag value parsed as the manifest spells it (`bf16-mixed`, `flash`, …).
fn parse<T: serde::de::DeserializeOwned>(field: &str, v: &str) -> Result<T, Error> {
    serde_json::from_value(serde_json::Value::String(v.into()))
        .map_err(|_| Error::InvalidSpec(format!("--{field} {v}: not a valid value")))
}
