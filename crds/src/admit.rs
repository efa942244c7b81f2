//! Admission: a spec resolved by the pure, planner-free [`crate::resolve`] and, with
//! `spec.topology.gpuMemory`, its memory plan ([`crate::plan`]) checked against the GPUs.

use crate::config::RunConfig;
use crate::resolve::{FieldError, InvalidSpec, resolve_unplanned};
use crate::types::TrainingRun;

/// Resolves a TrainingRun into the exact configuration the trainer runs; with
/// `spec.topology.gpuMemory`, only if its plan fits the GPUs.
pub fn resolve(run: &TrainingRun) -> Result<RunConfig, InvalidSpec> {
    let config = resolve_unplanned(run)?;
    if let Some(gpu_memory) = config.topology.gpu_memory_bytes
        && let Some(shortfall) = crate::plan::shortfall(&config, gpu_memory)
    {
        return Err(InvalidSpec(vec![FieldError {
            field: "spec.topology.gpuMemory".into(),
            message: format!("the run does not fit: {shortfall} (`trainer plan` prints the table)"),
        }]));
    }
    Ok(config)
}
