//! `trainer plan`: a run's memory per rank, before anything is launched.

use std::path::Path;

use crate::Error;

/// Prints the plan of `manifest` and checks it against `gpu_memory` (else the spec's
/// `topology.gpuMemory`): an error, with what would make it fit, when it does not.
pub fn plan(manifest: &Path, gpu_memory: Option<&str>, json: bool) -> Result<(), Error> {
    let run = crds::manifest::from_file(manifest)?;
    let config = crds::resolve::resolve_unplanned(&run)
        .map_err(|e| Error::InvalidSpec(format!("{}: {e}", manifest.display())))?;
    let have = match gpu_memory {
        Some(q) => Some(crds::quantity::parse_bytes(q).map_err(|m| Error::InvalidSpec(format!("--gpu-memory: {m}")))?),
        None => config.topology.gpu_memory_bytes,
    };
    let plan = crds::plan::plan(&config);
    if json {
        let u = &plan.peak;
        let value = serde_json::json!({
            "worldSize": plan.world_size,
            "parallelism": config.parallelism,
            "peakPhase": plan.phase.name(),
            "bytesPerRank": {
                "parameters": u.parameters,
                "gradients": u.gradients,
                "optimizerState": u.optimizer_state,
                "autocastWeights": u.autocast_weights,
                "activations": u.activations,
                "loss": u.loss,
                "buffers": u.buffers,
                "stepPeak": plan.step_peak(),
                "allowance": plan.allowance,
                "needed": plan.needed(),
            },
            "activationsWithoutCheckpointing": plan.activations_without_checkpointing,
            "activationsWithCheckpointing": plan.activations_with_checkpointing,
            "gpuMemory": have,
            "fits": have.map(|h| plan.fits(h)),
        });
        println!("{}", serde_json::to_string_pretty(&value).expect("JSON"));
    } else {
        print!("{}", plan.table(have));
    }
    match have.and_then(|h| crds::plan::shortfall(&config, h)) {
        Some(why) => Err(Error::InvalidSpec(format!("{}: does not fit: {why}", manifest.display()))),
        None => Ok(()),
    }
}
