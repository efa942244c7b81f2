//! A checkpoint directory on a small file system (a tmpfs in a private mount
//! namespace, `unshare --user --map-root-user --mount`): the trainer refuses to start a
//! run whose checkpoints cannot fit, and a disk that fills up mid-run ends the run with
//! `StorageFull` and its exit code, naming the path, instead of exit 1 (which the
//! operator retries).

use std::path::Path;
use std::process::Output;

use crds::contract::{FailureReason, TerminationMessage};

mod common;
use common::{cache, manifest_yaml, scratch};

/// Runs `script` in a new user and mount namespace with `$OUT` a tmpfs of `size`,
/// `$TRAINER` the trainer binary and `$MANIFEST` the run.
fn in_small_fs(dir: &Path, size: &str, manifest: &str, script: &str) -> Output {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let manifest_path = dir.join("run.yaml");
    std::fs::write(&manifest_path, manifest).unwrap();
    let mount = format!("mount -t tmpfs -o size={size} none \"$OUT\" && {script}");
    let o = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &mount])
        .env("OUT", &out)
        .env("TRAINER", env!("CARGO_BIN_EXE_trainer"))
        .env("MANIFEST", &manifest_path)
        .env("TRAINER_CACHE", cache())
        .env("TRAINER_TERMINATION_LOG", dir.join("termination"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("unshare (util-linux) runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !stderr.contains("unshare failed") && !stderr.contains("mount: "),
        "this machine cannot make a private tmpfs (unprivileged user namespaces): {stderr}"
    );
    o
}

fn termination(dir: &Path) -> TerminationMessage {
    let text = std::fs::read_to_string(dir.join("termination")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// nano (about 11 MiB a checkpoint with both AdamW moments) keeping 3: 4 copies, about
/// 44 MiB, refused on a 24 MiB file system before a step is trained.
#[test]
fn a_run_whose_checkpoints_cannot_fit_is_refused_before_training() {
    let dir = scratch("storage-preflight");
    let manifest = manifest_yaml(1, 4, 1024, "16384");
    let o = in_small_fs(&dir, "24m", &manifest, "exec \"$TRAINER\" run --no-sample -o \"$OUT\" \"$MANIFEST\"");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(FailureReason::StorageFull.exit_code()), "{stderr}");
    let t = termination(&dir);
    assert_eq!(t.reason, FailureReason::StorageFull);
    assert!(
        t.detail.contains("4 checkpoints (keepLast 3 and the one being written)") && t.detail.contains("is free"),
        "{t:?}"
    );
    assert!(t.detail.contains(&dir.join("out").display().to_string()), "the path is named: {t:?}");
    assert_eq!(t.step, None, "no step was trained: {t:?}");
}

/// Keeping 1 (2 copies fit in 48 MiB), the disk is filled once the first checkpoint
/// is written: the next write fails with ENOSPC, and the run ends with StorageFull.
#[test]
fn a_disk_that_fills_up_mid_run_ends_the_run_with_storage_full() {
    let dir = scratch("storage-full");
    let manifest =
        manifest_yaml(1, 4, 1024, "16384").replace("everySteps: 4, keepLast: 3", "everySteps: 2, keepLast: 1");
    let script = r#""$TRAINER" run --no-sample -o "$OUT" "$MANIFEST" & pid=$!
        while [ ! -e "$OUT/step-00000002" ]; do sleep 0.05; done
        dd if=/dev/zero of="$OUT/filler" bs=64k 2>/dev/null
        wait $pid"#;
    let o = in_small_fs(&dir, "48m", &manifest, script);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(FailureReason::StorageFull.exit_code()), "{stderr}");
    let t = termination(&dir);
    assert_eq!(t.reason, FailureReason::StorageFull, "{t:?}");
    assert!(t.detail.contains("No space left on device") && t.detail.contains("file system is full"), "{t:?}");
    assert!(t.step.is_some_and(|s| s >= 2), "{t:?}");
}
