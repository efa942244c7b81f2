//! What a checkpoint must match to be resumed, and copying its weights into a model.

use std::collections::HashMap;
use std::path::Path;

use crds::config::{Location, RunConfig};
use tch::Tensor;
use tch::nn::VarStore;

use crate::Error;
use crate::data::corpus;

/// Variables by name, sorted, so every rank and every checkpoint sees one order.
pub fn sorted_variables(vs: &VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// Trainable variables by name in definition order (the order the gradient reducer
/// buckets), so a sharded optimizer lines up with the reducer.
pub fn named_in_definition_order(vs: &VarStore) -> Vec<(String, Tensor)> {
    let name_of: HashMap<usize, String> =
        vs.variables().into_iter().map(|(name, t)| (t.data_ptr() as usize, name)).collect();
    vs.trainable_variables()
        .into_iter()
        .map(|t| {
            let name = name_of.get(&(t.data_ptr() as usize)).cloned().expect("every trainable variable is named");
            (name, t)
        })
        .collect()
}

/// Copies `weights` into the model's variables; every variable must be present with
/// its shape. Errors name the checkpoint and the parameter.
pub fn copy_weights(vs: &VarStore, weights: &HashMap<String, Tensor>, origin: &Path) -> Result<(), Error> {
    let bad = |message: String| Error::Checkpoint { path: origin.to_path_buf(), message };
    tch::no_grad(|| {
        for (name, mut var) in sorted_variables(vs) {
            let src = weights.get(&name).ok_or_else(|| bad(format!("parameter {name} is missing")))?;
            if src.size() != var.size() {
                return Err(bad(format!(
                    "parameter {name} has shape {:?}, the model needs {:?}",
                    src.size(),
                    var.size()
                )));
            }
            var.f_copy_(&src.f_to_kind(var.kind())?)?;
        }
        Ok(())
    })
}

/// What a checkpoint must match to be resumed: the resolved run's fingerprint, plus the
/// embedded corpus version when the run reads embedded data or the embedded tokenizer
/// (a checkpoint of an older corpus would resume at a position in different data).
pub fn resume_fingerprint(cfg: &RunConfig) -> String {
    let embedded = |l: &Location| matches!(l, Location::Embedded { .. });
    let uses_embedded = embedded(&cfg.tokenizer)
        || cfg.data.as_ref().is_some_and(|d| d.mix.iter().any(|s| embedded(&s.location)))
        || cfg.grpo.as_ref().is_some_and(|g| embedded(&g.dataset));
    if uses_embedded { format!("{}-corpus{}", cfg.fingerprint(), corpus::CORPUS_VERSION) } else { cfg.fingerprint() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(yaml: &str) -> RunConfig {
        crds::resolve(&crds::manifest::from_yaml(yaml, "test").unwrap()).unwrap()
    }

    /// A new embedded corpus makes old checkpoints of embedded runs incompatible, and
    /// leaves runs on prepared data alone.
    #[test]
    fn the_embedded_corpus_version_is_part_of_the_resume_fingerprint() {
        let embedded = resolved(include_str!("../../../examples/tiny-local.yaml"));
        assert_eq!(
            resume_fingerprint(&embedded),
            format!("{}-corpus{}", embedded.fingerprint(), corpus::CORPUS_VERSION)
        );
        let prepared = resolved(include_str!("../../../examples/seed002-medium-large-pretrain.yaml"));
        assert_eq!(resume_fingerprint(&prepared), prepared.fingerprint());
    }
}
