//! Checkpoints on the checkpoint PVC.
//!
//! Layout of a checkpoint directory (`spec.checkpoint`, mounted at `/checkpoints`):
//!
//! ```text
//! <dir>/step-00000100/model.safetensors      HF parameter names
//! <dir>/step-00000100/optimizer.safetensors
//! <dir>/step-00000100/state.json             TrainState, with the size and sha256 of each file
//! <dir>/latest                               "step-00000100": a hint, never trusted blindly
//! <dir>/best                                 the kept checkpoint of lowest validation loss (keepBest)
//! <dir>/metrics.jsonl                        the run's log (`crate::telemetry::metrics_log`)
//! <dir>/tensorboard/events.out.tfevents.*    TensorBoard's (`crate::telemetry::tensorboard`)
//! ```
//!
//! A write goes to `<dir>/.tmp-step-<step>-<pid>/`, every file and the directory are
//! fsynced, and the directory is renamed to its final name, so a `step-*` directory is
//! complete by construction; loading still verifies every file against `state.json` and
//! falls back to the next older checkpoint when one is damaged.
//!
//! One process writes a checkpoint directory (rank 0). Any `.tmp-*` entry not belonging
//! to a write in progress in this process is debris of a crashed writer, and is removed
//! when pruning.
//!
//! A save hashes each file as it writes it, straight from the tensors' memory
//! ([`safetensors_writer`]); loading hashes in 1 MiB reads. Memory stays flat for any
//! size either way; the measured costs of save, hashing, the background write's stall
//! and loading are in `docs/perf.md`.

pub mod mirror;
pub mod resume;
pub mod safetensors_writer;
pub mod space;
pub mod writer;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use crds::config::RunConfig;
use crds::types::CheckpointRef;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::Tensor;

use crate::{Error, io_err};

type Result<T, E = Error> = std::result::Result<T, E>;

/// Version of the checkpoint layout and of [`TrainState`]; bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;
/// Model weights, with Hugging Face parameter names.
pub const MODEL_FILE: &str = "model.safetensors";
/// Optimizer state.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The [`TrainState`] of a checkpoint.
pub const STATE_FILE: &str = "state.json";
/// Name of the newest complete checkpoint directory, inside the checkpoint directory.
pub const LATEST_FILE: &str = "latest";
/// Name of the kept checkpoint directory with the lowest validation loss
/// (`checkpoint.keepBest`), inside the checkpoint directory.
pub const BEST_FILE: &str = "best";

/// The run's JSONL log, beside the checkpoints.
pub const METRICS_LOG_FILE: &str = "metrics.jsonl";
/// TensorBoard's event files, beside the checkpoints.
pub const TENSORBOARD_DIR: &str = "tensorboard";

const TMP_PREFIX: &str = ".tmp-";
pub const STEP_PREFIX: &str = "step-";
const HASH_BUFFER: usize = 1 << 20;

/// Everything besides tensors that a resumed run needs, written as `state.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainState {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// Optimizer steps done.
    pub step: u64,
    /// Tokens trained on.
    pub tokens: u64,
    /// Samples consumed from the data stream, all ranks together.
    pub data_position: u64,
    /// Random number generator state, opaque to checkpointing.
    pub rng: serde_json::Value,
    /// [`crds::config::RunConfig::fingerprint`] of the run that wrote it.
    pub config_hash: String,
    /// [`RunConfig::record_view`] of the run that wrote it: what it trained under, so
    /// that a resume can name what changed (older trainers wrote only its
    /// [`RunConfig::resume_view`], or nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<RunConfig>,
    /// Every change accepted on resume, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ConfigChange>,
    /// Trainer processes of the run that wrote it.
    pub world_size: u32,
    /// Gang attempt that wrote it.
    pub attempt: u32,
    /// Model preset name.
    pub preset: String,
    /// Training loss at the checkpoint's step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// The mix's validation loss at the checkpoint's step, when validation ran there:
    /// what `keepBest` ranks by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// When the checkpoint was written (RFC 3339); set by the writer.
    #[serde(default)]
    pub time: String,
    /// Size and sha256 of every file of the checkpoint; set by the writer.
    #[serde(default)]
    pub files: BTreeMap<String, FileDigest>,
}

