//! Files written whole (readers, other ranks and later runs, see the old file or the
//! new one, never a partial one), and the checks on files this trainer did not write:
//! names that must stay inside their directory and sizes read before any allocation.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename,
/// so readers (other ranks, later runs) never see a partial file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{file_name}.{}.{}.tmp", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Bounds on metadata files read whole into memory. Each is far above what this trainer
/// writes or a Hugging Face model ships (a shard manifest is kilobytes, `state.json` a
/// few kilobytes, Qwen3's `tokenizer.json` 11 MB), and far below an allocation that
/// could hurt a pod.
pub mod limits {
    /// A shard manifest (`manifest.json`).
    pub const MANIFEST_BYTES: u64 = 64 << 20;
    /// A checkpoint's `state.json`.
    pub const STATE_BYTES: u64 = 16 << 20;
    /// A `tokenizer.json`.
    pub const TOKENIZER_BYTES: u64 = 256 << 20;
    /// A `latest` or `best` pointer file.
    pub const POINTER_BYTES: u64 = 4 << 10;
}

/// `name` when it is one plain file name: one normal path component (not empty, not
/// `.` or `..`, no separator, not absolute) and no NUL byte. Names read from manifests,
/// `state.json` and S3 listings go through this before they are joined to a directory.
pub fn plain_name(name: &str) -> Result<&str, String> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        _ if name.contains('\0') => Err(format!("{name:?} is not a plain file name (it contains a NUL byte)")),
        (Some(Component::Normal(n)), None) if n == name && !name.contains('\\') => Ok(name),
        _ => Err(format!("{name:?} is not a plain file name (one path component, no '/', '..' or leading '/')")),
    }
}

/// `root` joined with a relative `/`-separated `key` whose every component is a plain
/// file name, so the result stays under `root` (an S3 bucket and key mirrored into a cache).
pub fn under(root: &Path, key: &str) -> Result<PathBuf, String> {
    let mut path = root.to_path_buf();
    for part in key.split('/').filter(|p| !p.is_empty()) {
        path.push(plain_name(part).map_err(|e| format!("{key:?}: {e}"))?);
    }
    Ok(path)
}

/// The whole file when it holds at most `limit` bytes; larger files are refused before
/// anything is allocated for them. The error is the message only: callers name the file.
pub fn read_capped(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{len} bytes, more than the {limit} this file may have"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // `take` also bounds a file that grows after the size was read.
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("more than {limit} bytes")));
    }
    Ok(bytes)
}

/// [`read_capped`] of a UTF-8 text file.
pub fn read_text_capped(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, limit)?).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
pub(crate) mod test_util {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh, empty directory for one test, removed when dropped.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "trainer-test-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_leaves_no_temp_files() {
        let dir = test_util::TempDir::new("atomic");
        let path = dir.0.join("sub").join("x.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.json")]);
    }

    #[test]
    fn only_plain_names_pass() {
        for good in ["train-00000.bin", "manifest.json", ".hidden", "a..b", "step-00000012"] {
            assert_eq!(plain_name(good), Ok(good), "{good}");
        }
        for bad in ["", ".", "..", "../x", "../../etc/passwd", "/abs/path", "a/b", "a/", "./a", "x\0y", "a\\b"] {
            let e = plain_name(bad).unwrap_err();
            assert!(e.contains("not a plain file name"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn keys_stay_under_their_root() {
        let root = Path::new("/cache/s3");
        assert_eq!(under(root, "bucket/data/fineweb/").unwrap(), root.join("bucket/data/fineweb"));
        for bad in ["bucket/../../etc", "bucket/./x", "bucket/a\0"] {
            assert!(under(root, bad).unwrap_err().contains(bad.split('/').next().unwrap()), "{bad}");
        }
    }

    #[test]
    fn capped_reads_refuse_large_files_before_reading() {
        let dir = test_util::TempDir::new("capped");
        let path = dir.0.join("big.json");
        std::fs::File::create(&path).unwrap().set_len(1 << 40).unwrap();
        let e = read_capped(&path, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("1099511627776 bytes, more than the 1048576"), "{e}");
        std::fs::write(&path, b"{}").unwrap();
        assert_eq!(read_text_capped(&path, 2).unwrap(), "{}");
        assert!(read_capped(&path, 1).is_err());
    }
}
