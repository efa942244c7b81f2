use std::sync::{Arc, Mutex};

use tch::{Device, Kind};

use super::writer::{Checkpointer, to_cpu};
use super::*;
use crate::files::test_util::TempDir;
use crds::contract::FailureReason;

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
        val_loss: None,
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

/// Interleaved good and bad validation losses: the newest two and the best two stay,
/// `best` names the lowest, and a resume still starts from the newest.
#[test]
fn keep_best_keeps_the_lowest_validation_losses_through_rotation() -> Result<()> {
    let tmp = TempDir::new("best");
    let mut ckpt = Checkpointer::new(&tmp.0, 2)?.keeping_best(2);
    struct Case {
        step: u64,
        val_loss: Option<f64>,
        kept: &'static [u64],
        best: Option<u64>,
    }
    let case = |step, val_loss, kept, best| Case { step, val_loss, kept, best };
    let timeline = [
        case(1, None, &[1], None),
        case(2, Some(4.0), &[1, 2], Some(2)),
        case(3, Some(3.0), &[2, 3], Some(3)),
        case(4, Some(5.0), &[2, 3, 4], Some(3)),
        case(5, Some(3.5), &[3, 4, 5], Some(3)),
        case(6, Some(f64::NAN), &[3, 5, 6], Some(3)),
        case(7, Some(2.0), &[3, 6, 7], Some(7)),
        case(8, Some(6.0), &[3, 7, 8], Some(7)),
    ];
    for c in &timeline {
        let mut p = payload(c.step, c.step as f32)?;
        p.state.val_loss = c.val_loss;
        let written = ckpt.save(p)?;
        assert_eq!(written.val_loss.map(f64::to_bits), c.val_loss.map(f64::to_bits));
        let on_disk: Vec<u64> = step_dirs(&tmp.0).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(on_disk, c.kept, "after step {}", c.step);
        let best = best(&tmp.0);
        assert_eq!(best.as_ref().map(|b| b.step), c.best, "after step {}", c.step);
        if let Some(b) = best {
            assert!(Path::new(&b.uri).ends_with(step_dir_name(b.step)), "{b:?}");
            assert_eq!(b.val_loss, timeline.iter().find(|t| t.step == b.step).unwrap().val_loss);
        }
        assert_eq!(latest_valid(&tmp.0)?.unwrap().state.step, c.step, "resume starts from the newest");
    }
    // Without keepBest, rotation is keepLast alone and the pointer goes.
    let mut plain = Checkpointer::new(&tmp.0, 2)?;
    plain.save(payload(9, 9.0)?)?;
    assert_eq!(names(&tmp.0), ["latest", "step-00000008", "step-00000009"]);
    Ok(())
}

