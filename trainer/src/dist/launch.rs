//! The in-pod launcher, like torchrun: start one worker process per GPU (or the
//! requested number of CPU workers) with RANK, LOCAL_RANK and WORLD_SIZE, forward
//! SIGTERM, and when one worker fails stop the others and exit with that worker's
//! code and termination message.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crds::contract::env;

use crate::{Error, io_err};

/// How often the launcher looks at its workers.
const POLL: Duration = Duration::from_millis(50);

/// One node's share of the gang.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    pub nnodes: u32,
    pub node_rank: u32,
    pub nproc_per_node: u32,
    pub master_addr: String,
    pub master_port: u16,
    /// The worker command line after the program (this executable).
    pub worker_args: Vec<OsString>,
    /// Where the launcher leaves the termination message it chose, if anywhere.
    pub termination_log: Option<PathBuf>,
    /// After one worker fails (or SIGTERM), how long the others get before SIGKILL.
    pub grace: Duration,
}

/// How the gang on this node ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// The launcher's exit code: 0, or the first failed worker's (128 + signal when killed).
    pub exit_code: i32,
    /// Global rank of the first worker that failed.
    pub failed_rank: Option<u32>,
}

/// The exit code a shell would report: the code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

struct Worker {
    rank: u32,
    child: Child,
    termination: PathBuf,
    status: Option<ExitStatus>,
}

fn send(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// Runs the node's workers to completion. `stop` is raised by SIGTERM/SIGINT and is
/// forwarded to the workers as SIGTERM.
pub fn launch(spec: &LaunchSpec, stop: Arc<AtomicBool>) -> Result<LaunchOutcome, Error> {
    if spec.nproc_per_node == 0 || spec.nnodes == 0 || spec.node_rank >= spec.nnodes {
        return Err(Error::InvalidSpec(format!(
            "launch: node {} of {} with {} processes per node",
            spec.node_rank, spec.nnodes, spec.nproc_per_node
        )));
    }
    let exe = std::env::current_exe().map_err(io_err(Path::new("/proc/self/exe")))?;
    let scratch = std::env::temp_dir().join(format!("trainer-launch-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(io_err(&scratch))?;
    let world = spec.nnodes * spec.nproc_per_node;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) / spec.nproc_per_node as usize;
    let mut workers: Vec<Worker> = Vec::new();
    for local in 0..spec.nproc_per_node {
        let rank = spec.node_rank * spec.nproc_per_node + local;
        let termination = scratch.join(format!("termination-rank-{rank}"));
        let _ = std::fs::remove_file(&termination);
        let mut cmd = Command::new(&exe);
        cmd.args(&spec.worker_args)
            .env(env::RANK, rank.to_string())
            .env(env::LOCAL_RANK, local.to_string())
            .env(env::WORLD_SIZE, world.to_string())
            .env(env::NODE_RANK, spec.node_rank.to_string())
            .env(env::NNODES, spec.nnodes.to_string())
            .env(env::NPROC_PER_NODE, spec.nproc_per_node.to_string())
            .env(env::MASTER_ADDR, &spec.master_addr)
            .env(env::MASTER_PORT, spec.master_port.to_string())
            .env(env::TERMINATION_LOG, &termination);
        // Like torchrun: workers share the node's cores unless told otherwise.
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            cmd.env("OMP_NUM_THREADS", threads.max(1).to_string());
        }
        // SAFETY: prctl is async-signal-safe; a worker must not outlive its launcher.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for w in workers.iter_mut() {
                    let _ = w.child.kill();
                    let _ = w.child.wait();
                }
                return Err(Error::Io { path: exe.clone(), source: e });
            }
        };
        tracing::info!(rank, local_rank = local, pid = child.id(), "started worker");
        workers.push(Worker { rank, child, termination, status: None });
    }
    let outcome = supervise(&mut workers, spec.grace, &stop)?;
    if let Some(path) = &spec.termination_log {
        // The failed worker's message, or on success rank 0's final status.
        let source = match outcome.failed_rank {
            Some(rank) => workers.iter().find(|w| w.rank == rank),
            None => workers.iter().find(|w| w.rank == 0),
        };
        if let Some(text) = source.and_then(|w| std::fs::read(&w.termination).ok()) {
            std::fs::write(path, text).map_err(io_err(path))?;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(outcome)
}

fn supervise(workers: &mut [Worker], grace: Duration, stop: &AtomicBool) -> Result<LaunchOutcome, Error> {
    let mut failed: Option<(u32, i32)> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut killed = false;
    loop {
        for w in workers.iter_mut().filter(|w| w.status.is_none()) {
            if let Some(status) = w.child.try_wait().map_err(io_err(Path::new("worker")))? {
                let code = exit_code(status);
                w.status = Some(status);
                if code != 0 && failed.is_none() {
                    tracing::error!(rank = w.rank, code, "worker failed; stopping the others");
                    failed = Some((w.rank, code));
                }
            }
        }
        let running: Vec<u32> = workers.iter().filter(|w| w.status.is_none()).map(|w| w.child.id()).collect();
        if running.is_empty() {
            break;
        }
        if stopping_since.is_none() && (failed.is_some() || stop.load(Ordering::SeqCst)) {
            for &pid in &running {
                send(pid, libc::SIGTERM);
            }
            stopping_since = Some(Instant::now());
        }
        if let Some(since) = stopping_since
            && !killed
            && since.elapsed() > grace
        {
            tracing::warn!(workers = running.len(), "workers still running after the grace period; killing them");
            for &pid in &running {
                send(pid, libc::SIGKILL);
            }
            killed = true;
        }
        std::thread::sleep(POLL);
    }
    Ok(match failed {
        Some((rank, code)) => LaunchOutcome { exit_code: code, failed_rank: Some(rank) },
        None => LaunchOutcome { exit_code: 0, failed_rank: None },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_read_like_a_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(88 << 8)), 88);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }
}
