//! The libtorch trainer. `trainer --help` lists the commands.

pub mod cli;
pub mod data;
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
    /// A data source (named by its mix name or embedded name) cannot be produced or read.
    #[error("data source {name}: {message}")]
    Data { name: String, message: String },
    /// A tokenizer file cannot be read, parsed or written.
    #[error("tokenizer {path}: {message}")]
    Tokenizer { path: String, message: String },
}

impl Error {
    /// The contract's failure reason, if this error has one; others exit 1, which the
    /// operator treats as a retriable failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            Error::Api(_) | Error::InvalidSpec(_) => Some(FailureReason::InvalidConfig),
            Error::Torch(e) if e.to_string().contains("out of memory") => Some(FailureReason::OutOfMemory),
            Error::Torch(_) => None,
            Error::Data { .. } | Error::Tokenizer { .. } => Some(FailureReason::DataError),
        }
    }

    pub fn exit_code(&self) -> u8 {
        self.reason().map_or(1, |r| r.exit_code() as u8)
    }
}
