//! The libtorch trainer. `trainer --help` lists the commands.

pub mod checkpoint;
pub mod cli;
pub mod torch_info;

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
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint { path: PathBuf, message: String },
    /// A valid checkpoint that this run cannot resume from.
    #[error("cannot resume from the checkpoint of step {step}: {message}")]
    IncompatibleCheckpoint { step: u64, message: String },
}

impl Error {
    /// The contract's failure reason, if this error has one; others exit 1, which the
    /// operator treats as a retriable failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            Error::Api(_) | Error::InvalidSpec(_) | Error::IncompatibleCheckpoint { .. } => {
                Some(FailureReason::InvalidConfig)
            }
            Error::Torch(e) if e.to_string().contains("out of memory") => Some(FailureReason::OutOfMemory),
            Error::Torch(_) | Error::Io { .. } | Error::Checkpoint { .. } => None,
        }
    }

    pub fn exit_code(&self) -> u8 {
        self.reason().map_or(1, |r| r.exit_code() as u8)
    }
}
