//! Bind mounts private to one process (needs root: `CAP_SYS_ADMIN`): directories and
//! files mounted over paths the process reads, in a mount namespace of its own, so
//! the host's view never changes. A pod's `/etc/hosts` and ServiceAccount token
//! ([`crate::network::Enter`]) and a controller's certificates at a path compiled into
//! it ([`crate::kueue`]) are mounted this way.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bind mounts, prepared before a fork and made in the child by [`Binds::mount`].
#[derive(Default)]
pub struct Binds {
    /// (source, target).
    binds: Vec<(CString, CString)>,
}

impl Binds {
    /// Also mounts `source` (a directory or a file) over `target`. A missing
    /// directory target is created on the host, empty: a mount point needs one.
    pub fn bind(mut self, source: &Path, target: &Path) -> std::io::Result<Binds> {
        if source.is_dir() {
            std::fs::create_dir_all(target)?;
        }
        let cstr = |p: &Path| CString::new(p.display().to_string()).expect("no NUL in a path");
        self.binds.push((cstr(source), cstr(target)));
        Ok(self)
    }

    /// In the child, between fork and exec: a new mount namespace whose mounts do not
    /// propagate back to the host, then each bind mount.
    ///
    /// # Safety
    /// Only async-signal-safe system calls, on values prepared before the fork: call
    /// it from `pre_exec` only.
    pub unsafe fn mount(&self, extra_namespaces: libc::c_int) -> std::io::Result<()> {
        let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
        // SAFETY: plain system calls on NUL-terminated strings that outlive them.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS | extra_namespaces))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for (source, target) in &self.binds {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
        }
        Ok(())
    }

    /// Makes `cmd` run with these mounts.
    pub fn apply(self, cmd: &mut Command) {
        // SAFETY: `mount` makes only async-signal-safe system calls.
        unsafe {
            cmd.pre_exec(move || self.mount(0));
        }
    }
}

/// A directory bind-mounted over itself and made a shared mount on the host, until
/// dropped: mount namespaces made later as slaves of the host's (the nodes') receive
/// what is mounted beneath it afterwards, such as a size-limited file system over a
/// volume's directory. Without it they would not: the host's own mounts here are private.
pub struct SharedMount(PathBuf);

impl SharedMount {
    pub fn new(dir: &Path) -> std::io::Result<SharedMount> {
        std::fs::create_dir_all(dir)?;
        let c = CString::new(dir.display().to_string()).map_err(std::io::Error::other)?;
        let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
        // SAFETY: mount(2) of a directory this harness owns, over itself.
        unsafe {
            check(libc::mount(c.as_ptr(), c.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()))?;
            let shared = libc::MS_SHARED | libc::MS_REC;
            if let Err(e) = check(libc::mount(std::ptr::null(), c.as_ptr(), std::ptr::null(), shared, std::ptr::null()))
            {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                return Err(e);
            }
        }
        Ok(SharedMount(dir.to_path_buf()))
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        if let Ok(c) = CString::new(self.0.display().to_string()) {
            // SAFETY: umount2(2) of the bind mount `new` made.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