/// The changes a run accepted when it resumed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigChange {
    /// The step it resumed at.
    pub step: u64,
    /// Tokens trained by then.
    pub tokens: u64,
    /// The gang attempt that resumed.
    pub attempt: u32,
    /// When (RFC 3339).
    pub time: String,
    /// `path: was → now`, JSON paths of the RunConfig.
    pub changes: Vec<String>,
}

/// Size and content hash of one checkpoint file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Size in bytes.
    pub bytes: u64,
    /// Lower-case hex.
    pub sha256: String,
}

/// What one checkpoint holds. `state.time` and `state.files` are filled in by the writer.
pub struct Payload {
    /// Model parameters by Hugging Face name; any device, any layout.
    pub model: Vec<(String, Tensor)>,
    /// Optimizer state by name; any device, any layout.
    pub optimizer: Vec<(String, Tensor)>,
    /// Step, data position and the rest; `time` and `files` are overwritten.
    pub state: TrainState,
}

/// A verified checkpoint, loaded eagerly into CPU tensors (the caller copies them into
/// its parameters and optimizer, then drops this).
pub struct Loaded {
    /// The `step-*` directory.
    pub dir: PathBuf,
    /// Its `state.json`.
    pub state: TrainState,
    /// Model weights by Hugging Face name.
    pub model: HashMap<String, Tensor>,
    /// Optimizer state by name.
    pub optimizer: HashMap<String, Tensor>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("dir", &self.dir)
            .field("state", &self.state)
            .field("model_tensors", &self.model.len())
            .field("optimizer_tensors", &self.optimizer.len())
            .finish()
    }
}

/// How many checkpoints rotation keeps: the newest `last` (at least 1: the one just
/// written) and the `best` of lowest validation loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub last: usize,
    pub best: usize,
}

/// Name of the directory of the checkpoint at `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:08}")
}

