//! The pods bound to this node: started as processes in their own network, reported
//! as the kubelet reports them, stopped with SIGTERM, their grace period, then SIGKILL.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crds::contract;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};

use super::config::{Config, Error};
use super::container::{self, Process, Terminated, now_rfc3339};
use super::service_account;
use crate::network::{Enter, PodNetwork, hosts};

/// A pod this agent has started.
pub struct Running {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub net: PodNetwork,
    pub slot: u8,
    pub container: Container,
    pub process: Process,
    pub dir: PathBuf,
    /// Reported terminal; waiting for the API to delete it.
    pub finished: Option<Terminated>,
}

/// The pods of this node, by uid.
#[derive(Default)]
pub struct Pods {
    pub running: BTreeMap<String, Running>,
    /// Pods whose start failed, by uid: retried at each sync, reported once.
    pub waiting: BTreeMap<String, String>,
}

fn meta(pod: &Pod) -> (String, String, String) {
    (
        pod.metadata.uid.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
        pod.metadata.namespace.clone().unwrap_or_default(),
    )
}

fn terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Where a pod's files live: `<root>/pods/<namespace>_<name>_<uid>`.
pub fn pod_dir(root: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    root.join("pods").join(format!("{namespace}_{name}_{uid}"))
}

impl Pods {
    /// One pass of the sync loop over the pods bound to this node.
    pub async fn sync(&mut self, client: &kube::Client, cfg: &Config, pods: &[Pod]) {
        let present: BTreeMap<String, &Pod> = pods.iter().map(|p| (meta(p).0, p)).collect();
        for pod in pods {
            let (uid, name, ns) = meta(pod);
            let deleting = pod.metadata.deletion_timestamp.is_some();
            if !self.running.contains_key(&uid) {
                if deleting {
                    // Never started (or already reported): nothing to stop.
                    if let Err(e) = finish_deletion(client, pod).await {
                        tracing::warn!("{ns}/{name}: {e}");
                    }
                } else if !terminal(pod) {
                    match self.start(client, cfg, pod).await {
                        Ok(()) => {
                            self.waiting.remove(&uid);
                        }
                        Err(e) => {
                            let why = e.to_string();
                            if self.waiting.get(&uid) != Some(&why) {
                                tracing::warn!("{ns}/{name}: {why}");
                                let _ = report_waiting(client, pod, &why).await;
                                self.waiting.insert(uid.clone(), why);
                            }
                        }
                    }
                }
                continue;
            }
            let r = self.running.get_mut(&uid).expect("checked above");
            if deleting && r.finished.is_none() {
                let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30).max(0) as u64;
                let grace = Duration::from_secs(grace).min(cfg.max_grace);
                match r.process.term_sent {
                    None => {
                        container::signal_group(r.process.child.id(), libc::SIGTERM);
                        r.process.term_sent = Some((Instant::now(), grace));
                    }
                    Some((at, grace)) if at.elapsed() >= grace => {
                        container::signal_group(r.process.child.id(), libc::SIGKILL);
                    }
                    Some(_) => {}
                }
            }
            if r.finished.is_none()
                && let Some(t) = r.process.exited(&r.container)
            {
                // Whatever the container left behind dies with it.
                container::signal_group(r.process.child.id(), libc::SIGKILL);
                if let Err(e) = report_terminated(client, pod, &r.container, &t).await {
                    tracing::warn!("{ns}/{name}: {e}");
                    continue;
                }
                r.finished = Some(t);
                let _ = std::fs::remove_file(r.dir.join("pid"));
                r.net.delete();
                cfg.hosts.unregister(&uid);
            }
            if deleting
                && r.finished.is_some()
                && let Err(e) = finish_deletion(client, pod).await
            {
                tracing::warn!("{ns}/{name}: {e}");
            }
        }
        // Pods gone from the API: stop what is left of them.
        let gone: Vec<String> = self.running.keys().filter(|u| !present.contains_key(*u)).cloned().collect();
        for uid in gone {
            if let Some(mut r) = self.running.remove(&uid) {
                container::signal_group(r.process.child.id(), libc::SIGKILL);
                let _ = r.process.child.wait();
                let _ = std::fs::remove_file(r.dir.join("pid"));
                r.net.delete();
                cfg.hosts.unregister(&uid);
            }
        }
        self.waiting.retain(|u, _| present.contains_key(u));
    }

    /// Kills every container (the agent is stopping with its node).
    pub fn kill_all(&mut self, cfg: &Config) {
        for (uid, r) in self.running.iter_mut() {
            container::signal_group(r.process.child.id(), libc::SIGKILL);
            let _ = r.process.child.wait();
            r.net.delete();
            cfg.hosts.unregister(uid);
        }
        self.running.clear();
    }

    fn free_slot(&self) -> Option<u8> {
        (2..=254u8).find(|s| !self.running.values().any(|r| r.slot == *s && r.finished.is_none()))
    }

    /// Network, volumes, env, then the process; reports the pod Running.
    async fn start(&mut self, client: &kube::Client, cfg: &Config, pod: &Pod) -> Result<(), Error> {
        let (uid, name, ns) = meta(pod);
        let spec = pod.spec.as_ref().ok_or_else(|| Error::Pod("the pod has no spec".into()))?;
        let container =
            spec.containers.first().cloned().ok_or_else(|| Error::Pod("the pod has no container".into()))?;
        let program = image_binary(cfg, &container)?;
        let dir = pod_dir(&cfg.root, &ns, &name, &uid);
        let root = dir.join("root");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;

        // Volumes, each a directory; a mount is a link in the pod root.
        let mut backing: BTreeMap<String, PathBuf> = BTreeMap::new();
        for v in spec.volumes.clone().unwrap_or_default() {
            let path = if let Some(claim) = &v.persistent_volume_claim {
                claim_dir(client, &ns, &claim.claim_name).await?
            } else if let Some(cm) = &v.config_map {
                let obj: ConfigMap = Api::namespaced(client.clone(), &ns)
                    .get(&cm.name)
                    .await
                    .map_err(|e| Error::kube(format!("configmap {:?}", cm.name), e))?;
                let at = dir.join("volumes").join(&v.name);
                std::fs::create_dir_all(&at).map_err(|e| Error::io(&at, e))?;
                let data = obj.data.unwrap_or_default();
                let items: Vec<(String, String)> = match &cm.items {
                    Some(items) => items.iter().map(|i| (i.key.clone(), i.path.clone())).collect(),
                    None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
                };
                for (key, path) in items {
                    let text = data
                        .get(&key)
                        .ok_or_else(|| Error::Pod(format!("configmap {:?} has no key {key:?}", cm.name)))?;
                    let file = at.join(path);
                    std::fs::write(&file, text).map_err(|e| Error::io(&file, e))?;
                }
                at
            } else {
                dir.join("volumes").join(&v.name)
            };
            std::fs::create_dir_all(&path).map_err(|e| Error::io(&path, e))?;
            backing.insert(v.name.clone(), path);
        }
        let mut mounts: Vec<String> = Vec::new();
        // Claims under the trainer's PVC root are also bind-mounted at their paths in the
        // pod's mount namespace: the trainer derives `pvc://` paths from the run's config,
        // which no argument rewriting reaches.
        let mut claim_binds: Vec<(PathBuf, String)> = Vec::new();
        for m in container.volume_mounts.clone().unwrap_or_default() {
            let target =
                backing.get(&m.name).ok_or_else(|| Error::Pod(format!("volume mount {:?} names no volume", m.name)))?;
            let path = m.mount_path.trim_end_matches('/').to_string();
            if path.starts_with(&format!("{}/", contract::PVC_MOUNT_ROOT)) {
                claim_binds.push((target.clone(), path.clone()));
            }
            let at = root.join(path.trim_start_matches('/'));
            let parent = at.parent().expect("a mount path has a parent");
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            std::os::unix::fs::symlink(target, &at).map_err(|e| Error::io(&at, e))?;
            mounts.push(path);
        }
        // A process cannot see the pod's mounts at their paths (no image root file
        // system here), so paths under a mount are rewritten into the pod root.
        let in_root = |p: &str| root.join(p.trim_start_matches('/'));
        let under_mount = |p: &str| mounts.iter().any(|m| p == m || p.starts_with(&format!("{m}/")));

        let slot = self.free_slot().ok_or(Error::Exhausted)?;
        let mut net =
            PodNetwork::create(&cfg.netns_prefix, &cfg.cluster_netns, cfg.index, slot).map_err(Error::Network)?;
        // Checked after the link exists: whoever cuts the node writes the marker first,
        // then sets down the links it finds, so a pod started meanwhile is cut by one.
        if cfg.root.join(crate::network::PARTITIONED).exists() {
            net.set_link(false).map_err(Error::Network)?;
        }
        let pod_ip = net.ip.to_string();
        let host_ip = crate::network::pod_ip(cfg.index, 1).to_string();
        let started = async {
            let mut env: Vec<(String, String)> = vec![
                ("KUBERNETES_SERVICE_HOST".into(), crate::control_plane::KUBERNETES_SERVICE_IP.to_string()),
                ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
            ];
            if let Some(i) = pod.metadata.annotations.as_ref().and_then(|a| a.get(container::INDEX_ANNOTATION)) {
                env.push((contract::env::JOB_COMPLETION_INDEX.into(), i.clone()));
            }
            for e in container.env.clone().unwrap_or_default() {
                let value = match (&e.value, &e.value_from) {
                    (Some(v), _) => v.clone(),
                    (None, Some(from)) => {
                        if let Some(f) = &from.field_ref {
                            container::field(pod, &pod_ip, &host_ip, &f.field_path).ok_or_else(|| {
                                Error::Pod(format!("env {}: cannot resolve fieldRef {}", e.name, f.field_path))
                            })?
                        } else if let Some(r) = &from.config_map_key_ref {
                            let got = Api::<ConfigMap>::namespaced(client.clone(), &ns).get_opt(&r.name).await;
                            match got.ok().flatten().and_then(|c| c.data).and_then(|d| d.get(&r.key).cloned()) {
                                Some(v) => v,
                                None if r.optional == Some(true) => continue,
                                None => {
                                    return Err(Error::Pod(format!(
                                        "env {}: configmap {:?} key {:?} not found",
                                        e.name, r.name, r.key
                                    )));
                                }
                            }
                        } else if let Some(r) = &from.secret_key_ref {
                            let got = Api::<Secret>::namespaced(client.clone(), &ns).get_opt(&r.name).await;
                            let data = got.ok().flatten().and_then(|s| s.data).and_then(|d| d.get(&r.key).cloned());
                            match data {
                                Some(v) => String::from_utf8_lossy(&v.0).to_string(),
                                None if r.optional == Some(true) => continue,
                                None => {
                                    return Err(Error::Pod(format!(
                                        "env {}: secret {:?} key {:?} not found",
                                        e.name, r.name, r.key
                                    )));
                                }
                            }
                        } else {
                            String::new()
                        }
                    }
                    (None, None) => String::new(),
                };
                let value = if value.starts_with('/') && under_mount(&value) {
                    in_root(&value).display().to_string()
                } else {
                    value
                };
                env.push((e.name.clone(), value));
            }
            let termination_path =
                container.termination_message_path.clone().unwrap_or_else(|| contract::TERMINATION_LOG.into());
            let termination = in_root(&termination_path);
            let parent = termination.parent().expect("a file has a parent");
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            env.push((contract::env::TERMINATION_LOG.into(), termination.display().to_string()));
            if let Ok(filter) = std::env::var("RUST_LOG") {
                env.push(("RUST_LOG".into(), filter));
            }

            // The mapped binary is the image's entrypoint: a command names it first (its
            // path in the image is not this machine's), and without one the args follow it.
            let command = container.command.clone().unwrap_or_default();
            let mut args: Vec<String> = command.into_iter().skip(1).collect();
            args.extend(container.args.clone().unwrap_or_default());
            if args.first().map(String::as_str) == Some("launch") {
                args.extend(["--output".into(), in_root(contract::CHECKPOINT_MOUNT).display().to_string()]);
                args.extend(["--init-dir".into(), in_root(contract::INIT_MOUNT).display().to_string()]);
            }
            for a in args.iter_mut() {
                if a.starts_with('/') && under_mount(a) {
                    *a = in_root(a).display().to_string();
                }
            }
            let head = hosts::pod_head(
                &pod_ip,
                &spec.hostname.clone().unwrap_or(name.clone()),
                spec.subdomain.as_deref(),
                &ns,
            );
            let names = cfg.hosts.register(&uid, &head, Some(&ns)).map_err(Error::Network)?;
            let hostname = spec.hostname.clone().unwrap_or(name.clone());
            let mut enter =
                Enter::new(&crate::network::netns_path(&net.netns), &names, Some(&hostname)).map_err(Error::Network)?;
            for (source, target) in &claim_binds {
                enter = enter.bind(source, Path::new(target)).map_err(Error::Network)?;
            }
            if service_account::wanted(pod) {
                let files = service_account::project(client, cfg, pod, &dir).await?;
                enter = enter.bind(&files, Path::new(service_account::MOUNT)).map_err(Error::Network)?;
            }
            container::start(container::Launch {
                program,
                args,
                env,
                cwd: &root,
                log: dir.join("log"),
                termination,
                enter,
                oom_marker: dir.join("oom"),
            })
        }
        .await;
        let process = match started {
            Ok(p) => p,
            Err(e) => {
                net.delete();
                cfg.hosts.unregister(&uid);
                return Err(e);
            }
        };
        std::fs::write(dir.join("pid"), process.child.id().to_string()).map_err(|e| Error::io(&dir, e))?;
        let image = container.image.clone().unwrap_or_default();
        let status = json!({"status": {
            "phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
            "startTime": process.started_at,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": process.started_at},
                {"type": "Initialized", "status": "True", "lastTransitionTime": process.started_at},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": process.started_at},
                {"type": "Ready", "status": "True", "lastTransitionTime": process.started_at},
            ],
            "containerStatuses": [{"name": container.name, "ready": true, "started": true, "restartCount": 0,
                "image": image, "imageID": format!("e2e://{image}"), "containerID": format!("e2e://{}", process.child.id()),
                "state": {"running": {"startedAt": process.started_at}}}],
        }});
        let started_at = process.started_at.clone();
        self.running.insert(
            uid.clone(),
            Running {
                uid,
                name: name.clone(),
                namespace: ns.clone(),
                net,
                slot,
                container,
                process,
                dir,
                finished: None,
            },
        );
        patch_status(client, &ns, &name, status).await?;
        tracing::info!("{ns}/{name}: started at {started_at} on {}", cfg.node);
        Ok(())
    }
}

