//! The `TrainingRun` custom resource: the single source of truth for the API.
//!
//! The `///` docs on fields are user documentation: `kubectl explain` shows them.

mod failure;
mod grpo;
mod spec;
mod status;

pub use failure::*;
pub use grpo::*;
pub use spec::*;
pub use status::*;

pub const GROUP: &str = "training.puretransformer.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "TrainingRun";
