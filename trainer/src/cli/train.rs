//! The training commands: `trainer run` (one process, or local workers through the
//! launcher), `trainer launch` (the pod's entrypoint) and `trainer worker` (one rank).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crds::config::{Device as RunDevice, RunConfig};
use crds::contract::FailureReason;
use crds::rollback::NonFinite;

use super::worker_spec::{SpecFile, TrainFlags, WorkerSpec};
use crate::dist::Placement;
use crate::dist::launch::{self, LaunchSpec};
use crate::telemetry;
use crate::telemetry::progress::human_count;
use crate::telemetry::server::{SharedStatus, StatusServer};
use crate::telemetry::termination::{termination_log, write_final_report};
use crate::train::Trainer;
use crate::{Error, io_err};

/// The resolved run is kept beside its checkpoints, so `eval`, `generate` and
/// `export` know the model.
pub const RUN_FILE: &str = "run.json";

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// TrainingRun YAML file.
    pub manifest: PathBuf,
    /// Checkpoints and metrics.jsonl go here [default: runs/<metadata.name>].
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Serve /status, /metrics and /healthz here (port 0 picks a free one).
    #[arg(long, env = "TRAINER_STATUS_ADDR", default_value = "127.0.0.1:0")]
    pub status_addr: std::net::SocketAddr,
    #[command(flatten)]
    pub flags: TrainFlags,
}

#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// The resolved run (RunConfig JSON) from the run's ConfigMap.
    #[arg(long, env = "TRAINER_CONFIG", default_value = crds::contract::CONFIG_PATH)]
    pub config: PathBuf,
    /// Checkpoints and metrics.jsonl (the run's PVC).
    #[arg(long, default_value = crds::contract::CHECKPOINT_MOUNT)]
    pub output: PathBuf,
    /// Where `initFrom.trainingRun` runs are mounted.
    #[arg(long, default_value = crds::contract::INIT_MOUNT)]
    pub init_dir: PathBuf,
    /// Nodes in the gang [default: spec.topology.nodes].
    #[arg(long, env = "NNODES")]
    pub nnodes: Option<u32>,
    /// This node's index [default: JOB_COMPLETION_INDEX, else 0].
    #[arg(long, env = "NODE_RANK")]
    pub node_rank: Option<u32>,
    /// Workers on this node [default: the run's processes per node].
    #[arg(long, env = "NPROC_PER_NODE")]
    pub nproc_per_node: Option<u32>,
    /// Rank 0's host, where the rendezvous store listens.
    #[arg(long, env = "MASTER_ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,
    #[arg(long, env = "MASTER_PORT", default_value_t = crds::contract::RENDEZVOUS_PORT)]
    pub master_port: u16,
    /// Rank 0 serves /status, /metrics and /healthz here; other nodes serve /healthz.
    #[arg(long, env = "TRAINER_STATUS_PORT", default_value_t = crds::contract::STATUS_PORT)]
    pub status_port: u16,
    #[command(flatten)]
    pub flags: TrainFlags,
}

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The worker's description (WorkerSpec JSON), written by `trainer run` or
    /// `trainer launch`.
    #[arg(long)]
    pub spec: PathBuf,
}

/// `trainer run`: one process in place, or `world_size` local worker processes on
/// 127.0.0.1 through the same launcher a pod uses. A non-finite step under
/// `failurePolicy.onNaN: rollback` rolls back here as the operator would: the next
/// attempt resumes from the checkpoint before it, past its samples
/// ([`crds::RunConfig::rollback_plan`]), up to `maxRollbacks` times in one `trainer run`.
pub fn run(args: &RunArgs) -> Result<(), Error> {
    let manifest = crds::manifest::from_file(&args.manifest)?;
    let mut cfg =
        crds::resolve(&manifest).map_err(|e| Error::InvalidSpec(format!("{}: {e}", args.manifest.display())))?;
    if cfg.topology.device == RunDevice::Cuda && !tch::Cuda::is_available() {
        tracing::warn!(
            "spec.topology.gpusPerNode is {} but no CUDA device is visible: training {} process(es) on CPU with Gloo",
            cfg.topology.gpus_per_node,
            cfg.topology.world_size
        );
        cfg.topology.device = RunDevice::Cpu;
    }
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from("runs").join(&cfg.name));
    let stop = stop_on_signals()?;
    loop {
        write_run_file(&output, &cfg)?;
        let (result, non_finite) = run_attempt(args, &cfg, &output, stop.clone());
        let Some(at) = non_finite else { return result };
        match cfg.rollback_plan(&cfg.rollbacks, cfg.attempt, at, 0) {
            Ok(r) => {
                tracing::warn!(
                    "the loss or gradient norm of step {} was not finite: rolling back ({} of {}, \
                     failurePolicy.onNaN: rollback) as attempt {}",
                    r.step,
                    cfg.rollbacks.len() + 1,
                    cfg.failure.max_rollbacks,
                    cfg.attempt + 1
                );
                cfg.rollbacks.push(r);
                cfg.attempt += 1;
            }
            Err(why) => {
                if !why.is_empty() {
                    tracing::error!("the run fails as NaNLoss{why}");
                }
                return result;
            }
        }
    }
}

