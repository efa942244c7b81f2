//! Command-line interface.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use crds::presets::{H100_PEAK_BF16_FLOPS, ModelConfig, PRESETS};

use crate::Error;

#[derive(Parser, Debug)]
#[command(name = "trainer", version, about = "libtorch LLM trainer for TrainingRuns")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print every model preset with its parameter counts (total, without norms, matmul)
    /// and training FLOPs per token at its context length.
    Presets {
        /// One JSON object per line, as `torch_reference.py --list` prints.
        #[arg(long)]
        json: bool,
    },
    /// Resolve a TrainingRun manifest into the RunConfig JSON the trainer executes,
    /// with the same code the operator uses.
    Resolve {
        /// TrainingRun YAML file.
        manifest: PathBuf,
    },
    /// Report the libtorch build: CUDA, cuDNN, threads, and a bf16 matmul check per device.
    Info,
    /// Plot a metrics log (metrics.jsonl beside the checkpoints) to a PNG: training and
    /// validation loss, and the learning rate, against tokens.
    Plot {
        /// The metrics.jsonl file.
        log: PathBuf,
        /// Output PNG [default: beside the log, <stem>.png].
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

pub fn execute(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Presets { json } => {
            presets(json);
            Ok(())
        }
        Command::Resolve { manifest } => {
            let run = crds::manifest::from_file(&manifest)?;
            let config = crds::resolve(&run)
                .map_err(|e| Error::InvalidSpec(format!("{}: {e}", manifest.display())))?;
            println!("{}", serde_json::to_string_pretty(&config).expect("RunConfig serializes"));
            Ok(())
        }
        Command::Info => {
            println!("{}", serde_json::to_string_pretty(&crate::torch_info::describe()?).expect("JSON"));
            Ok(())
        }
        Command::Plot { log, output } => {
            let out = crate::plot::plot_file(&log, output.as_deref())?;
            println!("{}", out.display());
            Ok(())
        }
    }
}

fn presets(json: bool) {
    if !json {
        println!(
            "{:<14} {:<6} {:>6} {:>6} {:>5} {:>4} {:>7} {:>6} {:>14} {:>14} {:>14} {:>10}",
            "preset", "arch", "layers", "dModel", "heads", "kv", "vocab", "ctx", "params", "w/o norms", "matmul", "GFLOP/tok"
        );
    }
    for p in PRESETS {
        let m = ModelConfig::from(p);
        let c = m.param_counts();
        if json {
            println!(
                "{}",
                serde_json::json!({"preset": p.name, "params": c.total, "params_without_norms": c.without_norms, "matmul_params": c.matmul})
            );
        } else {
            println!(
                "{:<14} {:<6} {:>6} {:>6} {:>5} {:>4} {:>7} {:>6} {:>14} {:>14} {:>14} {:>10.3}",
                p.name,
                format!("{:?}", p.arch).to_lowercase(),
                p.n_layer,
                p.d_model,
                p.n_head,
                p.n_kv_head,
                p.vocab_size,
                p.seq_len,
                c.total,
                c.without_norms,
                c.matmul,
                m.flops_per_token(p.seq_len) / 1e9,
            );
        }
    }
    if !json {
        println!(
            "\nGFLOP/tok = 6·N_matmul + 12·L·H·d_head·T at the preset's context T.\nMFU = tokens/s × FLOP/tok / {:.0} TFLOP/s (H100 bf16 dense peak), as torch_reference.py computes it.",
            H100_PEAK_BF16_FLOPS / 1e12
        );
    }
}
