//! The configuration files of one real node: containerd's, the kubelet's, the CNI
//! network's and kube-proxy's, as text from the node's facts. Pure: the tests below
//! check what each must hold on this machine (see `../shared/FIELD-NOTES.md`, "A real
//! node on this machine").

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::network::{CLUSTER_DNS, POD_RANGE, pod_cidr};

/// The kubelet's node Lease duration; it renews the Lease every quarter of it.
pub const NODE_LEASE: std::time::Duration = std::time::Duration::from_secs(40);
/// How often the kubelet renews its node's Lease.
pub const LEASE_RENEW: std::time::Duration = std::time::Duration::from_secs(NODE_LEASE.as_secs() / 4);

/// Where the nodes' sockets and kubelet roots live: a short path, for Unix sockets.
pub const SHORT_ROOT: &str = "/var/lib/pt-e2e";

/// What the files of node `name` are made from.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub name: String,
    /// The node's number in its cluster: its pod range is [`pod_cidr`]`(index)`.
    pub index: u8,
    pub ip: Ipv4Addr,
    /// The node binaries (`scripts/setup-node.sh`).
    pub bin: PathBuf,
    /// This node's state: the kubelet's root, configuration, logs.
    pub dir: PathBuf,
    /// Its sockets and the kubelet's root, on a short path (a Unix socket's is at most
    /// 108 bytes, and the kubelet makes sockets deep in its root):
    /// `/var/lib/pt-e2e/<cluster>/<node>`.
    pub run_dir: PathBuf,
    /// containerd's root (images and snapshots), kept between clusters by node slot.
    pub containerd_root: PathBuf,
    /// The cgroup every pod of this node lives under (`/pt<pid>-<n>/node-<i>`).
    pub cgroup_root: String,
    /// The sandbox (pause) image's reference.
    pub pause_image: String,
    /// The machine's CPUs outside this node's share (a cpuset list like "1"), when it has
    /// a share: the kubelet reserves them, so that its pods run on the node's CPUs
    /// alone and it offers only those (the static CPU manager's shared pool).
    pub reserved_cpus: Option<String>,
}

impl NodeFacts {
    pub fn containerd_socket(&self) -> PathBuf {
        self.run_dir.join("containerd.sock")
    }
    pub fn cni_dir(&self) -> PathBuf {
        self.dir.join("cni")
    }
    pub fn kubelet_root(&self) -> PathBuf {
        self.run_dir.join("kubelet")
    }
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// containerd 2.x (config version 3). `restrict_oom_score_adj`: this machine refuses a
/// process that lowers its OOM score, and every sandbox would fail without it. Network
/// namespaces and runc's state live under this node's own directories, so that the
/// nodes of one machine never share them. NRI is off: no node here runs an NRI plugin,
/// and its one socket, `/var/run/nri/nri.sock`, would be shared by every containerd on
/// the machine, so two nodes starting at once race to bind it.
pub fn containerd(f: &NodeFacts) -> String {
    let state = f.dir.join("containerd-state");
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{runc_root}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{cni}"
"#,
        root = p(&f.containerd_root),
        state = p(&state),
        socket = p(&f.containerd_socket()),
        pause = f.pause_image,
        runc = p(&f.bin.join("runc")),
        runc_root = p(&state.join("runc")),
        bin = p(&f.bin),
        cni = p(&f.cni_dir()),
    )
}