/// One attempt of `trainer run`, and the failing step and its samples when a step was
/// not finite.
fn run_attempt(
    args: &RunArgs,
    cfg: &RunConfig,
    output: &Path,
    stop: Arc<AtomicBool>,
) -> (Result<(), Error>, Option<NonFinite>) {
    let spec =
        WorkerSpec::new(cfg.clone(), output.to_path_buf(), init_dir_of(output), Some(args.status_addr), &args.flags);
    if cfg.topology.world_size > 1 {
        let file = match spec.write_for_workers() {
            Ok(file) => file,
            Err(e) => return (Err(e), None),
        };
        let port = match crate::dist::free_port() {
            Ok(port) => port,
            Err(e) => return (Err(e), None),
        };
        let spec = LaunchSpec {
            nnodes: 1,
            node_rank: 0,
            nproc_per_node: cfg.topology.world_size,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            program: None,
            worker_args: worker_args(&file),
            termination_log: termination_log(),
            grace: LAUNCH_GRACE,
        };
        return match launch::launch(&spec, stop) {
            Ok(outcome) => {
                let nan = outcome.message.as_ref().filter(|m| m.reason == FailureReason::NaNLoss);
                let non_finite = nan.map(|m| NonFinite { step: m.step, samples: m.samples });
                (launch_outcome(outcome), non_finite)
            }
            Err(e) => (Err(e), None),
        };
    }
    let result = train_and_report(&spec, Placement::single(), stop);
    let non_finite = match &result {
        Err(e) if e.reason() == Some(FailureReason::NaNLoss) => {
            Some(NonFinite { step: e.step(), samples: e.failed_samples() })
        }
        _ => None,
    };
    (result, non_finite)
}

/// Where `spec.init` names another run's output: beside this run's `output`, so
/// `-o out` and `-o runs/x` both look in their parent (`.` for the first, whose parent
/// is the empty path).
fn init_dir_of(output: &Path) -> PathBuf {
    match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// How long workers get to checkpoint and exit after SIGTERM or a peer's failure.
const LAUNCH_GRACE: Duration = Duration::from_secs(60);

/// `trainer worker`: one rank, placed by the launcher's environment.
pub fn worker(args: &WorkerArgs) -> Result<(), Error> {
    let spec = WorkerSpec::read(&args.spec)?;
    let stop = stop_on_signals()?;
    train_and_report(&spec, Placement::from_env()?, stop)
}

/// How the launcher starts a worker of the description in `file`.
fn worker_args(file: &SpecFile) -> Vec<OsString> {
    vec!["worker".into(), "--spec".into(), file.path.clone().into_os_string()]
}

/// `trainer launch`: the pod's entrypoint. Starts this node's workers and exits as
/// the first one that fails.
pub fn launch(args: &LaunchArgs) -> Result<(), Error> {
    let text = std::fs::read_to_string(&args.config).map_err(io_err(&args.config))?;
    let cfg: RunConfig = serde_json::from_str(&text).map_err(|e| {
        Error::InvalidSpec(format!("{}: not a resolved run (RunConfig JSON): {e}", args.config.display()))
    })?;
    let t = &cfg.topology;
    let nnodes = args.nnodes.unwrap_or(t.nodes);
    let nproc = args.nproc_per_node.unwrap_or(t.procs_per_node);
    if nnodes * nproc != t.world_size {
        return Err(Error::InvalidSpec(format!(
            "NNODES={nnodes} × NPROC_PER_NODE={nproc} does not match the run's {} processes ({})",
            t.world_size,
            args.config.display()
        )));
    }
    let node_rank = args.node_rank.unwrap_or(0);
    let stop = stop_on_signals()?;
    let status_addr = SocketAddr::from(([0, 0, 0, 0], args.status_port));
    // Rank 0's worker serves the status port; elsewhere the launcher answers /healthz.
    let _health =
        if node_rank == 0 { None } else { Some(StatusServer::start(status_addr, SharedStatus::from_config(&cfg))?) };
    let rank0_status = (node_rank == 0).then_some(status_addr);
    let worker = WorkerSpec::new(cfg, args.output.clone(), args.init_dir.clone(), rank0_status, &args.flags);
    let file = worker.write_for_workers()?;
    let spec = LaunchSpec {
        nnodes,
        node_rank,
        nproc_per_node: nproc,
        master_addr: args.master_addr.clone(),
        master_port: args.master_port,
        program: None,
        worker_args: worker_args(&file),
        termination_log: termination_log(),
        grace: LAUNCH_GRACE,
    };
    tracing::info!(node_rank, nnodes, nproc_per_node = nproc, master = %format!("{}:{}", spec.master_addr, spec.master_port), "launching");
    launch_outcome(launch::launch(&spec, stop)?)
}

fn launch_outcome(outcome: launch::LaunchOutcome) -> Result<(), Error> {
    match outcome.failed_rank {
        None => Ok(()),
        Some(rank) => Err(Error::WorkerFailed { rank, code: outcome.exit_code, cause: outcome.cause }),
    }
}

fn stop_on_signals() -> Result<Arc<AtomicBool>, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    for (name, signal) in [("SIGTERM", signal_hook::consts::SIGTERM), ("SIGINT", signal_hook::consts::SIGINT)] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| Error::Io { path: format!("{name} handler").into(), source: e })?;
    }
    Ok(stop)
}

