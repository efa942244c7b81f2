use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use kube::Client;
use operator::Error;
use operator::clock::SystemClock;
use operator::context::Context;
use operator::controller;
use operator::http::{self, Health};
use operator::leader::{self, Election};
use operator::metrics::Metrics;
use operator::settings::{DEFAULT_STATUS_URL, Settings};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Kubernetes operator for TrainingRuns: reconciles each run into a ConfigMap, a
/// headless Service, a checkpoint PVC and an Indexed Job, and keeps its status true.
#[derive(Parser, Debug)]
#[command(name = "operator", version)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Trainer image for runs that set no spec.image.
    #[arg(long, env = "TRAINER_IMAGE", default_value = operator::settings::DEFAULT_TRAINER_IMAGE)]
    trainer_image: String,
    /// Watch only this namespace; all namespaces when empty.
    #[arg(long, env = "WATCH_NAMESPACE", default_value = "")]
    namespace: String,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// URL of rank 0's status endpoint; {job}, {service}, {namespace}, {run} and {port} are filled in.
    #[arg(long, env = "STATUS_URL", default_value = DEFAULT_STATUS_URL)]
    status_url: String,
    /// Poll rank 0 at most this often per run.
    #[arg(long, env = "STATUS_POLL_INTERVAL", default_value = "20s", value_parser = humantime::parse_duration)]
    status_poll_interval: Duration,
    /// Write progress-only status updates at most this often per run.
    #[arg(long, env = "STATUS_WRITE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    status_write_interval: Duration,
    /// Requeue an idle run after this long, as a safety net for missed watch events.
    #[arg(long, env = "REQUEUE_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    requeue_interval: Duration,
    /// Report a pod that cannot be scheduled or pull its image after this long.
    #[arg(long, env = "PENDING_TIMEOUT", default_value = "10m", value_parser = humantime::parse_duration)]
    pending_timeout: Duration,
    /// Reconciles in flight at once.
    #[arg(long, env = "CONCURRENCY", default_value_t = 16)]
    concurrency: u16,
    /// Elect a leader through a Lease, so only one replica reconciles.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Give every run a NetworkPolicy: its pods accept traffic only from the run's own
    /// pods and, on the status port, from the operator's pods.
    #[arg(long, env = "NETWORK_POLICY", default_value_t = false, action = clap::ArgAction::Set)]
    network_policy: bool,
    /// With --network-policy: the namespace whose pods (Prometheus) may also reach the
    /// trainers' status port, to scrape their /metrics.
    #[arg(long, env = "SCRAPE_NAMESPACE")]
    scrape_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "trainingrun-operator")]
    lease_name: String,
    /// Namespace of the Lease; the operator's own namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Identity in the election; the pod name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Print the ConfigMap, Service, PVC and Job the operator creates for a
    /// TrainingRun manifest (attempt 1), as a multi-document YAML stream.
    Render {
        /// TrainingRun manifest.
        manifest: std::path::PathBuf,
        /// Namespace for a manifest that names none.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Where a TrainingDataset the mix names is prepared, as the operator resolves
        /// it once the dataset is Ready: `NAME=URI` (its spec.output); repeatable.
        #[arg(long = "dataset", value_name = "NAME=URI")]
        datasets: Vec<String>,
    },
}

