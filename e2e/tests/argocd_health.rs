//! `deploy/argocd/health.lua`, judged by Argo CD's own Lua engine (`e2e::argocd`, Argo CD
//! v3.6.1's `util/lua` built from the Go module proxy) on every status fixture of
//! `deploy/argocd/health_fixtures.json`: each object gets the fixture's health, and a
//! message that contains the fixture's.

use std::path::Path;

use kube::Resource;
use serde_json::{Value, json};

#[test]
fn argo_cds_engine_judges_every_fixture_as_written() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/argocd/health_fixtures.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fixtures: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(fixtures.len() >= 10, "only {} fixtures in {}", fixtures.len(), path.display());
    let objects: Vec<Value> = fixtures
        .iter()
        .map(|f| {
            let mut object = f["object"].clone();
            object["apiVersion"] = json!(crds::TrainingRun::api_version(&()));
            object["kind"] = json!(crds::TrainingRun::kind(&()));
            object["metadata"]["name"] = f["name"].clone();
            object
        })
        .collect();
    let judged = e2e::argocd::health(&objects).unwrap_or_else(|e| panic!("{e}"));
    let mut wrong = Vec::new();
    for f in &fixtures {
        let (name, status, message) =
            (f["name"].as_str().unwrap(), f["status"].as_str().unwrap(), f["message"].as_str().unwrap());
        match judged.get(name) {
            Some((s, m)) if s == status && m.contains(message) => {}
            got => wrong.push(format!("{name}: got {got:?}, want {status} with a message containing {message:?}")),
        }
    }
    assert!(wrong.is_empty(), "{} of {} fixtures:\n  {}", wrong.len(), fixtures.len(), wrong.join("\n  "));
}