/// Fails, naming every mismatch, unless run `cfg`, whose resume fingerprint is
/// `config_hash`, can resume from a checkpoint with `state`. A pretraining run may
/// resume on another world size (every step's global samples are the same set, split
/// differently); GRPO's rollouts are drawn per rank, so it may not.
pub fn check_resumable(state: &TrainState, cfg: &RunConfig, config_hash: &str) -> Result<()> {
    let world_size = cfg.topology.world_size;
    let mut problems = Vec::new();
    if state.format_version != FORMAT_VERSION {
        problems.push(format!(
            "checkpoint format version {} differs from this trainer's {FORMAT_VERSION}",
            state.format_version
        ));
    }
    if state.config_hash != config_hash {
        // The stored config is compared under this trainer's rules (an older trainer
        // held more of it fixed, and hashed what it held); a changed embedded corpus
        // shows only in the hashes' suffix.
        let corpus = |hash: &str| hash.split_once("-corpus").map(|(_, version)| version.to_string());
        let changed = state.config.as_ref().map(|old| cfg.resume_differences(old)).unwrap_or_default();
        let same_run =
            state.config.is_some() && changed.is_empty() && corpus(&state.config_hash) == corpus(config_hash);
        if !same_run && changed.is_empty() {
            problems
                .push(format!("it was written by config {} but this run's config is {config_hash}", state.config_hash));
        } else if !same_run {
            problems.push(format!(
                "the run changed since it was written ({}); only the topology (with the same global batch), the \
                 token budget, the sharding, the micro-batch, gradient checkpointing, the attention backend and \
                 the checkpoint and validation cadences may change on resume",
                changed.join(", ")
            ));
        }
    }
    if state.world_size != world_size && cfg.grpo.is_some() {
        problems.push(format!(
            "it was written with world size {} but this run has {world_size}; GRPO resumes on the world size it \
             was written with (its rollouts are drawn per rank)",
            state.world_size
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::IncompatibleCheckpoint { step: state.step, message: problems.join("; ") })
    }
}

/// The newest checkpoint in `dir` that verifies, loaded; `None` when `dir` is missing or
/// holds none. Damaged checkpoints (truncated, corrupt or missing files, unreadable
/// `state.json`) are skipped with a warning naming the directory and the problem.
pub fn latest_valid(dir: impl AsRef<Path>) -> Result<Option<Loaded>> {
    let dir = dir.as_ref();
    for candidate in candidates(dir)? {
        let loaded = verify(&candidate, None).and_then(|state| {
            let model = read_tensors(&candidate.join(MODEL_FILE))?;
            let optimizer = read_tensors(&candidate.join(OPTIMIZER_FILE))?;
            Ok(Loaded { dir: candidate.clone(), state, model, optimizer })
        });
        match loaded {
            Ok(loaded) => return Ok(Some(loaded)),
            Err(problem) => skip(&candidate, &problem),
        }
    }
    Ok(None)
}

/// Model weights for `initFrom`. `path` is a checkpoint directory (verified; an error if
/// damaged), a directory of checkpoints (the newest whose weights verify), or a
/// safetensors file (loaded as is).
pub fn load_weights(path: impl AsRef<Path>) -> Result<HashMap<String, Tensor>> {
    let path = path.as_ref();
    let meta = fs::metadata(path).map_err(io_err(path))?;
    if meta.is_file() {
        return read_tensors(path).map_err(|message| Error::Checkpoint { path: path.into(), message });
    }
    if path.join(STATE_FILE).exists() {
        return verify(path, Some(MODEL_FILE))
            .and_then(|_| read_tensors(&path.join(MODEL_FILE)))
            .map_err(|message| Error::Checkpoint { path: path.into(), message });
    }
    for candidate in candidates(path)? {
        match verify(&candidate, Some(MODEL_FILE)).and_then(|_| read_tensors(&candidate.join(MODEL_FILE))) {
            Ok(weights) => return Ok(weights),
            Err(problem) => skip(&candidate, &problem),
        }
    }
    Err(Error::Checkpoint { path: path.into(), message: "no valid checkpoint with model weights".into() })
}

fn skip(candidate: &Path, problem: &str) {
    tracing::warn!(checkpoint = %candidate.display(), problem, "skipping damaged checkpoint");
}

/// `step-*` directories of `dir`, newest first. Warns about unfinished writes and about a
/// `latest` pointer that disagrees.
fn candidates(dir: &Path) -> Result<Vec<PathBuf>> {
    let steps = match step_dirs(dir) {
        Ok(steps) => steps,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for tmp in tmp_entries(dir).map_err(io_err(dir))?.into_iter().filter(|p| !is_live(p)) {
        tracing::warn!(path = %tmp.display(), "ignoring unfinished checkpoint write");
    }
    if let Ok(latest) = crate::files::read_text_capped(&dir.join(LATEST_FILE), crate::files::limits::POINTER_BYTES) {
        let latest = latest.trim();
        let newest = steps.last().map(|(_, p)| p.file_name().unwrap_or_default().to_string_lossy().into_owned());
        if newest.as_deref() != Some(latest) {
            tracing::info!(latest, newest = newest.as_deref().unwrap_or("none"), dir = %dir.display(),
                "the latest pointer is not the newest checkpoint directory; trying the newest first");
        }
    }
    Ok(steps.into_iter().rev().map(|(_, p)| p).collect())
}

/// `step-<digits>` directories of `dir`, sorted by step.
fn step_dirs(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut steps = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(step) = name.to_str().and_then(parse_step_dir) else { continue };
        if entry.file_type()?.is_dir() {
            steps.push((step, entry.path()));
        }
    }
    steps.sort();
    Ok(steps)
}

fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn tmp_entries(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Checks `state.json` and the size and sha256 of every file it lists (or only of the
/// file `only`), sizes first to fail fast. Returns the problem as text for the warning.
fn verify(dir: &Path, only: Option<&str>) -> Result<TrainState, String> {
    let state = read_state(dir)?;
    let dir_step = dir.file_name().and_then(|n| n.to_str()).and_then(parse_step_dir);
    if dir_step != Some(state.step) {
        return Err(format!("{STATE_FILE} records step {} but the directory name differs", state.step));
    }
    for required in [MODEL_FILE, OPTIMIZER_FILE] {
        if !state.files.contains_key(required) {
            return Err(format!("{STATE_FILE} does not list {required}"));
        }
    }
    let checked = || state.files.iter().filter(|(name, _)| only.is_none_or(|o| o == name.as_str()));
    for (name, digest) in checked() {
        crate::files::plain_name(name).map_err(|e| format!("{STATE_FILE} lists an invalid file name: {e}"))?;
        let path = dir.join(name);
        let bytes = match fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(format!("{name} is missing")),
            Err(e) => return Err(format!("{name}: {e}")),
        };
        if bytes != digest.bytes {
            return Err(format!("{name} has {bytes} bytes, {STATE_FILE} records {}", digest.bytes));
        }
    }
    for (name, digest) in checked() {
        let actual = sha256_file(&dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if actual.sha256 != digest.sha256 {
            return Err(format!("{name} has sha256 {}, {STATE_FILE} records {}", actual.sha256, digest.sha256));
        }
    }
    Ok(state)
}

fn read_state(dir: &Path) -> Result<TrainState, String> {
    let text = match crate::files::read_capped(&dir.join(STATE_FILE), crate::files::limits::STATE_BYTES) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(format!("{STATE_FILE} is missing")),
        Err(e) => return Err(format!("{STATE_FILE}: {e}")),
    };
    let state: TrainState = serde_json::from_slice(&text).map_err(|e| format!("{STATE_FILE} does not parse: {e}"))?;
    if state.format_version > FORMAT_VERSION {
        return Err(format!(
            "{STATE_FILE} has format version {}, newer than this trainer's {FORMAT_VERSION}",
            state.format_version
        ));
    }
    Ok(state)
}

/// The tensors of a safetensors file, read through mmap: its header (length, offsets,
/// shapes against the file's size) is checked by `safetensors` before any tensor is
/// allocated, so a header that lies is refused, not obeyed.
fn read_tensors(path: &Path) -> Result<HashMap<String, Tensor>, String> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let file = fs::File::open(path).map_err(|e| format!("{name}: {e}"))?;
    // SAFETY: checkpoint files are written once and renamed into place, never modified.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("{name}: {e}"))?;
    let tensors = safetensors::SafeTensors::deserialize(&map)
        .map_err(|e| format!("{name}: not a valid safetensors file ({e:?}, {} bytes)", map.len()))?;
    tensors
        .tensors()
        .into_iter()
        .map(|(key, view)| Ok((key.clone(), Tensor::try_from(view).map_err(|e| format!("{name}: {key}: {e}"))?)))
        .collect()
}

/// Size and sha256 of a file, read in 1 MiB chunks; throughput is in the module docs.
pub fn sha256_file(path: &Path) -> io::Result<FileDigest> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_BUFFER];
    let mut bytes = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(FileDigest { bytes, sha256: hex(&hasher.finalize()) })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Paths of `.tmp-*` entries that writes in this process are using.
