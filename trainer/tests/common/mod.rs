//! Helpers of the trainer's integration tests; each test binary uses some of them.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

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
