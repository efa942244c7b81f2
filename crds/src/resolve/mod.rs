//! `resolve`: TrainingRun spec → RunConfig, pure and planner-free. Every rule the CRD's
//! CEL enforces is checked here too, so `trainer run` on a laptop rejects what the API
//! server would; [`crate::admit`] adds the memory plan's check.

use crate::config::*;
use crate::presets::{self, Arch, EMBEDDED_VOCAB_SIZE, ModelConfig};
use crate::quantity::format_tokens;
use crate::types::*;

mod datasets;
mod errors;
mod failure;
mod grpo;
mod sources;

pub use datasets::{named_datasets, ready_uri, with_datasets};
use errors::{Errors, check_name};
pub use errors::{FieldError, InvalidSpec, MAX_NAME_LEN};
use failure::resolve_failure;
use grpo::resolve_grpo;
pub use sources::parse_location_str;
use sources::{check_keep_best, parse_location, resolve_checkpoint, resolve_data, resolve_init};

/// Resolves a TrainingRun into the exact configuration the trainer runs, without the
/// memory check [`crate::admit::resolve`] adds: what `trainer plan` shows a run that
/// does not fit.
pub fn resolve_unplanned(run: &TrainingRun) -> Result<RunConfig, InvalidSpec> {
    let mut e = Errors::default();
    let name = run.metadata.name.clone().unwrap_or_default();
    check_name(&mut e, "metadata.name", &name);
    let spec = &run.spec;

    let model = resolve_model(&mut e, spec);
    let topology = resolve_topology(&mut e, spec);
    let budget = e.tokens("spec.tokens", &spec.tokens);
    let (batch, tokens_per_step) = resolve_batch(&mut e, spec, model.as_ref(), topology.as_ref());
    let schedule = resolve_schedule(&mut e, spec, budget, tokens_per_step);
    let optimizer = resolve_optimizer(&mut e, &spec.optimizer);
    let data = resolve_data(&mut e, spec);
    let tokenizer = resolve_tokenizer(&mut e, &spec.model, model.as_ref());
    let checkpoint = resolve_checkpoint(&mut e, &spec.checkpoint, spec.topology.nodes);
    check_keep_best(&mut e, spec, data.as_ref());
    let init_from = resolve_init(&mut e, spec, &name);
    let grpo = resolve_grpo(&mut e, spec, topology.as_ref(), batch.as_ref());
    let failure = resolve_failure(&mut e, &spec.failure_policy, spec.checkpoint.every_steps);
    if let Some(q) = &spec.queue_name {
        check_label_value(&mut e, "spec.queueName", q);
    }
    for (i, var) in spec.env.iter().enumerate() {
        if crate::contract::env::RESERVED.contains(&var.name.as_str()) {
            e.add(
                format!("spec.env[{i}].name"),
                format!("{} is set by the operator and cannot be overridden", var.name),
            );
        }
    }
    if let Some(n) = spec.checkpointed_blocks {
        if !spec.gradient_checkpointing {
            e.add("spec.checkpointedBlocks", "needs spec.gradientCheckpointing: true");
        } else if n == 0 {
            e.add(
                "spec.checkpointedBlocks",
                "must be at least 1 (to recompute none, set spec.gradientCheckpointing: false)",
            );
        } else if let Some(m) = &model
            && n > m.n_layer
        {
            e.add("spec.checkpointedBlocks", format!("{n} is more than the model's {} blocks", m.n_layer));
        }
    }
    if spec.parallelism == crate::types::Parallelism::Fsdp && spec.phase == crate::types::Phase::Grpo {
        e.add(
            "spec.parallelism",
            "fsdp is for pretraining: GRPO samples from the whole model every step; use ddp, zero1 or zero2",
        );
    }
    if spec.ttl_seconds_after_finished.is_some_and(|t| t < 0) {
        e.add("spec.ttlSecondsAfterFinished", "must not be negative");
    }

    if !e.0.is_empty() {
        return Err(InvalidSpec(e.0));
    }
    let model = model.expect("no errors");
    let params = model.param_counts();
    Ok(RunConfig {
        version: RUN_CONFIG_VERSION,
        name,
        namespace: run.metadata.namespace.clone(),
        phase: spec.phase,
        seed: spec.seed,
        attempt: 1,
        model,
        params,
        tokenizer: tokenizer.expect("no errors"),
        precision: spec.precision,
        parallelism: spec.parallelism,
        attention: spec.attention,
        gradient_checkpointing: spec.gradient_checkpointing,
        checkpointed_blocks: spec.checkpointed_blocks,
        topology: topology.expect("no errors"),
        batch: batch.expect("no errors"),
        schedule: schedule.expect("no errors"),
        optimizer: optimizer.expect("no errors"),
        data,
        checkpoint: checkpoint.expect("no errors"),
        init_from,
        grpo,
        failure: failure.expect("no errors"),
        data_sized_for: None,
        rollbacks: Vec::new(),
    })
}

