//! The scale bench's peer: JobSet's controller given the same load, each run's shape
//! as the JobSet a user would write for it without us (one replicated Job of `nodes`
//! indexed pods of 8 GPUs, one restart, suspended or held alike), on a cluster of its
//! own. Its figures are the ones a user would compare: the time until every JobSet's
//! status shows its fate, the requests a settled controller makes, its memory, and
//! etcd's bytes per object.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::control_plane::{ControlPlane, Error};
use crate::scale::cluster::{OPERATOR_NS, RUNS_NS};
use crate::scale::load::{FAILING_AFTER_SECONDS, Fate, GPUS_PER_NODE, HELD_POOL, Shape};

/// JobSet's controller, as the audit log names it (a ServiceAccount of its own).
pub const PEER_USER: &str = "system:serviceaccount:bench-system:jobset-controller";
const PEER_ACCOUNT: &str = "jobset-controller";

pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"), "jobsets")
}

/// A ServiceAccount for JobSet's controller, bound to `cluster-admin` (its own
/// ClusterRole grants less; what it may do does not change what it asks), and a
/// kubeconfig with its token.
pub fn identity(cp: &ControlPlane, dir: &Path) -> Result<PathBuf, Error> {
    let binding = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {PEER_ACCOUNT}, namespace: {OPERATOR_NS}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {PEER_ACCOUNT}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\n\
         subjects: [{{kind: ServiceAccount, name: {PEER_ACCOUNT}, namespace: {OPERATOR_NS}}}]\n"
    );
    cp.kubectl_in(&["apply", "-f", "-"], &binding).map_err(Error::Setup)?;
    let token = cp
        .kubectl_out(&["-n", OPERATOR_NS, "create", "token", PEER_ACCOUNT, "--duration=24h"])
        .map_err(Error::Setup)?;
    let path = dir.join("jobset.kubeconfig");
    cp.write_kubeconfig(&path, &cp.server(), PEER_ACCOUNT, token.trim())?;
    Ok(path)
}

/// The JobSet of `shape`, in `namespace`.
pub fn manifest(shape: &Shape, namespace: &str) -> Value {
    let mut env = Vec::new();
    if shape.fate == Fate::Failing {
        env.push(json!({"name": "KWOK_RUN_SECONDS", "value": FAILING_AFTER_SECONDS.to_string()}));
        env.push(json!({"name": "KWOK_EXIT_CODE", "value": "1"}));
    }
    let gpus = json!({"nvidia.com/gpu": GPUS_PER_NODE.to_string()});
    let mut pod = json!({
        "restartPolicy": "Never",
        "subdomain": shape.name,
        "containers": [{
            "name": "trainer",
            "image": "ghcr.io/puretransformer/trainer:latest",
            "command": ["trainer", "train", "--config", "/etc/trainer/config.json"],
            "env": env,
            "resources": {"requests": gpus, "limits": gpus},
        }],
    });
    if shape.fate == Fate::Pending {
        pod["nodeSelector"] = json!({HELD_POOL: "later"});
    }
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": shape.name, "namespace": namespace, "labels": {"bench.puretransformer.dev/fate": shape.fate.to_string()}},
        "spec": {
            "suspend": shape.fate == Fate::Suspended,
            "failurePolicy": {"maxRestarts": 1},
            "network": {"enableDNSHostnames": true},
            "replicatedJobs": [{
                "name": "node",
                "replicas": 1,
                "template": {"spec": {
                    "parallelism": shape.nodes,
                    "completions": shape.nodes,
                    "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "template": {"spec": pod},
                }},
            }],
        },
    })
}

/// What a JobSet's status shows, in the words of [`Fate::settled_phase`].
pub fn shown(status: &Value) -> &'static str {
    let condition = |t: &str| {
        status["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
    };
    let jobs = &status["replicatedJobsStatus"][0];
    let count = |field: &str| jobs[field].as_u64().unwrap_or(0);
    if condition("Failed") {
        "Failed"
    } else if condition("Suspended") || count("suspended") > 0 {
        "Suspended"
    } else if count("ready") > 0 {
        "Running"
    } else if count("active") > 0 {
        "Pending"
    } else {
        ""
    }
}

