//! `spec.grpo`.

use super::errors::Errors;
use super::sources::parse_location;
use crate::config::*;
use crate::contract::EMBEDDED_QUESTION_SETS;
use crate::types::*;

pub(super) fn resolve_grpo(
    e: &mut Errors,
    spec: &TrainingRunSpec,
    topo: Option<&ResolvedTopology>,
    batch: Option<&ResolvedBatch>,
) -> Option<ResolvedGrpo> {
    let g = match (spec.phase, &spec.grpo) {
        (Phase::Grpo, Some(g)) => g,
        (Phase::Grpo, None) => {
            e.add("spec.grpo", "is required for phase grpo");
            return None;
        }
        (Phase::Pretrain, Some(_)) => {
            e.add("spec.grpo", "is only allowed with phase grpo");
            return None;
        }
        (Phase::Pretrain, None) => return None,
    };
    let before = e.0.len();
    let dataset = question_set(e, "spec.grpo.dataset", &g.dataset);
    if g.prompts_per_step == 0 {
        e.add("spec.grpo.promptsPerStep", "must be at least 1");
    }
    if g.generations_per_prompt < 2 {
        e.add("spec.grpo.generationsPerPrompt", "must be at least 2: advantages are relative to the group");
    }
    let world = topo.map_or(1, |t| t.world_size);
    if g.prompts_per_step > 0 && g.prompts_per_step % world != 0 {
        e.add(
            "spec.grpo.promptsPerStep",
            format!("{} prompts cannot be split evenly over {world} ranks", g.prompts_per_step),
        );
    }
    let prompts_per_rank = g.prompts_per_step / world.max(1);
    let completions_per_rank = u64::from(prompts_per_rank) * u64::from(g.generations_per_prompt);
    if completions_per_rank > u64::from(u32::MAX) {
        e.add(
            "spec.grpo.generationsPerPrompt",
            format!(
                "{} completions for each of {prompts_per_rank} prompts per rank are too many",
                g.generations_per_prompt
            ),
        );
    }
    let completions_per_rank = u32::try_from(completions_per_rank).unwrap_or(0);
    let micro = spec.batch.micro_batch;
    if micro > 0 && completions_per_rank > 0 && !completions_per_rank.is_multiple_of(micro) {
        e.add(
            "spec.batch.microBatch",
            format!("{micro} does not divide the {completions_per_rank} completions each rank trains on per step"),
        );
    }
    if g.max_new_tokens == 0 {
        e.add("spec.grpo.maxNewTokens", "must be at least 1");
    } else if let Some(b) = batch
        && g.max_new_tokens >= b.seq_len
    {
        e.add(
            "spec.grpo.maxNewTokens",
            format!("{} leaves no room for the prompt in seqLength {}", g.max_new_tokens, b.seq_len),
        );
    }
    if !(g.temperature.is_finite() && g.temperature > 0.0) {
        e.add("spec.grpo.temperature", format!("{} must be positive", g.temperature));
    }
    if !(g.top_p > 0.0 && g.top_p <= 1.0) {
        e.add("spec.grpo.topP", format!("{} must be in (0, 1]", g.top_p));
    }
    if !(g.beta.is_finite() && g.beta >= 0.0) {
        e.add("spec.grpo.beta", format!("{} must be ≥ 0", g.beta));
    }
    let high = g.clip_epsilon_high.unwrap_or(g.clip_epsilon);
    if !(g.clip_epsilon > 0.0 && g.clip_epsilon < 1.0) {
        e.add("spec.grpo.clipEpsilon", format!("{} must be in (0, 1)", g.clip_epsilon));
    }
    if !(high.is_finite() && high > 0.0) {
        e.add("spec.grpo.clipEpsilonHigh", format!("{high} must be positive"));
    }
    if !(g.length_penalty.is_finite() && g.length_penalty >= 0.0) {
        e.add("spec.grpo.lengthPenalty", format!("{} must be ≥ 0", g.length_penalty));
    }
    if g.iterations == 0 {
        e.add("spec.grpo.iterations", "must be at least 1");
    } else if !spec.checkpoint.every_steps.is_multiple_of(g.iterations) {
        e.add(
            "spec.checkpoint.everySteps",
            format!(
                "{} is not a multiple of grpo.iterations {}: a checkpoint must fall between generated batches to resume exactly",
                spec.checkpoint.every_steps, g.iterations
            ),
        );
    }
    if let Some(d) = g.off_policy_mask_threshold
        && !(d.is_finite() && d >= 0.0)
    {
        e.add("spec.grpo.offPolicyMaskThreshold", format!("{d} must be ≥ 0"));
    }
    let eval_dataset = g.eval_dataset.as_ref().map(|d| question_set(e, "spec.grpo.evalDataset", d));
    let eval_datasets: Vec<Option<Location>> = g
        .eval_datasets
        .iter()
        .enumerate()
        .map(|(i, d)| question_set(e, &format!("spec.grpo.evalDatasets[{i}]"), d))
        .collect();
    if e.0.len() != before {
        return None;
    }
    Some(ResolvedGrpo {
        dataset: dataset?,
        task: g.task,
        prompts_per_step: g.prompts_per_step,
        generations_per_prompt: g.generations_per_prompt,
        prompts_per_rank,
        max_new_tokens: g.max_new_tokens,
        temperature: g.temperature,
        top_p: g.top_p,
        beta: g.beta,
        clip_epsilon_low: g.clip_epsilon,
        clip_epsilon_high: high,
        length_penalty: g.length_penalty,
        loss_type: g.loss_type,
        scale_rewards: g.scale_rewards,
        iterations: g.iterations,
        unbiased_kl: g.unbiased_kl,
        off_policy_mask_threshold: g.off_policy_mask_threshold,
        mask_truncated_completions: g.mask_truncated_completions,
        eval_dataset: eval_dataset.flatten(),
        eval_datasets: eval_datasets.into_iter().flatten().collect(),
        eval_questions: g.eval_questions,
        no_signal_steps: g.no_signal_steps,
    })
}

/// A question set: an embedded one by name, or a file or prepared dataset's location.
fn question_set(e: &mut Errors, field: &str, uri: &str) -> Option<Location> {
    match uri.strip_prefix("embedded:") {
        Some(name) if EMBEDDED_QUESTION_SETS.contains(&name) => Some(Location::Embedded { name: name.into() }),
        Some(name) => {
            e.add(
                field,
                format!(
                    "no embedded question set named {name:?}; embedded question sets: {}",
                    EMBEDDED_QUESTION_SETS.join(", ")
                ),
            );
            None
        }
        None => parse_location(e, field, uri),
    }
}
