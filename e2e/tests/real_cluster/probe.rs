//! Whether one pod can open a TCP connection to an address: `bash`'s `/dev/tcp` in the
//! trainer image, run by `kubectl exec` through the pod's kubelet. What NetworkPolicies
//! allow is judged on the real path: the probing pod's network namespace, its node's
//! bridge and kube-router's rules there, the router, and the target's node.

use std::net::IpAddr;
use std::time::Duration;

use e2e::test_cluster::TestCluster;

use crate::harness::*;

/// How long a connection attempt may take: a dropped SYN never answers.
const CONNECT: Duration = Duration::from_secs(3);

/// Whether pod `ns/pod` opens a TCP connection to `ip:port` within [`CONNECT`].
pub fn reaches(c: &TestCluster, ns: &str, pod: &str, ip: IpAddr, port: u16) -> bool {
    let script = format!("exec 3<>/dev/tcp/{ip}/{port}");
    let timeout = CONNECT.as_secs().to_string();
    let out = c
        .kubectl()
        .args(["-n", ns, "exec", pod, "--", "timeout", &timeout, "bash", "-c", &script])
        .output()
        .expect("kubectl exec");
    out.status.success()
}

/// A pod of the trainer image in `ns` that belongs to no run: it idles until deleted.
pub struct Probe<'a> {
    c: &'a TestCluster,
    ns: String,
    name: String,
}

impl<'a> Probe<'a> {
    /// Creates the pod and waits until it is Ready.
    pub fn start(c: &'a TestCluster, ns: &str, name: &str) -> Probe<'a> {
        let image = c.image("trainer").expect("the trainer image");
        let manifest = format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: probe}}}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsNonRoot: true, runAsUser: 65532}}
  containers:
  - name: probe
    image: {image}
    imagePullPolicy: IfNotPresent
    command: [sleep, infinity]
    resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}
"#
        );
        apply(c, ns, &manifest);
        wait_for(c, ns, &format!("pod/{name}"), "condition=Ready", Duration::from_secs(120));
        Probe { c, ns: ns.to_string(), name: name.to_string() }
    }

    /// Whether this pod opens a TCP connection to `ip:port`.
    pub fn reaches(&self, ip: IpAddr, port: u16) -> bool {
        reaches(self.c, &self.ns, &self.name, ip, port)
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        let _ = self.c.kubectl_out(&["-n", &self.ns, "delete", "pod", &self.name, "--wait=true", "--timeout=60s"]);
    }
}