fn check_label_value(e: &mut Errors, field: &str, v: &str) {
    let ok = v.len() <= 63
        && !v.is_empty()
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
        && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        e.add(field, format!("{v:?} is not a valid label value (at most 63 alphanumerics, '-', '_' or '.')"));
    }
}

fn resolve_model(e: &mut Errors, spec: &TrainingRunSpec) -> Option<ModelConfig> {
    let m = &spec.model;
    let Some(preset) = presets::preset(&m.preset) else {
        e.add(
            "spec.model.preset",
            format!("unknown preset {:?}; known presets: {}", m.preset, presets::preset_names().join(", ")),
        );
        return None;
    };
    let before = e.0.len();
    let mut c = ModelConfig::from(preset);
    // Far past any model trained today (Llama 3 405B: 126 layers, dModel 16384, dFf
    // 53248), and small enough that parameter and FLOP counts never overflow.
    let mut dimension = |field: &str, value: Option<u32>, max: u32| {
        let value = e.positive(field, value)?;
        if value > max {
            e.add(field, format!("{value} is more than the {max} a model may have"));
            return None;
        }
        Some(value)
    };
    let layers = dimension("spec.model.layers", m.layers, 4096);
    let d_model = dimension("spec.model.dModel", m.d_model, 1 << 17);
    let heads = dimension("spec.model.heads", m.heads, 4096);
    let kv_heads = dimension("spec.model.kvHeads", m.kv_heads, 4096);
    let d_head = dimension("spec.model.dHead", m.d_head, 1 << 14);
    let d_ff = dimension("spec.model.dFf", m.d_ff, 1 << 20);
    let vocab = dimension("spec.model.vocabSize", m.vocab_size, 1 << 23);
    let seq = dimension("spec.model.seqLength", m.seq_length, 1 << 23);
    c.n_layer = layers.unwrap_or(c.n_layer);
    c.d_model = d_model.unwrap_or(c.d_model);
    c.n_head = heads.unwrap_or(c.n_head);
    c.d_ff = d_ff.unwrap_or(c.d_ff);
    c.vocab_size = vocab.unwrap_or(c.vocab_size);
    c.max_seq_len = seq.unwrap_or(c.max_seq_len);
    // Without an explicit dHead, a new width or head count re-derives it.
    c.d_head = match d_head {
        Some(d) => d,
        None if m.d_model.is_some() || m.heads.is_some() => {
            if c.d_model % c.n_head != 0 {
                e.add(
                    "spec.model.heads",
                    format!("{} heads do not divide dModel {}; set dHead or change heads", c.n_head, c.d_model),
                );
            }
            c.d_model / c.n_head.max(1)
        }
        None => c.d_head,
    };
    c.n_kv_head = match kv_heads {
        Some(k) => k,
        None if c.arch == Arch::Gpt2 => c.n_head,
        // Keep the preset's query-to-kv ratio when only the head count changes.
        None => (c.n_head / (preset.n_head / preset.n_kv_head)).max(1),
    };
    if c.n_head % c.n_kv_head != 0 {
        e.add("spec.model.kvHeads", format!("{} kv heads do not divide {} heads", c.n_kv_head, c.n_head));
    }
    if c.arch == Arch::Gpt2 && c.n_kv_head != c.n_head {
        e.add("spec.model.kvHeads", "GPT-2 has no grouped-query attention: kvHeads must equal heads");
    }
    if let Some(theta) = m.rope_theta {
        if c.arch == Arch::Gpt2 {
            e.add("spec.model.ropeTheta", "GPT-2 uses learned positions, not RoPE");
        } else if !(theta.is_finite() && theta > 0.0) {
            e.add("spec.model.ropeTheta", format!("{theta} must be a positive number"));
        } else {
            c.rope_theta = theta;
        }
    }
    if c.arch != Arch::Gpt2 && c.d_head % 2 != 0 {
        e.add("spec.model.dHead", format!("RoPE needs an even head width, got {}", c.d_head));
    }
    (e.0.len() == before).then_some(c)
}