/// Trains one rank; rank 0 serves status at `status_addr` from the start and prints
/// the summary.
fn train_and_report(spec: &WorkerSpec, placement: Placement, stop: Arc<AtomicBool>) -> Result<(), Error> {
    let (cfg, status_addr) = (&spec.config, spec.status_addr);
    let opts = spec.run_options(placement);
    let rank0 = opts.placement.rank == 0;
    let started = Instant::now();
    let status = SharedStatus::from_config(cfg);
    // Up before the slow setup, so readiness and the operator see a live trainer.
    let _server = match status_addr {
        Some(addr) if rank0 => {
            let server = StatusServer::start(addr, status.clone())?;
            tracing::info!("status on http://{}/status", server.addr());
            Some(server)
        }
        _ => None,
    };
    let outcome = telemetry::run(Trainer::new(cfg, opts)?, &status, stop)?;
    if status.snapshot().phase == crds::contract::TrainerPhase::Done {
        write_final_report(&status.snapshot());
    }
    if !rank0 {
        return Ok(());
    }
    let first = outcome.losses.first().map(|l| l.1);
    let last = outcome.losses.last().map(|l| l.1);
    println!(
        "{}: {} steps, {} tokens in {:.0} s; loss {} → {}{}{}",
        cfg.name,
        outcome.step,
        human_count(outcome.tokens as f64),
        started.elapsed().as_secs_f64(),
        first.map_or("-".into(), |l| format!("{l:.3}")),
        last.map_or("-".into(), |l| format!("{l:.3}")),
        outcome.unigram_entropy.map_or(String::new(), |h| format!(" (unigram entropy {h:.3})")),
        outcome.val_loss.map_or(String::new(), |v| format!(", val loss {v:.3}")),
    );
    for set in &outcome.accuracy {
        let percent = |s: &crate::eval::McqScore| format!("{:.1}%", 100.0 * s.all.greedy);
        let acc = |s: &crate::eval::McqScore| format!("{:.1}%", 100.0 * s.all.acc);
        println!(
            "{} accuracy (greedy answer letter): {} → {} (by log-likelihood: {} → {}) on {} questions",
            set.name,
            set.before.as_ref().map_or("-".into(), percent),
            percent(&set.after),
            set.before.as_ref().map_or("-".into(), acc),
            acc(&set.after),
            set.after.all.questions
        );
    }
    let silent = outcome.no_signal_steps.zip(cfg.grpo.as_ref()).filter(|(n, g)| *n >= u64::from(g.no_signal_steps));
    if let Some((n, _)) = silent {
        println!(
            "no learning signal: for the last {n} steps at least {:.0}% of the prompt groups got equal rewards for \
             every completion, so those steps taught nothing; raise spec.grpo.temperature or generationsPerPrompt, \
             or change the dataset",
            100.0 * crds::contract::NO_SIGNAL_FRACTION
        );
    }
    if let Some(c) = &outcome.last_checkpoint {
        println!("checkpoint: {}", c.uri);
    }
    Ok(())
}

fn write_run_file(dir: &Path, cfg: &RunConfig) -> Result<(), Error> {
    let path = dir.join(RUN_FILE);
    let json = serde_json::to_string_pretty(cfg).expect("RunConfig serializes");
    crate::files::write_atomic(&path, json.as_bytes()).map_err(io_err(&path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_dir_is_the_output_parent_and_never_empty() {
        assert_eq!(init_dir_of(Path::new("out")), PathBuf::from("."));
        assert_eq!(init_dir_of(Path::new("runs/tiny-local")), PathBuf::from("runs"));
        assert_eq!(init_dir_of(Path::new("/data/runs/a")), PathBuf::from("/data/runs"));
        assert_eq!(init_dir_of(Path::new("/")), PathBuf::from("."));
    }
}
