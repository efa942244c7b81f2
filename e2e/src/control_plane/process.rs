//! A long-running program of the test cluster: its own process group, its output in a
//! log file, stopped (SIGTERM, then SIGKILL) when dropped, and killed by the kernel if
//! the thread that started it dies first (`PR_SET_PDEATHSIG`), so a failing or aborted
//! test leaves nothing running.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::error::Error;

pub struct Daemon {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

/// SIGKILL to the child when the spawning thread exits, and a process group of its own.
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.process_group(0);
}

impl Daemon {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Daemon, Error> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| Error::io(log, e))?;
        let err = out.try_clone().map_err(|e| Error::io(log, e))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|e| Error::Spawn { program: format!("{:?}", cmd.get_program()), source: e })?;
        Ok(Daemon { name: name.to_string(), child: Some(child), log: log.to_path_buf() })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGKILL, as a crash: no chance to clean up.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal_group(c.id(), libc::SIGKILL);
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut c) = self.child.take() else { return };
        signal_group(c.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal_group(c.id(), libc::SIGKILL);
        let _ = c.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// A signal to every process of a group we started.
pub fn signal_group(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on the process group of a child we spawned (its own group).
    unsafe {
        libc::kill(-(pid as libc::pid_t), signal);
    }
}
