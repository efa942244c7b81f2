//! §3.1: the CRD, judged by the API server itself: Established, `kubectl explain`, every
//! example admitted by a server-side dry run, bad specs refused by CEL and the OpenAPI
//! schema with the messages the README promises, the printer columns, and the server's
//! verdicts compared with `crds::resolve`'s.

use std::time::Duration;

use serde_yaml_ng::Value;

use crate::harness::*;
use crate::slots::cluster_slot;

fn set(doc: &mut Value, path: &str, value: Value) {
    let mut at = &mut doc["spec"];
    let keys: Vec<&str> = path.split('.').collect();
    for k in &keys[..keys.len() - 1] {
        at = &mut at[*k];
    }
    at[keys[keys.len() - 1]] = value;
}

fn remove(doc: &mut Value, path: &str) {
    let mut at = &mut doc["spec"];
    let keys: Vec<&str> = path.split('.').collect();
    for k in &keys[..keys.len() - 1] {
        at = &mut at[*k];
    }
    if let Value::Mapping(m) = at {
        m.remove(keys[keys.len() - 1]);
    }
}

fn yaml(s: &str) -> Value {
    serde_yaml_ng::from_str(s).expect("YAML")
}

/// The resolver's verdict: `None` if it resolves, else its error.
fn resolver_verdict(manifest: &str) -> Option<String> {
    match crds::manifest::from_yaml(manifest, "case") {
        Err(e) => Some(e.to_string()),
        Ok(run) => crds::resolve(&run).err().map(|e| e.to_string()),
    }
}

/// The API server's verdict on a server-side dry run: `None` if admitted, else its error.
fn server_verdict(c: &e2e::test_cluster::TestCluster, manifest: &str) -> Option<String> {
    let (ok, _, err) = kubectl_stdin(c, &["-n", "default", "apply", "--dry-run=server", "-f", "-"], manifest);
    (!ok).then(|| err.trim().to_string())
}

/// Specs the resolver refuses that the API server admits, and why the CRD cannot (or
/// need not) say it: each needs the preset table, the memory planner or arithmetic
/// over several fields that the resolver does once with a better message.
const RESOLVER_ONLY: &[(&str, &str)] = &[(
    "global-batch-not-divisible",
    "globalTokens must be a multiple of microBatch × seqLength × world size: the world size needs gpusPerNode's CPU \
     case and a token quantity's suffix, so it stays in crds::resolve, which names the nearest valid values",
)];

