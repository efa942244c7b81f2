//! The libtorch trainer. `trainer --help` lists the commands.

pub mod bench;
pub mod cli;
pub mod export;
pub mod generate;
pub mod local;
pub mod model;
pub mod torch_info;
pub mod train;

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
    #[error("step {step}: non-finite training signal (loss {loss}, gradient norm {grad_norm})")]
    NonFinite { step: u64, loss: f64, grad_norm: f64 },
    #[error("stopped by a signal after step {step}; the checkpoint of that step is saved")]
    Terminated { step: u64 },
    #[error("step {step}: {source}")]
    AtStep { step: u64, source: Box<Error> },
}

/// libtorch's allocators say "CUDA out of memory" and "DefaultCPUAllocator: not enough memory".
fn is_oom(message: &str) -> bool {
    message.contains("out of memory") || message.contains("not enough memory")
}

impl Error {
    /// The contract's failure reason, if this error has one; others exit 1, which the
    /// operator treats as a retriable failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            Error::Api(_) | Error::InvalidSpec(_) => Some(FailureReason::InvalidConfig),
            Error::Torch(e) if is_oom(&e.to_string()) => Some(FailureReason::OutOfMemory),
            Error::NonFinite { .. } => Some(FailureReason::NaNLoss),
            Error::AtStep { source, .. } => source.reason(),
            Error::Torch(_) | Error::Io { .. } | Error::Terminated { .. } => None,
        }
    }

    /// The optimizer step the error happened at, when training had started.
    pub fn step(&self) -> Option<u64> {
        match self {
            Error::NonFinite { step, .. } | Error::Terminated { step } | Error::AtStep { step, .. } => Some(*step),
            _ => None,
        }
    }

    /// Tags the error with the step it happened at (once).
    pub fn at_step(self, step: u64) -> Error {
        match self {
            e @ (Error::AtStep { .. } | Error::NonFinite { .. } | Error::Terminated { .. }) => e,
            e => Error::AtStep { step, source: Box::new(e) },
        }
    }

    /// The process exit code: the contract's code for a reason, 143 after SIGTERM
    /// (like a process killed by it), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match (self, self.reason()) {
            (_, Some(r)) => r.exit_code() as u8,
            (Error::Terminated { .. }, None) => 143,
            _ => 1,
        }
    }
}
