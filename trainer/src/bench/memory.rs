//! `trainer bench-memory`: the memory planner ([`crds::plan`]) against what libtorch's
//! CPU allocator hands out during a training step. Ranks are threads of this process
//! talking Gloo over loopback; each counts its own allocations
//! ([`crate::ffi::host_memory_count`]) from before its trainer is built, so the peak
//! holds parameters, optimizer state and buffers as well as the step's activations.
//! The measured step is the second (the first builds lazily made state).

use serde_json::{Value, json};

use crate::Error;
use crate::dist::loopback::on_ranks;
use crate::ffi;
use crate::train::Trainer;
use crds::types::Parallelism;

/// One configuration to plan and measure.
#[derive(Clone, Debug)]
pub struct MemoryCase {
    pub preset: String,
    pub ranks: u32,
    pub micro_batch: u32,
    pub seq: u32,
    pub checkpointing: bool,
    pub parallelism: Parallelism,
}

/// The planner's step peak and the allocator's, for rank 0.
#[derive(Clone, Debug)]
pub struct MemoryResult {
    pub case: MemoryCase,
    pub planned: u64,
    pub measured: u64,
    /// Held between steps, measured.
    pub resident: u64,
}

impl MemoryResult {
    /// planned / measured.
    pub fn ratio(&self) -> f64 {
        self.planned as f64 / self.measured as f64
    }
}

fn config(c: &MemoryCase) -> Result<crds::config::RunConfig, Error> {
    let mut yaml = super::ddp::manifest(&c.preset, c.ranks, c.micro_batch, c.seq, 2, c.parallelism);
    if c.checkpointing {
        yaml.push_str("  gradientCheckpointing: true\n");
    }
    crds::resolve(&crds::manifest::from_yaml(&yaml, "bench-memory")?)
        .map_err(|e| Error::InvalidSpec(format!("bench-memory: {e}")))
}

/// Plans and measures `c`.
pub fn measure(c: &MemoryCase) -> Result<MemoryResult, Error> {
    let cfg = config(c)?;
    let planned = crds::plan::plan(&cfg).step_peak();
    let dir = std::env::temp_dir().join(format!("trainer-bench-memory-{}", std::process::id()));
    let world = c.ranks;
    let (measured, resident) = on_ranks(world, |rank, port| {
        let opts = super::ddp::local_rank_options(&dir, &format!("r{rank}"), rank, world, port);
        ffi::host_memory_count(true)?;
        let mut t = Trainer::new(&cfg, opts)?;
        t.train_step()?;
        let resident = ffi::host_memory()?.current;
        ffi::host_memory_reset_peak()?;
        t.train_step()?;
        let peak = ffi::host_memory()?.peak;
        drop(t);
        ffi::host_memory_count(false)?;
        Ok((peak as u64, resident as u64))
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(MemoryResult { case: c.clone(), planned, measured, resident })
}

/// Every case of `presets` × `micro_batches` × with and without checkpointing ×
/// `strategies`, printed as a table on stderr as they finish; the JSON lists them.
pub fn run(
    presets: &[String],
    micro_batches: &[u32],
    seq: u32,
    ranks: u32,
    strategies: &[Parallelism],
) -> Result<Value, Error> {
    tch::set_num_threads(1);
    eprintln!(
        "| preset | micro-batch | checkpointing | parallelism | planned MiB | measured MiB | planned / measured |"
    );
    eprintln!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for preset in presets {
        for &micro_batch in micro_batches {
            for checkpointing in [false, true] {
                for &parallelism in strategies {
                    let case =
                        MemoryCase { preset: preset.clone(), ranks, micro_batch, seq, checkpointing, parallelism };
                    let r = measure(&case)?;
                    let name = serde_json::to_value(parallelism).unwrap_or_default();
                    let mib = |b: u64| b as f64 / (1 << 20) as f64;
                    eprintln!(
                        "| {preset} | {micro_batch} × {seq} | {} | {} | {:.1} | {:.1} | {:.3} |",
                        if checkpointing { "yes" } else { "no" },
                        name.as_str().unwrap_or_default(),
                        mib(r.planned),
                        mib(r.measured),
                        r.ratio()
                    );
                    rows.push(json!({
                        "preset": preset, "micro_batch": micro_batch, "seq": seq, "ranks": ranks,
                        "checkpointing": checkpointing, "parallelism": name,
                        "planned_bytes": r.planned, "measured_bytes": r.measured, "resident_bytes": r.resident,
                        "planned_over_measured": r.ratio(),
                    }));
                }
            }
        }
    }
    let worst =
        rows.iter().filter_map(|r| r["planned_over_measured"].as_f64()).map(|x| (x - 1.0).abs()).fold(0.0, f64::max);
    Ok(json!({"cases": rows, "worst_relative_error": worst}))
}
