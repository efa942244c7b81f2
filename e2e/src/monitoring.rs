//! The chart's monitoring objects as a Prometheus configuration, without
//! prometheus-operator (whose controller the Go module proxy does not serve): each
//! `ServiceMonitor` endpoint and `PodMonitor` metrics endpoint becomes the scrape job
//! prometheus-operator generates for it, discovering targets through the real API
//! server (`kubernetes_sd_configs`, roles `endpointslice` and `pod`), and each
//! `PrometheusRule` becomes a rule file.
//!
//! The translation follows prometheus-operator's generator: the job is named
//! `serviceMonitor/<namespace>/<name>/<index>` (`podMonitor/...`); the selector keeps
//! targets by their Service's (or pod's) labels, the endpoint by its port name; the
//! `namespace`, `service`, `pod`, `container` and `endpoint` labels are set; `job` is the
//! Service's name (a PodMonitor's `<namespace>/<name>`), or the value of the `jobLabel`
//! label; the object's own `relabelings` come last. What it does not translate (TLS to
//! the target, basic auth, `metricRelabelings`, `sampleLimit`, the `attachMetadata`
//! block) is refused by name, so a chart change that needs it fails here first.

use std::path::Path;

use serde_json::{Value, json};

/// How Prometheus reaches and authenticates to the API server.
#[derive(Clone, Debug)]
pub struct Discovery<'a> {
    pub api_server: &'a str,
    pub ca_file: &'a Path,
    pub token_file: &'a Path,
}

/// A Kubernetes label name as a Prometheus meta label suffix.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

fn field<'a>(v: &'a Value, path: &str, what: &str) -> Result<&'a Value, String> {
    path.split('.').try_fold(v, |v, k| v.get(k)).ok_or_else(|| format!("{what}: no {path}"))
}

/// The `keep`/`drop` relabelings of a label selector on `kind`'s (`service`, `pod`)
/// labels.
fn selector(sel: &Value, kind: &str, what: &str) -> Result<Vec<Value>, String> {
    let label = |k: &str| format!("__meta_kubernetes_{kind}_label_{}", sanitize(k));
    let present = |k: &str| format!("__meta_kubernetes_{kind}_labelpresent_{}", sanitize(k));
    let mut out = Vec::new();
    for (k, v) in sel.get("matchLabels").and_then(Value::as_object).into_iter().flatten() {
        let v = v.as_str().ok_or_else(|| format!("{what}: matchLabels.{k} is not a string"))?;
        out.push(json!({"action": "keep", "source_labels": [label(k), present(k)], "regex": format!("({});true", regex_escape(v))}));
    }
    for e in sel.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
        let k = e["key"].as_str().ok_or_else(|| format!("{what}: a matchExpression without a key"))?;
        let values: Vec<String> =
            e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).map(regex_escape).collect();
        let one_of = format!("({});true", values.join("|"));
        out.push(match e["operator"].as_str() {
            Some("Exists") => json!({"action": "keep", "source_labels": [present(k)], "regex": "true"}),
            Some("DoesNotExist") => json!({"action": "drop", "source_labels": [present(k)], "regex": "true"}),
            Some("In") => json!({"action": "keep", "source_labels": [label(k), present(k)], "regex": one_of}),
            Some("NotIn") => json!({"action": "drop", "source_labels": [label(k), present(k)], "regex": one_of}),
            other => return Err(format!("{what}: matchExpressions operator {other:?}")),
        });
    }
    Ok(out)
}

/// `s` as a regular expression that matches only itself.
fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain(std::iter::once(c))
        })
        .collect()
}

