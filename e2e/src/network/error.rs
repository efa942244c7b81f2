//! The pod network's errors.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`ip {args}` failed: {stderr}")]
    Ip { args: String, stderr: String },
    #[error("`tc {args}` failed: {stderr}")]
    Tc { args: String, stderr: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}
