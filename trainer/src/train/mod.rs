//! The training loop of one process, assembled from parts: [`build`] makes the
//! runtime, data, model, optimizer, phase and gang and resumes the run ([`restore`]);
//! [`run`] steps ([`step`]), evaluates ([`evaluate`]) and checkpoints on schedule, and
//! tells its [`report::Sinks`] what happened. Rank 0 alone writes checkpoints.

mod build;
mod checkpoints;
pub mod evaluate;
pub mod faults;
mod options;
mod pending;
mod phase;
pub mod precision;
pub mod report;
pub mod restore;
mod run;
mod state;
pub mod step;
mod timing;
mod trainer;

pub use evaluate::HELD_OUT;
pub use options::{DEFAULT_CUDA_SYNC_EVERY, RunOptions};
pub use run::Outcome;
pub use trainer::Trainer;