/// `kubernetes_sd_configs` of `role` over a monitor's `namespaceSelector`.
fn sd(d: &Discovery, role: &str, monitor_ns: &str, namespaces: Option<&Value>) -> Value {
    let mut c = json!({
        "role": role,
        "api_server": d.api_server,
        "tls_config": {"ca_file": d.ca_file},
        "authorization": {"type": "Bearer", "credentials_file": d.token_file},
    });
    let any = namespaces.and_then(|n| n.get("any")).and_then(Value::as_bool) == Some(true);
    if !any {
        let names: Vec<&str> = namespaces
            .and_then(|n| n.get("matchNames"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_else(|| vec![monitor_ns]);
        c["namespaces"] = json!({"names": names});
    }
    json!([c])
}

/// Refuses what the translation does not carry over.
fn refuse_unsupported(endpoint: &Value, what: &str) -> Result<(), String> {
    for key in ["tlsConfig", "basicAuth", "bearerTokenSecret", "authorization", "oauth2", "metricRelabelings"] {
        if endpoint.get(key).is_some() {
            return Err(format!("{what}: {key} is not translated"));
        }
    }
    Ok(())
}

/// A monitor's own `relabelings`, in Prometheus' spelling.
fn user_relabelings(endpoint: &Value) -> Vec<Value> {
    let keys = [
        ("sourceLabels", "source_labels"),
        ("targetLabel", "target_label"),
        ("separator", "separator"),
        ("regex", "regex"),
        ("replacement", "replacement"),
        ("action", "action"),
        ("modulus", "modulus"),
    ];
    endpoint
        .get("relabelings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            let mut out = serde_json::Map::new();
            for (from, to) in keys {
                if let Some(v) = r.get(from) {
                    out.insert(
                        to.to_string(),
                        if to == "action" { json!(v.as_str().map(str::to_lowercase)) } else { v.clone() },
                    );
                }
            }
            Value::Object(out)
        })
        .collect()
}

fn replace(source: &[&str], target: &str) -> Value {
    json!({"source_labels": source, "target_label": target})
}

fn scrape_settings(job: &mut Value, endpoint: &Value) {
    job["metrics_path"] = json!(endpoint.get("path").and_then(Value::as_str).unwrap_or("/metrics"));
    if let Some(i) = endpoint.get("interval").and_then(Value::as_str) {
        job["scrape_interval"] = json!(i);
    }
    if let Some(t) = endpoint.get("scrapeTimeout").and_then(Value::as_str) {
        job["scrape_timeout"] = json!(t);
    }
    if let Some(s) = endpoint.get("scheme").and_then(Value::as_str) {
        job["scheme"] = json!(s);
    }
}

/// The scrape jobs of one ServiceMonitor.
fn service_monitor(m: &Value, d: &Discovery) -> Result<Vec<Value>, String> {
    let name = field(m, "metadata.name", "a ServiceMonitor")?.as_str().unwrap_or_default();
    let ns = m["metadata"]["namespace"].as_str().unwrap_or("default");
    let what = format!("ServiceMonitor {ns}/{name}");
    let spec = field(m, "spec", &what)?;
    let keep = selector(field(spec, "selector", &what)?, "service", &what)?;
    let mut jobs = Vec::new();
    for (i, e) in spec["endpoints"].as_array().ok_or_else(|| format!("{what}: no endpoints"))?.iter().enumerate() {
        refuse_unsupported(e, &format!("{what} endpoint {i}"))?;
        let port = e["port"].as_str().ok_or_else(|| format!("{what} endpoint {i}: only a named port is translated"))?;
        let mut relabel = vec![replace(&["job"], "__tmp_prometheus_job_name")];
        relabel.extend(keep.iter().cloned());
        relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": regex_escape(port)}));
        for (kind, target) in [("Node", "node"), ("Pod", "pod")] {
            relabel.push(json!({
                "source_labels": ["__meta_kubernetes_endpointslice_address_target_kind", "__meta_kubernetes_endpointslice_address_target_name"],
                "separator": ";", "regex": format!("{kind};(.*)"), "replacement": "${1}", "target_label": target,
            }));
        }
        relabel.push(replace(&["__meta_kubernetes_namespace"], "namespace"));
        relabel.push(replace(&["__meta_kubernetes_service_name"], "service"));
        relabel.push(replace(&["__meta_kubernetes_pod_name"], "pod"));
        relabel.push(replace(&["__meta_kubernetes_pod_container_name"], "container"));
        relabel.push(replace(&["__meta_kubernetes_service_name"], "job"));
        let at =
            Endpoint { monitor: "serviceMonitor", role: "endpointslice", labels_of: "service", ns, name, index: i };
        jobs.push(scrape_job(&at, spec, e, port, relabel, d));
    }
    Ok(jobs)
}

/// Where a monitor's endpoint is: its scrape job's name and service discovery.
struct Endpoint<'a> {
    /// `serviceMonitor` or `podMonitor`, as the job name starts.
    monitor: &'a str,
    /// The discovery role.
    role: &'a str,
    /// The object whose labels `jobLabel` names: `service` or `pod`.
    labels_of: &'a str,
    ns: &'a str,
    name: &'a str,
    index: usize,
}

