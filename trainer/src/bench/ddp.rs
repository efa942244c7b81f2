//! `trainer bench-ddp`: what data parallelism costs on this machine. Ranks are
//! threads of this process talking Gloo over loopback, each with one intra-op thread,
//! so N ranks use N cores as N pods would.
//!
//! 1. All-reduce bandwidth for a range of message sizes (algorithm and bus bandwidth,
//!    as nccl-tests reports them).
//! 2. The training step of N ranks over 1 rank at the same per-rank batch: the
//!    ratio is DDP's overhead (1.0 is free).
//! 3. `parallelism: zero1`, `zero2` and `fsdp` against ddp on N ranks: the step time ratio,
//!    the bytes of optimizer state each rank holds, and each rank's tensor memory
//!    between steps and at the step's peak (libtorch's CPU allocator, counted per rank).

use std::time::Instant;

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::dist::loopback::{gloo, on_ranks};
use crate::dist::{Placement, ProcessGroup, ReduceOp};
use crate::train::{RunOptions, Trainer};
use crds::types::Parallelism;

#[derive(Clone, Debug)]
pub struct DdpBenchOptions {
    pub ranks: u32,
    pub preset: String,
    pub micro_batch: u32,
    pub seq: u32,
    pub steps: u32,
    pub warmup: u32,
    /// All-reduce message sizes, MiB.
    pub sizes_mib: Vec<f64>,
    /// Sharded strategies to compare with ddp.
    pub strategies: Vec<Parallelism>,
}

/// Median seconds of one all-reduce of `numel` f32 over the group.
fn time_allreduce(group: &ProcessGroup, numel: i64, reps: u32) -> Result<f64, Error> {
    let t = Tensor::f_ones([numel], (Kind::Float, Device::Cpu))?;
    group.allreduce(&t, ReduceOp::Sum)?.wait()?;
    let mut times = Vec::new();
    for _ in 0..reps {
        group.barrier()?;
        let start = Instant::now();
        group.allreduce(&t, ReduceOp::Sum)?.wait()?;
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(super::step::median(&times).unwrap_or(f64::NAN))
}

/// What each node of a benchmark's manifest trains on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hardware {
    /// CPU ranks in f32.
    Cpu,
    /// One GPU a node, in bf16-mixed.
    Gpu,
}

pub(crate) fn manifest(
    preset: &str,
    nodes: u32,
    micro: u32,
    seq: u32,
    steps: u32,
    parallelism: Parallelism,
    hardware: Hardware,
) -> String {
    let (gpus, precision) = match hardware {
        Hardware::Cpu => (0, "f32"),
        Hardware::Gpu => (1, "bf16-mixed"),
    };
    let per_step = micro as u64 * seq as u64 * nodes as u64;
    format!(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: bench-ddp}}
spec:
  model: {{preset: {preset}, tokenizer: embedded}}
  tokens: "{tokens}"
  data:
    mix:
      - {{name: textbook, weight: 0.5, uri: "embedded:textbook"}}
      - {{name: facts, weight: 0.5, uri: "embedded:facts"}}
  topology: {{nodes: {nodes}, gpusPerNode: {gpus}}}
  batch: {{globalTokens: {per_step}, microBatch: {micro}, seqLength: {seq}}}
  precision: {precision}
  parallelism: {parallelism}
"#,
        tokens = per_step * steps as u64,
        parallelism =
            serde_json::to_value(parallelism).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
    )
}

/// Rank `rank` of `world` local ranks (threads) rendezvousing at 127.0.0.1:`port`,
/// writing to `dir`/`name`, quietly and without sampling.
pub(crate) fn local_rank_options(dir: &std::path::Path, name: &str, rank: u32, world: u32, port: u16) -> RunOptions {
    let placement =
        Placement { rank, local_rank: rank, world_size: world, master_addr: "127.0.0.1".into(), master_port: port };
    RunOptions {
        output_dir: dir.join(name),
        stop_after_steps: None,
        tty: Some(false),
        sample: false,
        init_dir: dir.to_path_buf(),
        placement,
        sync_every: None,
    }
}

/// What rank 0 of a timed run measured.
struct Timed {
    seconds_per_step: f64,
    optimizer_state_bytes: usize,
    /// Tensor bytes held between steps, and at most during the timed steps.
    resident_bytes: i64,
    peak_bytes: i64,
}

/// Rank 0 of an N-rank run after warm-up: mean seconds per optimizer step and its
/// optimizer state, with `threads` trainers running at once (`threads` = N for data
/// parallelism; `threads` > N = 1 runs independent single-rank trainers side by side,
/// the same CPU contention without communication).
fn time_steps(
    o: &DdpBenchOptions,
    world: u32,
    threads: u32,
    parallelism: Parallelism,
    dir: &std::path::Path,
) -> Result<Timed, Error> {
    let yaml = manifest(&o.preset, world, o.micro_batch, o.seq, o.steps + o.warmup, parallelism, Hardware::Cpu);
    let cfg = crds::resolve(&crds::manifest::from_yaml(&yaml, "bench-ddp")?)
        .map_err(|e| Error::InvalidSpec(format!("bench-ddp: {e}")))?;
    on_ranks(threads, |thread, port| {
        let rank = if world == 1 { 0 } else { thread };
        let opts = local_rank_options(dir, &format!("w{world}-t{thread}"), rank, world, port);
        crate::ffi::host_memory_count(true)?;
        let mut t = Trainer::new(&cfg, opts)?;
        for _ in 0..o.warmup.max(1) {
            t.train_step()?;
        }
        crate::ffi::host_memory_reset_peak()?;
        let start = Instant::now();
        for _ in 0..o.steps {
            t.train_step()?;
        }
        let seconds_per_step = start.elapsed().as_secs_f64() / o.steps as f64;
        let memory = crate::ffi::host_memory()?;
        let timed = Timed {
            seconds_per_step,
            optimizer_state_bytes: t.optimizer_state_bytes(),
            resident_bytes: memory.current,
            peak_bytes: memory.peak,
        };
        drop(t);
        crate::ffi::host_memory_count(false)?;
        Ok(timed)
    })
}

