//! A node slot's containerd store, filled from one store per image set instead of an
//! import per slot. The first node that needs a set of images (`scripts/setup-images.sh`'s
//! directory) imports them once, into `<images>/containerd-seed`, with a containerd of its
//! own; every slot is then a copy of that store whose content blobs and unpacked
//! snapshots are hard links (containerd never writes either in place: a container writes
//! to a snapshot of its own, over them), and whose metadata databases are copies. Six
//! slots cost one import (~40 s of CPU for the 1.7 GB trainer image) and six copies of a
//! few thousand links, and share the disk space of one.
//!
//! A new set of images starts from the newest older seed, so the layers they share (the
//! trainer's base and torch) are not unpacked again; its earlier images go through the
//! CRI, as [`super::images::import`] does.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::config::{self, NodeFacts};
use super::images::{self, Image};
use crate::control_plane::Error;
use crate::control_plane::process::Daemon;

/// The seed of an images directory: a containerd root holding its images, unpacked.
const SEED: &str = "containerd-seed";
/// What a slot's store was copied from (the seed's path), beside the store.
const SLOT_SEED: &str = "seed";
/// The parts of a store that are written once and only read after: linked, not copied.
const SHARED: [&str; 2] =
    ["io.containerd.content.v1.content/blobs", "io.containerd.snapshotter.v1.overlayfs/snapshots"];

/// The seed of `images_dir` (`catalogue` is its `images.json`), built first if need be,
/// under a lock: a second node waits for the first's import instead of doing its own.
pub fn seed(bin: &Path, images_dir: &Path, catalogue: &BTreeMap<String, Image>) -> Result<PathBuf, Error> {
    let seed = images_dir.join(SEED);
    if seed.is_dir() {
        return Ok(seed);
    }
    let lock_path = images_dir.join("seed.lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
    // SAFETY: flock(2) on a file we own; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(Error::io(&lock_path, std::io::Error::last_os_error()));
    }
    if seed.is_dir() {
        return Ok(seed);
    }
    let started = Instant::now();
    let work = images_dir.join(format!("{SEED}.partial"));
    remove(&work)?;
    std::fs::create_dir_all(&work).map_err(|e| Error::io(&work, e))?;
    let root = work.join("root");
    if let Some(older) = newest_other_seed(images_dir) {
        copy_store(&older, &root)?;
    }
    import_into(bin, &work, &root, catalogue)?;
    std::fs::rename(&root, &seed).map_err(|e| Error::io(&seed, e))?;
    remove(&work)?;
    tracing::info!("{}: the images' store, seeded in {:.1?}", seed.display(), started.elapsed());
    Ok(seed)
}

/// Makes the store at `containerd_root` (a slot's, locked by its node) a copy of `seed`,
/// unless it already is one; whether it copied.
pub fn fill_slot(containerd_root: &Path, seed: &Path) -> Result<bool, Error> {
    let slot = containerd_root.parent().expect("a slot's store is in the slot's directory");
    let marker = slot.join(SLOT_SEED);
    let seed_name = seed.display().to_string();
    if containerd_root.is_dir() && std::fs::read_to_string(&marker).is_ok_and(|s| s == seed_name) {
        return Ok(false);
    }
    remove(&marker)?;
    remove(containerd_root)?;
    copy_store(seed, containerd_root)?;
    std::fs::write(&marker, &seed_name).map_err(|e| Error::io(&marker, e))?;
    Ok(true)
}

/// The most recently built seed of the images directories beside `images_dir`.
fn newest_other_seed(images_dir: &Path) -> Option<PathBuf> {
    let parent = images_dir.parent()?;
    std::fs::read_dir(parent)
        .ok()?
        .flatten()
        .map(|e| e.path().join(SEED))
        .filter(|s| s.is_dir() && s.parent() != Some(images_dir))
        .filter_map(|s| Some((s.metadata().ok()?.modified().ok()?, s)))
        .max()
        .map(|(_, s)| s)
}

