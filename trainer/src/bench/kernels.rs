//! `trainer bench-kernels`: each fused op's kernels timed and checked on the model's
//! shapes.

use crds::presets::ModelConfig;
use crds::types::Precision;
use serde_json::{Value, json};
use tch::Device;

use crate::Error;
use crate::kernels::choice::Kernels;
use crate::kernels::trials::Candidate;
use crate::kernels::tune::{RunKinds, ops_of, tune};
use crate::train::precision::{matmul_kind, precision_plan};

/// `trainer bench-kernels`: each op's kernel sets (SwiGLU, RoPE, the residual RMSNorm,
/// the loss chunk; GPT-2 only the loss) timed on the model's shapes at this micro-batch
/// and sequence in the precision's dtypes, each as a run's trial times and checks it
/// ([`tune`]), and each one's speed-up over eager from the same run. The fused kernels
/// run on CUDA only; elsewhere they show as rejected.
pub fn run(
    model: &ModelConfig,
    micro_batch: i64,
    seq: i64,
    precision: Precision,
    device: Device,
) -> Result<Value, Error> {
    let (kind, autocast, _) = precision_plan(precision, device);
    let act = matmul_kind(kind, autocast, device)?;
    let kinds = RunKinds { weights: kind, matmuls: act, autocast };
    let candidates = [Kernels::Eager, Kernels::Composed, Kernels::Fused];
    let mut ops = serde_json::Map::new();
    for op in ops_of(model) {
        let choice = tune(op, model, micro_batch, seq, kinds, device, &candidates, None)?;
        let eager = choice.trials[0].ms;
        let vs_eager: serde_json::Map<String, Value> = choice
            .trials
            .iter()
            .map(|t| (t.candidate.name().to_string(), json!(eager.zip(t.ms).map(|(e, ms)| e / ms))))
            .collect();
        ops.insert(
            op.name().into(),
            json!({ "chosen": choice.chosen.name(), "trials": choice.trials, "speedup_vs_eager": vs_eager }),
        );
    }
    Ok(json!({
        "preset": model.preset,
        "device": if device.is_cuda() { "cuda" } else { "cpu" },
        "precision": serde_json::to_value(precision).expect("precision serializes"),
        "dtype": format!("{act:?}"),
        "micro_batch": micro_batch,
        "seq": seq,
        "threads": tch::get_num_threads(),
        "ops": ops,
    }))
}
