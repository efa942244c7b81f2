//! `trainer bench-checkpoint`: what a periodic checkpoint costs the training loop.
//! The training step of [`super::step`] (f32, CPU) runs `steps` times without
//! checkpoints and `steps` times with a background checkpoint (model and AdamW state)
//! every `every` steps, through the trainer's [`Checkpointer`] and the same
//! [`Snapshot`] wait before the optimizer step as training. The
//! stall of a checkpoint is what it adds to the loop: the save call, the snapshot wait,
//! and the steps' slowdown while the writer copies and writes beside them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crds::presets::ModelConfig;
use serde_json::{Value, json};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::checkpoint::resume::sorted_variables;
use crate::checkpoint::writer::{Checkpointer, Snapshot};
use crate::checkpoint::{FORMAT_VERSION, Payload, TrainState};
use crate::model::Model;
use crate::optim::{self, AdamW};

#[derive(Clone, Debug)]
pub struct CheckpointBenchOptions {
    pub model: ModelConfig,
    pub micro_batch: i64,
    pub seq: i64,
    /// Steps of each phase (without, then with checkpoints).
    pub steps: u32,
    /// A checkpoint every this many steps of the second phase.
    pub every: u32,
    /// The disk being measured: the checkpoints go to a scratch directory inside it,
    /// removed afterwards; nothing else there is touched.
    pub dir: PathBuf,
}

/// One step's wall time and the part of it spent on the checkpoint.
#[derive(Clone, Copy, Debug, Default)]
struct StepTime {
    total: f64,
    save_call: f64,
    snapshot_wait: f64,
}

pub fn run(o: &CheckpointBenchOptions) -> Result<Value, Error> {
    if o.every == 0 || o.steps < o.every {
        return Err(Error::InvalidSpec(format!("--every {}: 1 to --steps {}", o.every, o.steps)));
    }
    let mut cfg = o.model.clone();
    cfg.max_seq_len = cfg.max_seq_len.max(o.seq as u32);
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let model = Model::new(&vs.root(), &cfg, Device::Cpu)?;
    let mut opt = AdamW::new(sorted_variables(&vs), &super::step::OPTIMIZER)?;
    let loss_chunk = model.loss_chunk();
    let vocab = cfg.vocab_size as i64;
    let step = |opt: &mut AdamW, snapshot: Option<Snapshot>| -> Result<f64, Error> {
        let idx = Tensor::f_randint(vocab, [o.micro_batch, o.seq + 1], (Kind::Int64, Device::Cpu))?;
        let (x, y) = (idx.f_narrow(1, 0, o.seq)?, idx.f_narrow(1, 1, o.seq)?);
        let loss = model.backward_checkpointed(&x, &y, 1.0, loss_chunk, 0)?;
        let waited = snapshot.map_or(0.0, |s| s.wait().as_secs_f64());
        let _ = opt.clip_and_step(&loss, 1.0, optim::Lr::Value(super::step::LR), None)?;
        opt.zero_grad()?;
        Ok(waited)
    };
    // The first steps make AdamW's state, which the checkpoints hold.
    for _ in 0..2 {
        step(&mut opt, None)?;
    }
    let timed = |opt: &mut AdamW, with_checkpoints: Option<&mut Checkpointer>| -> Result<Vec<StepTime>, Error> {
        let mut checkpointer = with_checkpoints;
        let mut times = Vec::new();
        for i in 0..o.steps {
            let started = Instant::now();
            let mut t = StepTime::default();
            let snapshot = match checkpointer.as_deref_mut() {
                Some(c) if i % o.every == 0 => {
                    let payload = Payload {
                        model: sorted_variables(&vs),
                        optimizer: opt.state_tensors(),
                        state: bench_state(&cfg, u64::from(i)),
                    };
                    let (_, snapshot) = c.save_async(payload)?;
                    t.save_call = started.elapsed().as_secs_f64();
                    Some(snapshot)
                }
                _ => None,
            };
            t.snapshot_wait = step(opt, snapshot)?;
            t.total = started.elapsed().as_secs_f64();
            times.push(t);
        }
        Ok(times)
    };
    let plain = timed(&mut opt, None)?;
    let scratch = o.dir.join(format!(".bench-checkpoint-{}", std::process::id()));
    let mut checkpointer = Checkpointer::new(&scratch, 1)?;
    let with = timed(&mut opt, Some(&mut checkpointer))?;
    let finish = Instant::now();
    checkpointer.wait()?;
    let last_write_left = finish.elapsed().as_secs_f64();
    // A synchronous save of the same state, for scale.
    let sync_started = Instant::now();
    let saved = checkpointer.save(Payload {
        model: sorted_variables(&vs),
        optimizer: opt.state_tensors(),
        state: bench_state(&cfg, u64::from(o.steps) + 1),
    })?;
    let sync_save = sync_started.elapsed().as_secs_f64();
    let saved_dir = PathBuf::from(&saved.uri);
    let bytes: u64 = std::fs::read_dir(&saved_dir)
        .map_err(crate::io_err(&saved_dir))?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    drop(checkpointer);
    std::fs::remove_dir_all(&scratch).map_err(crate::io_err(&scratch))?;

    let checkpoints = o.steps.div_ceil(o.every) as f64;
    let sum = |v: &[StepTime], f: fn(&StepTime) -> f64| v.iter().map(f).sum::<f64>();
    let median_plain = super::step::median(&plain.iter().map(|t| t.total).collect::<Vec<_>>()).unwrap_or(f64::NAN);
    // What the checkpoints added, against the median plain step (robust to one slow step).
    let added = (sum(&with, |t| t.total) - median_plain * with.len() as f64) / checkpoints;
    let blocked = (sum(&with, |t| t.save_call) + sum(&with, |t| t.snapshot_wait)) / checkpoints;
    Ok(json!({
        "preset": cfg.preset,
        "micro_batch": o.micro_batch,
        "seq": o.seq,
        "threads": tch::get_num_threads(),
        "checkpoint_bytes": bytes,
        "checkpoints": checkpoints,
        "step_ms_median_without": 1e3 * median_plain,
        "step_ms_median_with": 1e3 * super::step::median(&with.iter().map(|t| t.total).collect::<Vec<_>>()).unwrap_or(f64::NAN),
        "stall_ms_per_checkpoint": 1e3 * added.max(blocked),
        "added_ms_per_checkpoint": 1e3 * added,
        "blocked_ms_per_checkpoint": 1e3 * blocked,
        "save_call_ms": with.iter().filter(|t| t.save_call > 0.0).map(|t| 1e3 * t.save_call).collect::<Vec<_>>(),
        "snapshot_wait_ms": with.iter().filter(|t| t.save_call > 0.0).map(|t| 1e3 * t.snapshot_wait).collect::<Vec<_>>(),
        "last_write_left_ms": 1e3 * last_write_left,
        "sync_save_ms": 1e3 * sync_save,
    }))
}

fn bench_state(cfg: &ModelConfig, step: u64) -> TrainState {
    TrainState {
        format_version: FORMAT_VERSION,
        step,
        tokens: 0,
        data_position: 0,
        rng: Value::Null,
        config_hash: "bench-checkpoint".into(),
        config: None,
        history: Vec::new(),
        world_size: 1,
        attempt: 1,
        preset: cfg.preset.clone(),
        loss: None,
        val_loss: None,
        time: String::new(),
        files: BTreeMap::new(),
    }
}
