//! Benchmark evaluation: multiple-choice question sets (MedQA, MMLU, ARC) scored as
//! lm-evaluation-harness scores them ([`mcq`], [`task`], [`score`]), and the answer
//! letter a generated completion commits to ([`answer`]), which GRPO's reward uses too.

pub mod answer;
pub mod mcq;
pub mod score;
pub mod task;

pub use answer::parse_answer;
pub use mcq::{EvalOptions, Fewshot, evaluate};
pub use score::{Accuracy, McqScore};
