//! Every run reason that the alerts, their promtool tests, the Grafana dashboard, the
//! chart's snapshot and the Argo CD health check name is one the operator writes:
//! a [`RunReason`]. A misspelt reason in a matcher never matches, so nothing fires.

use std::path::Path;

use crds::contract::RunReason;

/// Files that name reasons, relative to the repository root.
const FILES: &[&str] = &[
    "charts/trainingrun-operator/files/alerts.yaml",
    "charts/trainingrun-operator/files/alerts_test.yaml",
    "charts/trainingrun-operator/files/dashboard.json",
    "charts/trainingrun-operator/tests/snapshot.yaml",
    "deploy/argocd/health.lua",
    "deploy/argocd/health_fixtures.json",
];

/// A reason named in a file, with the line it is on.
#[derive(Debug, PartialEq)]
struct Named {
    line: usize,
    name: String,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// A string literal at the start of `s` (`"…"`, or `\"…\"` inside a JSON string):
/// its content and the length it spans.
fn string_literal(s: &str) -> Option<(&str, usize)> {
    let (open, close) = if s.starts_with("\\\"") { ("\\\"", "\\\"") } else { ("\"", "\"") };
    let body = s.strip_prefix(open)?;
    let end = body.find(close)?;
    Some((&body[..end], open.len() + end + close.len()))
}

/// Names matched against `reason`: PromQL matchers (`reason="A"`, `reason=~"A|B"`,
/// `reason!~"A|B"`, `reason!="A"`), Lua fields and comparisons (`reason = "A"`,
/// `reason == "A"`, `reason ~= "A"`) and YAML labels (`reason: A`). An alternation
/// of anything but plain names is reported as the name `<regex …>`, which never
/// passes: such a matcher cannot be checked.
fn matched_names(text: &str) -> Vec<Named> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("reason") {
        if text[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = &text[at + "reason".len()..];
        if rest.chars().next().is_some_and(is_ident) {
            continue;
        }
        let rest = rest.trim_start_matches([' ', '\t']);
        let line = line_of(text, at);
        if let Some(value) = rest.strip_prefix(':') {
            let value = value.trim_start_matches([' ', '\t']);
            let name: String = value.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                out.push(Named { line, name });
            }
            continue;
        }
        let Some(op) = ["=~", "!~", "!=", "==", "~=", "="].into_iter().find(|op| rest.starts_with(op)) else {
            continue;
        };
        let Some((value, _)) = string_literal(rest[op.len()..].trim_start()) else { continue };
        if value.is_empty() {
            continue;
        }
        for alternative in value.split('|') {
            let name = if !alternative.is_empty() && alternative.chars().all(is_ident) {
                alternative.to_string()
            } else {
                format!("<regex {value:?}>")
            };
            out.push(Named { line, name });
        }
    }
    out
}

/// Every value of a `reason` key in a JSON document (the Argo CD health fixtures), with
/// the line of its first occurrence.
fn json_reasons(text: &str) -> Vec<Named> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("reason", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let doc: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON: {e}"));
    let mut names = Vec::new();
    walk(&doc, &mut names);
    let mut named: Vec<Named> = names
        .into_iter()
        .map(|name| {
            let at = text.find(&format!("\"{name}\"")).unwrap_or(0);
            Named { line: line_of(text, at), name }
        })
        .collect();
    named.sort_by_key(|n| n.line);
    named
}

fn names_in(path: &str, text: &str) -> Vec<Named> {
    if path.ends_with(".json") && !path.contains("dashboard") { json_reasons(text) } else { matched_names(text) }
}

fn unknown(names: &[Named]) -> Vec<&Named> {
    names.iter().filter(|n| RunReason::parse(&n.name).is_none()).collect()
}

#[test]
fn every_reason_named_outside_the_code_is_a_run_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut problems = Vec::new();
    let mut found = 0;
    for path in FILES {
        let text = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let names = names_in(path, &text);
        found += names.len();
        for n in unknown(&names) {
            problems.push(format!("{path}:{}: {}", n.line, n.name));
        }
    }
    // The matchers the alerts are built on, so a change of format cannot make this vacuous.
    assert!(found >= 10, "only {found} reasons found; has the format of these files changed?");
    let known: Vec<&str> = RunReason::all().map(RunReason::as_str).collect();
    assert!(
        problems.is_empty(),
        "reasons the operator never writes (crds::contract::RunReason):\n  {}\nknown reasons: {}",
        problems.join("\n  "),
        known.join(", ")
    );
}

#[test]
fn the_extraction_finds_each_form() {
    let promql = r#"trainingrun_condition{type="Failed", reason="NaNLoss"} and x{reason=~"OutOfMemory|DataError", reason!~"A.*"}"#;
    let names: Vec<String> = matched_names(promql).into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["NaNLoss", "OutOfMemory", "DataError", r#"<regex "A.*">"#]);

    let json = r#"{"expr": "sum(trainingrun_condition{reason=\"Stalled\"})", "legendFormat": "{{reason}}"}"#;
    let names: Vec<String> = matched_names(json).into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["Stalled"]);

    let yaml = "exp_labels: {severity: critical, namespace: ml, reason: RestartLimitExceeded}\nsummary: reason {{ $labels.reason }}";
    let names = matched_names(yaml);
    assert_eq!(names, [Named { line: 1, name: "RestartLimitExceeded".into() }]);
    assert_eq!(unknown(&names).len(), 1, "a reason the operator never writes is caught");

    let lua = "if status.reason == \"Stalled\" then end\nlocal x = { reason = \"NaNLoss\", reason2 = \"x\" }\nhs.message = status.reason or \"unknown reason\"";
    let names: Vec<String> = names_in("x.lua", lua).into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["Stalled", "NaNLoss"]);

    let fixtures = r#"[{"name": "n", "object": {"status": {"reason": "NaNLoss",
        "conditions": [{"type": "Stalled", "status": "True", "reason": "NoProgress", "message": "reason: x"}]}}}]"#;
    let names = names_in("fixtures.json", fixtures);
    assert_eq!(names, [Named { line: 1, name: "NaNLoss".into() }, Named { line: 2, name: "NoProgress".into() }]);
}
