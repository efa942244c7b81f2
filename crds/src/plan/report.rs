//! The plan as a table, whether it fits a GPU, and what would make it fit.

use std::fmt::Write;

use super::estimate::{GIB, MemoryPlan, plan};
use crate::config::RunConfig;
use crate::types::Parallelism;

/// A change to the spec and the bytes per rank it saves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remedy {
    /// The spec field and its new value, as a user would write it.
    pub change: String,
    pub saves: u64,
}

/// `bytes` in GiB with one decimal, as the messages print it.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

impl MemoryPlan {
    /// Whether the plan fits a device of `gpu_memory` bytes.
    pub fn fits(&self, gpu_memory: u64) -> bool {
        self.needed() <= gpu_memory
    }

    /// The table `trainer plan` prints.
    pub fn table(&self, gpu_memory: Option<u64>) -> String {
        let u = &self.peak;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "memory per rank: {} rank{}, parallelism {}, micro-batch {} × {}, {} recomputed block{}; peak at the {}",
            self.world_size,
            if self.world_size == 1 { "" } else { "s" },
            parallelism_name(self.parallelism),
            self.micro_batch,
            self.seq_len,
            self.recomputed_blocks,
            if self.recomputed_blocks == 1 { "" } else { "s" },
            self.phase.name()
        );
        let rows: [(&str, u64, String); 9] = [
            ("parameters", u.parameters, String::new()),
            ("gradients", u.gradients, "with the reducer's buckets or shards".into()),
            ("optimizer state", u.optimizer_state, "AdamW's two moments".into()),
            ("autocast weights", u.autocast_weights, "bf16 copies for one forward and backward".into()),
            (
                "activations",
                u.activations,
                format!(
                    "saved for backward; {} without checkpointing, {} with every block recomputed",
                    gib(self.activations_without_checkpointing),
                    gib(self.activations_with_checkpointing)
                ),
            ),
            ("loss chunk", u.loss, "logits becoming their gradient in place, the hidden states' gradient".into()),
            ("all-gather buffers", u.buffers, String::new()),
            ("step peak", self.step_peak(), String::new()),
            ("CUDA allowance", self.allowance, "context, workspaces, NCCL, allocator slack".into()),
        ];
        for (name, bytes, note) in rows {
            let line = format!("  {name:<20} {:>10}  {note}", gib(bytes));
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let _ = write!(out, "  {:<20} {:>10}", "needed", gib(self.needed()));
        if let Some(have) = gpu_memory {
            let verdict = if self.fits(have) { "fits" } else { "does not fit" };
            let _ = write!(out, "  of {} per GPU: {verdict}", gib(have));
        }
        out.push('\n');
        out
    }
}

fn parallelism_name(p: Parallelism) -> &'static str {
    match p {
        Parallelism::Ddp => "ddp",
        Parallelism::Zero1 => "zero1",
        Parallelism::Zero2 => "zero2",
        Parallelism::Fsdp => "fsdp",
    }
}

/// Changes to `cfg` that lower its per-rank need, each alone, largest saving first:
/// a stronger sharding, recomputing every block, half the micro-batch (with twice the
/// accumulation, so a step trains the same tokens).
pub fn remedies(cfg: &RunConfig) -> Vec<Remedy> {
    let needed = plan(cfg).needed();
    let mut candidates: Vec<(String, RunConfig)> = Vec::new();
    if cfg.topology.world_size > 1 {
        for p in [Parallelism::Zero1, Parallelism::Zero2, Parallelism::Fsdp] {
            if p == Parallelism::Fsdp && cfg.grpo.is_some() {
                continue;
            }
            if p as u8 > cfg.parallelism as u8 {
                let mut c = cfg.clone();
                c.parallelism = p;
                candidates.push((format!("spec.parallelism: {}", parallelism_name(p)), c));
            }
        }
    }
    if cfg.recomputed_blocks() < cfg.model.n_layer {
        let mut c = cfg.clone();
        c.gradient_checkpointing = true;
        c.checkpointed_blocks = None;
        candidates.push(("spec.gradientCheckpointing: true".into(), c));
    }
    if cfg.batch.micro_batch > 1 {
        let mut c = cfg.clone();
        c.batch.micro_batch /= 2;
        c.batch.grad_accum *= 2;
        candidates.push((format!("spec.batch.microBatch: {}", c.batch.micro_batch), c));
    }
    let mut out: Vec<Remedy> = candidates
        .into_iter()
        .filter_map(|(change, c)| {
            let saves = needed.saturating_sub(plan(&c).needed());
            (saves > 0).then_some(Remedy { change, saves })
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.saves));
    out
}

/// Why `cfg` does not fit `gpu_memory` bytes per GPU, with its remedies; `None` when
/// it fits.
pub fn shortfall(cfg: &RunConfig, gpu_memory: u64) -> Option<String> {
    let p = plan(cfg);
    if p.fits(gpu_memory) {
        return None;
    }
    let mut message = format!("needs {} per GPU, has {}", gib(p.needed()), gib(gpu_memory));
    let fixes = remedies(cfg);
    if !fixes.is_empty() {
        let list: Vec<String> = fixes.iter().map(|r| format!("{} saves {}", r.change, gib(r.saves))).collect();
        let _ = write!(message, "; {}", list.join(", "));
    }
    Some(message)
}