fn resolve_tokenizer(e: &mut Errors, m: &ModelSpec, model: Option<&ModelConfig>) -> Option<Location> {
    let loc = parse_location(
        e,
        "spec.model.tokenizer",
        if m.tokenizer == "embedded" { "embedded:bpe" } else { &m.tokenizer },
    )?;
    if let (Location::Embedded { name }, Some(model)) = (&loc, model) {
        if name != "bpe" {
            e.add("spec.model.tokenizer", format!("{:?}: the embedded tokenizer is written `embedded`", m.tokenizer));
        } else if model.vocab_size < EMBEDDED_VOCAB_SIZE {
            e.add(
                "spec.model.vocabSize",
                format!("{} is smaller than the embedded tokenizer's {EMBEDDED_VOCAB_SIZE} tokens", model.vocab_size),
            );
        }
    }
    Some(loc)
}

fn resolve_topology(e: &mut Errors, spec: &TrainingRunSpec) -> Option<ResolvedTopology> {
    let t = &spec.topology;
    let before = e.0.len();
    if t.nodes == 0 {
        e.add("spec.topology.nodes", "must be at least 1");
    }
    if t.gpus_per_node > 0 && t.gpu_resource_name.trim().is_empty() {
        e.add("spec.topology.gpuResourceName", "must not be empty");
    }
    if !(1..=1024).contains(&t.bucket_cap_mb) {
        e.add("spec.topology.bucketCapMB", format!("{} is outside 1..=1024", t.bucket_cap_mb));
    }
    let timeout = match humantime::parse_duration(t.collective_timeout.trim()) {
        Ok(d) if d.as_secs() >= 1 => d.as_secs(),
        Ok(_) => {
            e.add("spec.topology.collectiveTimeout", format!("{:?} is shorter than 1s", t.collective_timeout));
            0
        }
        Err(err) => {
            e.add(
                "spec.topology.collectiveTimeout",
                format!("{:?} is not a duration like \"10m\": {err}", t.collective_timeout),
            );
            0
        }
    };
    let gpu_memory_bytes = match &t.gpu_memory {
        None => None,
        Some(_) if t.gpus_per_node == 0 => {
            e.add("spec.topology.gpuMemory", "needs gpusPerNode of at least 1 (a CPU run has no GPU memory)");
            None
        }
        Some(q) => crate::quantity::parse_bytes(q).map_err(|m| e.add("spec.topology.gpuMemory", m)).ok(),
    };
    let procs = t.gpus_per_node.max(1);
    if t.nodes.checked_mul(procs).is_none() {
        e.add("spec.topology.nodes", format!("{} nodes of {procs} processes are more than a run can count", t.nodes));
    }
    if e.0.len() != before {
        return None;
    }
    Some(ResolvedTopology {
        nodes: t.nodes,
        gpus_per_node: t.gpus_per_node,
        procs_per_node: procs,
        world_size: t.nodes * procs,
        device: if t.gpus_per_node > 0 { Device::Cuda } else { Device::Cpu },
        display: format!("{}x{}", t.nodes, t.gpus_per_node),
        bucket_cap_mb: t.bucket_cap_mb,
        collective_timeout_seconds: timeout,
        gpu_memory_bytes,
    })
}

