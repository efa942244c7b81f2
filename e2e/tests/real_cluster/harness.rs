//! What every real-cluster test shares: the binaries, the images, waits that
//! print the cluster when they time out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::test_cluster::{Options, TestCluster};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A binary of this workspace's target directory (`cargo build -p operator -p trainer`,
/// which `make test` runs first).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let profile = exe.parent().and_then(Path::parent).expect("target/<profile>");
    profile.join(name)
}

/// The root of test clusters: under the target directory, so `cargo clean` removes it.
pub fn clusters_root() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>").join("e2e-clusters")
}

/// A cluster of `nodes` real nodes (kubelet, containerd, runc, kube-proxy, CoreDNS).
pub async fn cluster(nodes: usize) -> TestCluster {
    cluster_with(nodes, |_| {}).await
}

/// A cluster of `nodes` real nodes with `edit` applied to its options.
pub async fn cluster_with(nodes: usize, edit: impl FnOnce(&mut Options)) -> TestCluster {
    assert_root();
    let mut options = Options::with_nodes(nodes, &images_dir());
    edit(&mut options);
    match TestCluster::start(&clusters_root(), options).await {
        Ok(c) => c,
        Err(e) => panic!("the test cluster did not start: {e}"),
    }
}

/// The directory of the images the nodes run: `$PT_IMAGES_DIR` (set by `make test`),
/// else what `scripts/setup-images.sh` prints for this workspace's trainer, the static
/// operator (`$PT_OPERATOR_STATIC`, else `scripts/build-operator-static.sh`'s) and the
/// node stack's CoreDNS.
pub fn images_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PT_IMAGES_DIR") {
        return PathBuf::from(dir);
    }
    let script_out = |script: &str, args: &[&std::ffi::OsStr]| -> String {
        let out = std::process::Command::new("bash")
            .arg(repo().join("scripts").join(script))
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("{script}: {e}"));
        assert!(out.status.success(), "{script} failed ({})", out.status);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let operator = std::env::var("PT_OPERATOR_STATIC").unwrap_or_else(|_| script_out("build-operator-static.sh", &[]));
    let node_bin = e2e::node::binaries().unwrap_or_else(|e| panic!("the node binaries: {e}"));
    let trainer = workspace_binary("trainer");
    let coredns = node_bin.join("coredns");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--trainer".as_ref(),
        trainer.as_os_str(),
        "--operator".as_ref(),
        operator.as_ref(),
        "--coredns".as_ref(),
        coredns.as_os_str(),
    ];
    PathBuf::from(script_out("setup-images.sh", &args))
}

/// The chart's values that make it run this cluster's operator and trainer images.
pub fn chart_image_values(c: &TestCluster) -> Vec<String> {
    let split = |name: &str| {
        let image = c.image(name).unwrap_or_else(|e| panic!("{e}"));
        let (repo, tag) = image.rsplit_once(':').expect("an image with a tag");
        (repo.to_string(), tag.to_string())
    };
    let (operator, operator_tag) = split("operator");
    let (trainer, trainer_tag) = split("trainer");
    vec![
        format!("image.repository={operator}"),
        format!("image.tag={operator_tag}"),
        format!("trainerImage.repository={trainer}"),
        format!("trainerImage.tag={trainer_tag}"),
    ]
}

/// `helm install` of the chart with this cluster's images and `sets`, then waits until
/// the operator's Deployment has rolled out (its pods Ready).
pub fn helm_install_in_cluster(c: &TestCluster, sets: &[&str]) {
    let images = chart_image_values(c);
    let mut all: Vec<&str> = images.iter().map(String::as_str).collect();
    all.extend(sets);
    helm_install(c, &all);
    let deployment = format!("deployment/{RELEASE}");
    if let Err(e) = c.kubectl_out(&["-n", OPERATOR_NS, "rollout", "status", &deployment, "--timeout=180s"]) {
        panic!(
            "the operator's Deployment did not roll out: {e}
{}",
            c.dump(OPERATOR_NS)
        );
    }
}

