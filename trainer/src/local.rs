//! The local commands: `trainer run`, `eval`, `generate` and `export`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crds::config::RunConfig;
use tch::nn::VarStore;
use tch::Device;

use crate::{Error, io_err};
use crate::cli::{GenerateArgs, RunArgs};
use crate::data::corpus::{self, Split};
use crate::generate::Sampling;
use crate::model::Model;
use crate::status::SharedStatus;
use crate::train::{self, RunOptions, Trainer};

/// The resolved run is kept beside its checkpoints, so `eval`, `generate` and
/// `export` know the model.
pub const RUN_FILE: &str = "run.json";

pub fn run(args: &RunArgs) -> Result<(), Error> {
    let manifest = crds::manifest::from_file(&args.manifest)?;
    let mut cfg = crds::resolve(&manifest).map_err(|e| Error::InvalidSpec(format!("{}: {e}", args.manifest.display())))?;
    if cfg.topology.world_size != 1 {
        return Err(Error::InvalidSpec(format!(
            "{}: spec.topology asks for {} processes; `trainer run` trains with one process",
            args.manifest.display(),
            cfg.topology.world_size
        )));
    }
    if let Some(attempt) = std::env::var(crds::contract::env::ATTEMPT).ok().and_then(|a| a.parse().ok()) {
        cfg.attempt = attempt;
    }
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from("runs").join(&cfg.name));
    write_run_file(&output, &cfg)?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())
        .map_err(|e| Error::Io { path: "SIGTERM handler".into(), source: e })?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())
        .map_err(|e| Error::Io { path: "SIGINT handler".into(), source: e })?;
    let opts = RunOptions {
        output_dir: output.clone(),
        status_addr: Some(args.status_addr),
        stop_after_steps: args.stop_after_steps,
        tty: None,
        sample: !args.no_sample,
        init_dir: output.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        rank: 0,
    };
    let started = Instant::now();
    let status = SharedStatus::from_config(&cfg);
    let outcome = Trainer::new(&cfg, opts, status.clone())?.run(stop)?;
    if status.snapshot().phase == crds::contract::TrainerPhase::Done {
        crate::status::write_final_report(&status.snapshot());
    }
    let first = outcome.losses.first().map(|l| l.1);
    let last = outcome.losses.last().map(|l| l.1);
    println!(
        "{}: {} steps, {} tokens in {:.0} s; loss {} → {} (unigram entropy {:.3}){}",
        cfg.name,
        outcome.step,
        crate::progress::human_count(outcome.tokens as f64),
        started.elapsed().as_secs_f64(),
        first.map_or("-".into(), |l| format!("{l:.3}")),
        last.map_or("-".into(), |l| format!("{l:.3}")),
        outcome.unigram_entropy,
        outcome.val_loss.map_or(String::new(), |v| format!(", val loss {v:.3}")),
    );
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

pub fn eval(checkpoint: &Path) -> Result<(), Error> {
    let (cfg, _vs, model) = load_model(checkpoint)?;
    let val = train::validation_mixes(&cfg, &train::load_tokenizer(&cfg)?)?;
    let (mean, per_source) = train::evaluate(&model, &cfg, &val, Device::Cpu, false)?;
    for (name, loss) in &per_source {
        println!("{name:<16} val loss {loss:.4}  perplexity {:.2}", loss.exp());
    }
    println!("{:<16} val loss {mean:.4}  perplexity {:.2}", "mix", mean.exp());
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
    let samples = crate::generate::complete(&model, &tokenizer, &prompt, args.n, args.max_new_tokens, &sampling, Device::Cpu)?;
    println!("{}", samples.iter().map(|s| format!("{prompt}{s}")).collect::<Vec<_>>().join("\n---\n"));
    Ok(())
}

pub fn export(checkpoint: &Path, hf: &Path) -> Result<(), Error> {
    let (cfg, vs, _model) = load_model(checkpoint)?;
    crate::export::export_hf(&cfg.model, &vs.variables(), hf)?;
    println!("wrote {} (config.json, model.safetensors)", hf.display());
    Ok(())
}
