//! Training data (`spec.data`): the weighted mix, held-out evaluation, and how
//! documents share a packed window.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds;
use crate::quantity::TokenQuantity;

/// Training data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mix.map(m, m.weight).sum() >= 0.999999 && self.mix.map(m, m.weight).sum() <= 1.000001").message("mix weights must sum to 1").field_path(".mix"))]
pub struct DataSpec {
    /// Weighted sources, keyed by name, at most 64. Every global batch draws from them
    /// in exactly these proportions for the whole run (a static mix, no curriculum).
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(min = 1, max = bounds::MIX_SOURCES))]
    pub mix: Vec<MixEntry>,
    /// Held-out evaluation: how often and on how many tokens per source.
    #[serde(default)]
    pub validation: ValidationSpec,
    /// How documents share a packed training window. `concat` (default): the window is
    /// one sequence, attending across document boundaries. `documents`: each token
    /// attends only within its own document (a document ends at its end-of-text token),
    /// positions restart at each document, and the prediction across a boundary is not
    /// trained, so each document trains as if it were alone (short records packed among
    /// long pages, as MedQA among web text).
    #[serde(default, skip_serializing_if = "Packing::is_concat")]
    pub packing: Packing,
}

/// How documents share a packed window (`spec.data.packing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Packing {
    #[default]
    Concat,
    Documents,
}

impl Packing {
    pub fn is_concat(&self) -> bool {
        *self == Packing::Concat
    }
}

/// One source of the data mix: prepared shards at `uri`, or a TrainingDataset by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.uri) != has(self.dataset)").message("set exactly one of uri and dataset"))]
pub struct MixEntry {
    /// Source name, unique in the mix; used in metrics and per-source validation loss.
    #[schemars(length(min = 1, max = bounds::DNS_LABEL))]
    pub name: String,
    /// Share of training samples drawn from this source, in (0, 1]. Weights sum to 1.
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("weight must be in (0, 1]"))]
    pub weight: f64,
    /// Where the prepared shards are: `s3://bucket/prefix`, `pvc://claim/path`,
    /// an absolute path inside the pod, or `embedded:<name>` for a corpus compiled
    /// into the trainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = bounds::URI))]
    pub uri: Option<String>,
    /// A TrainingDataset in the run's namespace: the run waits until it is Ready, then
    /// trains on its manifest. A dataset in use by a live run cannot be deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = bounds::DNS_SUBDOMAIN))]
    pub dataset: Option<String>,
}

/// Held-out evaluation schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidationSpec {
    /// Evaluate every this many optimizer steps, and at the end. 0 disables evaluation.
    #[serde(default = "default_eval_every")]
    pub every_steps: u32,
    /// Held-out tokens evaluated per source at each evaluation.
    #[serde(default = "default_eval_tokens")]
    pub tokens: TokenQuantity,
}

fn default_eval_every() -> u32 {
    1000
}

fn default_eval_tokens() -> TokenQuantity {
    TokenQuantity::Text("1M".into())
}

impl Default for ValidationSpec {
    fn default() -> Self {
        ValidationSpec { every_steps: default_eval_every(), tokens: default_eval_tokens() }
    }
}