#[test]
fn damaged_checkpoints_fall_back_to_the_previous_one() -> Result<()> {
    type Damage = fn(&Path);
    let cases: [(&str, Damage, &str); 9] = [
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
        (
            "traversal",
            |d| {
                let path = d.join(STATE_FILE);
                let digest = r#""files": {"../step-00000001/model.safetensors": {"bytes": 1, "sha256": "00"},"#;
                let text = fs::read_to_string(&path).unwrap().replace(r#""files": {"#, digest);
                fs::write(&path, text).unwrap();
            },
            "model.safetensors\\\" is not a plain file name (one path component",
        ),
        (
            "state-bomb",
            |d| fs::File::options().write(true).open(d.join(STATE_FILE)).unwrap().set_len(1 << 40).unwrap(),
            "state.json: 1099511627776 bytes, more than the 16777216",
        ),
        (
            "header-bomb",
            // A safetensors header claiming 2^60 bytes, in a file whose state.json records
            // its new digest: only the header check stands between it and the allocation.
            |d| {
                let path = d.join(MODEL_FILE);
                let mut bytes = fs::read(&path).unwrap();
                bytes[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
                fs::write(&path, &bytes).unwrap();
                let state_path = d.join(STATE_FILE);
                let mut state: serde_json::Value = serde_json::from_slice(&fs::read(&state_path).unwrap()).unwrap();
                state["files"][MODEL_FILE]["sha256"] = sha256_file(&path).unwrap().sha256.into();
                fs::write(&state_path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
            },
            "model.safetensors: not a valid safetensors file (HeaderTooLarge",
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

/// The file hook sees each tensor file as soon as it is on disk, inside the unfinished
/// write and before the checkpoint exists, in the foreground and in the background: a
/// process killed there leaves a torn write that resume ignores.
#[test]
fn the_file_hook_runs_inside_the_unfinished_write() -> Result<()> {
    /// What the hook saw of one file.
    #[derive(Clone, Debug)]
    struct Seen {
        step: u64,
        /// The directory the file was written in.
        dir: String,
        /// Whether the step's checkpoint existed then.
        complete: bool,
        bytes: u64,
    }
    let tmp = TempDir::new("file-hook");
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let record = seen.clone();
    let hook: FileHook = Arc::new(move |step, path: &Path| {
        let dir = path.parent().unwrap();
        record.lock().unwrap().push(Seen {
            step,
            dir: dir.file_name().unwrap().to_string_lossy().into_owned(),
            complete: dir.parent().unwrap().join(step_dir_name(step)).exists(),
            bytes: fs::metadata(path).unwrap().len(),
        });
    });
    let mut ckpt = Checkpointer::new(&tmp.0, 2)?.after_each_file(hook);
    ckpt.save(payload(1, 1.0)?)?;
    let (_, snapshot) = ckpt.save_async(payload(2, 1.0)?)?;
    snapshot.wait();
    ckpt.wait()?;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.step, 1 + i as u64 / 2, "{seen:?}");
        assert!(s.dir.starts_with(&format!(".tmp-step-0000000{}-", s.step)), "{s:?}");
        assert!(!s.complete && s.bytes > 0, "{s:?}");
    }
    Ok(())
}

#[test]
fn background_save_writes_the_same_bytes_as_sync_save() -> Result<()> {
    let (a, b) = (TempDir::new("sync"), TempDir::new("async"));
    let sync_ref = Checkpointer::new(&a.0, 2)?.save(payload(4, 0.5)?)?;
    let mut ckpt = Checkpointer::new(&b.0, 2)?;
    let (previous, snapshot) = ckpt.save_async(payload(4, 0.5)?)?;
    assert_eq!(previous, None);
    snapshot.wait();
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
fn a_finished_background_write_is_returned_without_waiting_and_a_running_one_is_not() -> Result<()> {
    let tmp = TempDir::new("finished");
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = Mutex::new(held);
    // The writer stops after its first file until released.
    let hook: FileHook = Arc::new(move |_, _: &Path| {
        let _ = held.lock().unwrap().recv();
    });
    let mut ckpt = Checkpointer::new(&tmp.0, 2)?.after_each_file(hook);
    assert_eq!(ckpt.finished()?, None, "nothing pending");
    let (_, snapshot) = ckpt.save_async(payload(5, 0.0)?)?;
    snapshot.wait();
    assert_eq!(ckpt.finished()?, None, "the write is held after its first file");
    drop(release);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let done = loop {
        if let Some(done) = ckpt.finished()? {
            break done;
        }
        assert!(std::time::Instant::now() < deadline, "the released write never finished");
        std::thread::yield_now();
    };
    assert_eq!(done.step, 5);
    assert!(tmp.0.join("step-00000005").is_dir());
    assert_eq!(ckpt.wait()?, None, "its outcome was returned once");
    Ok(())
}

#[test]
fn a_background_save_holds_its_copy_once_the_snapshot_returns() -> Result<()> {
    let tmp = TempDir::new("snapshot");
    let expected = payload(3, 0.0)?;
    let mut p = payload(3, 0.0)?;
    let mut ckpt = Checkpointer::new(&tmp.0, 2)?;
    let (_, snapshot) = ckpt.save_async(Payload {
        model: p.model.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        optimizer: p.optimizer.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        state: p.state.clone(),
    })?;
    // Reading while the writer copies is allowed; changing waits for the snapshot.
    assert_same_tensors(&expected.model, &p.model.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect());
    snapshot.wait();
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
    let (previous, snapshot) = ckpt.save_async(payload(1, 0.0)?)?;
    assert_eq!(previous, None);
    // A write that fails still releases its snapshot.
    snapshot.wait();
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

/// `state.json` and the safetensors files are read from volumes and buckets other
/// processes write: whatever bytes they hold, reading them does not panic, and a
/// refusal names the file.
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256)
    }

    /// A valid state.json with some bytes replaced, or any bytes at all.
    fn state_bytes() -> impl Strategy<Value = Vec<u8>> {
        let valid = serde_json::to_vec_pretty(&state(3)).unwrap();
        let len = valid.len();
        prop_oneof![
            proptest::collection::vec((0..len, any::<u8>()), 1..4).prop_map(move |edits| {
                let mut bytes = valid.clone();
                edits.into_iter().for_each(|(i, b)| bytes[i] = b);
                bytes
            }),
            proptest::collection::vec(any::<u8>(), 0..256),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_state_file_is_read_or_refused_by_name(bytes in state_bytes()) {
            let dir = TempDir::new("prop-state");
            fs::write(dir.0.join(STATE_FILE), &bytes).unwrap();
            match read_state(&dir.0) {
                Ok(state) => {
                    let again = serde_json::to_vec(&state).unwrap();
                    let back: TrainState = serde_json::from_slice(&again).unwrap();
                    prop_assert_eq!(serde_json::to_value(back).unwrap(), serde_json::to_value(state).unwrap());
                }
                Err(message) => prop_assert!(message.starts_with(STATE_FILE), "{message}"),
            }
        }

        #[test]
        fn any_safetensors_bytes_are_read_or_refused_by_name(
            header_len in prop_oneof![0u64..200, any::<u64>()],
            header in "\\PC{0,120}",
            tail in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let dir = TempDir::new("prop-safetensors");
            let path = dir.0.join(MODEL_FILE);
            let mut bytes = header_len.to_le_bytes().to_vec();
            bytes.extend_from_slice(header.as_bytes());
            bytes.extend_from_slice(&tail);
            fs::write(&path, &bytes).unwrap();
            if let Err(message) = read_tensors(&path) {
                prop_assert!(message.starts_with(MODEL_FILE), "{message}");
            }
        }
    }
}
