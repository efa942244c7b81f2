//! The in-pod launcher, like torchrun: start one worker process per GPU (or the
//! requested number of CPU workers) with RANK, LOCAL_RANK and WORLD_SIZE, forward
//! SIGTERM, and when one worker fails stop the others and exit with that worker's
//! code and termination message.
//!
//! Workers' stderr passes through the launcher, which watches it for libtorch's NCCL
//! watchdog: that thread aborts the process (SIGABRT) on a collective timeout or a
//! peer's death before the worker can say why, so the launcher says it for it.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crds::contract::{FailureReason, TerminationMessage, env};

use crate::{Error, io_err};

/// Set by `trainer launch` for its workers when its own stderr is a terminal: theirs
/// is a pipe through the launcher.
pub const FORCE_COLOR_ENV: &str = "CLICOLOR_FORCE";

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
    /// The worker program; `None` is this executable.
    pub program: Option<PathBuf>,
    /// The worker command line after the program.
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
    /// What the launcher saw of that failure when the worker could not report it:
    /// the NCCL watchdog's line.
    pub cause: Option<String>,
    /// The failed worker's termination message (or the launcher's, for it).
    pub message: Option<TerminationMessage>,
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
    /// Relays the worker's stderr; returns the first collective-failure line.
    relay: Option<JoinHandle<Option<String>>>,
}

/// What libtorch 2.11's ProcessGroupNCCL logs before its watchdog (or the heartbeat
/// monitor behind it) ends the process: a collective timed out, a peer died, or the
/// watchdog itself hung on a broken NCCL/CUDA call.
const NCCL_WATCHDOG: &[&str] = &[
    "Watchdog caught collective operation timeout",
    "ncclRemoteError",
    "NCCL communicator was aborted",
    "failure detected by watchdog",
    "Process group watchdog thread terminated with exception",
    "ProcessGroupNCCL's watchdog got stuck",
];

/// The line without glog's prefix ("[rank0]:[E1218 20:27:21.42 ProcessGroupNCCL.cpp:629] "),
/// if it is one of the NCCL watchdog's.
fn collective_failure(line: &str) -> Option<String> {
    let at = NCCL_WATCHDOG.iter().filter_map(|s| line.find(s)).min()?;
    let start = line[..at].find(".cpp:").and_then(|c| line[c..at].find("] ").map(|e| c + e + 2)).unwrap_or(0);
    Some(line[start..].trim().chars().take(500).collect())
}

/// Copies a worker's stderr to `sink` line by line (one write each, so workers do not
/// interleave mid-line) and returns the first collective-failure line.
fn relay(source: impl Read + Send + 'static, mut sink: impl Write + Send + 'static) -> JoinHandle<Option<String>> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        let mut first = None;
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return first,
                Ok(_) => {
                    let _ = sink.write_all(&line);
                    if first.is_none() {
                        first = collective_failure(&String::from_utf8_lossy(&line));
                    }
                }
            }
        }
    })
}

/// How long the relays get to drain after every worker has exited; a grandchild
/// holding a worker's stderr open must not hold the launcher.
const RELAY_DRAIN: Duration = Duration::from_secs(5);

