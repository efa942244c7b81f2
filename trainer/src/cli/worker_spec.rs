//! One worker's description: the resolved run and the options every process of it
//! shares. `trainer run` and `trainer launch` write it once; each `trainer worker`
//! reads it once, so nothing travels through argv or is parsed twice.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crds::config::RunConfig;
use serde::{Deserialize, Serialize};

use crate::dist::Placement;
use crate::train::RunOptions;
use crate::{Error, io_err};

/// What every process of a run is told besides its config and placement, by
/// `trainer run` or `trainer launch` to each worker through its [`WorkerSpec`].
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct TrainFlags {
    /// Stop after this many optimizer steps (with a checkpoint); rerun to resume.
    #[arg(long)]
    pub stop_after_steps: Option<u64>,
    /// Skip the sample generation at the end.
    #[arg(long)]
    pub no_sample: bool,
    /// Read the loss back from the GPU once every N steps (and at every checkpoint,
    /// evaluation and the last step), so the GPU never waits for the host between
    /// them [default: 8 on CUDA, 1 on CPU; always 1 for GRPO].
    #[arg(long, env = "TRAINER_SYNC_EVERY", value_parser = clap::value_parser!(u64).range(1..))]
    pub sync_every: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerSpec {
    /// The resolved run.
    pub config: RunConfig,
    /// Checkpoints and `metrics.jsonl`.
    pub output: PathBuf,
    /// Where `initFrom.trainingRun` runs are found.
    pub init_dir: PathBuf,
    /// Rank 0 serves `/status`, `/metrics` and `/healthz` here.
    pub status_addr: Option<SocketAddr>,
    /// Stop (with a checkpoint) after this many optimizer steps in total.
    pub stop_after_steps: Option<u64>,
    /// Print a sample generation at the end.
    pub sample: bool,
    /// Read the loss back from the device once every this many steps.
    pub sync_every: Option<u64>,
}

impl WorkerSpec {
    pub fn new(
        config: RunConfig,
        output: PathBuf,
        init_dir: PathBuf,
        status_addr: Option<SocketAddr>,
        flags: &TrainFlags,
    ) -> WorkerSpec {
        WorkerSpec {
            config,
            output,
            init_dir,
            status_addr,
            stop_after_steps: flags.stop_after_steps,
            sample: !flags.no_sample,
            sync_every: flags.sync_every,
        }
    }

    /// The options of the process at `placement`.
    pub fn run_options(&self, placement: Placement) -> RunOptions {
        RunOptions {
            output_dir: self.output.clone(),
            stop_after_steps: self.stop_after_steps,
            tty: None,
            sample: self.sample,
            init_dir: self.init_dir.clone(),
            placement,
            sync_every: self.sync_every,
        }
    }

    pub fn read(path: &Path) -> Result<WorkerSpec, Error> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        serde_json::from_str(&text).map_err(|e| {
            Error::InvalidSpec(format!("{}: not a worker description (WorkerSpec JSON): {e}", path.display()))
        })
    }

    /// Writes the description for this node's workers into the temporary directory;
    /// the file goes when the returned guard is dropped.
    pub fn write_for_workers(&self) -> Result<SpecFile, Error> {
        let path = std::env::temp_dir().join(format!("trainer-worker-{}.json", std::process::id()));
        let json = serde_json::to_vec_pretty(self).expect("WorkerSpec serializes");
        crate::files::write_atomic(&path, &json).map_err(io_err(&path))?;
        Ok(SpecFile { path })
    }
}

/// A written [`WorkerSpec`], removed on drop.
pub struct SpecFile {
    pub path: PathBuf,
}

impl Drop for SpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RunConfig {
        let manifest =
            crds::manifest::from_file(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/tiny-local.yaml")))
                .expect("the example reads");
        crds::resolve(&manifest).expect("the example resolves")
    }

    #[test]
    fn a_worker_reads_what_the_launcher_wrote() {
        let flags = TrainFlags { stop_after_steps: Some(3), no_sample: true, sync_every: Some(2) };
        let spec =
            WorkerSpec::new(config(), "runs/x".into(), "runs".into(), Some(([127, 0, 0, 1], 8080).into()), &flags);
        let file = spec.write_for_workers().unwrap();
        assert_eq!(WorkerSpec::read(&file.path).unwrap(), spec);
        let opts = spec.run_options(Placement::single());
        assert_eq!((opts.stop_after_steps, opts.sample, opts.sync_every), (Some(3), false, Some(2)));
        let path = file.path.clone();
        drop(file);
        assert!(!path.exists(), "the file goes with its guard");
    }

    #[test]
    fn a_bad_description_names_its_file() {
        let dir = std::env::temp_dir().join(format!("worker-spec-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spec.json");
        std::fs::write(&path, r#"{"config": 1}"#).unwrap();
        let err = WorkerSpec::read(&path).unwrap_err().to_string();
        assert!(err.contains("spec.json") && err.contains("WorkerSpec"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
