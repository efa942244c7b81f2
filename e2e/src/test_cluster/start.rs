//! Starting a test cluster ([`crate::node`]): the routed node network, the API server
//! reaching the kubelets through its egress proxy, a kubelet, containerd, kube-proxy and
//! kube-router (NetworkPolicy) per node, and CoreDNS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{Options, TestCluster, controllers_runtime, dns, fresh_dir, netpol};
use crate::control_plane::{self, ControlPlane, Error, RealNodes, wait_until};
use crate::cpus;
use crate::mounts::SharedMount;
use crate::network::egress::EgressProxy;
use crate::network::nodes::{NodeNetwork, ROUTER};
use crate::network::relay::Relay;
use crate::node::{self, NodeFacts, NodeStart, RealNode, Slot, images};

/// The images every real cluster runs.
pub const IMAGES: [&str; 4] = ["pause", "trainer", "operator", "coredns"];

fn setup(e: impl std::fmt::Display) -> Error {
    Error::Setup(e.to_string())
}

/// The machine's CPUs outside `share`, as a cpuset list; none when the share is all.
pub fn reserved_cpus(host: &[usize], share: &[usize]) -> Option<String> {
    let rest: Vec<usize> = host.iter().copied().filter(|c| !share.contains(c)).collect();
    (!share.is_empty() && !rest.is_empty()).then(|| crate::node::cgroups::cpu_list(&rest))
}

impl TestCluster {
    /// Starts a cluster in a fresh directory under `root`, and waits until every node is
    /// Ready, advertises its GPUs ([`Options::gpus`]), and CoreDNS has rolled out (with
    /// no node, the control plane alone).
    pub async fn start(root: &std::path::Path, options: Options) -> Result<TestCluster, Error> {
        let (dir, prefix, number) = fresh_dir(root)?;
        start(dir, prefix, number, options).await
    }
}

async fn start(dir: PathBuf, prefix: String, number: usize, options: Options) -> Result<TestCluster, Error> {
    let images_dir = options.images.clone();
    let catalogue = images::catalogue(&images_dir)?;
    if let Some(missing) = IMAGES.iter().find(|i| !catalogue.contains_key(**i)) {
        return Err(Error::Setup(format!("{}: no {missing} image", images_dir.display())));
    }
    let bin = node::binaries()?;
    node::sweep_stale();
    let net = crate::network::nodes::create_router(&prefix).map_err(setup)?;
    let mut node_nets = Vec::new();
    for i in 0..options.nodes {
        node_nets.push(NodeNetwork::create(&prefix, &net.netns, i as u8).map_err(setup)?);
    }
    // Unix sockets on a short path: a socket's is at most 108 bytes.
    let run_dir = PathBuf::from(crate::node::SHORT_ROOT).join(&prefix);
    std::fs::create_dir_all(&run_dir).map_err(|e| Error::io(&run_dir, e))?;
    let egress = EgressProxy::start(&run_dir.join("egress.sock"), &net.path()).map_err(setup)?;
    let names: Vec<String> = (0..options.nodes).map(|i| format!("node-{i}")).collect();
    let real = RealNodes {
        ips: node_nets.iter().map(|n| n.ip).collect(),
        advertise: ROUTER,
        egress_selector: crate::network::egress::selector_config(&egress.socket),
    };
    let cp = ControlPlane::start(&dir.join("control-plane"), &names, &real).await?;
    let client = cp.client().await?;
    let relay = Relay::start(
        &net.path(),
        SocketAddr::from((ROUTER, cp.api_port)),
        SocketAddr::from(([127, 0, 0, 1], cp.api_port)),
    )
    .map_err(setup)?;
    crate::provisioner::install(&client).await.map_err(|e| Error::Setup(format!("the StorageClass: {e}")))?;
    let controllers = controllers_runtime()?;
    let (kubeconfig, volumes) = (cp.kubeconfig.clone(), dir.join("volumes"));
    // Before the nodes' mount namespaces: a file system a test mounts over a volume's
    // directory later reaches the containers.
    let shared_volumes =
        SharedMount::new(&volumes).map_err(|e| Error::Setup(format!("{}: a shared mount: {e}", volumes.display())))?;
    controllers.spawn(async move {
        match control_plane::client_for(&kubeconfig).await {
            Ok(client) => crate::provisioner::run(client, volumes).await,
            Err(e) => tracing::error!("the cluster's provisioner: {e}"),
        }
    });
    let mut cluster = TestCluster {
        nodes: Vec::new(),
        controllers: Some(controllers),
        volumes_mount: Some(shared_volumes),
        _relay: relay,
        _egress: egress,
        net,
        cp,
        dir,
        client,
        options,
    };
    let seed = node::seed::seed(&bin, &images_dir, &catalogue)?;
    let slots = node::slots_root();
    let host = cpus::host_cpus();
    for (i, net) in node_nets.into_iter().enumerate() {
        let slot = Slot::take(&slots)?;
        let facts = NodeFacts {
            name: names[i].clone(),
            index: i as u8,
            ip: net.ip,
            bin: bin.clone(),
            dir: cluster.dir.join("nodes").join(&names[i]),
            run_dir: run_dir.join(&names[i]),
            containerd_root: slot.containerd_root.clone(),
            cgroup_root: format!("/{prefix}/{}", names[i]),
            pause_image: catalogue["pause"].reference.clone(),
            reserved_cpus: None,
        };
        let cpus = cpus::node_share(&host, cluster.options.nodes, number, i);
        let facts = NodeFacts { reserved_cpus: reserved_cpus(&host, &cpus), ..facts };
        let start = NodeStart { cp: &cluster.cp, net, slot, cpus, cluster: &prefix, images: &catalogue, seed: &seed };
        let node = RealNode::start(facts, start).await?;
        cluster.nodes.push(node);
    }
    cluster.wait_nodes_ready().await?;
    cluster.wait_default_service_account("default").await?;
    if cluster.options.nodes == 0 {
        return Ok(cluster);
    }
    if cluster.options.gpus > 0 {
        cluster.advertise_gpus().await?;
    }
    cluster.kubectl_in(&["apply", "-f", "-"], netpol::RBAC).map_err(setup)?;
    for node in &mut cluster.nodes {
        node.start_kube_router(&cluster.cp)?;
    }
    for node in &cluster.nodes {
        netpol::wait_enforcing(node).await?;
    }
    cluster
        .kubectl_in(&["apply", "-f", "-"], &dns::manifests(&catalogue["coredns"].reference, cluster.options.nodes))
        .map_err(setup)?;
    cluster
        .kubectl_out(&["-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s"])
        .map_err(|e| Error::Setup(format!("cluster DNS: {e}\n{}", cluster.dump("kube-system"))))?;
    for node in &cluster.nodes {
        wait_services_routed(node).await?;
    }
    Ok(cluster)
}