/// Returns the batch and the tokens one optimizer step trains on.
fn resolve_batch(
    e: &mut Errors,
    spec: &TrainingRunSpec,
    model: Option<&ModelConfig>,
    topo: Option<&ResolvedTopology>,
) -> (Option<ResolvedBatch>, Option<u64>) {
    let b = &spec.batch;
    let micro = e.positive("spec.batch.microBatch", Some(b.micro_batch));
    let seq = e.positive("spec.batch.seqLength", b.seq_length);
    let (Some(model), Some(topo), Some(micro)) = (model, topo, micro) else { return (None, None) };
    let seq = seq.unwrap_or(model.max_seq_len);
    if seq > model.max_seq_len {
        e.add(
            "spec.batch.seqLength",
            format!("{seq} exceeds the model's context of {} tokens; raise spec.model.seqLength", model.max_seq_len),
        );
        return (None, None);
    }
    let world = u64::from(topo.world_size);
    let Some(per_micro_step) = (u64::from(micro) * u64::from(seq)).checked_mul(world) else {
        e.add(
            "spec.batch.microBatch",
            format!("{micro} sequences of {seq} tokens on each of {world} ranks are more tokens than a step can count"),
        );
        return (None, None);
    };
    match spec.phase {
        Phase::Pretrain => {
            let Some(q) = &b.global_tokens else {
                e.add("spec.batch.globalTokens", "is required for phase pretrain");
                return (None, None);
            };
            let Some(global) = e.tokens("spec.batch.globalTokens", q) else { return (None, None) };
            if global % per_micro_step != 0 {
                let lower = (global / per_micro_step) * per_micro_step;
                let upper = lower + per_micro_step;
                let suggest = if lower > 0 { format!("{lower} or {upper}") } else { upper.to_string() };
                e.add(
                    "spec.batch.globalTokens",
                    format!(
                        "{global} is not a multiple of microBatch {micro} × seqLength {seq} × world size {world} = {per_micro_step}; use e.g. {suggest}"
                    ),
                );
                return (None, None);
            }
            let accum = global / per_micro_step;
            let Ok(grad_accum) = u32::try_from(accum) else {
                e.add("spec.batch.globalTokens", format!("needs {accum} accumulation steps, which is too many"));
                return (None, None);
            };
            let batch = ResolvedBatch {
                micro_batch: micro,
                seq_len: seq,
                grad_accum,
                global_sequences: global / u64::from(seq),
                tokens_per_step: global,
            };
            (Some(batch), Some(global))
        }
        Phase::Grpo => {
            if b.global_tokens.is_some() {
                e.add(
                    "spec.batch.globalTokens",
                    "is not used in phase grpo: a step is grpo.promptsPerStep × grpo.generationsPerPrompt completions",
                );
            }
            let Some(g) = &spec.grpo else { return (None, None) };
            let completions = u64::from(g.prompts_per_step) * u64::from(g.generations_per_prompt);
            let per_rank = completions / world.max(1);
            if per_rank == 0 || per_rank % u64::from(micro) != 0 {
                // Reported by resolve_grpo, which knows the prompt split.
                return (None, None);
            }
            let Some(tokens_per_step) = completions.checked_mul(u64::from(seq)) else {
                e.add(
                    "spec.grpo.promptsPerStep",
                    format!("{completions} completions of {seq} tokens are more tokens than a step can count"),
                );
                return (None, None);
            };
            let batch = ResolvedBatch {
                micro_batch: micro,
                seq_len: seq,
                grad_accum: (per_rank / u64::from(micro)) as u32,
                global_sequences: completions,
                tokens_per_step,
            };
            (Some(batch), Some(tokens_per_step))
        }
    }
}

