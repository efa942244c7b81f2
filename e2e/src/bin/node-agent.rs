//! `node-agent`: one node of the e2e test cluster (see `e2e::node_agent`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::network::hosts::HostsDir;
use e2e::node_agent::{self, Config};

/// Registers a Node with the API server and runs the pods bound to it as processes.
#[derive(Parser, Debug)]
struct Args {
    /// The Node's name; the kubeconfig's identity must be `system:node:<name>`.
    #[arg(long)]
    node: String,
    /// The node's number: its pods get 10.244.<index + 1>.<n>.
    #[arg(long)]
    index: u8,
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Pods' files live under <root>/pods.
    #[arg(long)]
    root: PathBuf,
    /// The cluster's network namespace, which holds the bridge `br0`.
    #[arg(long)]
    cluster_netns: String,
    /// Pod network namespaces are named <prefix>-<index>-<slot>.
    #[arg(long)]
    netns_prefix: String,
    /// The cluster DNS's hosts directory.
    #[arg(long)]
    hosts_dir: PathBuf,
    /// An image repository (suffix) and the binary it runs: `trainer=/path/to/trainer`.
    #[arg(long = "image", value_parser = parse_image)]
    images: Vec<(String, PathBuf)>,
    #[arg(long, default_value = "8")]
    cpu: String,
    #[arg(long, default_value = "32Gi")]
    memory: String,
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// A deleted pod's processes get at most this long after SIGTERM.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    max_grace: Duration,
}

fn parse_image(s: &str) -> Result<(String, PathBuf), String> {
    let (image, path) = s.split_once('=').ok_or_else(|| format!("--image {s:?}: expected <image>=<binary>"))?;
    Ok((image.to_string(), PathBuf::from(path)))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    let client = match e2e::control_plane::client_for(&args.kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let ca_pem = match e2e::control_plane::kubeconfig_ca(&args.kubeconfig) {
        Ok(pem) => pem,
        Err(e) => {
            eprintln!("node-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = Config {
        node: args.node,
        index: args.index,
        root: args.root,
        images: args.images.into_iter().collect::<BTreeMap<_, _>>(),
        cluster_netns: args.cluster_netns,
        netns_prefix: args.netns_prefix,
        hosts: HostsDir(args.hosts_dir),
        cpu: args.cpu,
        memory: args.memory,
        gpus: args.gpus,
        kubelet_version: "v1.37.2-e2e".into(),
        max_grace: args.max_grace,
        ca_pem,
    };
    let stop = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
    };
    match node_agent::run(client, cfg, stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
