//! The runs of a scale bench: their shapes (1–8 nodes of 8 GPUs, one in four GRPO) and
//! their fates, which the kwok pods' marks and the node selectors bring about.

use std::fmt;

/// What becomes of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    /// Its pods run until deleted; rank 0 (the stub) reports steps.
    Training,
    /// Its pods exit 1 a few seconds after they start, in both of its attempts: one
    /// restart, then Failed.
    Failing,
    /// Its pods ask for a node pool that no node has: the scheduler holds them.
    Pending,
    /// `spec.suspend`: a suspended Job, no pods.
    Suspended,
}

impl Fate {
    /// The phase the run's status shows once the operator has caught up with it.
    pub fn settled_phase(self) -> &'static str {
        match self {
            Fate::Training => "Running",
            Fate::Failing => "Failed",
            Fate::Pending => "Pending",
            Fate::Suspended => "Suspended",
        }
    }
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// One run of the load.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: String,
    pub nodes: u32,
    pub grpo: bool,
    pub fate: Fate,
}

/// GPUs on each kwok node, and each run's pods ask for all of a node's.
pub const GPUS_PER_NODE: u32 = 8;
/// The share of the nodes that training runs fill.
pub const TRAINING_SHARE: f64 = 0.9;
/// Of the runs that do not train: one in this many fails, one in this many is held.
const FAILING_EVERY: usize = 50;
const PENDING_EVERY: usize = 33;
/// How long a failing run's pods run before they exit 1.
pub const FAILING_AFTER_SECONDS: u32 = 3;

/// `runs` runs on `nodes` nodes: training runs up to [`TRAINING_SHARE`] of the nodes,
/// 1-node failing runs within what is left (each attempt needs its node for a few
/// seconds), some held, the rest suspended.
pub fn plan(runs: usize, nodes: usize) -> Vec<Shape> {
    let budget = (nodes as f64 * TRAINING_SHARE) as u32;
    let mut training = 0u32;
    let mut others = 0usize;
    (0..runs)
        .map(|i| {
            let size = (i % 8) as u32 + 1;
            let grpo = i % 4 == 3;
            let (nodes, fate) = if training + size <= budget {
                training += size;
                (size, Fate::Training)
            } else {
                others += 1;
                if others % FAILING_EVERY == 1 {
                    (1, Fate::Failing)
                } else if others % PENDING_EVERY == 2 {
                    (size, Fate::Pending)
                } else {
                    (size, Fate::Suspended)
                }
            };
            Shape { name: format!("run-{i:05}"), nodes, grpo, fate }
        })
        .collect()
}

/// The node label the held runs ask for and no node has.
pub const HELD_POOL: &str = "bench.puretransformer.dev/pool";

impl Shape {
    /// The run's manifest (JSON, for the API), in `namespace`.
    pub fn manifest(&self, namespace: &str) -> serde_json::Value {
        use serde_json::json;
        let mut env = Vec::new();
        if self.fate == Fate::Failing {
            env.push(json!({"name": "KWOK_RUN_SECONDS", "value": FAILING_AFTER_SECONDS.to_string()}));
            env.push(json!({"name": "KWOK_EXIT_CODE", "value": "1"}));
        }
        let mut topology = json!({"nodes": self.nodes, "gpusPerNode": GPUS_PER_NODE});
        if self.fate == Fate::Pending {
            topology["nodeSelector"] = json!({HELD_POOL: "later"});
        }
        let mut spec = json!({
            "model": {"preset": "small", "tokenizer": "s3://pt-datasets/tokenizers/gpt2/tokenizer.json"},
            "tokens": "10B",
            "topology": topology,
            // Two micro-batches of 4 × 2048 tokens a GPU a step, whatever the size.
            "batch": {"globalTokens": 2 * 4 * 2048 * GPUS_PER_NODE * self.nodes, "microBatch": 4, "seqLength": 2048},
            "optimizer": {"lr": 3.0e-4, "minLr": 3.0e-5, "warmupTokens": "100M"},
            "precision": "bf16-mixed",
            "checkpoint": {"everySteps": 1000, "keepLast": 3, "size": "100Gi"},
            "failurePolicy": {"maxRestarts": 1},
            "suspend": self.fate == Fate::Suspended,
            "env": env,
        });
        if self.grpo {
            spec["phase"] = json!("grpo");
            spec["initFrom"] = json!({"uri": "s3://pt-checkpoints/base/step-010000"});
            // One prompt a rank a step.
            let prompts = GPUS_PER_NODE * self.nodes;
            spec["grpo"] = json!({
                "dataset": "s3://pt-datasets/raw/medqa-usmle-4-options/train.jsonl",
                "task": "mcq",
                "promptsPerStep": prompts,
            });
            spec["tokens"] = json!("600M");
            spec["batch"] = json!({"microBatch": 8, "seqLength": 1024});
            spec["optimizer"] = json!({"lr": 1.0e-5, "schedule": "constant", "warmupTokens": "10M"});
        } else {
            spec["data"] = json!({"mix": [
                {"name": "fineweb-edu", "weight": 0.7, "uri": "s3://pt-datasets/gpt2/fineweb-edu"},
                {"name": "finepdfs", "weight": 0.3, "uri": "s3://pt-datasets/gpt2/finepdfs"},
            ]});
        }
        json!({
            "apiVersion": "training.puretransformer.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": self.name, "namespace": namespace, "labels": {"bench.puretransformer.dev/fate": self.fate.to_string()}},
            "spec": spec,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_fills_its_share_of_the_nodes_and_every_fate_occurs() {
        let shapes = plan(10_000, 1_000);
        let training: u32 = shapes.iter().filter(|s| s.fate == Fate::Training).map(|s| s.nodes).sum();
        assert!((890..=900).contains(&training), "{training} nodes training");
        for fate in [Fate::Failing, Fate::Pending, Fate::Suspended] {
            assert!(shapes.iter().any(|s| s.fate == fate), "no {fate} run");
        }
        let failing: u32 = shapes.iter().filter(|s| s.fate == Fate::Failing).map(|s| s.nodes).sum();
        assert!(failing > 0 && shapes.iter().all(|s| (1..=8).contains(&s.nodes)));
    }

    #[test]
    fn every_manifest_is_a_valid_run() {
        for shape in plan(64, 20) {
            let run: crds::TrainingRun = serde_json::from_value(shape.manifest("bench")).expect("a TrainingRun");
            let run =
                crds::TrainingRun { metadata: kube::api::ObjectMeta { uid: Some("u".into()), ..run.metadata }, ..run };
            operator::validate::validate(&run, 1).unwrap_or_else(|e| panic!("{}: {e}", shape.name));
        }
    }
}
