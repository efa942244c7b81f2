//! The libtorch trainer. `trainer --help` lists the commands.
//!
//! # Map of the crate
//!
//! Each layer imports only itself and the layers before it, and the modules import each
//! other without a cycle (`tests/layout.rs` reads this table and checks both):
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 1 | [`error`], [`fault_injection`], [`ffi`], [`files`], [`https`], [`rng`], [`storage`], [`torch_info`] | the crate's Error and the failure reason of each, the gate of the test-only `TRAINER_INJECT_*` variables, the C++ shim over ATen and c10d, atomic file writes, `https://` files, libtorch's global RNG lock, S3 |
//! | 2 | [`dist`] | the c10d process group, the gradient reducer, the launcher |
//! | 3 | [`kernels`] | SDPA switches, SwiGLU, RoPE, and the timed choice between kernels |
//! | 4 | [`model`] | LLaMA/Qwen3 and GPT-2 over `kernels` and `ffi` only, HF parameter names |
//! | 5 | [`optim`], [`parallel`], [`data`], [`checkpoint`], [`generate`], [`export`] | AdamW, replicated or sharded; DDP, ZeRO and fsdp as one trait the loop calls; token streams; checkpoints; sampling; HF export |
//! | 6 | [`eval`], [`grpo`] | multiple-choice benchmarks scored as lm-evaluation-harness scores them; GRPO's questions, rollouts, rewards and loss |
//! | 7 | [`train`] | the [`train::Trainer`]: one process's loop, which only orchestrates the above, and the events it reports ([`train::report`]) |
//! | 8 | [`telemetry`] | the sinks of those events: `/status`, `metrics.jsonl`, progress; and the termination message |
//! | 9 | [`bench`], [`plot`], [`cli`] | benchmarks, plots, and the commands; `cli` is used by `main.rs` alone |
//!
//! `dist` sits below `kernels` because a kernel choice timed on every rank must be the
//! same on every rank. The loop hands each event to [`train::report::Sinks`] without
//! knowing which sinks exist; they live above it and are chosen by the caller
//! ([`telemetry::run`]).

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod dist;
pub mod error;
pub mod eval;
pub mod export;
pub mod fault_injection;
pub mod ffi;
pub mod files;
pub mod generate;
pub mod grpo;
pub mod https;
pub mod kernels;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod plot;
pub mod rng;
pub mod storage;
pub mod telemetry;
pub mod torch_info;
pub mod train;

pub use error::Error;
pub(crate) use error::io_err;
