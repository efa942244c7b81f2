//! The crate's [`Error`], and the failure reason of the contract each error means: what
//! an out-of-memory or a full file system looks like in libtorch's and the OS's errors.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use crds::contract::{FailedSamples, FailureReason};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] crds::Error),
    #[error("{0}")]
    InvalidSpec(String),
    /// A file could not be read, written or renamed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// An ATen call through the C++ shim threw; the message names the call.
    #[error("libtorch shim: {0}")]
    Shim(String),
    /// Saved optimizer state does not fit the model's parameters.
    #[error("optimizer state: {0}")]
    OptimizerState(String),
    /// A data source (named by its mix name or embedded name) cannot be produced or read.
    #[error("data source {name}: {message}")]
    Data { name: String, message: String },
    /// A tokenizer file cannot be read, parsed or written.
    #[error("tokenizer {path}: {message}")]
    Tokenizer { path: String, message: String },
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint { path: PathBuf, message: String },
    /// A valid checkpoint that this run cannot resume from.
    #[error("cannot resume from the checkpoint of step {step}: {message}")]
    IncompatibleCheckpoint { step: u64, message: String },
    /// A line of a JSONL metrics log is not a valid record.
    #[error("{}:{line}: bad metrics record: {source}", path.display())]
    MetricsLog { path: PathBuf, line: usize, source: serde_json::Error },
    /// The status server could not bind its port.
    #[error("status server on {addr}: {message}")]
    StatusServer { addr: SocketAddr, message: String },
    /// A plot could not be drawn or written.
    #[error("plot {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
    /// An object store request failed after retries; `permanent` when retrying cannot
    /// help (a missing bucket or object, denied credentials).
    #[error("{uri}: {message}")]
    Storage { uri: String, message: String, permanent: bool },
    /// A collective failed: a peer died, the network broke, or it timed out.
    #[error("rank {rank}: {op} failed (timeout {}): {message}", humantime::format_duration(*timeout))]
    Collective { op: String, rank: u32, timeout: std::time::Duration, message: String },
    /// The ranks could not meet at the TCPStore.
    #[error("rank {rank} of {world_size}: rendezvous at {addr} failed: {message}")]
    Rendezvous { addr: String, rank: u32, world_size: u32, message: String },
    /// A worker of `trainer launch` failed; its own message is already logged and
    /// left as the termination message. `cause` is what the launcher saw when the
    /// worker could not report it (the NCCL watchdog's line).
    #[error("worker rank {rank} exited with code {code}{}", cause.as_ref().map(|c| format!(": {c}")).unwrap_or_default())]
    WorkerFailed { rank: u32, code: i32, cause: Option<String> },
    /// `samples`: where the step was in the run's sample order, for a rollback.
    #[error("step {step}: non-finite training signal (loss {loss}, gradient norm {grad_norm})")]
    NonFinite { step: u64, loss: f64, grad_norm: f64, samples: Option<FailedSamples> },
    #[error("stopped by a signal after step {step}; the checkpoint of that step is saved")]
    Terminated { step: u64 },
    #[error("step {step}: {source}")]
    AtStep { step: u64, source: Box<Error> },
    /// The file system holding `path` is full or over quota, or will be (the preflight).
    #[error("{}: the file system is full: {message}", path.display())]
    StorageFull { path: PathBuf, message: String },
}

/// `map_err` adapter: an I/O error on `path`.
pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

/// libtorch's allocators say "CUDA out of memory", "DefaultCPUAllocator: not enough
/// memory" or "DefaultCPUAllocator: can't allocate memory".
fn is_oom(message: &str) -> bool {
    ["out of memory", "not enough memory", "can't allocate memory"].iter().any(|m| message.contains(m))
}

impl Error {
    /// The contract's failure reason, if this error has one; others exit 1, which the
    /// operator treats as a retriable failure.
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            // A checkpoint that does not fit the spec fails the same way on every retry.
            Error::Api(_) | Error::InvalidSpec(_) | Error::OptimizerState(_) | Error::IncompatibleCheckpoint { .. } => {
                Some(FailureReason::InvalidConfig)
            }
            Error::Torch(e) if is_oom(&e.to_string()) => Some(FailureReason::OutOfMemory),
            Error::Shim(msg) if is_oom(msg) => Some(FailureReason::OutOfMemory),
            Error::Data { .. } | Error::Tokenizer { .. } => Some(FailureReason::DataError),
            Error::NonFinite { .. } => Some(FailureReason::NaNLoss),
            Error::Collective { .. } | Error::Rendezvous { .. } => Some(FailureReason::CollectiveTimeout),
            Error::StorageFull { .. } => Some(FailureReason::StorageFull),
            Error::Io { source, .. } if is_full(source) => Some(FailureReason::StorageFull),
            Error::Checkpoint { message, .. } | Error::Storage { message, .. } if mentions_full(message) => {
                Some(FailureReason::StorageFull)
            }
            Error::Torch(e) if mentions_full(&e.to_string()) => Some(FailureReason::StorageFull),
            Error::Storage { permanent: true, .. } => Some(FailureReason::DataError),
            Error::AtStep { source, .. } => source.reason(),
            Error::Torch(_)
            | Error::Shim(_)
            | Error::Io { .. }
            | Error::Checkpoint { .. }
            | Error::MetricsLog { .. }
            | Error::StatusServer { .. }
            | Error::Plot { .. }
            | Error::Terminated { .. }
            | Error::WorkerFailed { .. }
            | Error::Storage { permanent: false, .. } => None,
        }
    }

    /// The optimizer step the error happened at, when training had started.
    pub fn step(&self) -> Option<u64> {
        match self {
            Error::NonFinite { step, .. } | Error::Terminated { step } | Error::AtStep { step, .. } => Some(*step),
            _ => None,
        }
    }

    /// A non-finite step's place in the sample order.
    pub fn failed_samples(&self) -> Option<FailedSamples> {
        match self {
            Error::NonFinite { samples, .. } => *samples,
            Error::AtStep { source, .. } => source.failed_samples(),
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
            (Error::WorkerFailed { code, .. }, None) => (*code).clamp(1, 255) as u8,
            _ => 1,
        }
    }
}

/// The text of ENOSPC and EDQUOT, which errors of libraries that keep only a message
/// (safetensors through tch) still carry.
const FULL_TEXTS: [&str; 2] = ["No space left on device", "Disk quota exceeded"];

/// Whether `e` is a full file system or an exceeded quota.
pub fn is_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Whether an error message reports a full file system or an exceeded quota.
pub fn mentions_full(message: &str) -> bool {
    FULL_TEXTS.iter().any(|t| message.contains(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_systems_are_recognised_by_errno_and_by_text() {
        assert!(is_full(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_full(&io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_full(&io::Error::from_raw_os_error(libc::EACCES)));
        assert!(mentions_full(&io::Error::from_raw_os_error(libc::ENOSPC).to_string()));
        assert!(!mentions_full("Permission denied (os error 13)"));
    }
}