fn assert_root() {
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "the real-cluster suite needs root: it runs kubelets, containerd and runc in namespaces of its own");
}

/// `kubectl args...` that must succeed; its stdout.
pub fn kubectl(c: &TestCluster, args: &[&str]) -> String {
    c.kubectl_out(args).unwrap_or_else(|e| panic!("{e}\n{}", c.dump("default")))
}

/// `kubectl args...` fed `stdin`: (success, stdout, stderr).
pub fn kubectl_stdin(c: &TestCluster, args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = c
        .kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("kubectl's stdin");
    let out = child.wait_with_output().expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `kubectl wait --for=<condition> <what> -n <ns>` within `timeout`; on timeout, the
/// cluster's state is printed.
pub fn wait_for(c: &TestCluster, ns: &str, what: &str, condition: &str, timeout: Duration) {
    let t = format!("--timeout={}s", timeout.as_secs());
    let f = format!("--for={condition}");
    if let Err(e) = c.kubectl_out(&["-n", ns, "wait", &f, what, &t]) {
        panic!("{what} never became {condition} within {timeout:?}: {e}\n{}", c.dump(ns));
    }
}

/// Installs the CRDs and waits until the API server serves them.
pub fn install_crd(c: &TestCluster) {
    for plural in ["trainingruns", "trainingdatasets"] {
        let crd = repo().join(format!("crds/{plural}.yaml"));
        kubectl(c, &["apply", "--server-side", "-f", &crd.display().to_string()]);
        wait_established(c, plural);
    }
}

/// Waits until CRD `<plural>.training.puretransformer.dev` is Established. Not `kubectl
/// wait`: on a CRD whose status the API server has not written yet it fails at once
/// ("<nil> is of the type <nil>") instead of waiting, as it did once in CI.
pub fn wait_established(c: &TestCluster, plural: &str) {
    let name = format!("crd/{plural}.training.puretransformer.dev");
    let established = "jsonpath={.status.conditions[?(@.type==\"Established\")].status}";
    poll(c, "default", &format!("{name} Established"), Duration::from_secs(60), || {
        let status = c.kubectl_out(&["get", &name, "-o", established])?;
        if status.trim() == "True" { Ok(()) } else { Err(format!("Established={status:?}")) }
    });
}

/// Polls `check` until it returns `Ok` (a condition of the cluster, not a timer), or
/// panics after `timeout` with the last state it returned and the cluster's objects.
pub fn poll<T>(
    c: &TestCluster,
    ns: &str,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let start = std::time::Instant::now();
    // Each check is a kubectl process or two: every 200 ms at first, then less often up
    // to once a second, which a wait of minutes needs no finer.
    let mut pause = Duration::from_millis(200);
    loop {
        match check() {
            Ok(v) => return v,
            Err(state) if start.elapsed() >= timeout => {
                panic!("{what}: not within {timeout:?}; last seen: {state}\n{}", c.dump(ns))
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 3 / 2).min(Duration::from_secs(1));
            }
        }
    }
}

pub const OPERATOR_NS: &str = "trainingrun-system";
pub const RELEASE: &str = "trainingrun-operator";

