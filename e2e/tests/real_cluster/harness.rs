//! What every real-cluster test shares: one cluster at a time, the binaries, waits that
//! print the cluster when they time out.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use e2e::test_cluster::{Options, TestCluster};

pub const TR: &str = "training.puretransformer.dev/v1alpha1";

/// Serialises the tests of this binary: one cluster at a time.
pub fn serial() -> &'static tokio::sync::Mutex<()> {
    static LOCK: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    LOCK.get_or_init(|| tokio::sync::Mutex::new(()))
}

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
fn clusters_root() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>").join("e2e-clusters")
}

/// A cluster of `nodes` nodes that run the trainer image.
pub async fn cluster(nodes: usize) -> TestCluster {
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "the real-cluster suite needs root: it creates network and mount namespaces for the pods");
    let options = Options::with_nodes(nodes, Path::new(env!("CARGO_BIN_EXE_node-agent")), &workspace_binary("trainer"));
    match TestCluster::start(&clusters_root(), options).await {
        Ok(c) => c,
        Err(e) => panic!("the test cluster did not start: {e}"),
    }
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

/// Installs the CRD and waits until the API server serves it.
pub fn install_crd(c: &TestCluster) {
    let crd = repo().join("crds/trainingruns.yaml");
    kubectl(c, &["apply", "--server-side", "-f", &crd.display().to_string()]);
    wait_for(
        c,
        "default",
        "crd/trainingruns.training.puretransformer.dev",
        "condition=Established",
        Duration::from_secs(60),
    );
}
