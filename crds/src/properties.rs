//! Property tests of every parser of the API: token quantities, memory sizes and
//! durations, the termination message, the trainer's `/status` document, and the
//! resolver over specs generated from the CRD's schema. For any input: no panic,
//! every error names its field or file, and what parses round-trips.
//!
//! `PROPTEST_CASES` sets the cases of each (CI: the default below; `make fuzz`: many
//! more).

use std::time::Duration;

use kube::CustomResourceExt;
use proptest::prelude::*;
use serde_json::Value;

use crate::arbitrary::{mutations, schema_of, values};
use crate::contract::{ExitReport, TerminationMessage, TrainerStatus};
use crate::quantity::{QuantityError, format_tokens, parse_bytes, parse_tokens};
use crate::types::TrainingRun;
use crate::{RunConfig, manifest, resolve};

/// The valid manifests the resolver's cases start from.
const EXAMPLES: [(&str, &str); 4] = [
    ("tiny-local.yaml", include_str!("../../examples/tiny-local.yaml")),
    ("tiny-grpo-local.yaml", include_str!("../../examples/tiny-grpo-local.yaml")),
    ("tiny-cluster.yaml", include_str!("../../examples/tiny-cluster.yaml")),
    ("seed000-xlarge-8xa100.yaml", include_str!("../../examples/seed000-xlarge-8xa100.yaml")),
];

fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(default_cases);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

fn crd_schema() -> Value {
    let crd = TrainingRun::crd();
    let schema = crd.spec.versions[0].schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema.expect("the CRD has a schema")).expect("a schema serializes")
}

/// A valid example manifest with some fields redrawn, as JSON.
fn specs() -> impl Strategy<Value = (String, Value)> {
    let schema = crd_schema();
    let each: Vec<BoxedStrategy<(String, Value)>> = EXAMPLES
        .iter()
        .map(|(name, text)| {
            let base: Value = serde_yaml_ng::from_str(text).expect("the examples are YAML");
            let name = name.to_string();
            mutations(base, &schema, 0).prop_map(move |v| (name.clone(), v)).boxed()
        })
        .collect();
    proptest::strategy::Union::new(each)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn token_counts_print_and_parse_back(n in 1u64..) {
        prop_assert_eq!(parse_tokens(&n.to_string()), Ok(n));
        let printed = format_tokens(n);
        let back = parse_tokens(&printed).map_err(|e| TestCaseError::fail(format!("{printed}: {e}")))?;
        // Printing rounds to two decimals of its unit: within half a percent, and exact
        // for whole units.
        let error = (back as f64 - n as f64).abs() / n as f64;
        prop_assert!(error <= 0.005, "{n} printed {printed} parses to {back}");
        let unit = [1_000_000_000_000u64, 1_000_000_000, 1_000_000, 1_000, 1].into_iter().find(|&u| n >= u).unwrap_or(1);
        if n % unit == 0 {
            prop_assert_eq!(back, n, "{} printed {}", n, printed);
        }
    }

    #[test]
    fn any_token_spelling_parses_or_says_why(text in "\\PC{0,24}|[ 0-9.]{0,22}[kKmMbBtT ]{0,2}") {
        match parse_tokens(&text) {
            Ok(n) => {
                prop_assert!(n >= 1);
                prop_assert_eq!(parse_tokens(&n.to_string()), Ok(n));
                // What the resolver accepts, the API server's pattern accepts too.
                let trimmed = text.trim();
                prop_assert!(pattern_accepts(trimmed), "{text:?} parses to {n} but the CRD's pattern refuses it");
            }
            Err(e) => {
                let message = e.to_string();
                prop_assert!(message.contains(&format!("{:?}", text)) || e == QuantityError::Zero, "{message}");
            }
        }
    }

    #[test]
    fn any_memory_spelling_parses_or_names_itself(text in "\\PC{0,24}|[0-9.]{1,12}(Ki|Mi|Gi|Ti|k|M|G|T)?B?") {
        match parse_bytes(&text) {
            Ok(b) => prop_assert!(b >= 1),
            Err(message) => prop_assert!(message.contains(&format!("{text:?}")), "{message}"),
        }
    }

    #[test]
    fn durations_print_and_parse_back(secs in 0u64..10_000_000_000, nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        let printed = humantime::format_duration(d).to_string();
        prop_assert_eq!(humantime::parse_duration(&printed).ok(), Some(d), "{}", printed);
    }

    #[test]
    fn termination_messages_fit_and_parse_back(doc in values(&schema_of::<TerminationMessage>(), 0)) {
        let Ok(message) = serde_json::from_value::<TerminationMessage>(doc) else { return Ok(()) };
        let json = message.to_json();
        prop_assert!(json.len() <= TerminationMessage::MAX_BYTES, "{} bytes", json.len());
        let back = TerminationMessage::parse(&json).expect("what it writes, it reads");
        if json.len() < TerminationMessage::MAX_BYTES - 8 {
            prop_assert_eq!(&back, &message);
        }
        prop_assert!(matches!(ExitReport::parse(&json), Some(ExitReport::Failure(m)) if m == back));
    }

    #[test]
    fn any_termination_text_is_read_or_ignored(text in "\\PC{0,200}") {
        let _ = ExitReport::parse(&text);
    }

    #[test]
    fn status_documents_round_trip(doc in values(&schema_of::<TrainerStatus>(), 0)) {
        let Ok(status) = serde_json::from_value::<TrainerStatus>(doc) else { return Ok(()) };
        let json = serde_json::to_string(&status).expect("a status serializes");
        prop_assert_eq!(serde_json::from_str::<TrainerStatus>(&json).ok(), Some(status.clone()));
        prop_assert!(matches!(ExitReport::parse(&json), Some(ExitReport::Success(s)) if *s == status));
    }
}