/// `helm install` of the chart into the real API server (its CRD from the chart's
/// `crds/`), with `sets` (`key=value`).
pub fn helm_install(c: &TestCluster, sets: &[&str]) {
    let chart = repo().join("charts/trainingrun-operator");
    let mut cmd = c.cp.helm();
    cmd.args(["install", RELEASE]).arg(&chart).args([
        "--namespace",
        OPERATOR_NS,
        "--create-namespace",
        "--timeout",
        "2m",
    ]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm");
    assert!(
        out.status.success(),
        "helm install failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_established(c, "trainingruns");
}

/// `helm template` of the chart with `sets` (`key=value`): every object it renders.
pub fn helm_template(c: &TestCluster, sets: &[&str]) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    let chart = repo().join("charts/trainingrun-operator");
    let mut cmd = c.cp.helm();
    cmd.args(["template", RELEASE]).arg(&chart).args(["--namespace", OPERATOR_NS]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm");
    assert!(out.status.success(), "helm template failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    serde_yaml_ng::Deserializer::from_str(&text)
        .filter_map(|doc| Option::<serde_json::Value>::deserialize(doc).expect("helm's YAML"))
        .collect()
}

/// The chart's operator pods that run, by name.
pub fn operator_pods(c: &TestCluster) -> Vec<String> {
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let jsonpath = "jsonpath={range .items[?(@.status.phase==\"Running\")]}{.metadata.name}{'\\n'}{end}";
    let out = c.kubectl_out(&["-n", OPERATOR_NS, "get", "pods", "-l", &selector, "-o", jsonpath]).unwrap_or_default();
    let mut pods: Vec<String> = out.lines().map(String::from).collect();
    pods.sort();
    pods
}

/// The operator pod that holds the leader Lease (its holder identity is the pod name);
/// empty while none does.
pub fn operator_leader(c: &TestCluster) -> String {
    c.kubectl_out(&["-n", OPERATOR_NS, "get", "lease", RELEASE, "-o", "jsonpath={.spec.holderIdentity}"])
        .unwrap_or_default()
}

/// `/metrics` of operator pod `pod`, fetched from its address as Prometheus scrapes it.
pub fn operator_metrics(c: &TestCluster, pod: &str) -> Result<String, String> {
    let ip = c.pod_ip(OPERATOR_NS, pod).map_err(|e| e.to_string())?;
    c.http_get(std::net::SocketAddr::new(ip, OPERATOR_METRICS_PORT), "/metrics").map_err(|e| e.to_string())
}

/// The chart's metrics port (`metrics.port`).
pub const OPERATOR_METRICS_PORT: u16 = 8080;

/// The restarts of operator pod `pod`'s container.
pub fn operator_restarts(c: &TestCluster, pod: &str) -> u32 {
    let path = "jsonpath={.status.containerStatuses[0].restartCount}";
    kubectl(c, &["-n", OPERATOR_NS, "get", "pod", pod, "-o", path]).trim().parse().unwrap_or(0)
}

/// SIGKILLs operator pod `pod`'s process through its node's runtime, as a crash; its
/// kubelet restarts the container in the same pod.
pub fn kill_operator(c: &TestCluster, pod: &str) {
    let pid = c.container_pid(OPERATOR_NS, pod).unwrap_or_else(|e| panic!("the operator's container: {e}"));
    // SAFETY: kill(2) on the operator's container process, found through its runtime.
    let killed = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

/// Waits until operator pod `pod`'s container has restarted more than `restarts` times
/// and is Ready again.
pub fn wait_operator_restarted(c: &TestCluster, pod: &str, restarts: u32) {
    let ready = "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].ready}";
    poll(c, OPERATOR_NS, &format!("{pod} restarted and Ready"), Duration::from_secs(120), || {
        let state = c.kubectl_out(&["-n", OPERATOR_NS, "get", "pod", pod, "-o", ready])?;
        let (count, is_ready) = state.trim().split_once(' ').unwrap_or(("0", "false"));
        if count.parse::<u32>().is_ok_and(|n| n > restarts) && is_ready == "true" { Ok(()) } else { Err(state) }
    });
}

/// A namespace for runs, with its default ServiceAccount (pods need it to be admitted).
pub async fn namespace(c: &TestCluster, ns: &str) {
    kubectl(c, &["create", "namespace", ns]);
    c.wait_default_service_account(ns).await.unwrap_or_else(|e| panic!("{e}"));
}

/// A field of a TrainingRun by JSONPath (`{.status.attempt}`).
pub fn run_field(c: &TestCluster, ns: &str, run: &str, path: &str) -> String {
    c.kubectl_out(&["-n", ns, "get", "trainingrun", run, "-o", &format!("jsonpath={path}")]).unwrap_or_default()
}

/// `examples/tiny-cluster.yaml`, named `name`, with `edit` applied to the document. Its
/// pods request 300m of CPU, not the example's 1: a test node offers one CPU (its
/// share of this machine), less the operator's and CoreDNS's requests.
pub fn tiny_cluster(name: &str, edit: impl FnOnce(&mut serde_yaml_ng::Value)) -> String {
    let text = std::fs::read_to_string(repo().join("examples/tiny-cluster.yaml")).expect("tiny-cluster.yaml");
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("YAML");
    doc["metadata"]["name"] = serde_yaml_ng::Value::from(name);
    doc["spec"]["topology"]["resources"]["requests"]["cpu"] = serde_yaml_ng::Value::from("300m");
    edit(&mut doc);
    serde_yaml_ng::to_string(&doc).expect("YAML")
}

/// `kubectl apply -n ns -f -` of a manifest.
pub fn apply(c: &TestCluster, ns: &str, manifest: &str) {
    let (ok, _, err) = kubectl_stdin(c, &["-n", ns, "apply", "-f", "-"], manifest);
    assert!(ok, "kubectl apply: {err}");
}

/// The reasons of the events about object `name`, oldest first.
pub fn event_reasons(c: &TestCluster, ns: &str, name: &str) -> Vec<String> {
    let selector = format!("involvedObject.name={name}");
    let out = kubectl(
        c,
        &[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &selector,
            "-o",
            "jsonpath={range .items[*]}{.reason}{'\\n'}{end}",
        ],
    );
    out.lines().map(String::from).collect()
}

/// `kubectl patch trainingrun <run> --type=merge -p <patch>`, as a user edits a run.
pub fn patch_run(c: &TestCluster, ns: &str, run: &str, patch: &str) {
    kubectl(c, &["-n", ns, "patch", "trainingrun", run, "--type=merge", "-p", patch]);
}

/// Argo CD's judgement of run `name`, by Argo CD's own Lua engine (`e2e::argocd`) on
/// the object as `kubectl get -o json` returns it, with that object's phase: the
/// (phase, health, message) of one read.
pub fn argo_cd_health(c: &TestCluster, ns: &str, name: &str) -> Result<(String, String, String), String> {
    let run: serde_json::Value =
        serde_json::from_str(&kubectl(c, &["-n", ns, "get", "trainingrun", name, "-o", "json"]))
            .map_err(|e| e.to_string())?;
    let phase = run["status"]["phase"].as_str().unwrap_or_default().to_string();
    let judged = e2e::argocd::health(&[run]).map_err(|e| e.to_string())?;
    let (health, message) = judged.get(name).cloned().ok_or_else(|| format!("no judgement of {name}: {judged:?}"))?;
    Ok((phase, health, message))
}

/// `kubectl port-forward -n <ns> <target> :<port>` (through the API server and the
/// kubelet's server), running until the returned child is killed; the local port, once
/// kubectl says it forwards.
pub fn port_forward(c: &TestCluster, ns: &str, target: &str, port: u16) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut child = c
        .kubectl()
        .args(["-n", ns, "port-forward", target, &format!(":{port}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("kubectl port-forward");
    let out = child.stdout.take().expect("piped");
    let mut lines = std::io::BufReader::new(out).lines();
    // "Forwarding from 127.0.0.1:40123 -> 8080", or its end of output if it fails.
    let local = lines
        .next()
        .and_then(Result::ok)
        .and_then(|l| l.strip_prefix("Forwarding from 127.0.0.1:").and_then(|r| r.split(' ').next()?.parse().ok()));
    let Some(local) = local else {
        let _ = child.kill();
        panic!("kubectl port-forward {target} :{port} did not forward\n{}", c.dump(ns));
    };
    // kubectl goes on printing a line a connection: drain them.
    std::thread::spawn(move || lines.for_each(drop));
    (child, local)
}