/// The end of every scrape job prometheus-operator generates, after the relabelings of
/// its kind: the monitor's `jobLabel`, the `endpoint` label, the endpoint's own
/// relabelings, and its scrape settings.
fn scrape_job(at: &Endpoint, spec: &Value, e: &Value, port: &str, mut relabel: Vec<Value>, d: &Discovery) -> Value {
    if let Some(l) = spec.get("jobLabel").and_then(Value::as_str) {
        let source = format!("__meta_kubernetes_{}_label_{}", at.labels_of, sanitize(l));
        relabel.push(json!({"source_labels": [source], "regex": "(.+)", "replacement": "${1}", "target_label": "job"}));
    }
    relabel.push(json!({"target_label": "endpoint", "replacement": port}));
    relabel.extend(user_relabelings(e));
    let mut job = json!({
        "job_name": format!("{}/{}/{}/{}", at.monitor, at.ns, at.name, at.index),
        "honor_labels": e.get("honorLabels").and_then(Value::as_bool).unwrap_or(false),
        "kubernetes_sd_configs": sd(d, at.role, at.ns, spec.get("namespaceSelector")),
        "relabel_configs": relabel,
    });
    scrape_settings(&mut job, e);
    job
}

/// The scrape jobs of one PodMonitor.
fn pod_monitor(m: &Value, d: &Discovery) -> Result<Vec<Value>, String> {
    let name = field(m, "metadata.name", "a PodMonitor")?.as_str().unwrap_or_default();
    let ns = m["metadata"]["namespace"].as_str().unwrap_or("default");
    let what = format!("PodMonitor {ns}/{name}");
    let spec = field(m, "spec", &what)?;
    let keep = selector(field(spec, "selector", &what)?, "pod", &what)?;
    let endpoints = spec["podMetricsEndpoints"].as_array().ok_or_else(|| format!("{what}: no podMetricsEndpoints"))?;
    let mut jobs = Vec::new();
    for (i, e) in endpoints.iter().enumerate() {
        refuse_unsupported(e, &format!("{what} endpoint {i}"))?;
        let port = e["port"].as_str().ok_or_else(|| format!("{what} endpoint {i}: only a named port is translated"))?;
        let mut relabel = vec![replace(&["job"], "__tmp_prometheus_job_name")];
        relabel.extend(keep.iter().cloned());
        relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": regex_escape(port)}));
        relabel.push(replace(&["__meta_kubernetes_namespace"], "namespace"));
        relabel.push(replace(&["__meta_kubernetes_pod_container_name"], "container"));
        relabel.push(replace(&["__meta_kubernetes_pod_name"], "pod"));
        relabel.push(json!({"target_label": "job", "replacement": format!("{ns}/{name}")}));
        let at = Endpoint { monitor: "podMonitor", role: "pod", labels_of: "pod", ns, name, index: i };
        jobs.push(scrape_job(&at, spec, e, port, relabel, d));
    }
    Ok(jobs)
}

