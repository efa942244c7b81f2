use std::process::ExitCode;

use clap::Parser;
use crds::contract::TerminationMessage;
use trainer::cli::{Cli, execute};
use trainer::telemetry::termination::termination_log;

fn main() -> ExitCode {
    trainer::telemetry::progress::init_logging();
    match execute(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // libtorch appends a C++ backtrace to its messages; it helps nobody here.
            let text = e.to_string();
            let detail = text
                .split(['\n'])
                .take_while(|l| !l.starts_with("Exception raised from") && !l.starts_with("frame #"))
                .collect::<Vec<_>>()
                .join("\n");
            eprintln!("error: {detail}");
            if let (Some(reason), Some(path)) = (e.reason(), termination_log()) {
                let msg = TerminationMessage { reason, step: e.step(), detail, samples: e.failed_samples() };
                if let Err(io) = std::fs::write(&path, msg.to_json()) {
                    eprintln!("error: writing the termination message to {}: {io}", path.display());
                }
            }
            ExitCode::from(e.exit_code())
        }
    }
}