/// How long a launcher whose workers failed a collective waits before exiting. A
/// collective fails on every rank when one rank dies: the rank that died (a crash, a
/// fatal error such as a full disk) is the cause, the others only see the broken
/// connection. Leaving last lets the cause's pod fail first, so the Job's failure and
/// the operator's verdict name the cause, not a symptom that would restart the gang.
const SYMPTOM_DELAY: Duration = Duration::from_secs(3);

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
    let exe = match &spec.program {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(io_err(Path::new("/proc/self/exe")))?,
    };
    static LAUNCHES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = LAUNCHES.fetch_add(1, Ordering::Relaxed);
    let scratch = std::env::temp_dir().join(format!("trainer-launch-{}-{n}", std::process::id()));
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
            .env(env::TERMINATION_LOG, &termination)
            .stderr(Stdio::piped());
        if std::io::stderr().is_terminal() {
            cmd.env(FORCE_COLOR_ENV, "1");
        }
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
        let mut child = match cmd.spawn() {
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
        let relay = child.stderr.take().map(|e| relay(e, std::io::stderr()));
        workers.push(Worker { rank, child, termination, status: None, relay });
    }
    let mut outcome = supervise(&mut workers, spec.grace, &stop)?;
    let seen = drain(&mut workers);
    // The failed worker's message, or on success rank 0's final status.
    let source = workers.iter().find(|w| w.rank == outcome.failed_rank.unwrap_or(0));
    let mut text = source.and_then(|w| std::fs::read(&w.termination).ok());
    if let (Some(rank), None) = (outcome.failed_rank, &text)
        && let Some(line) = seen.into_iter().find_map(|(r, line)| (r == rank).then_some(line).flatten())
    {
        let reason = FailureReason::CollectiveTimeout;
        tracing::error!(rank, code = outcome.exit_code, "the worker was ended by the NCCL watchdog: {line}");
        text =
            Some(TerminationMessage { reason, step: None, detail: line.clone(), samples: None }.to_json().into_bytes());
        outcome.exit_code = reason.exit_code();
        outcome.cause = Some(line);
    }
    if outcome.failed_rank.is_some() {
        outcome.message = text.as_deref().and_then(|t| TerminationMessage::parse(&String::from_utf8_lossy(t)));
    }
    if let (Some(path), Some(text)) = (&spec.termination_log, text) {
        std::fs::write(path, text).map_err(io_err(path))?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if outcome.exit_code == FailureReason::CollectiveTimeout.exit_code() {
        let until = Instant::now() + SYMPTOM_DELAY;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(outcome)
}

/// Waits (up to `RELAY_DRAIN`) for the stderr relays of exited workers; returns each
/// rank's first collective-failure line.
fn drain(workers: &mut [Worker]) -> Vec<(u32, Option<String>)> {
    let deadline = Instant::now() + RELAY_DRAIN;
    let mut seen = Vec::new();
    for w in workers.iter_mut() {
        let Some(relay) = w.relay.take() else { continue };
        while !relay.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if relay.is_finished() {
            seen.push((w.rank, relay.join().ok().flatten()));
        }
    }
    seen
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
        Some((rank, code)) => LaunchOutcome { exit_code: code, failed_rank: Some(rank), cause: None, message: None },
        None => LaunchOutcome { exit_code: 0, failed_rank: None, cause: None, message: None },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libtorch 2.11's watchdog lines, as ProcessGroupNCCL logs them.
    const TIMEOUT: &str = "[rank1]:[E1122 10:00:00.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.";
    const REMOTE: &str = "[rank0]:[E1122 10:00:00.5 ProcessGroupNCCL.cpp:2057] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.27.5\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.";

    #[test]
    fn the_nccl_watchdog_lines_are_recognised_without_the_log_prefix() {
        assert_eq!(
            collective_failure(TIMEOUT).as_deref(),
            Some(
                "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out."
            )
        );
        assert!(
            collective_failure(REMOTE)
                .unwrap()
                .starts_with("[PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog")
        );
        let stuck = "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.";
        assert_eq!(collective_failure(stuck).as_deref(), Some(stuck));
        for other in [
            "INFO step 3 loss 10.9",
            "terminate called after throwing an instance of 'c10::Error'",
            "CUDA error: an illegal memory access",
        ] {
            assert_eq!(collective_failure(other), None, "{other}");
        }
    }

    #[derive(Clone, Default)]
    struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_relay_passes_every_byte_through_and_keeps_the_first_watchdog_line() {
        let mut input = format!("2026-11-22T10:00:00Z INFO step 7\n{TIMEOUT}\n{REMOTE}\n").into_bytes();
        input.extend_from_slice(b"\xff not utf-8\nno newline at the end");
        let sink = Sink::default();
        let first = relay(std::io::Cursor::new(input.clone()), sink.clone()).join().unwrap();
        assert_eq!(*sink.0.lock().unwrap(), input);
        assert_eq!(first, collective_failure(TIMEOUT));
    }

    /// Two `sh` workers; rank 1 runs `script`, rank 0 sleeps until the launcher stops it.
    fn launch_sh(name: &str, script: &str) -> (LaunchOutcome, Option<String>) {
        let dir = std::env::temp_dir().join(format!("trainer-launch-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("termination");
        let spec = LaunchSpec {
            nnodes: 1,
            node_rank: 0,
            nproc_per_node: 2,
            master_addr: "127.0.0.1".into(),
            master_port: 1,
            program: Some("/bin/sh".into()),
            worker_args: vec![
                "-c".into(),
                format!("if [ \"$RANK\" = 1 ]; then {script}; else exec sleep 60; fi").into(),
            ],
            termination_log: Some(log.clone()),
            grace: Duration::from_secs(10),
        };
        let outcome = launch(&spec, Arc::new(AtomicBool::new(false))).unwrap();
        let message = std::fs::read_to_string(&log).ok();
        std::fs::remove_dir_all(&dir).unwrap();
        (outcome, message)
    }

    #[test]
    fn a_worker_aborted_by_the_nccl_watchdog_is_reported_as_a_collective_timeout() {
        let script = format!(
            "echo 'INFO step 7' >&2; echo '{TIMEOUT}' >&2; echo \"terminate called after throwing an instance of 'c10::DistBackendError'\" >&2; kill -ABRT $$"
        );
        let (outcome, message) = launch_sh("watchdog", &script);
        let detail = collective_failure(TIMEOUT).unwrap();
        let code = FailureReason::CollectiveTimeout.exit_code();
        let message = TerminationMessage::parse(&message.expect("a termination message")).unwrap();
        let want = TerminationMessage { reason: FailureReason::CollectiveTimeout, step: None, detail, samples: None };
        assert_eq!(message, want);
        assert_eq!(
            outcome,
            LaunchOutcome {
                exit_code: code,
                failed_rank: Some(1),
                cause: want.detail.clone().into(),
                message: Some(want)
            }
        );
    }

    #[test]
    fn any_other_crash_keeps_its_signal_and_leaves_the_log_tail_to_kubernetes() {
        let (outcome, message) = launch_sh("abort", "echo 'CUDA error: an illegal memory access' >&2; kill -ABRT $$");
        assert_eq!(outcome, LaunchOutcome { exit_code: 134, failed_rank: Some(1), cause: None, message: None });
        assert_eq!(message, None, "FallbackToLogsOnError takes the log tail only when the message is empty");
    }

    #[test]
    fn a_worker_that_reports_its_own_failure_is_believed() {
        let own = TerminationMessage {
            reason: FailureReason::NaNLoss,
            step: Some(9),
            detail: "loss NaN".into(),
            samples: Some(crds::contract::FailedSamples { from: 64, to: 72, checkpoint: 32 }),
        };
        let json = own.to_json();
        let script = format!("echo '{TIMEOUT}' >&2; printf '%s' '{json}' > \"${}\"; exit 86", env::TERMINATION_LOG);
        let (outcome, message) = launch_sh("own", &script);
        assert_eq!(outcome, LaunchOutcome { exit_code: 86, failed_rank: Some(1), cause: None, message: Some(own) });
        assert_eq!(message.as_deref(), Some(json.as_str()));
    }

    #[test]
    fn exit_codes_read_like_a_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(88 << 8)), 88);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }
}
