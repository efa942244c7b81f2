//! The libtorch trainer. `trainer --help` lists the commands.

pub mod cli;
pub mod ffi;
pub mod optim;
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
    /// An ATen call through the C++ shim threw; the message names the call.
    #[error("libtorch shim: {0}")]
    Shim(String),
    /// Saved optimizer state does not fit the model's parameters.
    #[error("optimizer state: {0}")]
    OptimizerState(String),
}

impl Error {
    /// The contract's failure reason, if this error has one; others exit 1, which the
    /// operator treats as a retriable failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            // A checkpoint whose optimizer state does not fit the spec's model fails
            // the same way on every retry.
            Error::Api(_) | Error::InvalidSpec(_) | Error::OptimizerState(_) => Some(FailureReason::InvalidConfig),
            Error::Torch(e) if e.to_string().contains("out of memory") => Some(FailureReason::OutOfMemory),
            Error::Shim(msg) if msg.contains("out of memory") => Some(FailureReason::OutOfMemory),
            Error::Torch(_) | Error::Shim(_) => None,
        }
    }

    pub fn exit_code(&self) -> u8 {
        self.reason().map_or(1, |r| r.exit_code() as u8)
    }
}