static LIVE: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Registers a temporary path as live; on drop removes whatever is left at it and
/// unregisters it.
struct LiveTmp(PathBuf);

impl LiveTmp {
    fn claim(path: PathBuf) -> Result<Self> {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if !live.insert(path.clone()) {
            return Err(Error::Checkpoint { path, message: "another write in this process is using it".into() });
        }
        drop(live);
        let claimed = LiveTmp(path);
        // Debris of an earlier process that had the same pid (pids repeat across pod restarts).
        remove_path(&claimed.0).map_err(io_err(&claimed.0))?;
        Ok(claimed)
    }
}

impl Drop for LiveTmp {
    fn drop(&mut self) {
        if let Err(e) = remove_path(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove a temporary checkpoint path");
        }
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.0);
    }
}

fn is_live(path: &Path) -> bool {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).contains(path)
}

fn remove_path(path: &Path) -> io::Result<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Called with the step and the path of each tensor file of a checkpoint as soon as it
/// is written and synced, before the checkpoint is complete (fault injection: a torn
/// write).
pub type FileHook = std::sync::Arc<dyn Fn(u64, &Path) + Send + Sync>;

fn write_checkpoint(
    dir: &Path,
    keep: Retention,
    model: Vec<(String, Tensor)>,
    optimizer: Vec<(String, Tensor)>,
    mut state: TrainState,
    after_file: Option<&FileHook>,
) -> Result<CheckpointRef> {
    let pid = std::process::id();
    let name = step_dir_name(state.step);
    let final_dir = dir.join(&name);
    let tmp = LiveTmp::claim(dir.join(format!("{TMP_PREFIX}{name}-{pid}")))?;
    fs::create_dir(&tmp.0).map_err(io_err(&tmp.0))?;

    state.format_version = FORMAT_VERSION;
    state.files.clear();
    for (file, tensors) in [(MODEL_FILE, &model), (OPTIMIZER_FILE, &optimizer)] {
        // Written straight from the tensors, fsynced, and hashed in the same pass.
        let path = tmp.0.join(file);
        let written = safetensors_writer::write_synced(&path, tensors)?;
        state.files.insert(file.into(), FileDigest { bytes: written.bytes, sha256: hex(&written.sha256) });
        if let Some(hook) = after_file {
            hook(state.step, &path);
        }
    }
    drop((model, optimizer));
    state.time = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let state_path = tmp.0.join(STATE_FILE);
    let json = serde_json::to_vec_pretty(&state).expect("TrainState serializes");
    write_file(&state_path, &json)?;
    fsync_dir(&tmp.0)?;

    if final_dir.exists() {
        // A re-save of the same step after a resume: move the old one aside first, so
        // the new one lands with a single rename.
        let old = LiveTmp::claim(dir.join(format!("{TMP_PREFIX}replaced-{name}-{pid}")))?;
        fs::rename(&final_dir, &old.0).map_err(io_err(&final_dir))?;
        if let Err(e) = fs::rename(&tmp.0, &final_dir) {
            let _ = fs::rename(&old.0, &final_dir);
            return Err(io_err(&final_dir)(e));
        }
        fsync_dir(dir)?;
        drop(old);
    } else {
        fs::rename(&tmp.0, &final_dir).map_err(io_err(&final_dir))?;
        fsync_dir(dir)?;
    }
    drop(tmp);

    let latest_tmp = LiveTmp::claim(dir.join(format!("{TMP_PREFIX}{LATEST_FILE}-{pid}")))?;
    write_file(&latest_tmp.0, format!("{name}\n").as_bytes())?;
    let latest = dir.join(LATEST_FILE);
    fs::rename(&latest_tmp.0, &latest).map_err(io_err(&latest))?;
    fsync_dir(dir)?;
    drop(latest_tmp);

    // The checkpoint is durable; a failure to prune is reported but does not undo it.
    match prune(dir, keep, state.step) {
        Ok(best) => {
            if let Err(e) = point_best(dir, best) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not update the best checkpoint pointer");
            }
        }
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "could not prune old checkpoints"),
    }
    tracing::info!(checkpoint = %final_dir.display(), step = state.step, "checkpoint written");
    // A mirror (S3) hooks in here: after the local checkpoint is complete and durable.
    Ok(CheckpointRef {
        step: state.step,
        tokens: state.tokens,
        uri: final_dir.to_string_lossy().into_owned(),
        time: Some(state.time),
        val_loss: state.val_loss,
    })
}

