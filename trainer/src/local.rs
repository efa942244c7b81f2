//! The local commands: `trainer run`, `eval`, `generate` and `export`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crds::config::{Device as RunDevice, RunConfig};
use tch::Device;
use tch::nn::VarStore;

use crate::cli::{GenerateArgs, LaunchArgs, RunArgs, WorkerArgs};
use crate::data::corpus::{self, Split};
use crate::dist::Placement;
use crate::dist::launch::{self, LaunchSpec};
use crate::generate::Sampling;
use crate::model::Model;
use crate::status::SharedStatus;
use crate::status::StatusServer;
use crate::train::{self, RunOptions, Trainer};
use crate::{Error, io_err};

/// The resolved run is kept beside its checkpoints, so `eval`, `generate` and
/// `export` know the model.
pub const RUN_FILE: &str = "run.json";

/// `trainer run`: one process in place, or `world_size` local worker processes on
/// 127.0.0.1 through the same launcher a pod uses.
pub fn run(args: &RunArgs) -> Result<(), Error> {
    let manifest = crds::manifest::from_file(&args.manifest)?;
    let mut cfg =
        crds::resolve(&manifest).map_err(|e| Error::InvalidSpec(format!("{}: {e}", args.manifest.display())))?;
    if let Some(attempt) = std::env::var(crds::contract::env::ATTEMPT).ok().and_then(|a| a.parse().ok()) {
        cfg.attempt = attempt;
    }
    if cfg.topology.device == RunDevice::Cuda && !tch::Cuda::is_available() {
        tracing::warn!(
            "spec.topology.gpusPerNode is {} but no CUDA device is visible: training {} process(es) on CPU with Gloo",
            cfg.topology.gpus_per_node,
            cfg.topology.world_size
        );
        cfg.topology.device = RunDevice::Cpu;
    }
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from("runs").join(&cfg.name));
    write_run_file(&output, &cfg)?;
    let stop = stop_on_signals()?;
    let init_dir = init_dir_of(&output);
    if cfg.topology.world_size > 1 {
        let mut worker = vec![
            "worker".into(),
            "--config".into(),
            output.join(RUN_FILE).into_os_string(),
            "--output".into(),
            output.clone().into_os_string(),
            "--init-dir".into(),
            init_dir.into_os_string(),
            "--status-addr".into(),
            args.status_addr.to_string().into(),
        ];
        if let Some(n) = args.stop_after_steps {
            worker.extend(["--stop-after-steps".into(), n.to_string().into()]);
        }
        if args.no_sample {
            worker.push("--no-sample".into());
        }
        if let Some(n) = args.sync_every {
            worker.extend(["--sync-every".into(), n.to_string().into()]);
        }
        let spec = LaunchSpec {
            nnodes: 1,
            node_rank: 0,
            nproc_per_node: cfg.topology.world_size,
            master_addr: "127.0.0.1".into(),
            master_port: crate::dist::free_port()?,
            program: None,
            worker_args: worker,
            termination_log: crate::status::termination_log(),
            grace: LAUNCH_GRACE,
        };
        return launch_outcome(launch::launch(&spec, stop)?);
    }
    let opts = RunOptions {
        output_dir: output,
        status_addr: Some(args.status_addr),
        stop_after_steps: args.stop_after_steps,
        tty: None,
        sample: !args.no_sample,
        init_dir,
        placement: Placement::single(),
        sync_every: args.sync_every,
    };
    train_and_report(&cfg, opts, stop)
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
    let text = std::fs::read_to_string(&args.config).map_err(io_err(&args.config))?;
    let mut cfg: RunConfig = serde_json::from_str(&text).map_err(|e| {
        Error::InvalidSpec(format!("{}: not a resolved run (RunConfig JSON): {e}", args.config.display()))
    })?;
    if let Some(attempt) = std::env::var(crds::contract::env::ATTEMPT).ok().and_then(|a| a.parse().ok()) {
        cfg.attempt = attempt;
    }
    let stop = stop_on_signals()?;
    let opts = RunOptions {
        output_dir: args.output.clone(),
        status_addr: args.status_addr,
        stop_after_steps: args.stop_after_steps,
        tty: None,
        sample: !args.no_sample,
        init_dir: args.init_dir.clone(),
        placement: Placement::from_env()?,
        sync_every: args.sync_every,
    };
    train_and_report(&cfg, opts, stop)
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
    let mut worker = vec![
        "worker".into(),
        "--config".into(),
        args.config.clone().into_os_string(),
        "--output".into(),
        args.output.clone().into_os_string(),
        "--init-dir".into(),
        args.init_dir.clone().into_os_string(),
    ];
    if node_rank == 0 {
        worker.extend(["--status-addr".into(), status_addr.to_string().into()]);
    }
    let spec = LaunchSpec {
        nnodes,
        node_rank,
        nproc_per_node: nproc,
        master_addr: args.master_addr.clone(),
        master_port: args.master_port,
        program: None,
        worker_args: worker,
        termination_log: crate::status::termination_log(),
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

/// Trains one rank; rank 0 serves status from the start and prints the summary.
fn train_and_report(cfg: &RunConfig, mut opts: RunOptions, stop: Arc<AtomicBool>) -> Result<(), Error> {
    let rank0 = opts.placement.rank == 0;
    let started = Instant::now();
    let status = SharedStatus::from_config(cfg);
    // Up before the slow setup, so readiness and the operator see a live trainer.
    let _server = match opts.status_addr.take() {
        Some(addr) if rank0 => Some(StatusServer::start(addr, status.clone())?),
        _ => None,
    };
    let outcome = Trainer::new(cfg, opts, status.clone())?.run(stop)?;
    if status.snapshot().phase == crds::contract::TrainerPhase::Done {
        crate::status::write_final_report(&status.snapshot());
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
        crate::progress::human_count(outcome.tokens as f64),
        started.elapsed().as_secs_f64(),
        first.map_or("-".into(), |l| format!("{l:.3}")),
        last.map_or("-".into(), |l| format!("{l:.3}")),
        outcome.unigram_entropy.map_or(String::new(), |h| format!(" (unigram entropy {h:.3})")),
        outcome.val_loss.map_or(String::new(), |v| format!(", val loss {v:.3}")),
    );
    if let Some((before, after)) = &outcome.accuracy {
        let before = before.map_or("-".into(), |b| format!("{:.1}%", 100.0 * b.greedy));
        println!(
            "held-out accuracy (greedy answer letter): {before} → {:.1}% ({:.1}% by log-likelihood) on {} questions",
            100.0 * after.greedy,
            100.0 * after.log_likelihood,
            after.questions
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
    crate::data::write_atomic(&path, json.as_bytes()).map_err(io_err(&path))
}

/// The resolved run of a run directory or of one of its checkpoints.
fn run_config(checkpoint: &Path) -> Result<RunConfig, Error> {
    let candidates = [checkpoint.join(RUN_FILE), checkpoint.parent().map(|p| p.join(RUN_FILE)).unwrap_or_default()];
    let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| Error::Checkpoint {
        path: checkpoint.to_path_buf(),
        message: format!("no {RUN_FILE} here or in the parent directory; is this a `trainer run` output?"),
    })?;
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Checkpoint { path: path.clone(), message: format!("not a resolved run: {e}") })
}

/// The model of a checkpoint, on CPU in f32 (or the checkpoint's bf16).
fn load_model(checkpoint: &Path) -> Result<(RunConfig, VarStore, Model), Error> {
    let cfg = run_config(checkpoint)?;
    let weights = crate::checkpoint::load_weights(checkpoint)?;
    let vs = VarStore::new(Device::Cpu);
    let model = Model::new(&vs.root(), &cfg.model, Device::Cpu)?;
    train::copy_weights(&vs, &weights, checkpoint)?;
    Ok((cfg, vs, model))
}

pub fn eval(args: &crate::cli::EvalArgs) -> Result<(), Error> {
    if args.task == crate::cli::EvalTask::Mcq {
        return eval_mcq(args);
    }
    let (cfg, _vs, model) = load_model(&args.checkpoint)?;
    let val = train::validation_mixes(&cfg, &train::load_tokenizer(&cfg)?)?;
    let (mean, per_source) = train::evaluate(&model, &cfg, &val, Device::Cpu, false, None)?;
    for (name, loss) in &per_source {
        println!("{name:<16} val loss {loss:.4}  perplexity {:.2}", loss.exp());
    }
    println!("{:<16} val loss {mean:.4}  perplexity {:.2}", "mix", mean.exp());
    Ok(())
}

/// `trainer eval --task mcq`.
fn eval_mcq(args: &crate::cli::EvalArgs) -> Result<(), Error> {
    let (cfg, _vs, model) = load_model(&args.checkpoint)?;
    let tokenizer = train::load_tokenizer(&cfg)?;
    let records = match (&args.dataset, &cfg.grpo) {
        // The run's own held-out split, exactly as it evaluated itself.
        (None, Some(g)) => {
            let mut held_out = crate::grpo::data::load(&cfg, g)?.held_out;
            held_out.truncate(args.questions);
            held_out
        }
        (Some(uri), _) => {
            let location = match uri.strip_prefix("embedded:") {
                Some(name) => crds::config::Location::Embedded { name: name.into() },
                None => {
                    crds::resolve::parse_location_str(uri).map_err(|m| Error::InvalidSpec(format!("--dataset: {m}")))?
                }
            };
            crate::grpo::data::eval_set(&cfg, &location, args.questions)?
        }
        (None, None) => {
            crate::grpo::data::eval_set(&cfg, &crds::config::Location::Embedded { name: "mcq".into() }, args.questions)?
        }
    };
    if records.is_empty() {
        return Err(Error::Data { name: "--dataset".into(), message: "has no questions to evaluate".into() });
    }
    let ctx = cfg.model.max_seq_len as usize;
    let options = crate::grpo::eval::EvalOptions {
        max_prompt_tokens: ctx.saturating_sub(args.max_new_tokens).max(1),
        max_new_tokens: args.max_new_tokens.min(ctx - 1),
        batch: 16,
        device: Device::Cpu,
        autocast: false,
    };
    let score = crate::grpo::eval::evaluate(&model, &tokenizer, &records, &options, None)?;
    if args.json {
        println!("{}", serde_json::to_string(&score).expect("McqScore serializes"));
    } else {
        println!(
            "{} questions: {:.1}% greedy answer letter, {:.1}% by log-likelihood, {:.1}% unanswered (chance 25%)",
            score.questions,
            100.0 * score.greedy,
            100.0 * score.log_likelihood,
            100.0 * score.unparsed
        );
    }
    Ok(())
}

pub fn generate(args: &GenerateArgs) -> Result<(), Error> {
    let (cfg, _vs, model) = load_model(&args.checkpoint)?;
    let tokenizer = train::load_tokenizer(&cfg)?;
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => corpus::mcq_records(cfg.seed, 1, Split::Validation).remove(0).prompt(),
    };
    let sampling = Sampling { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p };
    tch::manual_seed(args.seed as i64);
    let samples =
        crate::generate::complete(&model, &tokenizer, &prompt, args.n, args.max_new_tokens, &sampling, Device::Cpu)?;
    println!("{}", samples.iter().map(|s| format!("{prompt}{s}")).collect::<Vec<_>>().join("\n---\n"));
    Ok(())
}

pub fn export(checkpoint: &Path, hf: &Path) -> Result<(), Error> {
    let (cfg, vs, _model) = load_model(checkpoint)?;
    crate::export::export_hf(&cfg.model, &vs.variables(), hf)?;
    println!("wrote {} (config.json, model.safetensors)", hf.display());
    Ok(())
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
