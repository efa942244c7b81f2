//! Room for checkpoints: the preflight before training, and the error that names the
//! room a checkpoint needed.

use std::io;
use std::path::Path;

use bytesize::ByteSize;

use crate::Error;

/// Bytes this process may still write on the file system holding `dir`.
pub fn available(dir: &Path) -> io::Result<u64> {
    fs4::available_space(dir)
}

/// Bytes of every file under the `step-*` directories of `dir`: room that pruning frees.
pub fn checkpoints_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for (_, step) in super::step_dirs(dir)? {
        for entry in std::fs::read_dir(&step)? {
            total += entry?.metadata()?.len();
        }
    }
    Ok(total)
}

/// Fails, naming the numbers, unless the file system of `dir` holds `keep_last +
/// keep_best + 1` checkpoints of about `estimate` bytes each (the newest `keep_last`,
/// the `keep_best` of lowest validation loss and the one being written), counting the
/// room of the checkpoints already there as free.
pub fn preflight(dir: &Path, keep_last: u32, keep_best: u32, estimate: u64) -> Result<(), Error> {
    let io = |e| Error::Io { path: dir.to_path_buf(), source: e };
    let (free, existing) = (available(dir).map_err(io)?, checkpoints_bytes(dir).map_err(io)?);
    let copies = u64::from(keep_last.max(1)) + u64::from(keep_best) + 1;
    let best = if keep_best > 0 { format!(", keepBest {keep_best}") } else { String::new() };
    let needed = copies * estimate;
    if free + existing >= needed {
        return Ok(());
    }
    Err(Error::StorageFull {
        path: dir.to_path_buf(),
        message: format!(
            "{copies} checkpoints (keepLast {keep_last}{best} and the one being written) of about {} each need {}, but \
             {} is free{}",
            ByteSize::b(estimate),
            ByteSize::b(needed),
            ByteSize::b(free),
            if existing > 0 {
                format!(" and the checkpoints there hold {}", ByteSize::b(existing))
            } else {
                String::new()
            }
        ),
    })
}

/// `e` as [`Error::StorageFull`] when it is a full file system, naming how many bytes
/// the write of `needed` bytes into `dir` had and has; other errors unchanged.
pub fn explain(e: Error, dir: &Path, needed: u64) -> Error {
    if e.reason() != Some(crds::contract::FailureReason::StorageFull) || matches!(e, Error::StorageFull { .. }) {
        return e;
    }
    let free = available(dir).map_or_else(|_| "unknown".to_string(), |b| ByteSize::b(b).to_string());
    Error::StorageFull {
        path: dir.to_path_buf(),
        message: format!("writing a checkpoint of {} failed, {free} free: {e}", ByteSize::b(needed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_util::TempDir;

    #[test]
    fn the_preflight_counts_existing_checkpoints_as_room() {
        let dir = TempDir::new("space");
        let free = available(&dir.0).unwrap();
        preflight(&dir.0, 2, 0, free / 4).unwrap();
        assert!(preflight(&dir.0, 2, 2, free / 4).is_err(), "keepBest's checkpoints need room too");
        let err = preflight(&dir.0, 2, 0, free / 2).unwrap_err();
        assert_eq!(err.reason(), Some(crds::contract::FailureReason::StorageFull));
        let text = err.to_string();
        assert!(text.contains("3 checkpoints (keepLast 2") && text.contains("is free"), "{text}");
        // A checkpoint of 1 GiB already there (sparse: it takes no room here) will be
        // pruned: 3 checkpoints of (free + 512 MiB) / 3 fit only by counting it.
        let step = dir.0.join("step-00000004");
        std::fs::create_dir_all(&step).unwrap();
        std::fs::File::create(step.join("model.safetensors")).unwrap().set_len(1 << 30).unwrap();
        assert_eq!(checkpoints_bytes(&dir.0).unwrap(), 1 << 30);
        let free = available(&dir.0).unwrap();
        let estimate = (free + (512 << 20)) / 3;
        preflight(&dir.0, 2, 0, estimate).unwrap();
        std::fs::remove_dir_all(&step).unwrap();
        assert!(preflight(&dir.0, 2, 0, estimate).is_err(), "without the checkpoint there is no room");
    }
}
