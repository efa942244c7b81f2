//! Issue 62 §3 and §4: a node is real. A pod of the trainer image is a container under
//! the kubelet: in the pod cgroup of its QoS class, on its node's share of the CPUs, as the non-root user its security
//! context names, on a read-only root file system, with the kubelet's hosts file and
//! cluster DNS (CoreDNS answers the Service names, kube-proxy routes the `kubernetes`
//! ClusterIP to the API server); `kubectl logs` and `kubectl exec` reach it through the
//! kubelet's own server.

use std::time::Duration;

use crate::harness::*;
use crate::slots::cluster_slot;

/// What the probe pod runs: each line of its output is checked below.
const PROBE: &str = r#"set -u
echo "id: $(id -u):$(id -g)"
echo "cgroup: $(grep -m1 memory /proc/self/cgroup)"
echo "cpus: $(nproc)"
echo "limit: $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || echo none)"
echo "dns: $(getent hosts kubernetes.default.svc.cluster.local)"
if (exec 3<>/dev/tcp/kubernetes.default.svc.cluster.local/443) 2>/dev/null; then echo "api: connected"; else echo "api: refused"; fi
if touch /rootfs-write 2>/dev/null; then echo "root: writable"; else echo "root: read-only"; fi
if touch /tmp/ok 2>/dev/null; then echo "tmp: writable"; else echo "tmp: read-only"; fi
exec sleep 3600
"#;

fn probe_pod(image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: probe, namespace: default}}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
  - name: probe
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["/bin/bash", "-c", {script}]
    resources: {{requests: {{cpu: 100m, memory: 64Mi}}, limits: {{memory: 128Mi}}}}
    securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}
    volumeMounts: [{{name: tmp, mountPath: /tmp}}]
  volumes: [{{name: tmp, emptyDir: {{}}}}]
"#,
        script = serde_json::to_string(PROBE).expect("a JSON string"),
    )
}

#[tokio::test]
async fn a_pod_is_a_container_under_a_real_kubelet() {
    let _slot = cluster_slot().await;
    let c = cluster_with(2, |_| {}).await;
    let image = c.image("trainer").unwrap_or_else(|e| panic!("{e}"));
    apply(&c, "default", &probe_pod(&image));
    wait_for(&c, "default", "pod/probe", "condition=Ready", Duration::from_secs(120));
    // The script prints its lines, then sleeps: the last line is there once it sleeps.
    let log = poll(&c, "default", "the probe's output", Duration::from_secs(60), || {
        let log = c.kubectl_out(&["logs", "probe"])?;
        if log.contains("tmp: ") { Ok(log) } else { Err(log) }
    });
    eprintln!("{log}");
    let line = |key: &str| log.lines().find_map(|l| l.strip_prefix(&format!("{key}: "))).unwrap_or_default();
    assert_eq!(line("id"), "65532:65532", "{log}");
    assert!(line("cgroup").contains("/kubepods/burstable/pod"), "{log}");
    let share = (e2e::cpus::host_cpus().len() / 2).max(1);
    assert_eq!(line("cpus"), share.to_string(), "a node's pods run on its share of the CPUs: {log}");
    assert_eq!(line("limit"), (128u64 << 20).to_string(), "the container's memory limit is its cgroup's: {log}");
    assert!(line("dns").starts_with("10.96.0.1 "), "cluster DNS answers the kubernetes Service: {log}");
    assert_eq!(line("api"), "connected", "kube-proxy routes the kubernetes ClusterIP: {log}");
    assert_eq!(line("root"), "read-only", "{log}");
    assert_eq!(line("tmp"), "writable", "{log}");

    // exec through the API server and the kubelet's server, as `kubectl exec` does.
    let hostname = kubectl(&c, &["exec", "probe", "--", "cat", "/etc/hostname"]);
    assert_eq!(hostname.trim(), "probe");
    let node = kubectl(&c, &["get", "pod", "probe", "-o", "jsonpath={.spec.nodeName}"]);
    let runtime = kubectl(&c, &["get", "node", &node, "-o", "jsonpath={.status.nodeInfo.containerRuntimeVersion}"]);
    assert!(runtime.starts_with("containerd://"), "{runtime}");
}
