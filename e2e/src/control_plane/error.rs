//! The control plane harness's errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("starting {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("certificates: {0}")]
    Pki(String),
    #[error("{what} was not ready within {waited:?}: {state}")]
    NotReady { what: String, waited: Duration, state: String },
    #[error("{0}")]
    Setup(String),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), source }
    }
}
