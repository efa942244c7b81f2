//! Checkpoints on the checkpoint PVC.
//!
//! Layout of a checkpoint directory (`spec.checkpoint`, mounted at `/checkpoints`):
//!
//! ```text
//! <dir>/step-00000100/model.safetensors      HF parameter names
//! <dir>/step-00000100/optimizer.safetensors
//! <dir>/step-00000100/state.json             TrainState, with the size and sha256 of each file
//! <dir>/latest                               "step-00000100": a hint, never trusted blindly
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
//! Hashing is streaming (1 MiB reads), so memory stays flat for any size; the measured
//! costs of save, hashing, the background write's stall and loading are in
//! `docs/perf.md`.

pub mod mirror;
pub mod resume;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::SystemTime;

use crds::config::{ResolvedCheckpoint, RunConfig};
use crds::types::CheckpointRef;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::{Device, Tensor};

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

/// Writes checkpoints into one directory, synchronously or on a background thread, and
/// keeps the newest `keep_last` of them.
///
/// At most one write is in flight: a save waits for the previous background write
/// first. Dropping the checkpointer waits for a pending write (logging its error, as
/// there is no caller left to return it to); call [`Checkpointer::wait`] to get it.
pub struct Checkpointer {
    dir: PathBuf,
    keep_last: usize,
    pending: Option<JoinHandle<Result<CheckpointRef>>>,
}

