//! What both CRDs' tests check the same way: every field documented for `kubectl
//! explain`, and printer columns that read fields the status schema has. Each test
//! binary uses some of them.
#![allow(dead_code)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// The openAPIV3Schema of the CRD's first version.
pub fn schema(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
}

/// The paths of the spec and status fields without a description.
pub fn undocumented_fields(schema: &Value) -> Vec<String> {
    fn walk(path: &str, node: &Value, missing: &mut Vec<String>) {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                let p = format!("{path}.{k}");
                if v.get("description").is_none() {
                    missing.push(p.clone());
                }
                walk(&p, v, missing);
            }
        }
        if let Some(items) = node.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    let mut missing = Vec::new();
    walk("spec", &schema["properties"]["spec"], &mut missing);
    walk("status", &schema["properties"]["status"], &mut missing);
    missing
}

/// The columns `kubectl get` shows by default: (upper-case name, JSONPath).
pub fn shown_columns(crd: &CustomResourceDefinition) -> Vec<(String, String)> {
    let cols = crd.spec.versions[0].additional_printer_columns.clone().unwrap();
    cols.iter().filter(|c| c.priority.unwrap_or(0) == 0).map(|c| (c.name.to_uppercase(), c.json_path.clone())).collect()
}

/// Panics naming a column whose `.status.` path the status schema lacks.
pub fn assert_status_paths_exist(crd: &CustomResourceDefinition, shown: &[(String, String)]) {
    let s = schema(crd);
    for (name, path) in shown.iter().filter(|(_, p)| p.starts_with(".status.")) {
        let mut node = &s["properties"]["status"];
        for part in path.trim_start_matches(".status.").split('.') {
            node = &node["properties"][part];
            assert!(!node.is_null(), "{name}: {path} is not in the status schema");
        }
    }
}