fn resolve_schedule(
    e: &mut Errors,
    spec: &TrainingRunSpec,
    budget: Option<u64>,
    tokens_per_step: Option<u64>,
) -> Option<ResolvedSchedule> {
    let o = &spec.optimizer;
    let (default_lr, grpo) = match spec.phase {
        Phase::Pretrain => (3e-4, false),
        Phase::Grpo => (1e-5, true),
    };
    let lr = o.lr.unwrap_or(default_lr);
    let mut ok = true;
    if !(lr.is_finite() && lr > 0.0) {
        e.add("spec.optimizer.lr", format!("{lr} must be a positive number"));
        ok = false;
    }
    let min_lr = match (o.min_lr, o.lr) {
        (Some(m), _) => m,
        (None, _) if grpo => lr,
        (None, None) => 3e-5,
        (None, Some(lr)) => lr / 10.0,
    };
    if !(min_lr.is_finite() && min_lr >= 0.0 && min_lr <= lr) {
        e.add("spec.optimizer.minLr", format!("{min_lr} must be between 0 and lr ({lr})"));
        ok = false;
    }
    let warmup = match &o.warmup_tokens {
        Some(q) => e.tokens("spec.optimizer.warmupTokens", q),
        None => budget.map(|b| (b / 20).min(100_000_000)),
    };
    let decay = match (o.schedule, o.decay_fraction, o.decay_shape) {
        (Schedule::Wsd, fraction, shape) => {
            let fraction = fraction.unwrap_or(DEFAULT_DECAY_FRACTION);
            if !(fraction > 0.0 && fraction <= 1.0) {
                e.add("spec.optimizer.decayFraction", format!("{fraction} must be in (0, 1]"));
                ok = false;
            }
            Some(WsdDecay { fraction, shape: shape.unwrap_or_default() })
        }
        (_, Some(_), _) | (_, _, Some(_)) => {
            let field = if o.decay_fraction.is_some() { "decayFraction" } else { "decayShape" };
            e.add(format!("spec.optimizer.{field}"), "applies to schedule: wsd only");
            ok = false;
            None
        }
        _ => None,
    };
    let (budget, per_step, warmup) = (budget?, tokens_per_step?, warmup?);
    let steps = budget / per_step;
    if steps == 0 {
        e.add("spec.tokens", format!("budget {} is smaller than one step of {per_step} tokens", format_tokens(budget)));
        return None;
    }
    let total_tokens = steps * per_step;
    if warmup > total_tokens {
        e.add(
            "spec.optimizer.warmupTokens",
            format!("{} exceeds the {} tokens the run trains on", format_tokens(warmup), format_tokens(total_tokens)),
        );
        return None;
    }
    ok.then_some(ResolvedSchedule {
        budget_tokens: budget,
        total_tokens,
        total_steps: steps,
        warmup_tokens: warmup,
        lr,
        min_lr,
        kind: o.schedule,
        decay,
        anchor: None,
    })
}

fn resolve_optimizer(e: &mut Errors, o: &OptimizerSpec) -> Option<ResolvedOptimizer> {
    let before = e.0.len();
    if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
        e.add("spec.optimizer.weightDecay", format!("{} must be ≥ 0", o.weight_decay));
    }
    let betas_ok = o.betas.len() == 2 && o.betas.iter().all(|b| (0.0..1.0).contains(b));
    if !betas_ok {
        e.add("spec.optimizer.betas", format!("{:?} must be two numbers in [0, 1)", o.betas));
    }
    if !(o.eps.is_finite() && o.eps > 0.0) {
        e.add("spec.optimizer.eps", format!("{} must be positive", o.eps));
    }
    if !(o.grad_clip.is_finite() && o.grad_clip >= 0.0) {
        e.add("spec.optimizer.gradClip", format!("{} must be ≥ 0 (0 disables clipping)", o.grad_clip));
    }
    (e.0.len() == before).then(|| ResolvedOptimizer {
        weight_decay: o.weight_decay,
        beta1: o.betas[0],
        beta2: o.betas[1],
        eps: o.eps,
        grad_clip: o.grad_clip,
    })
}