impl Checkpointer {
    /// A checkpointer for `dir`, which is created if missing. `keep_last` below 1
    /// counts as 1: the checkpoint just written is never deleted.
    pub fn new(dir: impl Into<PathBuf>, keep_last: u32) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        Ok(Checkpointer { dir, keep_last: keep_last.max(1) as usize, pending: None })
    }

    /// A checkpointer for the run's resolved checkpoint settings.
    pub fn from_config(config: &ResolvedCheckpoint) -> Result<Self> {
        Self::new(&config.dir, config.keep_last)
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a checkpoint on the calling thread, after any pending background write.
    /// An error of that pending write is returned instead, and nothing is written.
    pub fn save(&mut self, payload: Payload) -> Result<CheckpointRef> {
        self.wait()?;
        let model = to_cpu(&self.dir, &payload.model, false)?;
        let optimizer = to_cpu(&self.dir, &payload.optimizer, false)?;
        write_checkpoint(&self.dir, self.keep_last, model, optimizer, payload.state)
    }

    /// Copies the payload's tensors to the CPU and writes them on a background thread,
    /// so the caller may go on mutating its tensors as soon as this returns.
    ///
    /// Waits for the previous background write first and returns its outcome:
    /// `Ok(Some(..))` when it succeeded, `Ok(None)` when there was none. When it failed,
    /// its error is returned and this payload is not written.
    pub fn save_async(&mut self, payload: Payload) -> Result<Option<CheckpointRef>> {
        // Waiting before copying keeps at most one CPU copy of the state in memory.
        let previous = self.wait()?;
        let model = to_cpu(&self.dir, &payload.model, true)?;
        let optimizer = to_cpu(&self.dir, &payload.optimizer, true)?;
        let (dir, keep_last, state) = (self.dir.clone(), self.keep_last, payload.state);
        let handle = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || write_checkpoint(&dir, keep_last, model, optimizer, state))
            .map_err(io_err(&self.dir))?;
        self.pending = Some(handle);
        Ok(previous)
    }

    /// Waits for the pending background write and returns its outcome; `Ok(None)` when
    /// none is pending (its outcome was already returned).
    pub fn wait(&mut self) -> Result<Option<CheckpointRef>> {
        let Some(handle) = self.pending.take() else { return Ok(None) };
        match handle.join() {
            Ok(result) => result.map(Some),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Error::Checkpoint { path: self.dir.clone(), message: format!("writer thread panicked: {what}") })
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            tracing::error!(error = %e, "background checkpoint write failed");
        }
    }
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
    if let Ok(latest) = fs::read_to_string(dir.join(LATEST_FILE)) {
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
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
            return Err(format!("{STATE_FILE} lists an invalid file name {name:?}"));
        }
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
    let text = match fs::read(dir.join(STATE_FILE)) {
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

fn read_tensors(path: &Path) -> Result<HashMap<String, Tensor>, String> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    Ok(Tensor::read_safetensors(path).map_err(|e| format!("{name}: {e}"))?.into_iter().collect())
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

/// Owned, contiguous CPU tensors. With `always_copy` false, tensors already on the CPU
/// and contiguous are shared instead, which is only safe while the caller is blocked.
fn to_cpu(dir: &Path, tensors: &[(String, Tensor)], always_copy: bool) -> Result<Vec<(String, Tensor)>> {
    let mut seen = BTreeSet::new();
    tch::no_grad(|| {
        tensors
            .iter()
            .map(|(name, t)| {
                if !seen.insert(name.as_str()) {
                    return Err(Error::Checkpoint {
                        path: dir.into(),
                        message: format!("tensor {name} is given twice"),
                    });
                }
                if !always_copy && t.device() == Device::Cpu && t.is_contiguous() {
                    return Ok((name.clone(), t.shallow_clone()));
                }
                // A fresh allocation and copy_, because to_device(Cpu) on a CPU tensor
                // returns the same storage, which training would then overwrite.
                let mut copy = Tensor::f_empty(t.size(), (t.kind(), Device::Cpu))?;
                copy.f_copy_(t)?;
                Ok((name.clone(), copy))
            })
            .collect()
    })
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

fn write_checkpoint(
    dir: &Path,
    keep_last: usize,
    model: Vec<(String, Tensor)>,
    optimizer: Vec<(String, Tensor)>,
    mut state: TrainState,
) -> Result<CheckpointRef> {
    let pid = std::process::id();
    let name = step_dir_name(state.step);
    let final_dir = dir.join(&name);
    let tmp = LiveTmp::claim(dir.join(format!("{TMP_PREFIX}{name}-{pid}")))?;
    fs::create_dir(&tmp.0).map_err(io_err(&tmp.0))?;

    state.format_version = FORMAT_VERSION;
    state.files.clear();
    for (file, tensors) in [(MODEL_FILE, &model), (OPTIMIZER_FILE, &optimizer)] {
        let path = tmp.0.join(file);
        Tensor::write_safetensors(tensors, &path)
            .map_err(|e| Error::Checkpoint { path: path.clone(), message: e.to_string() })?;
        fsync(&path)?;
        state.files.insert(file.into(), sha256_file(&path).map_err(io_err(&path))?);
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
    if let Err(e) = prune(dir, keep_last, state.step) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not prune old checkpoints");
    }
    tracing::info!(checkpoint = %final_dir.display(), step = state.step, "checkpoint written");
    // A mirror (S3) hooks in here: after the local checkpoint is complete and durable.
    Ok(CheckpointRef {
        step: state.step,
        tokens: state.tokens,
        uri: final_dir.to_string_lossy().into_owned(),
        time: Some(state.time),
    })
}

/// Keeps the checkpoint of step `written` and the newest `keep_last - 1` older ones
/// whose files are all present with their recorded sizes; removes other `step-*`
/// directories and `.tmp-*` debris. Newer steps than `written` belong to a timeline
/// abandoned by a resume from an older checkpoint, and would otherwise be taken for the
/// newest on the next resume.
fn prune(dir: &Path, keep_last: usize, written: u64) -> Result<()> {
    let mut kept = 1;
    let mut doomed = Vec::new();
    for (step, path) in step_dirs(dir).map_err(io_err(dir))?.into_iter().rev() {
        if step == written {
            continue;
        }
        if step < written && kept < keep_last && looks_complete(&path) {
            kept += 1;
        } else {
            doomed.push(path);
        }
    }
    doomed.extend(tmp_entries(dir).map_err(io_err(dir))?.into_iter().filter(|p| !is_live(p)));
    for path in doomed {
        tracing::info!(path = %path.display(), "removing old checkpoint");
        remove_path(&path).map_err(io_err(&path))?;
    }
    Ok(())
}

/// Cheap check without hashing: `state.json` parses and every file has its recorded size.
fn looks_complete(dir: &Path) -> bool {
    let Ok(state) = read_state(dir) else { return false };
    state.files.iter().all(|(name, d)| fs::metadata(dir.join(name)).is_ok_and(|m| m.len() == d.bytes))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

fn fsync(path: &Path) -> Result<()> {
    File::open(path).and_then(|f| f.sync_all()).map_err(io_err(path))
}

fn fsync_dir(path: &Path) -> Result<()> {
    match File::open(path).and_then(|f| f.sync_all()) {
        // Some network filesystems cannot fsync a directory; their renames are synchronous.
        Err(e) if matches!(e.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported) => Ok(()),
        other => other.map_err(io_err(path)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use tch::Kind;

    use super::*;
    use crds::contract::FailureReason;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("trainer-ckpt-{}-{n}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn state(step: u64) -> TrainState {
        TrainState {
            format_version: FORMAT_VERSION,
            step,
            tokens: step * 4096,
            data_position: step * 8,
            rng: serde_json::json!({"seed": 7, "words": [1, 2, 3]}),
            config_hash: "0123456789abcdef".into(),
            config: None,
            history: Vec::new(),
            world_size: 2,
            attempt: 1,
            preset: "tiny".into(),
            loss: Some(3.25),
            time: String::new(),
            files: BTreeMap::new(),
        }
    }

    /// f32 with -0.0, NaN and a subnormal, a non-contiguous f32 view, bf16 and i64;
    /// `seed` shifts the values.
    fn payload(step: u64, seed: f32) -> Result<Payload> {
        let f32s = Tensor::f_from_slice(&[1.5f32 + seed, -0.0, f32::NAN, 1e-40, -7.25, 3.0e38])?.f_reshape([2, 3])?;
        let transposed = Tensor::f_arange(12, (Kind::Float, Device::Cpu))?
            .f_add_scalar(seed as f64)?
            .f_reshape([3, 4])?
            .f_transpose(0, 1)?;
        let bf16 = Tensor::f_from_slice(&[0.1f32 + seed, -2.5, 65504.0, 1e-3])?.f_to_kind(Kind::BFloat16)?;
        let i64s = Tensor::f_from_slice(&[i64::MIN, -1, 0, i64::MAX, seed as i64])?;
        Ok(Payload {
            model: vec![
                ("model.embed_tokens.weight".into(), f32s),
                ("lm_head.weight".into(), transposed),
                ("model.norm.weight".into(), bf16),
            ],
            optimizer: vec![
                ("state.0.exp_avg".into(), Tensor::f_full([4, 2], seed as f64 + 0.5, (Kind::Float, Device::Cpu))?),
                ("state.0.step".into(), i64s),
            ],
            state: state(step),
        })
    }

    fn raw(t: &Tensor) -> Vec<u8> {
        let t = t.f_contiguous().unwrap();
        let mut bytes = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, t.numel()).unwrap();
        bytes
    }

    fn assert_same_tensors(expected: &[(String, Tensor)], got: &HashMap<String, Tensor>) {
        assert_eq!(expected.len(), got.len());
        for (name, want) in expected {
            let have = got.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(have.kind(), want.kind(), "{name}");
            assert_eq!(have.size(), want.size(), "{name}");
            assert_eq!(raw(have), raw(want), "{name}");
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// Runs `f` with WARN-level log lines captured.
    fn capture_warnings<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink(Arc::new(Mutex::new(Vec::new())));
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let out = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        (out, text)
    }

    #[test]
    fn round_trip_is_bit_exact() -> Result<()> {
        let tmp = TempDir::new("roundtrip");
        assert!(latest_valid(tmp.0.join("absent"))?.is_none());
        assert!(latest_valid(&tmp.0)?.is_none());

        let expected = payload(7, 0.0)?;
        let mut ckpt = Checkpointer::new(&tmp.0, 3)?;
        let r = ckpt.save(payload(7, 0.0)?)?;
        let step_dir = tmp.0.join("step-00000007");
        assert_eq!((r.step, r.tokens, r.uri.as_str()), (7, 7 * 4096, step_dir.to_str().unwrap()));
        humantime::parse_rfc3339(r.time.as_deref().unwrap()).unwrap();
        assert_eq!(names(&step_dir), [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE]);

        let loaded = latest_valid(&tmp.0)?.expect("a checkpoint");
        assert_eq!(loaded.dir, step_dir);
        assert_same_tensors(&expected.model, &loaded.model);
        assert_same_tensors(&expected.optimizer, &loaded.optimizer);
        let mut want = expected.state.clone();
        want.time = r.time.clone().unwrap();
        want.files = loaded.state.files.clone();
        assert_eq!(loaded.state, want);
        for file in [MODEL_FILE, OPTIMIZER_FILE] {
            assert_eq!(loaded.state.files[file], sha256_file(&step_dir.join(file)).unwrap());
        }
        Ok(())
    }

    #[test]
    fn keep_last_prunes_and_latest_follows() -> Result<()> {
        let tmp = TempDir::new("prune");
        let mut ckpt = Checkpointer::new(&tmp.0, 2)?;
        for step in 1..=3 {
            if step == 3 {
                fs::create_dir(tmp.0.join(".tmp-step-00000009-4242")).unwrap();
                fs::write(tmp.0.join(".tmp-step-00000009-4242").join(MODEL_FILE), b"torn").unwrap();
            }
            ckpt.save(payload(step, step as f32)?)?;
            assert_eq!(fs::read_to_string(tmp.0.join(LATEST_FILE)).unwrap(), format!("step-{step:08}\n"));
        }
        assert_eq!(names(&tmp.0), ["latest", "step-00000002", "step-00000003"]);
        assert_eq!(latest_valid(&tmp.0)?.unwrap().state.step, 3);

        // Re-saving an older step after a resume replaces it and drops the abandoned newer one.
        let again = payload(2, 20.0)?;
        ckpt.save(payload(2, 20.0)?)?;
        assert_eq!(names(&tmp.0), ["latest", "step-00000002"]);
        let loaded = latest_valid(&tmp.0)?.unwrap();
        assert_same_tensors(&again.model, &loaded.model);
        Ok(())
    }

    #[test]
    fn damaged_checkpoints_fall_back_to_the_previous_one() -> Result<()> {
        type Damage = fn(&Path);
        let cases: [(&str, Damage, &str); 6] = [
            (
                "truncated",
                |d| fs::File::options().write(true).open(d.join(MODEL_FILE)).unwrap().set_len(20).unwrap(),
                "model.safetensors has 20 bytes",
            ),
            (
                "flipped",
                |d| {
                    let path = d.join(OPTIMIZER_FILE);
                    let mut bytes = fs::read(&path).unwrap();
                    *bytes.last_mut().unwrap() ^= 0x01;
                    fs::write(&path, bytes).unwrap();
                },
                "optimizer.safetensors has sha256",
            ),
            ("no-state", |d| fs::remove_file(d.join(STATE_FILE)).unwrap(), "state.json is missing"),
            ("bad-state", |d| fs::write(d.join(STATE_FILE), b"{\"step\": 2").unwrap(), "state.json does not parse"),
            ("no-model", |d| fs::remove_file(d.join(MODEL_FILE)).unwrap(), "model.safetensors is missing"),
            (
                "wrong-step",
                |d| {
                    let path = d.join(STATE_FILE);
                    let text = fs::read_to_string(&path).unwrap().replace("\"step\": 2,", "\"step\": 5,");
                    fs::write(&path, text).unwrap();
                },
                "records step 5",
            ),
        ];
        for (name, damage, problem) in cases {
            let tmp = TempDir::new(name);
            let mut ckpt = Checkpointer::new(&tmp.0, 5)?;
            ckpt.save(payload(1, 1.0)?)?;
            ckpt.save(payload(2, 2.0)?)?;
            let bad = tmp.0.join("step-00000002");
            damage(&bad);
            let (loaded, log) = capture_warnings(|| latest_valid(&tmp.0));
            let loaded = loaded?.unwrap_or_else(|| panic!("{name}: no fallback"));
            assert_eq!(loaded.state.step, 1, "{name}");
            assert_same_tensors(&payload(1, 1.0)?.model, &loaded.model);
            assert!(log.contains(bad.to_str().unwrap()) && log.contains(problem), "{name}: {log}");
        }
        Ok(())
    }

    #[test]
    fn unfinished_write_is_ignored_with_a_warning() -> Result<()> {
        let tmp = TempDir::new("torn-tmp");
        Checkpointer::new(&tmp.0, 2)?.save(payload(1, 1.0)?)?;
        let torn = tmp.0.join(".tmp-step-00000002-999");
        fs::create_dir(&torn).unwrap();
        fs::write(torn.join(MODEL_FILE), b"partial").unwrap();
        let (loaded, log) = capture_warnings(|| latest_valid(&tmp.0));
        assert_eq!(loaded?.unwrap().state.step, 1);
        assert!(log.contains(torn.to_str().unwrap()), "{log}");
        Ok(())
    }

    #[test]
    fn background_save_writes_the_same_bytes_as_sync_save() -> Result<()> {
        let (a, b) = (TempDir::new("sync"), TempDir::new("async"));
        let sync_ref = Checkpointer::new(&a.0, 2)?.save(payload(4, 0.5)?)?;
        let mut ckpt = Checkpointer::new(&b.0, 2)?;
        assert_eq!(ckpt.save_async(payload(4, 0.5)?)?, None);
        let async_ref = ckpt.wait()?.expect("the background write's result");
        assert_eq!(ckpt.wait()?, None);
        assert_eq!((async_ref.step, async_ref.tokens), (sync_ref.step, sync_ref.tokens));
        for file in [MODEL_FILE, OPTIMIZER_FILE] {
            let sync_bytes = fs::read(a.0.join("step-00000004").join(file)).unwrap();
            assert_eq!(sync_bytes, fs::read(b.0.join("step-00000004").join(file)).unwrap(), "{file}");
        }
        Ok(())
    }

    #[test]
    fn save_async_snapshots_before_returning() -> Result<()> {
        let tmp = TempDir::new("snapshot");
        let expected = payload(3, 0.0)?;
        let mut p = payload(3, 0.0)?;
        let mut ckpt = Checkpointer::new(&tmp.0, 2)?;
        ckpt.save_async(Payload {
            model: p.model.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
            optimizer: p.optimizer.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
            state: p.state.clone(),
        })?;
        for (_, t) in p.model.iter_mut().chain(p.optimizer.iter_mut()) {
            _ = t.f_zero_()?;
        }
        ckpt.wait()?;
        let loaded = latest_valid(&tmp.0)?.unwrap();
        assert_same_tensors(&expected.model, &loaded.model);
        assert_same_tensors(&expected.optimizer, &loaded.optimizer);
        Ok(())
    }

    #[test]
    fn cpu_snapshot_does_not_share_storage() -> Result<()> {
        let mut source = Tensor::f_from_slice(&[1.0f32, 2.0, 3.0])?;
        let copy = to_cpu(Path::new("x"), &[("w".into(), source.shallow_clone())], true)?;
        _ = source.f_fill_(9.0)?;
        assert_eq!(raw(&copy[0].1), raw(&Tensor::f_from_slice(&[1.0f32, 2.0, 3.0])?));
        let dup = to_cpu(Path::new("x"), &[("w".into(), source.shallow_clone()), ("w".into(), source)], true);
        assert!(matches!(dup, Err(Error::Checkpoint { message, .. }) if message.contains("w is given twice")));
        Ok(())
    }

    #[test]
    fn background_write_errors_are_reported() -> Result<()> {
        let tmp = TempDir::new("errors");
        let dir = tmp.0.join("ckpt");
        let mut ckpt = Checkpointer::new(&dir, 2)?;
        fs::remove_dir(&dir).unwrap();
        fs::write(&dir, b"not a directory").unwrap();
        assert_eq!(ckpt.save_async(payload(1, 0.0)?)?, None);
        let err = ckpt.save_async(payload(2, 0.0)?).unwrap_err();
        assert!(err.to_string().contains(dir.to_str().unwrap()), "{err}");
        // The failed write's error was returned once; the second payload was not written.
        assert_eq!(ckpt.wait()?, None);
        Ok(())
    }

    #[test]
    fn load_weights_from_each_path_form() -> Result<()> {
        let tmp = TempDir::new("weights");
        let mut ckpt = Checkpointer::new(&tmp.0, 5)?;
        ckpt.save(payload(1, 1.0)?)?;
        ckpt.save(payload(2, 2.0)?)?;
        let (one, two) = (payload(1, 1.0)?, payload(2, 2.0)?);
        let step2 = tmp.0.join("step-00000002");

        assert_same_tensors(&two.model, &load_weights(&tmp.0)?);
        assert_same_tensors(&one.model, &load_weights(tmp.0.join("step-00000001"))?);
        assert_same_tensors(&two.model, &load_weights(step2.join(MODEL_FILE))?);

        // Weights only: a damaged optimizer does not matter, a damaged model does.
        fs::write(step2.join(OPTIMIZER_FILE), b"junk").unwrap();
        assert_same_tensors(&two.model, &load_weights(&tmp.0)?);
        let mut bytes = fs::read(step2.join(MODEL_FILE)).unwrap();
        *bytes.last_mut().unwrap() ^= 0x80;
        fs::write(step2.join(MODEL_FILE), bytes).unwrap();
        assert_same_tensors(&one.model, &load_weights(&tmp.0)?);
        let err = load_weights(&step2).unwrap_err();
        assert!(err.to_string().contains("model.safetensors has sha256"), "{err}");

        let err = load_weights(tmp.0.join("nowhere")).unwrap_err();
        assert!(matches!(&err, Error::Io { path, .. } if path.ends_with("nowhere")), "{err}");
        let empty = TempDir::new("weights-empty");
        assert!(matches!(load_weights(&empty.0), Err(Error::Checkpoint { .. })));
        Ok(())
    }

    /// A CPU run of `nodes` ranks with learning rate `lr`.
    fn run_config(nodes: u32, lr: &str) -> RunConfig {
        let yaml = format!(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: r}}\nspec:\n  \
             model: {{preset: nano, tokenizer: embedded}}\n  tokens: 1M\n  \
             data: {{mix: [{{name: t, weight: 1, uri: \"embedded:textbook\"}}]}}\n  \
             topology: {{nodes: {nodes}, gpusPerNode: 0}}\n  batch: {{globalTokens: 1024, microBatch: 2, seqLength: 64}}\n  \
             optimizer: {{lr: {lr}}}\n"
        );
        crds::resolve(&crds::manifest::from_yaml(&yaml, "test").unwrap()).unwrap()
    }

    #[test]
    fn check_resumable_names_each_mismatch() {
        let s = state(10);
        let two = run_config(2, "3e-4");
        check_resumable(&s, &two, "0123456789abcdef").unwrap();
        let err = check_resumable(&s, &two, "fedcba9876543210").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("0123456789abcdef") && text.contains("fedcba9876543210") && text.contains("step 10"),
            "{text}"
        );
        assert_eq!(err.reason(), Some(FailureReason::InvalidConfig));
        // Pretraining resumes on any world size with the same global batch.
        check_resumable(&s, &run_config(4, "3e-4"), "0123456789abcdef").unwrap();
        check_resumable(&s, &run_config(1, "3e-4"), "0123456789abcdef").unwrap();
        // GRPO draws its rollouts per rank.
        let grpo_yaml = include_str!("../../../examples/tiny-grpo-local.yaml");
        let mut grpo = crds::resolve(&crds::manifest::from_yaml(grpo_yaml, "tiny-grpo-local").unwrap()).unwrap();
        grpo.topology.world_size = 2;
        check_resumable(&s, &grpo, "0123456789abcdef").unwrap();
        grpo.topology.world_size = 1;
        let text = check_resumable(&s, &grpo, "0123456789abcdef").unwrap_err().to_string();
        assert!(text.contains("world size 2") && text.contains("has 1") && text.contains("GRPO"), "{text}");
        let both = check_resumable(&s, &grpo, "x").unwrap_err().to_string();
        assert!(both.contains("config") && both.contains("world size"), "{both}");
    }

    /// A checkpoint that carries its run's config names each changed field, not hashes.
    #[test]
    fn a_refused_resume_names_the_fields_that_changed() {
        let old = run_config(2, "3e-4");
        let s = TrainState { config_hash: old.fingerprint(), config: Some(old.record_view()), ..state(10) };
        check_resumable(&s, &old, &old.fingerprint()).unwrap();
        // Written by a trainer whose hash covered more (say, the world size): the stored
        // config, compared under today's rules, is the same run.
        let stricter = TrainState { config_hash: "0000000000000000".into(), ..s.clone() };
        check_resumable(&stricter, &run_config(4, "3e-4"), &old.fingerprint()).unwrap();
        // A changed embedded corpus still refuses.
        let corpus = TrainState { config_hash: format!("{}-corpus1", old.fingerprint()), ..s.clone() };
        let text = check_resumable(&corpus, &old, &format!("{}-corpus2", old.fingerprint())).unwrap_err().to_string();
        assert!(text.contains("-corpus1") && text.contains("-corpus2"), "{text}");
        let new = run_config(2, "1e-3");
        let text = check_resumable(&s, &new, &new.fingerprint()).unwrap_err().to_string();
        assert!(text.contains("schedule.lr: 0.0003 → 0.001"), "{text}");
        assert!(text.contains("step 10") && !text.contains(&old.fingerprint()), "{text}");
        // The budget may change (the trainer continues the schedule, see
        // `RunConfig::continue_from`).
        let mut bigger = old.clone();
        bigger.schedule.total_steps += 100;
        bigger.schedule.total_tokens += 100 * bigger.batch.tokens_per_step;
        bigger.schedule.budget_tokens = bigger.schedule.total_tokens;
        check_resumable(&s, &bigger, &bigger.fingerprint()).unwrap();
        // state.json round-trips the config and its history.
        let s = TrainState {
            history: vec![ConfigChange {
                step: 10,
                tokens: 40960,
                attempt: 2,
                time: "2026-11-24T06:00:00Z".into(),
                changes: vec!["topology.worldSize: 2 → 1".into()],
            }],
            ..s
        };
        let back: TrainState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
