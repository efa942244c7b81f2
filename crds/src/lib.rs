//! The TrainingRun API: CRD types, model presets, the resolver and the
//! operator↔trainer contract. The operator and the trainer both use this crate,
//! so they can never disagree about a run.

pub mod admit;
#[cfg(any(test, feature = "arbitrary"))]
pub mod arbitrary;
pub mod config;
pub mod contract;
pub mod manifest;
pub mod plan;
pub mod presets;
#[cfg(test)]
mod properties;
pub mod quantity;
pub mod resolve;
pub mod rollback;
pub mod schedule;
pub mod types;

pub use admit::resolve;
pub use config::RunConfig;
pub use resolve::InvalidSpec;
pub use types::{TrainingRun, TrainingRunSpec, TrainingRunStatus};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{origin}: {message}")]
    Manifest { origin: String, message: String },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
}
