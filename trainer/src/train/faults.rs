//! Test-only fault injection, by environment variable: the operator's and the
//! launcher's failure handling is tested against real NaNs, allocation failures and
//! killed processes, and against the error a full disk gives (the real one is tested
//! on a small tmpfs).
//!
//! Only a trainer built with the `fault-injection` feature honours them
//! ([`crate::fault_injection`]).

use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::fault_injection::knob;

/// The loss of this optimizer step becomes NaN.
pub const INJECT_NAN_ENV: &str = "TRAINER_INJECT_NAN_AT_STEP";
/// This step allocates far more memory than exists.
pub const INJECT_OOM_ENV: &str = "TRAINER_INJECT_OOM_AT_STEP";
/// The process SIGKILLs itself at this step.
pub const INJECT_KILL_ENV: &str = "TRAINER_INJECT_KILL_AT_STEP";
/// The process SIGKILLs itself while it writes this step's checkpoint: the first tensor
/// file is on disk, synced, and the checkpoint not complete (a torn write).
pub const INJECT_KILL_IN_CHECKPOINT_ENV: &str = "TRAINER_INJECT_KILL_IN_CHECKPOINT_AT_STEP";
/// Writing the checkpoint of this step, or of any later one, finds the disk full (ENOSPC).
pub const INJECT_DISK_FULL_ENV: &str = "TRAINER_INJECT_DISK_FULL_AT_STEP";
/// Every step sleeps this many milliseconds before its forward pass: a straggler.
pub const INJECT_SLOW_ENV: &str = "TRAINER_INJECT_SLOW_STEP_MS";
/// The injections above apply only to this global rank (default: all).
pub const INJECT_RANK_ENV: &str = "TRAINER_INJECT_RANK";
/// The injections above apply only to this gang attempt (default: all).
pub const INJECT_ATTEMPT_ENV: &str = "TRAINER_INJECT_ATTEMPT";

/// The optimizer steps at which this rank injects each fault.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    nan: Option<u64>,
    oom: Option<u64>,
    kill: Option<u64>,
    kill_in_checkpoint: Option<u64>,
    disk_full: Option<u64>,
    slow_ms: Option<u64>,
}

impl Faults {
    /// The faults the environment asks of `rank` in gang attempt `attempt` (none unless
    /// this build has fault injection).
    pub fn from_env(rank: u32, attempt: u32) -> Faults {
        Faults::read(rank, attempt, &knob)
    }

    /// The faults the variables `get` returns ask of `rank` in gang attempt `attempt`.
    fn read(rank: u32, attempt: u32, get: &dyn Fn(&str) -> Option<String>) -> Faults {
        let for_attempt = get(INJECT_ATTEMPT_ENV).and_then(|a| a.parse::<u32>().ok());
        if for_attempt.is_some_and(|a| a != attempt) {
            return Faults::default();
        }
        let for_rank = get(INJECT_RANK_ENV).and_then(|r| r.parse::<u32>().ok());
        let injected = |name: &str| match for_rank {
            Some(r) if r != rank => None,
            _ => get(name).and_then(|v| v.parse().ok()),
        };
        Faults {
            nan: injected(INJECT_NAN_ENV),
            oom: injected(INJECT_OOM_ENV),
            kill: injected(INJECT_KILL_ENV),
            kill_in_checkpoint: injected(INJECT_KILL_IN_CHECKPOINT_ENV),
            disk_full: injected(INJECT_DISK_FULL_ENV),
            slow_ms: injected(INJECT_SLOW_ENV),
        }
    }

    /// Before step `step`'s first forward pass: a real allocation failure through
    /// libtorch's allocator, SIGKILL, or a delay.
    pub fn before_step(&self, step: u64, rank: u32, device: Device) -> Result<(), Error> {
        if let Some(ms) = self.slow_ms {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        if self.oom == Some(step) {
            let _ = Tensor::f_empty([1 << 40], (Kind::Float, device))?;
        }
        if self.kill == Some(step) {
            tracing::warn!(rank, "{INJECT_KILL_ENV}: killing this process");
            // SAFETY: raise(3) on this process; SIGKILL cannot be caught.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        Ok(())
    }

    /// What the checkpoint writer calls after each file, where a kill during a
    /// checkpoint is injected.
    pub fn checkpoint_hook(&self) -> Option<crate::checkpoint::FileHook> {
        let at = self.kill_in_checkpoint?;
        Some(std::sync::Arc::new(move |step, path: &std::path::Path| {
            if step == at {
                tracing::warn!(path = %path.display(), "{INJECT_KILL_IN_CHECKPOINT_ENV}: killing this process");
                // SAFETY: raise(3) on this process; SIGKILL cannot be caught.
                unsafe { libc::raise(libc::SIGKILL) };
            }
        }))
    }

    /// Before writing the checkpoint of `step` into `dir`: ENOSPC from that step on.
    pub fn before_checkpoint(&self, step: u64, dir: &std::path::Path) -> Result<(), Error> {
        match self.disk_full {
            Some(from) if step >= from => {
                Err(Error::Io { path: dir.to_path_buf(), source: std::io::Error::from_raw_os_error(libc::ENOSPC) })
            }
            _ => Ok(()),
        }
    }

    /// Step `step`'s loss scale: `scale`, or NaN where injected, so every gradient is NaN.
    pub fn loss_scale(&self, step: u64, scale: f64) -> f64 {
        if self.nan == Some(step) { f64::NAN } else { scale }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault_injection::knob_in;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn a_build_without_fault_injection_ignores_every_knob() {
        let set = env(&[(INJECT_NAN_ENV, "3"), (INJECT_SLOW_ENV, "250"), (INJECT_KILL_ENV, "2")]);
        let off = |name: &str| knob_in(false, name, &set);
        assert_eq!(Faults::read(0, 1, &off), Faults::default());
        let on = |name: &str| knob_in(true, name, &set);
        let faults = Faults::read(0, 1, &on);
        assert_eq!((faults.nan, faults.slow_ms, faults.kill), (Some(3), Some(250), Some(2)));
    }

    #[test]
    fn knobs_apply_to_their_rank_and_attempt_only() {
        let set = env(&[(INJECT_NAN_ENV, "3"), (INJECT_RANK_ENV, "1"), (INJECT_ATTEMPT_ENV, "2")]);
        let on = |name: &str| knob_in(true, name, &set);
        assert_eq!(Faults::read(1, 2, &on).nan, Some(3));
        assert_eq!(Faults::read(0, 2, &on), Faults::default(), "another rank");
        assert_eq!(Faults::read(1, 1, &on), Faults::default(), "another attempt");
    }
}