/// The CRD's token-quantity pattern, as the API server applies it.
fn pattern_accepts(text: &str) -> bool {
    thread_local! {
        static PATTERN: regex::Regex = regex::Regex::new(crate::quantity::PATTERN).expect("the pattern compiles");
    }
    PATTERN.with(|p| p.is_match(text))
}

proptest! {
    #![proptest_config(config(128))]

    /// The resolver over specs from the CRD's schema: no panic, and every problem
    /// named by its field; what resolves survives the ConfigMap's JSON unchanged.
    #[test]
    fn any_spec_resolves_or_names_each_problem((origin, doc) in specs()) {
        let text = serde_json::to_string(&doc).expect("JSON");
        let run = match manifest::from_yaml(&text, &origin) {
            Ok(run) => run,
            Err(e) => {
                let message = e.to_string();
                prop_assert!(message.starts_with(&format!("{origin}: ")), "{message}");
                return Ok(());
            }
        };
        match resolve(&run) {
            Ok(cfg) => {
                let json = serde_json::to_string(&cfg).expect("a RunConfig serializes");
                let back: RunConfig = serde_json::from_str(&json).expect("a RunConfig parses back");
                prop_assert_eq!(back, cfg);
            }
            Err(invalid) => {
                prop_assert!(!invalid.0.is_empty());
                for e in &invalid.0 {
                    prop_assert!(
                        e.field.starts_with("spec") || e.field.starts_with("metadata"),
                        "an error names no field: {e}"
                    );
                    prop_assert!(!e.message.trim().is_empty(), "{}: an empty message", e.field);
                }
            }
        }
    }
}

/// The generators reach what they are for: a fair share of the specs resolve, a fair
/// share get past the manifest and fail in the resolver, and most status documents
/// and termination messages are well-formed, so the properties above test something.
#[test]
fn the_generators_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut resolved, mut refused, mut malformed) = (0, 0, 0);
    let strategy = specs();
    for _ in 0..300 {
        let (origin, doc) = strategy.new_tree(&mut runner).unwrap().current();
        match manifest::from_yaml(&serde_json::to_string(&doc).unwrap(), &origin) {
            Err(_) => malformed += 1,
            Ok(run) if resolve(&run).is_ok() => resolved += 1,
            Ok(_) => refused += 1,
        }
    }
    assert!(
        resolved >= 60 && refused >= 30 && malformed >= 15,
        "{resolved} resolved, {refused} refused, {malformed} malformed"
    );
    let mut well_formed = |schema: Value, parses: &dyn Fn(Value) -> bool| {
        let strategy = values(&schema, 0);
        (0..300).filter(|_| parses(strategy.new_tree(&mut runner).unwrap().current())).count()
    };
    let statuses = well_formed(schema_of::<TrainerStatus>(), &|v| serde_json::from_value::<TrainerStatus>(v).is_ok());
    let messages =
        well_formed(schema_of::<TerminationMessage>(), &|v| serde_json::from_value::<TerminationMessage>(v).is_ok());
    assert!(statuses >= 45 && messages >= 60, "{statuses} status documents, {messages} termination messages");
}
