//! Benchmark evaluation: multiple-choice question sets (MedQA, MMLU, ARC) scored as
//! lm-evaluation-harness scores them ([`mcq`], [`task`], [`fewshot`], [`score`];
//! proved against lm-eval itself by `tests/lm_eval_parity.rs`), and the answer
//! letter a generated completion commits to ([`answer`]), which GRPO's reward uses too.

pub mod answer;
pub mod fewshot;
pub mod mcq;
pub mod score;
pub mod task;

pub use answer::parse_answer;
pub use fewshot::Fewshot;
pub use mcq::{EvalOptions, Sample, evaluate, evaluate_samples};
pub use score::{Accuracy, McqScore};
