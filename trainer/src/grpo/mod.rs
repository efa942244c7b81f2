//! GRPO fine-tuning on multiple-choice questions: prompts, rollouts with the KV cache,
//! rewards, group-relative advantages and the clipped loss (TRL's formulas). The
//! accuracy evaluation before and after is [`crate::eval`]'s.

pub mod data;
pub mod loss;
pub mod reward;
pub mod stats;
pub mod step;