#[tokio::test]
async fn the_api_server_judges_the_crd_as_the_readme_says() {
    let _slot = cluster_slot().await;
    let c = cluster(0).await;
    install_crd(&c);

    // kubectl explain prints the field's documentation from the CRD's schema. The API
    // server republishes a new CRD's OpenAPI document once or twice after it is
    // Established, so a read may miss it for a moment: retried, as a user would.
    poll(&c, "default", "kubectl explain prints our docs", Duration::from_secs(30), || {
        let explain = c.kubectl_out(&["explain", "trainingrun.spec.batch.globalTokens"])?;
        if explain.contains("Tokens per optimizer step across all ranks") && explain.contains("accumulation") {
            Ok(())
        } else {
            Err(explain)
        }
    });

    // Every example is admitted by the API server (CEL, OpenAPI, strict field validation).
    let mut examples: Vec<_> = std::fs::read_dir(repo().join("examples"))
        .expect("examples/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 10, "examples: {examples:?}");
    // The TrainingDatasets of examples/datasets too; a run naming them resolves as the
    // operator resolves it once they are Ready (each at its spec.output).
    let mut outputs = std::collections::BTreeMap::new();
    let mut dirs = vec![repo().join("examples/datasets")];
    while let Some(dir) = dirs.pop() {
        for path in std::fs::read_dir(&dir).expect("examples/datasets").flatten().map(|e| e.path()) {
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("example");
            if let Some(why) = server_verdict(&c, &text) {
                panic!("{} refused by the API server: {why}", path.display());
            }
            let ds: crds::types::TrainingDataset = serde_yaml_ng::from_str(&text).expect("a TrainingDataset");
            outputs.insert(ds.metadata.name.clone().unwrap_or_default(), ds.spec.output);
        }
    }
    assert!(outputs.len() >= 4, "the seed-002 datasets: {outputs:?}");
    for path in &examples {
        let text = std::fs::read_to_string(path).expect("example");
        if let Some(why) = server_verdict(&c, &text) {
            panic!("{} refused by the API server: {why}", path.display());
        }
        let run = crds::manifest::from_yaml(&text, "example").expect("a TrainingRun");
        let run = crds::resolve::with_datasets(&run, |n| outputs.get(n).cloned())
            .unwrap_or_else(|missing| panic!("{}: no example dataset {missing:?}", path.display()));
        let text = serde_yaml_ng::to_string(&run).expect("YAML");
        assert_eq!(resolver_verdict(&text), None, "{} must resolve", path.display());
    }

    // Bad specs: (case, manifest, what the API server says, or None where only the resolver refuses).
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        (
            "weights-do-not-sum-to-one",
            tiny_cluster("w", |d| {
                set(
                    d,
                    "data.mix",
                    yaml(
                        "[{name: a, weight: 0.5, uri: 'embedded:textbook'}, {name: b, weight: 0.4, uri: 'embedded:facts'}]",
                    ),
                )
            }),
            Some("mix weights must sum to 1"),
        ),
        (
            "weight-above-one",
            tiny_cluster("w1", |d| set(d, "data.mix", yaml("[{name: a, weight: 1.5, uri: 'embedded:textbook'}]"))),
            Some("weight must be in (0, 1]"),
        ),
        (
            "no-nodes",
            tiny_cluster("n0", |d| set(d, "topology.nodes", Value::from(0))),
            Some("nodes must be at least 1"),
        ),
        (
            "micro-batch-zero",
            tiny_cluster("mb0", |d| set(d, "batch.microBatch", Value::from(0))),
            Some("microBatch must be at least 1"),
        ),
        (
            "checkpoint-every-zero",
            tiny_cluster("ck0", |d| set(d, "checkpoint.everySteps", Value::from(0))),
            Some("everySteps must be at least 1"),
        ),
        (
            "grpo-phase-without-grpo",
            tiny_cluster("g", |d| set(d, "phase", Value::from("grpo"))),
            Some("spec.grpo must be set exactly when spec.phase is grpo"),
        ),
        (
            "pretrain-without-data",
            tiny_cluster("nd", |d| remove(d, "data")),
            Some("spec.data is required when spec.phase is pretrain"),
        ),
        (
            "pretrain-without-global-batch",
            tiny_cluster("nb", |d| remove(d, "batch.globalTokens")),
            Some("spec.batch.globalTokens is required when spec.phase is pretrain"),
        ),
        (
            "init-from-both",
            tiny_cluster("if", |d| set(d, "initFrom", yaml("{trainingRun: base, uri: 's3://b/p'}"))),
            Some("set exactly one of initFrom.trainingRun and initFrom.uri"),
        ),
        (
            "unknown-field",
            tiny_cluster("uf", |d| set(d, "batch.microbatch", Value::from(8))),
            Some("unknown field \"spec.batch.microbatch\""),
        ),
        ("global-batch-not-divisible", tiny_cluster("gb", |d| set(d, "batch.globalTokens", Value::from(10000))), None),
    ];
    let mut disagreements = Vec::new();
    for (case, manifest, message) in &cases {
        let server = server_verdict(&c, manifest);
        let resolver = resolver_verdict(manifest);
        match (message, &server) {
            (Some(want), Some(got)) => {
                assert!(got.contains(want), "{case}: the API server said {got:?}, expected {want:?}")
            }
            (Some(want), None) => panic!("{case}: the API server admitted it; expected {want:?}"),
            (None, Some(got)) => {
                panic!("{case}: the API server refused it ({got}); the table says only the resolver does")
            }
            (None, None) => {}
        }
        if server.is_some() != resolver.is_some() {
            disagreements.push(format!("{case}: server {server:?}, resolver {resolver:?}"));
            let known = RESOLVER_ONLY.iter().any(|(k, _)| k == case);
            assert!(
                known && server.is_none(),
                "{case}: the API server and crds::resolve disagree: server {server:?}, resolver {resolver:?}"
            );
        }
    }
    eprintln!("specs the resolver refuses and the API server admits (by design):\n  {}", disagreements.join("\n  "));

    // kubectl get tr prints our printer columns.
    let tiny = std::fs::read_to_string(repo().join("examples/tiny-cluster.yaml")).expect("example");
    let (ok, _, err) = kubectl_stdin(&c, &["-n", "default", "apply", "-f", "-"], &tiny);
    assert!(ok, "{err}");
    let table = kubectl(&c, &["-n", "default", "get", "tr"]);
    let header = table.lines().next().unwrap_or_default().to_string();
    let crd: Value = serde_yaml_ng::from_str(&crds::manifest::crd_yaml()).expect("the CRD");
    let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"].as_sequence().expect("printer columns");
    for col in columns {
        let name = col["name"].as_str().expect("a column name").to_uppercase();
        let priority = col["priority"].as_i64().unwrap_or(0);
        if priority == 0 {
            assert!(header.contains(&name), "`kubectl get tr` lacks column {name}: {header}");
        }
    }
    let wide = kubectl(&c, &["-n", "default", "get", "tr", "-o", "wide"]);
    for col in columns {
        let name = col["name"].as_str().expect("a column name").to_uppercase();
        assert!(
            wide.lines().next().unwrap_or_default().contains(&name),
            "`kubectl get tr -o wide` lacks {name}: {wide}"
        );
    }
    assert!(table.contains("tiny-cluster"), "{table}");
}