/// Runs a containerd on store `root` (its state under `work`) just long enough to import
/// the images, in a mount namespace of its own so that no unpacking mount outlives it.
fn import_into(bin: &Path, work: &Path, root: &Path, catalogue: &BTreeMap<String, Image>) -> Result<(), Error> {
    let run_dir = PathBuf::from(config::SHORT_ROOT).join(format!("pt{}-seed", std::process::id()));
    let facts = NodeFacts {
        name: "seed".into(),
        index: 0,
        ip: std::net::Ipv4Addr::LOCALHOST,
        bin: bin.to_path_buf(),
        dir: work.to_path_buf(),
        run_dir: run_dir.clone(),
        containerd_root: root.to_path_buf(),
        cgroup_root: String::new(),
        pause_image: catalogue.get("pause").map(|i| i.reference.clone()).unwrap_or_default(),
        reserved_cpus: None,
    };
    for dir in [&run_dir, &facts.cni_dir()] {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let conf = work.join("containerd.toml");
    std::fs::write(&conf, config::containerd(&facts)).map_err(|e| Error::io(&conf, e))?;
    let mut cmd = Command::new(bin.join("containerd"));
    cmd.arg("--config").arg(&conf).args(["--log-level", "warn"]);
    // SAFETY: unshare(2) and mount(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let private = libc::MS_REC | libc::MS_SLAVE;
            let (none, data) = (std::ptr::null(), std::ptr::null());
            if libc::unshare(libc::CLONE_NEWNS) != 0 || libc::mount(none, c"/".as_ptr(), none, private, data) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut containerd = Daemon::spawn("the seed's containerd", cmd, &work.join("containerd.log"))?;
    let socket = facts.containerd_socket();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        let state = match containerd.exited() {
            Some(status) => Some(format!("exited ({status})")),
            None if Instant::now() > deadline => Some("no socket after 60 s".to_string()),
            None => None,
        };
        if let Some(state) = state {
            let tail = containerd.log_tail(5);
            return Err(Error::Setup(format!("the seed's containerd ({}): {state}: {tail}", socket.display())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let imported =
        images::import(bin, &socket, catalogue).and_then(|i| images::collect_garbage(bin, &socket).map(|()| i));
    containerd.stop(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&run_dir);
    tracing::info!("the seed's images imported: {:?}", imported.as_ref().map_err(ToString::to_string));
    imported.map(|_| ())
}

/// Copies store `from` to `to` (absent): every file a hard link (`cp -a --link` keeps
/// the directories' owners, modes and extended attributes), then every file outside
/// [`SHARED`] replaced by a copy of its own. Where `from` and `to` are on different
/// file systems, a plain copy.
fn copy_store(from: &Path, to: &Path) -> Result<(), Error> {
    let cp = |link: bool| {
        let mut cmd = Command::new("cp");
        cmd.arg("-a").args(link.then_some("--link")).arg(from).arg(to);
        cmd.output().map_err(|e| Error::Spawn { program: "cp".into(), source: e })
    };
    let linked = cp(true)?;
    if !linked.status.success() {
        remove(to)?;
        let copied = cp(false)?;
        if !copied.status.success() {
            let why = String::from_utf8_lossy(&copied.stderr);
            return Err(Error::Setup(format!("cp -a {} {}: {}", from.display(), to.display(), why.trim())));
        }
        return Ok(());
    }
    unlink_private(to, to)
}

/// Replaces every linked file under `dir` outside [`SHARED`] with a copy.
fn unlink_private(root: &Path, dir: &Path) -> Result<(), Error> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| Error::io(&path, e))?;
        if kind.is_dir() {
            let relative = path.strip_prefix(root).expect("under the root");
            if !SHARED.iter().any(|s| relative == Path::new(s)) {
                unlink_private(root, &path)?;
            }
        } else if kind.is_file() {
            let mut copy = path.clone().into_os_string();
            copy.push(".copy");
            std::fs::copy(&path, &copy).map_err(|e| Error::io(&path, e))?;
            std::fs::rename(&copy, &path).map_err(|e| Error::io(&path, e))?;
        }
    }
    Ok(())
}

fn remove(path: &Path) -> Result<(), Error> {
    let result = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn tree(root: &Path) {
        for (file, text) in [
            ("io.containerd.content.v1.content/blobs/sha256/ab", "blob"),
            ("io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/bin/trainer", "elf"),
            ("io.containerd.snapshotter.v1.overlayfs/metadata.db", "snapshots"),
            ("io.containerd.metadata.v1.bolt/meta.db", "images"),
        ] {
            let path = root.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    #[test]
    fn a_copy_links_blobs_and_snapshots_and_owns_its_databases() {
        let dir = std::env::temp_dir().join(format!("seed-test-{}", std::process::id()));
        let (from, to) = (dir.join("seed"), dir.join("slot/containerd"));
        let _ = std::fs::remove_dir_all(&dir);
        tree(&from);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        assert!(fill_slot(&to, &from).unwrap(), "an empty slot is filled");
        let ino = |root: &Path, f: &str| std::fs::metadata(root.join(f)).unwrap().ino();
        for shared in [
            "io.containerd.content.v1.content/blobs/sha256/ab",
            "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/bin/trainer",
        ] {
            assert_eq!(ino(&from, shared), ino(&to, shared), "{shared} is linked");
        }
        for own in ["io.containerd.snapshotter.v1.overlayfs/metadata.db", "io.containerd.metadata.v1.bolt/meta.db"] {
            assert_ne!(ino(&from, own), ino(&to, own), "{own} is a copy");
            std::fs::write(to.join(own), "written by the slot's containerd").unwrap();
            assert_ne!(std::fs::read_to_string(from.join(own)).unwrap(), "written by the slot's containerd");
        }
        assert!(!fill_slot(&to, &from).unwrap(), "a slot copied from the same seed is kept");
        let other = dir.join("other-seed");
        tree(&other);
        assert!(fill_slot(&to, &other).unwrap(), "a slot of another seed is replaced");
        assert_eq!(
            ino(&other, "io.containerd.content.v1.content/blobs/sha256/ab"),
            ino(&to, "io.containerd.content.v1.content/blobs/sha256/ab")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
