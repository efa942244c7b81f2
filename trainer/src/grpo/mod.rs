//! GRPO fine-tuning on multiple-choice questions: prompts, rollouts with the KV cache,
//! rewards, group-relative advantages and the clipped loss (TRL's formulas), and the
//! accuracy evaluation.

pub mod data;
pub mod eval;
pub mod loss;
pub mod reward;
pub mod stats;
pub mod step;
