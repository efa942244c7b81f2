//! The libtorch trainer. `trainer --help` lists the commands.

pub mod cli;
pub mod export;
pub mod generate;
pub mod model;
pub mod torch_info;

use crds::contract::FailureReason;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] crds::Error),
    #[error("{0}")]
    InvalidSpec(String),
    #[error("{}: {source}", path.display())]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

impl Error {
    /// The contract's failure reason, if this error has one; others exit 1, which the
    /// operator treats as a retriable failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            Error::Api(_) | Error::InvalidSpec(_) => Some(FailureReason::InvalidConfig),
            Error::Torch(e) if e.to_string().contains("out of memory") => Some(FailureReason::OutOfMemory),
            Error::Torch(_) | Error::Io { .. } => None,
        }
    }

    pub fn exit_code(&self) -> u8 {
        self.reason().map_or(1, |r| r.exit_code() as u8)
    }
}