/// The TrainingDataset CRD, judged by the API server: Established, `kubectl explain`, a
/// dataset admitted, bad ones refused with the rules' messages, what its manifest
/// describes immutable while `workers` may change, and `kubectl get tds`'s columns.
#[tokio::test]
async fn the_api_server_judges_the_dataset_crd() {
    let _slot = cluster_slot().await;
    let c = cluster(0).await;
    let crd = repo().join("crds/trainingdatasets.yaml");
    kubectl(&c, &["apply", "--server-side", "-f", &crd.display().to_string()]);
    wait_established(&c, "trainingdatasets");
    poll(&c, "default", "kubectl explain prints the dataset's docs", Duration::from_secs(30), || {
        let explain = c.kubectl_out(&["explain", "trainingdataset.spec.workers"])?;
        // kubectl wraps the text; compare it with its lines joined.
        let words = explain.split_whitespace().collect::<Vec<_>>().join(" ");
        if words.contains("each a share of the files balanced by size") { Ok(()) } else { Err(explain) }
    });
    let dataset = |name: &str, spec: &str| {
        format!(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingDataset\nmetadata: {{name: {name}}}\nspec:\n{spec}"
        )
    };
    let good = "  source: {uris: ['s3://raw/fineweb-edu/*.parquet']}\n  tokenizer: {embedded: true}\n  output: s3://prepared/fineweb-edu\n  workers: 4\n";
    assert_eq!(server_verdict(&c, &dataset("fineweb-edu", good)), None);
    for (case, spec, message) in [
        (
            "output-path",
            good.replace("s3://prepared/fineweb-edu", "/data/out"),
            "output must be s3://bucket/prefix or pvc://claim/path",
        ),
        (
            "source-scheme",
            good.replace("s3://raw", "ftp://raw"),
            "each source uri must start with s3://, pvc:// or https://",
        ),
        (
            "two-tokenizers",
            good.replace("{embedded: true}", "{embedded: true, uri: 's3://t/tokenizer.json'}"),
            "set exactly one of tokenizer.uri, tokenizer.embedded and tokenizer.train",
        ),
        ("no-workers", good.replace("workers: 4", "workers: 0"), "workers must be in [1, 256]"),
        ("unknown-field", good.replace("workers: 4", "workers: 4\n  wrokers: 2"), "unknown field \"spec.wrokers\""),
    ] {
        let verdict = server_verdict(&c, &dataset(case, &spec)).unwrap_or_else(|| panic!("{case}: admitted"));
        assert!(verdict.contains(message), "{case}: {verdict}");
    }
    let (ok, _, err) = kubectl_stdin(&c, &["-n", "default", "apply", "-f", "-"], &dataset("fineweb-edu", good));
    assert!(ok, "{err}");
    let edited = good.replace("*.parquet", "**/*.parquet");
    let verdict = server_verdict(&c, &dataset("fineweb-edu", &edited)).expect("source edit refused");
    assert!(verdict.contains("source is immutable"), "{verdict}");
    assert_eq!(server_verdict(&c, &dataset("fineweb-edu", &good.replace("workers: 4", "workers: 8"))), None);
    let header = kubectl(&c, &["-n", "default", "get", "tds"]);
    let header = header.lines().next().unwrap_or_default();
    for column in ["NAME", "PHASE", "PROGRESS", "TOKENS", "SHARDS", "AGE"] {
        assert!(header.contains(column), "`kubectl get tds` lacks {column}: {header}");
    }
    kubectl(&c, &["-n", "default", "delete", "tds", "fineweb-edu"]);
}
