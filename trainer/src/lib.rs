//! The libtorch trainer. `trainer --help` lists the commands.

pub mod cli;
pub mod metrics_log;
pub mod plot;
pub mod progress;
pub mod status;
pub mod torch_info;

use std::net::SocketAddr;
use std::path::PathBuf;

use crds::contract::FailureReason;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] crds::Error),
    #[error("{0}")]
    InvalidSpec(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A file could not be read, written or renamed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A line of a JSONL metrics log is not a valid record.
    #[error("{}:{line}: bad metrics record: {source}", path.display())]
    MetricsLog { path: PathBuf, line: usize, source: serde_json::Error },
    /// The status server could not bind its port.
    #[error("status server on {addr}: {message}")]
    StatusServer { addr: SocketAddr, message: String },
    /// A plot could not be drawn or written.
    #[error("plot {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
}

impl Error {
    /// The contract's failure reason, if this error has one; others exit 1, which the
    /// operator treats as a retriable failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            Error::Api(_) | Error::InvalidSpec(_) => Some(FailureReason::InvalidConfig),
            Error::Torch(e) if e.to_string().contains("out of memory") => Some(FailureReason::OutOfMemory),
            Error::Torch(_)
            | Error::Io { .. }
            | Error::MetricsLog { .. }
            | Error::StatusServer { .. }
            | Error::Plot { .. } => None,
        }
    }

    pub fn exit_code(&self) -> u8 {
        self.reason().map_or(1, |r| r.exit_code() as u8)
    }
}
