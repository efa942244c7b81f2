//! The libtorch trainer. `trainer --help` lists the commands.

pub mod cli;
pub mod torch_info;

use crds::contract::FailureReason;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] crds::Error),
    #[error("{0}")]
    InvalidSpec(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

impl Error {
    /// The contract's failure reason, which decides the exit code.
    pub fn reason(&self) -> FailureReason {
        match self {
            Error::Api(_) | Error::InvalidSpec(_) => FailureReason::InvalidConfig,
            Error::Torch(e) if e.to_string().contains("out of memory") => FailureReason::OutOfMemory,
            Error::Torch(_) | Error::Io { .. } => FailureReason::DataError,
        }
    }
}