pub fn run(o: &DdpBenchOptions) -> Result<Value, Error> {
    if o.ranks < 2 {
        return Err(Error::InvalidSpec("--ranks must be at least 2".into()));
    }
    // One core per rank, as pods would have.
    tch::set_num_threads(1);
    let world = o.ranks;
    let bus_factor = 2.0 * (world as f64 - 1.0) / world as f64;
    let mut allreduce = Vec::new();
    for &mib in &o.sizes_mib {
        let numel = (mib * 1024.0 * 1024.0 / 4.0) as i64;
        let seconds = on_ranks(world, |rank, port| time_allreduce(&gloo(rank, world, port)?, numel, 7))?;
        let bytes = numel as f64 * 4.0;
        let algbw = bytes / seconds / 1e9;
        eprintln!(
            "all-reduce {mib:>6.1} MiB × {world} ranks: {:>8.2} ms, algbw {algbw:.2} GB/s, busbw {:.2} GB/s",
            seconds * 1e3,
            algbw * bus_factor
        );
        allreduce.push(json!({"mib": mib, "ms": seconds * 1e3, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor}));
    }
    let dir = std::env::temp_dir().join(format!("trainer-bench-ddp-{}", std::process::id()));
    let one = time_steps(o, 1, 1, Parallelism::Ddp, &dir)?.seconds_per_step;
    let side_by_side = time_steps(o, 1, world, Parallelism::Ddp, &dir)?.seconds_per_step;
    let ddp = time_steps(o, world, world, Parallelism::Ddp, &dir)?;
    let sharded = o
        .strategies
        .iter()
        .copied()
        .filter(|p| *p != Parallelism::Ddp)
        .map(|p| Ok((p, time_steps(o, world, world, p, &dir)?)))
        .collect::<Result<Vec<_>, Error>>()?;
    let _ = std::fs::remove_dir_all(&dir);
    let many = ddp.seconds_per_step;
    let ratio = many / one;
    eprintln!(
        "step time at micro-batch {} × {} on {}: 1 rank alone {:.1} ms, {world} independent ranks side by side {:.1} ms, \
         {world}-rank DDP {:.1} ms: DDP/1 rank {ratio:.3}, DDP/side by side {:.3}",
        o.micro_batch,
        o.seq,
        o.preset,
        one * 1e3,
        side_by_side * 1e3,
        many * 1e3,
        many / side_by_side
    );
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    let mut strategies = serde_json::Map::new();
    for (p, t) in std::iter::once((Parallelism::Ddp, &ddp)).chain(sharded.iter().map(|(p, t)| (*p, t))) {
        let name = serde_json::to_value(p).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let (time_ratio, state_ratio) = (
            t.seconds_per_step / ddp.seconds_per_step,
            t.optimizer_state_bytes as f64 / ddp.optimizer_state_bytes as f64,
        );
        let (resident_ratio, peak_ratio) =
            (t.resident_bytes as f64 / ddp.resident_bytes as f64, t.peak_bytes as f64 / ddp.peak_bytes as f64);
        eprintln!(
            "{world}-rank {name:<5} step {:>7.1} ms ({time_ratio:.3} of ddp); per rank: optimizer state {:>9} bytes \
             ({state_ratio:.3}), between steps {:.1} MiB ({resident_ratio:.3}), step peak {:.1} MiB ({peak_ratio:.3})",
            t.seconds_per_step * 1e3,
            t.optimizer_state_bytes,
            mib(t.resident_bytes),
            mib(t.peak_bytes),
        );
        strategies.insert(
            name,
            json!({
                "step_ms": t.seconds_per_step * 1e3,
                "step_time_over_ddp": time_ratio,
                "optimizer_state_bytes_per_rank": t.optimizer_state_bytes,
                "optimizer_state_over_ddp": state_ratio,
                "resident_bytes_per_rank": t.resident_bytes,
                "resident_over_ddp": resident_ratio,
                "peak_bytes_per_rank": t.peak_bytes,
                "peak_over_ddp": peak_ratio,
            }),
        );
    }
    Ok(json!({
        "ranks": world,
        "backend": "gloo",
        "allreduce": allreduce,
        "preset": o.preset,
        "micro_batch": o.micro_batch,
        "seq": o.seq,
        "step_ms_1_rank": one * 1e3,
        "step_ms_n_ranks": many * 1e3,
        "step_ms_side_by_side": side_by_side * 1e3,
        "ddp_step_time_ratio": ratio,
        "ddp_over_side_by_side": many / side_by_side,
        "strategies": strategies,
    }))
}