fn render(
    manifest: &std::path::Path,
    namespace: &str,
    datasets: &[String],
    trainer_image: &str,
) -> Result<String, String> {
    let run = crds::manifest::from_file(manifest).map_err(|e| e.to_string())?;
    let mut uris = std::collections::BTreeMap::new();
    for d in datasets {
        let (name, uri) = d.split_once('=').ok_or_else(|| format!("--dataset {d:?}: write NAME=URI"))?;
        uris.insert(name.to_string(), uri.to_string());
    }
    let mut run = crds::resolve::with_datasets(&run, |n| uris.get(n).cloned()).map_err(|missing| {
        format!("{}: the mix names TrainingDatasets {missing:?}; give each with --dataset NAME=URI", manifest.display())
    })?;
    run.metadata.namespace.get_or_insert_with(|| namespace.to_string());
    // Owner references need a uid; the API server assigns the real one.
    run.metadata.uid.get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
    let cfg = operator::validate::validate(&run, 1).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let i = operator::resources::Inputs { run: &run, cfg: &cfg, trainer_image };
    let suspend = run.spec.suspend || run.spec.queue_name.is_some();
    let docs = [
        serde_yaml_ng::to_string(&operator::resources::configmap(&i)),
        serde_yaml_ng::to_string(&operator::resources::service(&i)),
        serde_yaml_ng::to_string(&operator::resources::pvc(&i)),
        serde_yaml_ng::to_string(&operator::resources::job(&i, suspend)),
    ];
    let docs: Result<Vec<String>, _> = docs.into_iter().collect();
    Ok(docs.map_err(|e| e.to_string())?.join("---\n"))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn main_inner(args: Args) -> Result<(), Error> {
    let client = Client::try_default().await.map_err(Error::Connect)?;
    controller::check_crd(&client).await?;
    let settings = Settings {
        trainer_image: args.trainer_image,
        status_url: args.status_url,
        status_poll_interval: args.status_poll_interval,
        status_write_interval: args.status_write_interval,
        requeue_interval: args.requeue_interval,
        pending_timeout: args.pending_timeout,
        concurrency: args.concurrency,
        network_policy: args.network_policy.then(|| args.lease_namespace.clone()),
        scrape_namespace: args.scrape_namespace.filter(|n| !n.is_empty()),
        ..Settings::default()
    };
    let metrics = Arc::new(Metrics::new()?);
    let ready = Arc::new(AtomicBool::new(false));
    let (addr, _server) =
        http::serve(args.metrics_addr, Health { metrics: metrics.clone(), ready: ready.clone() }).await?;
    tracing::info!("serving /metrics, /healthz and /readyz on {addr}");
    let namespace = Some(args.namespace).filter(|n| !n.is_empty());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    ready.store(true, Ordering::Relaxed);
    let ctx = Context::new(client.clone(), settings, metrics.clone(), Arc::new(SystemClock));
    let both = |ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>| async move {
        tokio::join!(
            controller::run(ctx.clone(), namespace.clone(), stopped(stop.clone())),
            operator::dataset::run(ctx, namespace, stopped(stop)),
        );
    };
    if !args.leader_elect {
        both(ctx, stop_rx).await;
        return Ok(());
    }
    let identity = args.identity.unwrap_or_else(|| format!("{}-{}", operator::MANAGER, std::process::id()));
    let election = Election { lease: args.lease_name, namespace: args.lease_namespace, identity, duration: 15 };
    metrics.set_leading(&election.lease, false);
    let (mut leading, _task) = leader::start(client, &election).await?;
    tracing::info!("waiting to lead through Lease {}/{} as {}", election.namespace, election.lease, election.identity);
    loop {
        tokio::select! {
            _ = stopped(stop_rx.clone()) => return Ok(()),
            changed = leading.changed() => if changed.is_err() {
                return Err(Error::Leader { lease: election.lease.clone(), message: "the election stopped".into() });
            },
        }
        if *leading.borrow_and_update() {
            break;
        }
    }
    metrics.set_leading(&election.lease, true);
    tracing::info!("leading; reconciling TrainingRuns and TrainingDatasets");
    // Losing the lease ends the process: the replacement starts as a standby.
    tokio::spawn(async move {
        while leading.changed().await.is_ok() {
            if !*leading.borrow_and_update() {
                break;
            }
        }
        tracing::error!("lost the leader lease; exiting");
        std::process::exit(1);
    });
    both(ctx, stop_rx).await;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    // Err only when a provider is already installed, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if let Some(Command::Render { manifest, namespace, datasets }) = &args.command {
        return match render(manifest, namespace, datasets, &args.trainer_image) {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    init_logging(args.log_format);
    match main_inner(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