/// The node's pod network: a bridge with the node's range, the gateway on it, no
/// masquerade (a pod's address is what its peers on other nodes see, which
/// NetworkPolicies judge), portmap for `hostPort`.
pub fn cni_conflist(f: &NodeFacts) -> String {
    let ipam_dir = f.dir.join("cni-ipam");
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": format!("pods-{}", f.name),
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
                "ipam": {"type": "host-local", "dataDir": p(&ipam_dir), "ranges": [[{"subnet": pod_cidr(f.index)}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// The kubelet: cgroup v1 with the cgroupfs driver (this machine has no v2
/// controllers), its own cgroup root, x509 and webhook authentication and webhook
/// authorization like a real cluster's, its own serving certificate, cluster DNS, and
/// no image garbage collection or eviction: the imported images cannot be pulled again.
/// Its pods' logs are the node's own: kubelets that share `/var/log/pods` delete each
/// other's pods' logs as orphans.
pub fn kubelet(f: &NodeFacts, ca: &Path, serving: &crate::control_plane::pki::CertPair, resolv: &Path) -> String {
    // The none policy gives the pods' cgroup every CPU of the machine; the static one
    // leaves it the node's, and with strict reservation runs containers on the shared
    // pool without the reserved CPUs.
    let cpus = match &f.reserved_cpus {
        Some(reserved) => format!(
            "cpuManagerPolicy: static\nreservedSystemCPUs: \"{reserved}\"\ncpuManagerPolicyOptions: {{strict-cpu-reservation: \"true\"}}\n"
        ),
        None => "cpuManagerPolicy: none\n".to_string(),
    };
    let text = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: "{cgroup_root}"
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: "unix://{socket}"
address: "{ip}"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: "{cert}"
tlsPrivateKeyFile: "{key}"
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{ca}"}}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: ["{dns}"]
resolvConf: "{resolv}"
podLogsDir: "{logs}"
enforceNodeAllocatable: []
evictionHard: {{}}
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 5s
nodeLeaseDurationSeconds: {lease}
rotateCertificates: false
serverTLSBootstrap: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
"#,
        cgroup_root = f.cgroup_root,
        lease = NODE_LEASE.as_secs(),
        socket = p(&f.containerd_socket()),
        ip = f.ip,
        cert = p(&serving.cert),
        key = p(&serving.key),
        ca = p(ca),
        dns = CLUSTER_DNS,
        resolv = p(resolv),
        logs = p(&f.dir.join("pod-logs")),
    );
    text + &cpus
}

/// kube-proxy in iptables mode. It leaves the machine-wide conntrack tunables alone
/// (zeros), and the OOM score as it is: this machine refuses a lower one.
pub fn kube_proxy(f: &NodeFacts, kubeconfig: &Path) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: "{kubeconfig}"
hostnameOverride: "{name}"
bindAddress: "{ip}"
healthzBindAddress: "127.0.0.1:10256"
metricsBindAddress: "127.0.0.1:10249"
clusterCIDR: "{pods}"
mode: iptables
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        kubeconfig = p(kubeconfig),
        name = f.name,
        ip = f.ip,
        pods = POD_RANGE,
    )
}

/// kube-router's arguments: the NetworkPolicy firewall alone (iptables and ipsets in the
/// node's network namespace). Its BGP router and IPVS service proxy stay off: the CNI
/// bridge and the router route pods, kube-proxy serves Services, and both parts carry
/// v2.1.0's published advisories (GHSA-v5mh-h5hx-7v92, GHSA-phqm-jgc3-qf8g). Policies
/// apply on events; the periodic full sync is a backstop.
pub fn kube_router_args(f: &NodeFacts, kubeconfig: &Path) -> Vec<String> {
    [
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        "--enable-ipv6=false",
        "--metrics-port=0",
        "--iptables-sync-period=1m",
        "--v=1",
    ]
    .into_iter()
    .map(String::from)
    .chain([
        format!("--kubeconfig={}", p(kubeconfig)),
        format!("--hostname-override={}", f.name),
        format!("--service-cluster-ip-range={}", crate::control_plane::SERVICE_RANGE),
    ])
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> NodeFacts {
        NodeFacts {
            name: "node-1".into(),
            index: 1,
            ip: Ipv4Addr::new(172, 18, 0, 3),
            bin: "/bin-dir".into(),
            dir: "/c/nodes/node-1".into(),
            run_dir: "/var/lib/pt-e2e/pt1-0/node-1".into(),
            containerd_root: "/cache/slot-3/containerd".into(),
            cgroup_root: "/pt1-0/node-1".into(),
            pause_image: "puretransformer.local/pause:1".into(),
            reserved_cpus: Some("0".into()),
        }
    }

    #[test]
    fn containerd_keeps_the_oom_score_and_its_state_to_the_node() {
        let text = containerd(&facts());
        for want in [
            "restrict_oom_score_adj = true",
            "root = \"/cache/slot-3/containerd\"",
            "address = \"/var/lib/pt-e2e/pt1-0/node-1/containerd.sock\"",
            "netns_mounts_under_state_dir = true",
            "BinaryName = \"/bin-dir/runc\"",
            "Root = \"/c/nodes/node-1/containerd-state/runc\"",
            "sandbox = \"puretransformer.local/pause:1\"",
            "conf_dir = \"/c/nodes/node-1/cni\"",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
    }

    #[test]
    fn containerd_binds_no_socket_outside_the_node() {
        let text = containerd(&facts());
        assert!(
            text.contains("[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n"),
            "NRI's machine-wide socket is not switched off in:\n{text}"
        );
        let addresses: Vec<&str> = text.lines().filter(|l| l.contains("address") || l.contains("socket")).collect();
        for line in &addresses {
            assert!(!line.contains("/run/"), "{line} is outside the node's directories");
        }
    }

    #[test]
    fn the_pod_network_is_the_nodes_range_without_masquerade() {
        let conf: serde_json::Value = serde_json::from_str(&cni_conflist(&facts())).unwrap();
        let bridge = &conf["plugins"][0];
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.2.0/24");
        assert_eq!(bridge["ipam"]["dataDir"], "/c/nodes/node-1/cni-ipam");
        assert_eq!(conf["name"], "pods-node-1");
    }

    #[test]
    fn the_kubelet_runs_on_cgroup_v1_and_never_collects_images() {
        let serving = crate::control_plane::pki::CertPair { cert: "/k.crt".into(), key: "/k.key".into() };
        let text = kubelet(&facts(), Path::new("/ca.crt"), &serving, Path::new("/resolv"));
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(doc["failCgroupV1"], false);
        assert_eq!(doc["cgroupDriver"], "cgroupfs");
        assert_eq!(doc["cgroupRoot"], "/pt1-0/node-1");
        assert_eq!(doc["imageGCHighThresholdPercent"], 100);
        assert_eq!(doc["evictionHard"], serde_yaml_ng::Value::Mapping(Default::default()));
        assert_eq!(doc["authorization"]["mode"], "Webhook");
        assert_eq!(doc["clusterDNS"][0], CLUSTER_DNS.to_string());
        assert_eq!(doc["cpuManagerPolicy"], "static");
        assert_eq!(doc["reservedSystemCPUs"], "0");
        assert_eq!(doc["cpuManagerPolicyOptions"]["strict-cpu-reservation"], "true");
        assert_eq!(doc["protectKernelDefaults"], false);
        assert_eq!(doc["podLogsDir"], "/c/nodes/node-1/pod-logs");
    }

    #[test]
    fn kube_router_runs_only_its_firewall() {
        let args = kube_router_args(&facts(), Path::new("/kr"));
        for off in ["--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false"] {
            assert!(args.iter().any(|a| a == off), "{off} missing from {args:?}");
        }
        assert!(args.iter().any(|a| a == "--run-firewall=true"));
        assert!(args.iter().any(|a| a == "--hostname-override=node-1"), "{args:?}");
        assert!(args.iter().any(|a| a == "--kubeconfig=/kr"), "{args:?}");
    }

    #[test]
    fn kube_proxy_leaves_the_machine_wide_tunables() {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&kube_proxy(&facts(), Path::new("/kp"))).unwrap();
        assert_eq!(doc["conntrack"]["maxPerCore"], 0);
        assert_eq!(doc["mode"], "iptables");
        assert_eq!(doc["clusterCIDR"], POD_RANGE);
    }
}