/// The JobSets as a watch shows them: what each one's status shows; waits wake on each
/// event.
#[derive(Clone)]
pub struct Watched {
    shown: Arc<Mutex<HashMap<String, &'static str>>>,
    /// When the watch last showed any JobSet's fate change.
    last_change: Arc<Mutex<Option<Instant>>>,
    notify: Arc<Notify>,
}

pub fn watch(client: kube::Client) -> Watched {
    let w = Watched { shown: Arc::default(), last_change: Arc::default(), notify: Arc::new(Notify::new()) };
    let feeding = w.clone();
    let api: Api<DynamicObject> = Api::namespaced_with(client, RUNS_NS, &resource());
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff().applied_objects());
        while let Some(event) = events.next().await {
            let Ok(js) = event else { continue };
            let name = js.metadata.name.clone().unwrap_or_default();
            let now = shown(&js.data["status"]);
            if feeding.shown.lock().expect("the JobSets' lock").insert(name, now) != Some(now) {
                *feeding.last_change.lock().expect("the JobSets' lock") = Some(Instant::now());
            }
            feeding.notify.notify_waiters();
        }
    });
    w
}

impl Watched {
    /// Waits until every shape's JobSet shows its fate, on each watch event; once no
    /// fate has changed for `stall`, or after `limit`, fails with how many of each fate
    /// show what.
    pub async fn wait_fates(&self, shapes: &[Shape], stall: Duration, limit: Duration) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let woken = self.notify.notified();
            let off = {
                let shown = self.shown.lock().expect("the JobSets' lock");
                let mut off: BTreeMap<(Fate, &'static str), usize> = BTreeMap::new();
                for s in shapes {
                    let now = shown.get(&s.name).copied().unwrap_or_default();
                    if now != s.fate.settled_phase() {
                        *off.entry((s.fate, now)).or_insert(0) += 1;
                    }
                }
                off
            };
            if off.is_empty() {
                return Ok(());
            }
            let last = *self.last_change.lock().expect("the JobSets' lock");
            let since_progress = last.filter(|t| *t > start).unwrap_or(start).elapsed();
            if start.elapsed() >= limit || since_progress >= stall {
                return Err(Error::NotReady {
                    what: "every JobSet's status showing its fate".into(),
                    waited: start.elapsed(),
                    state: format!("not yet (fate, shown): count: {off:?}; no fate changed for {since_progress:?}"),
                });
            }
            let _ = tokio::time::timeout(Duration::from_secs(5), woken).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::load::plan;

    #[test]
    fn a_jobset_asks_what_its_run_asks() {
        for shape in plan(64, 20) {
            let js = manifest(&shape, "bench");
            let job = &js["spec"]["replicatedJobs"][0]["template"]["spec"];
            assert_eq!(job["parallelism"], shape.nodes, "{}", shape.name);
            let pod = &job["template"]["spec"];
            assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], GPUS_PER_NODE.to_string());
            assert_eq!(js["spec"]["suspend"], shape.fate == Fate::Suspended);
            assert_eq!(pod["nodeSelector"].is_object(), shape.fate == Fate::Pending, "{}", shape.name);
            let env = pod["containers"][0]["env"].as_array().map_or(0, Vec::len);
            assert_eq!(env > 0, shape.fate == Fate::Failing, "{}", shape.name);
        }
    }

    #[test]
    fn a_status_shows_the_fate_its_run_would() {
        let table = [
            (json!({}), ""),
            (json!({"replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 0}]}), "Pending"),
            (json!({"replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 1}]}), "Running"),
            (json!({"replicatedJobsStatus": [{"name": "node", "suspended": 1}]}), "Suspended"),
            (json!({"conditions": [{"type": "Suspended", "status": "True"}]}), "Suspended"),
            (
                json!({"conditions": [{"type": "Suspended", "status": "False"}], "replicatedJobsStatus": [{"active": 1}]}),
                "Pending",
            ),
            (
                json!({"conditions": [{"type": "Failed", "status": "True"}], "replicatedJobsStatus": [{"failed": 1}]}),
                "Failed",
            ),
        ];
        for (status, want) in table {
            assert_eq!(shown(&status), want, "{status}");
        }
    }
}
