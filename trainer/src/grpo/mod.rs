//! GRPO fine-tuning on multiple-choice questions: prompts, rollouts with the KV cache,
//! rewards, group-relative advantages and the clipped loss (TRL's, proved against it). The
//! accuracy evaluation before and after is [`crate::eval`]'s.

pub mod data;
pub mod loss;
pub mod record;
pub mod reward;
pub mod stats;
pub mod step;