/// The Services every pod needs, by the comments kube-proxy gives their endpoints' rules.
const ROUTED_SERVICES: [&str; 2] = ["default/kubernetes:https -> ", "kube-system/kube-dns:dns -> "];

/// Waits until kube-proxy on `node` routes the `kubernetes` and `kube-dns` Services to
/// their endpoints: CoreDNS being Ready says nothing of a node whose kube-proxy has not
/// yet synced, and a pod started there would find no resolver.
async fn wait_services_routed(node: &RealNode) -> Result<(), Error> {
    let netns = node.net.netns.clone();
    wait_until(
        &format!("kube-proxy on {} routing the cluster's Services", node.facts.name),
        Duration::from_secs(60),
        || {
            let out =
                std::process::Command::new("ip").args(["netns", "exec", &netns, "iptables-save", "-t", "nat"]).output();
            async move {
                let rules = out.map_err(|e| format!("iptables-save: {e}"))?;
                let rules = String::from_utf8_lossy(&rules.stdout);
                let missing: Vec<&str> = ROUTED_SERVICES.iter().copied().filter(|s| !rules.contains(s)).collect();
                if missing.is_empty() { Ok(()) } else { Err(format!("no rules yet for {missing:?}")) }
            }
        },
    )
    .await
}

impl TestCluster {
    /// Advertises [`Options::gpus`] `nvidia.com/gpu` on every node: a patch of its
    /// status' capacity, as for any extended resource no device plugin manages. The
    /// kubelet keeps it, and the scheduler counts it.
    async fn advertise_gpus(&self) -> Result<(), Error> {
        use k8s_openapi::api::core::v1::Node;
        use kube::api::{Patch, PatchParams};
        let nodes: kube::Api<Node> = kube::Api::all(self.client.clone());
        let gpus = self.options.gpus.to_string();
        let patch = serde_json::json!({"status": {"capacity": {"nvidia.com/gpu": gpus}}});
        for node in &self.nodes {
            let name = &node.facts.name;
            nodes
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::Setup(format!("advertising {gpus} GPUs on {name}: {e}")))?;
        }
        control_plane::wait_until("every node's GPUs allocatable", Duration::from_secs(60), || {
            let nodes = nodes.clone();
            let gpus = gpus.clone();
            async move {
                let list = nodes.list(&Default::default()).await.map_err(|e| e.to_string())?;
                let allocatable: Vec<Option<String>> = list
                    .items
                    .iter()
                    .map(|n| {
                        let a = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
                        a.and_then(|a| a.get("nvidia.com/gpu")).map(|q| q.0.clone())
                    })
                    .collect();
                if allocatable.iter().all(|a| a.as_deref() == Some(gpus.as_str())) {
                    Ok(())
                } else {
                    Err(format!("allocatable nvidia.com/gpu: {allocatable:?}"))
                }
            }
        })
        .await
    }

    /// The image of `name` (`trainer`, `operator`, ...) in a real cluster's nodes.
    pub fn image(&self, name: &str) -> Result<String, Error> {
        let catalogue = images::catalogue(&self.options.images)?;
        catalogue.get(name).map(|i| i.reference.clone()).ok_or_else(|| Error::Setup(format!("no image {name}")))
    }

    /// The host pid of pod `namespace/name`'s running container (its first), as its
    /// node's runtime reports it (`crictl inspect`).
    pub fn container_pid(&self, namespace: &str, name: &str) -> Result<u32, Error> {
        let pid = self.inspect_container(namespace, name, "{{.info.pid}}")?;
        pid.parse().map_err(|_| Error::Setup(format!("pod {name}'s container: not a pid: {pid:?}")))
    }

    /// When pod `namespace/name`'s running container started, in seconds since the
    /// epoch, to the nanosecond its runtime records (the API's `startedAt` is to the
    /// second).
    pub fn container_started_at(&self, namespace: &str, name: &str) -> Result<f64, Error> {
        let at = self.inspect_container(namespace, name, "{{.status.startedAt}}")?;
        let t: jiff::Timestamp =
            at.parse().map_err(|e| Error::Setup(format!("pod {name}'s container: not a start time: {at:?}: {e}")))?;
        Ok(t.as_nanosecond() as f64 / 1e9)
    }

    /// `crictl inspect --template <template>` of pod `namespace/name`'s running
    /// container (its first), on its node.
    fn inspect_container(&self, namespace: &str, name: &str, template: &str) -> Result<String, Error> {
        let node_name = self
            .kubectl_out(&["-n", namespace, "get", "pod", name, "-o", "jsonpath={.spec.nodeName}"])
            .map_err(Error::Setup)?;
        let node = self.node(node_name.trim())?;
        let run = |mut cmd: std::process::Command| -> Result<String, Error> {
            let out = cmd.output().map_err(|e| Error::Spawn { program: "crictl".into(), source: e })?;
            if !out.status.success() {
                return Err(Error::Setup(format!("crictl: {}", String::from_utf8_lossy(&out.stderr).trim())));
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let mut ps = node.crictl();
        ps.args(["ps", "--quiet", "--state", "running"])
            .args(["--label", &format!("io.kubernetes.pod.name={name}")])
            .args(["--label", &format!("io.kubernetes.pod.namespace={namespace}")]);
        let ids = run(ps)?;
        let id = ids.lines().next().ok_or_else(|| Error::Setup(format!("pod {name} has no running container")))?;
        let mut inspect = node.crictl();
        inspect.args(["inspect", "--output", "go-template", "--template", template, id]);
        run(inspect)
    }

    /// Node `name`, of a real cluster.
    pub fn node(&self, name: &str) -> Result<&RealNode, Error> {
        self.nodes.iter().find(|n| n.facts.name == name).ok_or_else(|| Error::Setup(format!("no real node {name}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reserves_the_cpus_outside_its_share() {
        assert_eq!(reserved_cpus(&[0, 1], &[0]), Some("1".into()));
        assert_eq!(reserved_cpus(&[0, 1, 2, 3], &[2, 3]), Some("0,1".into()));
        assert_eq!(reserved_cpus(&[0, 1], &[0, 1]), None);
        assert_eq!(reserved_cpus(&[0, 1], &[]), None);
    }
}