/// Points [`BEST_FILE`] at the checkpoint of `step`, or removes it when none is best.
fn point_best(dir: &Path, step: Option<u64>) -> Result<()> {
    let best = dir.join(BEST_FILE);
    let Some(step) = step else { return remove_path(&best).map_err(io_err(&best)) };
    let tmp = LiveTmp::claim(dir.join(format!("{TMP_PREFIX}{BEST_FILE}-{}", std::process::id())))?;
    write_file(&tmp.0, format!("{}\n", step_dir_name(step)).as_bytes())?;
    fs::rename(&tmp.0, &best).map_err(io_err(&best))?;
    fsync_dir(dir)
}

/// The checkpoint [`BEST_FILE`] names in `dir`, with its step and validation loss;
/// `None` without one (no `keepBest`, or no validation yet).
pub fn best(dir: &Path) -> Option<CheckpointRef> {
    let name = crate::files::read_text_capped(&dir.join(BEST_FILE), crate::files::limits::POINTER_BYTES).ok()?;
    let path = dir.join(name.trim());
    parse_step_dir(name.trim())?;
    let state = read_state(&path).ok()?;
    Some(CheckpointRef {
        step: state.step,
        tokens: state.tokens,
        uri: path.to_string_lossy().into_owned(),
        time: Some(state.time),
        val_loss: state.val_loss,
    })
}

