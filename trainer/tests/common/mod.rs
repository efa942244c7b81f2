//! Helpers of the trainer's integration tests; each test binary uses some of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fresh directory for one test, unique to this test process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trainer-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The tokenizer and corpus cache every test shares.
pub fn cache() -> PathBuf {
    std::env::temp_dir().join("trainer-train-tests-cache")
}

/// The trainer binary, quiet, with the shared cache.
pub fn trainer_bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    cmd.env("TRAINER_CACHE", cache()).env("RUST_LOG", "warn");
    cmd
}

/// Step records in a run's metrics.jsonl so far (0 before it exists).
pub fn logged_steps(log: &Path) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches("\"kind\":\"step\"").count()
}

/// Waits (up to 5 minutes) until the run logging to `log` has recorded `n` steps.
pub fn wait_for_steps(log: &Path, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while logged_steps(log) < n {
        assert!(Instant::now() < deadline, "{what}: the run did not reach step {n}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `trainer run --no-sample <extra> -o <out> <manifest>` in the background, returned
/// once it has logged `steps` steps.
pub fn run_until_step(manifest: &Path, out: &Path, extra: &[&str], steps: usize, what: &str) -> Child {
    let child = trainer_bin()
        .args(["run", "--no-sample"])
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(manifest)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_steps(&out.join("metrics.jsonl"), steps, what);
    child
}

/// Sends SIGTERM to `child`.
pub fn sigterm(child: &Child) {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
}