/// Prometheus' configuration (JSON, which its YAML loader reads) and rule file for the
/// monitoring objects among `objects`; the rule file is expected at `rules_file`.
pub fn translate(
    objects: &[Value],
    d: &Discovery,
    rules_file: &Path,
    evaluation_interval: &str,
) -> Result<(Value, Value), String> {
    let mut jobs = Vec::new();
    let mut groups = Vec::new();
    for o in objects {
        match (o["apiVersion"].as_str(), o["kind"].as_str()) {
            (Some("monitoring.coreos.com/v1"), Some("ServiceMonitor")) => jobs.extend(service_monitor(o, d)?),
            (Some("monitoring.coreos.com/v1"), Some("PodMonitor")) => jobs.extend(pod_monitor(o, d)?),
            (Some("monitoring.coreos.com/v1"), Some("PrometheusRule")) => {
                let g = o["spec"]["groups"].as_array().ok_or("a PrometheusRule without spec.groups")?;
                groups.extend(g.iter().cloned());
            }
            _ => {}
        }
    }
    let config = json!({
        "global": {"scrape_interval": "30s", "evaluation_interval": evaluation_interval},
        "rule_files": [rules_file],
        "scrape_configs": jobs,
    });
    Ok((config, json!({"groups": groups})))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discovery() -> Discovery<'static> {
        Discovery {
            api_server: "https://10.96.0.1:443",
            ca_file: Path::new("/ca.crt"),
            token_file: Path::new("/token"),
        }
    }

    #[test]
    fn a_pod_monitor_keeps_its_pods_port_and_relabelings() {
        let m = json!({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": "op-trainers", "namespace": "sys"},
            "spec": {
                "selector": {
                    "matchLabels": {"batch.kubernetes.io/job-completion-index": "0"},
                    "matchExpressions": [{"key": "training.puretransformer.dev/run", "operator": "Exists"}],
                },
                "namespaceSelector": {"any": true},
                "podMetricsEndpoints": [{"port": "status", "path": "/metrics", "interval": "5s", "relabelings": [
                    {"sourceLabels": ["__meta_kubernetes_pod_label_training_puretransformer_dev_run"], "targetLabel": "name"},
                ]}],
            },
        });
        let (config, _) = translate(&[m], &discovery(), Path::new("/rules.yaml"), "1s").unwrap();
        let job = &config["scrape_configs"][0];
        assert_eq!(job["job_name"], "podMonitor/sys/op-trainers/0");
        assert_eq!((job["metrics_path"].as_str(), job["scrape_interval"].as_str()), (Some("/metrics"), Some("5s")));
        let sd = &job["kubernetes_sd_configs"][0];
        assert_eq!((sd["role"].as_str(), sd.get("namespaces")), (Some("pod"), None), "any namespace");
        let relabel = job["relabel_configs"].as_array().unwrap();
        assert!(relabel.contains(&json!({"action": "keep", "source_labels": [
            "__meta_kubernetes_pod_label_batch_kubernetes_io_job_completion_index",
            "__meta_kubernetes_pod_labelpresent_batch_kubernetes_io_job_completion_index"], "regex": "(0);true"})));
        assert!(relabel.contains(&json!({"action": "keep", "source_labels": [
            "__meta_kubernetes_pod_labelpresent_training_puretransformer_dev_run"], "regex": "true"})));
        assert!(relabel.contains(&json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "status"})));
        assert!(relabel.contains(&json!({"target_label": "job", "replacement": "sys/op-trainers"})));
        assert_eq!(
            relabel.last().unwrap(),
            &json!({"source_labels": ["__meta_kubernetes_pod_label_training_puretransformer_dev_run"], "target_label": "name"}),
            "the monitor's own relabelings come last"
        );
    }

    #[test]
    fn a_service_monitor_takes_its_job_from_the_job_label_and_its_namespace_by_default() {
        let m = json!({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "op", "namespace": "sys"},
            "spec": {"jobLabel": "app.kubernetes.io/name", "selector": {"matchLabels": {"app.kubernetes.io/name": "trainingrun-operator"}},
                     "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "2s"}]},
        });
        let (config, _) = translate(&[m], &discovery(), Path::new("/rules.yaml"), "1s").unwrap();
        let job = &config["scrape_configs"][0];
        assert_eq!(job["job_name"], "serviceMonitor/sys/op/0");
        assert_eq!(job["kubernetes_sd_configs"][0]["namespaces"], json!({"names": ["sys"]}));
        let relabel = job["relabel_configs"].as_array().unwrap();
        let job_from_service =
            relabel.iter().position(|r| r == &replace(&["__meta_kubernetes_service_name"], "job")).unwrap();
        let job_label = relabel
            .iter()
            .position(|r| {
                r["source_labels"] == json!(["__meta_kubernetes_service_label_app_kubernetes_io_name"])
                    && r["target_label"] == "job"
            })
            .unwrap();
        assert!(job_from_service < job_label, "the job label wins over the service name");
        assert!(relabel.contains(&json!({"target_label": "endpoint", "replacement": "metrics"})));
    }

    #[test]
    fn rules_pass_through_and_what_is_not_translated_is_refused() {
        let rule = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "r"},
                          "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0"}]}]}});
        let (config, rules) = translate(&[rule], &discovery(), Path::new("/rules.yaml"), "1s").unwrap();
        assert_eq!(rules["groups"][0]["rules"][0]["alert"], "A");
        assert_eq!(config["rule_files"], json!(["/rules.yaml"]));
        let tls = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "s", "namespace": "n"},
                         "spec": {"selector": {}, "endpoints": [{"port": "m", "tlsConfig": {}}]}});
        let e = translate(&[tls], &discovery(), Path::new("/r"), "1s").unwrap_err();
        assert_eq!(e, "ServiceMonitor n/s endpoint 0: tlsConfig is not translated");
        assert_eq!(regex_escape("a.b(c)"), "a\\.b\\(c\\)");
    }
}