/// Keeps the checkpoint of step `written`, the newest `keep.last - 1` older ones and the
/// `keep.best` of lowest validation loss (ties: the earlier), of those whose files are
/// all present with their recorded sizes; removes other `step-*` directories and
/// `.tmp-*` debris. Newer steps than `written` belong to a timeline abandoned by a
/// resume from an older checkpoint, and would otherwise be taken for the newest on the
/// next resume. Returns the step of the best kept, when `keep.best` asks for one.
fn prune(dir: &Path, keep: Retention, written: u64) -> Result<Option<u64>> {
    let steps = step_dirs(dir).map_err(io_err(dir))?;
    let mut kept = BTreeSet::from([written]);
    let mut ranked = Vec::new();
    for (step, path) in steps.iter().rev().filter(|(step, _)| *step <= written) {
        let Some(state) = complete_state(path) else { continue };
        if *step < written && kept.len() < keep.last {
            kept.insert(*step);
        }
        if let Some(v) = state.val_loss.filter(|v| v.is_finite()) {
            ranked.push((v, *step));
        }
    }
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    kept.extend(ranked.iter().take(keep.best).map(|(_, step)| *step));
    let mut doomed: Vec<PathBuf> =
        steps.into_iter().filter(|(step, _)| !kept.contains(step)).map(|(_, path)| path).collect();
    doomed.extend(tmp_entries(dir).map_err(io_err(dir))?.into_iter().filter(|p| !is_live(p)));
    for path in doomed {
        tracing::info!(path = %path.display(), "removing old checkpoint");
        remove_path(&path).map_err(io_err(&path))?;
    }
    Ok(if keep.best > 0 { ranked.first().map(|(_, step)| *step) } else { None })
}

/// Cheap check without hashing: `state.json` parses and every file has its recorded
/// size. The state, when so.
fn complete_state(dir: &Path) -> Option<TrainState> {
    let state = read_state(dir).ok()?;
    state.files.iter().all(|(name, d)| fs::metadata(dir.join(name)).is_ok_and(|m| m.len() == d.bytes)).then_some(state)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

fn fsync_dir(path: &Path) -> Result<()> {
    match File::open(path).and_then(|f| f.sync_all()) {
        // Some network filesystems cannot fsync a directory; their renames are synchronous.
        Err(e) if matches!(e.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported) => Ok(()),
        other => other.map_err(io_err(path)),
    }
}

#[cfg(test)]
mod tests;
