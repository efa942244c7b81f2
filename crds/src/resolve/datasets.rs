//! A mix entry's `dataset`: the TrainingDataset it names, and the run as it trains once
//! each is Ready (its entries given their datasets' manifest URIs).

use crate::types::{DatasetPhase, TrainingDataset, TrainingRun};

/// The TrainingDatasets a run's mix names, in mix order, each once.
pub fn named_datasets(run: &TrainingRun) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for m in run.spec.data.iter().flat_map(|d| &d.mix) {
        if let Some(d) = &m.dataset
            && !names.contains(d)
        {
            names.push(d.clone());
        }
    }
    names
}

/// A dataset's manifest URI, when runs may train on it: Ready, with a manifest.
pub fn ready_uri(dataset: &TrainingDataset) -> Option<&str> {
    let s = dataset.status.as_ref()?;
    (s.phase == Some(DatasetPhase::Ready)).then_some(())?;
    s.manifest.as_ref().map(|m| m.uri.as_str())
}

/// `run` with each mix entry that names a dataset given `uri_of(dataset)` in its place;
/// or the datasets `uri_of` has no URI for.
pub fn with_datasets(run: &TrainingRun, uri_of: impl Fn(&str) -> Option<String>) -> Result<TrainingRun, Vec<String>> {
    let mut out = run.clone();
    let mut missing = Vec::new();
    for m in out.spec.data.iter_mut().flat_map(|d| &mut d.mix) {
        let Some(name) = m.dataset.clone() else { continue };
        match uri_of(&name) {
            Some(uri) => (m.uri, m.dataset) = (Some(uri), None),
            None if !missing.contains(&name) => missing.push(name),
            None => {}
        }
    }
    if missing.is_empty() { Ok(out) } else { Err(missing) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mix: &str) -> TrainingRun {
        crate::manifest::from_yaml(
            &format!(
                "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: r, namespace: ml}}\n\
                 spec:\n  model: {{preset: nano}}\n  tokens: 1M\n  topology: {{nodes: 1, gpusPerNode: 0}}\n  \
                 batch: {{globalTokens: 8192, microBatch: 8, seqLength: 256}}\n  data:\n    mix:\n{mix}"
            ),
            "run.yaml",
        )
        .unwrap()
    }

    #[test]
    fn entries_naming_datasets_take_their_uris_and_the_missing_ones_are_named_once() {
        let r = run(
            "    - {name: web, weight: 0.5, dataset: web}\n    - {name: web2, weight: 0.25, dataset: web}\n    \
                     - {name: pdf, weight: 0.125, dataset: pdf}\n    - {name: kb, weight: 0.125, uri: 'embedded:textbook'}\n",
        );
        assert_eq!(named_datasets(&r), ["web", "pdf"]);
        assert_eq!(with_datasets(&r, |_| None).unwrap_err(), ["web", "pdf"]);
        assert_eq!(with_datasets(&r, |n| (n == "web").then(|| "s3://p/web".into())).unwrap_err(), ["pdf"]);
        let done = with_datasets(&r, |n| Some(format!("pvc://prepared/{n}"))).unwrap();
        let uris: Vec<_> = done.spec.data.unwrap().mix.into_iter().map(|m| (m.uri.unwrap(), m.dataset)).collect();
        assert_eq!(
            uris,
            [
                ("pvc://prepared/web".to_string(), None),
                ("pvc://prepared/web".into(), None),
                ("pvc://prepared/pdf".into(), None),
                ("embedded:textbook".into(), None)
            ]
        );
        assert!(named_datasets(&run("    - {name: kb, weight: 1.0, uri: 'embedded:textbook'}\n")).is_empty());
    }
}
