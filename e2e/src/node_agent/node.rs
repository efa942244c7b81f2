//! The node's registration and heartbeats: its `Node` object with capacity and the
//! `Ready` condition, and its `Lease` in `kube-node-lease`, renewed as the kubelet does
//! (the node-lifecycle controller marks the node NotReady when renewals stop).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::config::{Config, Error};

pub const LEASE_NAMESPACE: &str = "kube-node-lease";
pub const LEASE_SECONDS: i32 = 40;

/// Creates the Node (or keeps the one that exists) and reports it Ready.
pub async fn register(client: &kube::Client, cfg: &Config) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": cfg.node, "labels": {
            "kubernetes.io/hostname": cfg.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        }},
        "spec": {"podCIDR": crate::network::pod_cidr(cfg.index), "podCIDRs": [crate::network::pod_cidr(cfg.index)]},
    }))
    .expect("a Node");
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(Error::kube(format!("creating node {}", cfg.node), e)),
    }
    report_status(client, cfg).await
}

/// The node's status: capacity, addresses, and Ready with a fresh heartbeat.
pub async fn report_status(client: &kube::Client, cfg: &Config) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = super::container::now_rfc3339();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let mut capacity = json!({"cpu": cfg.cpu, "memory": cfg.memory, "pods": "110", "ephemeral-storage": "100Gi"});
    if cfg.gpus > 0 {
        capacity["nvidia.com/gpu"] = json!(cfg.gpus.to_string());
    }
    let status = json!({"status": {
        "capacity": capacity, "allocatable": capacity,
        "addresses": [{"type": "InternalIP", "address": crate::network::pod_ip(cfg.index, 1).to_string()},
                      {"type": "Hostname", "address": cfg.node}],
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", "True", "KubeletReady", "e2e node agent is posting ready status"),
        ],
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "e2e",
                     "containerRuntimeVersion": "e2e-agent://1", "kubeletVersion": cfg.kubelet_version,
                     "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
    }});
    nodes
        .patch_status(&cfg.node, &PatchParams::default(), &Patch::Strategic(status))
        .await
        .map_err(|e| Error::kube(format!("node {} status", cfg.node), e))?;
    Ok(())
}

/// Creates or renews the node's Lease.
pub async fn renew_lease(client: &kube::Client, cfg: &Config) -> Result<(), Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let now = MicroTime(jiff::Timestamp::now());
    match leases.get_opt(&cfg.node).await.map_err(|e| Error::kube("node lease".into(), e))? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.renew_time = Some(now);
            spec.holder_identity = Some(cfg.node.clone());
            spec.lease_duration_seconds = Some(LEASE_SECONDS);
            leases
                .replace(&cfg.node, &PostParams::default(), &lease)
                .await
                .map_err(|e| Error::kube("renewing the node lease".into(), e))?;
        }
        None => {
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": cfg.node, "namespace": LEASE_NAMESPACE},
            }))
            .expect("a Lease");
            let lease = Lease {
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.node.clone()),
                    lease_duration_seconds: Some(LEASE_SECONDS),
                    renew_time: Some(now),
                    ..Default::default()
                }),
                ..lease
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .map_err(|e| Error::kube("creating the node lease".into(), e))?;
        }
    }
    Ok(())
}