/// The binary an image runs: the first `--image` whose repository the image names.
fn image_binary(cfg: &Config, container: &Container) -> Result<PathBuf, Error> {
    let image = container.image.clone().unwrap_or_default();
    let repo = image.split('@').next().unwrap_or_default();
    let repo = match repo.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => repo,
    };
    cfg.images.iter().find(|(name, _)| repo.ends_with(name.as_str())).map(|(_, path)| path.clone()).ok_or_else(|| {
        Error::Image(format!(
            "image {image:?} is not one this node can run (it runs {:?})",
            cfg.images.keys().collect::<Vec<_>>()
        ))
    })
}

/// The directory behind a bound claim: its PersistentVolume's `hostPath`.
async fn claim_dir(client: &kube::Client, ns: &str, claim: &str) -> Result<PathBuf, Error> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get(claim)
        .await
        .map_err(|e| Error::kube(format!("persistentvolumeclaim {claim:?}"), e))?;
    let volume = pvc
        .spec
        .and_then(|s| s.volume_name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Error::Pod(format!("persistentvolumeclaim {claim:?} is not bound")))?;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .map_err(|e| Error::kube(format!("persistentvolume {volume:?}"), e))?;
    pv.spec
        .and_then(|s| s.host_path)
        .map(|h| PathBuf::from(h.path))
        .ok_or_else(|| Error::Pod(format!("persistentvolume {volume:?} has no hostPath")))
}

