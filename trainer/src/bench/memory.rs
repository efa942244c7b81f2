//! `trainer bench-memory`: the memory planner ([`crds::plan`]) against what libtorch's
//! allocator hands out during a training step.
//!
//! On the CPU, ranks are threads of this process talking Gloo over loopback; each
//! counts its own allocations ([`crate::ffi::host_memory_count`]) from before its
//! trainer is built, so the peak holds parameters, optimizer state and buffers as well
//! as the step's activations. On CUDA, one rank trains in bf16-mixed on GPU 0 and the
//! peak is the caching allocator's (`torch.cuda.max_memory_allocated`'s counterpart),
//! which holds the same. The measured step is the second (the first builds lazily made
//! state).

use serde_json::{Value, json};

pub use super::ddp::Hardware;
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
    pub hardware: Hardware,
}

/// The planner's step peak and the allocator's, for rank 0.
#[derive(Clone, Debug)]
pub struct MemoryResult {
    pub case: MemoryCase,
    pub planned: u64,
    pub measured: u64,
    /// Held between steps, measured.
    pub resident: u64,
    /// On CUDA: the planner's device total (the step peak and its allowance) and what
    /// the caching allocator had reserved from the driver after the step.
    pub device: Option<DeviceTotals>,
}

/// A GPU's whole use: planned with the allowance, and reserved by the allocator.
#[derive(Clone, Copy, Debug)]
pub struct DeviceTotals {
    pub planned: u64,
    pub reserved: u64,
}

impl MemoryResult {
    /// planned / measured.
    pub fn ratio(&self) -> f64 {
        self.planned as f64 / self.measured as f64
    }
}

fn config(c: &MemoryCase) -> Result<crds::config::RunConfig, Error> {
    let mut yaml = super::ddp::manifest(&c.preset, c.ranks, c.micro_batch, c.seq, 2, c.parallelism, c.hardware);
    if c.checkpointing {
        yaml.push_str("  gradientCheckpointing: true\n");
    }
    crds::resolve(&crds::manifest::from_yaml(&yaml, "bench-memory")?)
        .map_err(|e| Error::InvalidSpec(format!("bench-memory: {e}")))
}

/// Plans and measures `c`.
pub fn measure(c: &MemoryCase) -> Result<MemoryResult, Error> {
    let cfg = config(c)?;
    let plan = crds::plan::plan(&cfg);
    let planned = plan.step_peak();
    if c.hardware == Hardware::Gpu {
        return measure_cuda(c, &cfg, planned, plan.needed());
    }
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
    Ok(MemoryResult { case: c.clone(), planned, measured, resident, device: None })
}

/// One rank on GPU 0, measured at the caching allocator.
#[cfg(feature = "cuda")]
fn measure_cuda(
    c: &MemoryCase,
    cfg: &crds::config::RunConfig,
    planned: u64,
    planned_device: u64,
) -> Result<MemoryResult, Error> {
    if c.ranks != 1 {
        return Err(Error::InvalidSpec(format!("--ranks {}: on CUDA bench-memory runs one rank, on GPU 0", c.ranks)));
    }
    if !tch::Cuda::is_available() {
        return Err(Error::InvalidSpec("--device cuda: no CUDA device is visible".into()));
    }
    let dir = std::env::temp_dir().join(format!("trainer-bench-memory-{}", std::process::id()));
    let opts = super::ddp::local_rank_options(&dir, "r0", 0, 1, crate::dist::free_port()?);
    let counters = || -> Result<ffi::CudaMemory, Error> {
        tch::Cuda::synchronize(0);
        ffi::cuda_memory(0)
    };
    let mut t = Trainer::new(cfg, opts)?;
    t.train_step()?;
    let resident = counters()?.allocated;
    ffi::cuda_reset_peak_memory(0)?;
    t.train_step()?;
    let after = counters()?;
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(MemoryResult {
        case: c.clone(),
        planned,
        measured: after.peak_allocated as u64,
        resident: resident as u64,
        device: Some(DeviceTotals { planned: planned_device, reserved: after.reserved as u64 }),
    })
}

#[cfg(not(feature = "cuda"))]
fn measure_cuda(_: &MemoryCase, _: &crds::config::RunConfig, _: u64, _: u64) -> Result<MemoryResult, Error> {
    Err(Error::InvalidSpec("--device cuda: this trainer was built without the `cuda` feature".into()))
}

/// The cases `trainer bench-memory` measures: every combination.
#[derive(Clone, Copy, Debug)]
pub struct Grid<'a> {
    pub presets: &'a [String],
    pub micro_batches: &'a [u32],
    pub seq: u32,
    pub ranks: u32,
    pub strategies: &'a [Parallelism],
    /// Without gradient checkpointing (`false`), with it (`true`), or both.
    pub checkpointing: &'a [bool],
    pub hardware: Hardware,
}

/// Every case of the grid, printed as a table on stderr as they finish; the JSON lists
/// them.
pub fn run(g: &Grid) -> Result<Value, Error> {
    let Grid { presets, micro_batches, seq, ranks, strategies, checkpointing: with_checkpointing, hardware } = *g;
    tch::set_num_threads(1);
    eprintln!(
        "| preset | micro-batch | checkpointing | parallelism | planned MiB | measured MiB | planned / measured |"
    );
    eprintln!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for preset in presets {
        for &micro_batch in micro_batches {
            for &checkpointing in with_checkpointing {
                for &parallelism in strategies {
                    let case = MemoryCase {
                        preset: preset.clone(),
                        ranks,
                        micro_batch,
                        seq,
                        checkpointing,
                        parallelism,
                        hardware,
                    };
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
                        "device": if hardware == Hardware::Gpu { "cuda" } else { "cpu" },
                        "planned_device_bytes": r.device.map(|d| d.planned),
                        "reserved_bytes": r.device.map(|d| d.reserved),
                    }));
                }
            }
        }
    }
    let worst =
        rows.iter().filter_map(|r| r["planned_over_measured"].as_f64()).map(|x| (x - 1.0).abs()).fold(0.0, f64::max);
    Ok(json!({"cases": rows, "worst_relative_error": worst}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(hardware: Hardware) -> MemoryCase {
        MemoryCase {
            preset: "medium-large".into(),
            ranks: 1,
            micro_batch: 8,
            seq: 2048,
            checkpointing: false,
            parallelism: Parallelism::Ddp,
            hardware,
        }
    }

    #[test]
    fn a_gpu_case_is_planned_as_one_cuda_rank_in_bf16_mixed_with_the_allowance() {
        let gpu = config(&case(Hardware::Gpu)).unwrap();
        assert_eq!(gpu.topology.device, crds::config::Device::Cuda);
        assert_eq!(gpu.precision, crds::types::Precision::Bf16Mixed);
        let plan = crds::plan::plan(&gpu);
        assert_eq!(plan.needed() - plan.step_peak(), crds::plan::CUDA_ALLOWANCE_BYTES);

        let cpu = config(&case(Hardware::Cpu)).unwrap();
        assert_eq!((cpu.topology.device, cpu.precision), (crds::config::Device::Cpu, crds::types::Precision::F32));
        assert_eq!(crds::plan::plan(&cpu).needed(), crds::plan::plan(&cpu).step_peak());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_gpu_case_without_the_cuda_feature_is_refused_naming_the_flag() {
        let e = measure(&case(Hardware::Gpu)).unwrap_err().to_string();
        assert!(e.contains("--device cuda"), "{e}");
    }
}