async fn patch_status(client: &kube::Client, ns: &str, name: &str, status: Value) -> Result<(), Error> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
        .await
        .map_err(|e| Error::kube(format!("pod {ns}/{name} status"), e))?;
    Ok(())
}

/// A container that could not start: waiting, with the reason the kubelet would give.
async fn report_waiting(client: &kube::Client, pod: &Pod, why: &str) -> Result<(), Error> {
    let (_, name, ns) = meta(pod);
    let container = pod.spec.as_ref().and_then(|s| s.containers.first()).map(|c| c.name.clone()).unwrap_or_default();
    let reason = if why.starts_with("image ") { "ErrImagePull" } else { "CreateContainerConfigError" };
    let status = json!({"status": {
        "phase": "Pending",
        "containerStatuses": [{"name": container, "ready": false, "restartCount": 0, "image": "", "imageID": "",
            "state": {"waiting": {"reason": reason, "message": why}}}],
    }});
    patch_status(client, &ns, &name, status).await
}

/// The container's end: phase (restartPolicy Never), `terminated` state, not Ready.
async fn report_terminated(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    t: &Terminated,
) -> Result<(), Error> {
    let (_, name, ns) = meta(pod);
    let phase = if t.exit_code == 0 { "Succeeded" } else { "Failed" };
    let now = now_rfc3339();
    let image = container.image.clone().unwrap_or_default();
    let status = json!({"status": {
        "phase": phase,
        "conditions": [
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": now},
        ],
        "containerStatuses": [{"name": container.name, "ready": false, "started": false, "restartCount": 0,
            "image": image, "imageID": format!("e2e://{image}"),
            "state": {"terminated": {"exitCode": t.exit_code, "reason": t.reason, "message": t.message,
                                     "startedAt": t.started_at, "finishedAt": t.finished_at}}}],
    }});
    patch_status(client, &ns, &name, status).await
}

/// The kubelet's last word on a deleted pod: delete it with no grace, for its uid.
async fn finish_deletion(client: &kube::Client, pod: &Pod) -> Result<(), Error> {
    let (uid, name, ns) = meta(pod);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(client.clone(), &ns).delete(&name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting pod {ns}/{name}"), e)),
    }
}
