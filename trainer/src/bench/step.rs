//! `trainer bench`: the training step of `torch_reference.py` (random tokens,
//! forward, backward, clip, AdamW), timed the same way and printed as the same JSON
//! fields, for side-by-side runs on one machine.

use std::time::Instant;

use crds::config::ResolvedOptimizer;
use crds::presets::{H100_PEAK_BF16_FLOPS, ModelConfig};
use crds::types::{Packing, Precision};
use serde_json::{Value, json};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use std::sync::Arc;

use crate::Error;
use crate::checkpoint::resume::sorted_variables;
use crate::dist::{Backend, DEFAULT_BUCKET_CAP_BYTES, GlooDevice, GradReducer, GroupOptions, ProcessGroup, ReduceOp};
use crate::kernels::choice::KernelRequest;
use crate::kernels::sdp;
use crate::kernels::trials::Candidate;
use crate::kernels::tune::{RunKinds, choose_kernels};
use crate::model::documents::DocumentAttention;
use crate::model::{Documents, Model, Resident};
use crate::optim::{self, AdamW};
use crate::train::precision::{matmul_kind, precision_plan};

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub model: ModelConfig,
    pub micro_batch: i64,
    pub seq: i64,
    pub steps: u32,
    pub warmup: u32,
    pub precision: Precision,
    /// The SDPA backend and SwiGLU's and RoPE's kernels.
    pub kernels: KernelRequest,
    pub device: Device,
    pub gradient_checkpointing: bool,
    /// With `gradient_checkpointing`, recompute only this many leading blocks.
    pub checkpointed_blocks: Option<u32>,
    /// Run each step through a world-size-1 c10d group (NCCL on CUDA, Gloo on CPU)
    /// and the data-parallel gradient reducer, after checking a bf16 all-reduce.
    pub ddp: bool,
    /// Tokens per lm_head + loss chunk; 0: the full logits at once (unless
    /// checkpointing); `None`: training's choice for the vocabulary.
    pub loss_chunk: Option<i64>,
    /// Capture one whole step (forward, backward, clip, AdamW) as a CUDA graph after
    /// the warm-up, and replay it for each timed step.
    pub cuda_graph: bool,
    /// Cap the CUDA caching allocator at this many GiB, as on a smaller GPU.
    pub memory_limit_gib: Option<f64>,
    /// Count host tensor memory at the CPU allocator from before the model is built
    /// ([`crate::ffi::host_memory_count`]): what the timed steps hold at most, and what
    /// stays between steps.
    pub host_memory: bool,
    /// With `host_memory`: fail an allocation that would hold more than this many bytes.
    pub host_memory_limit: Option<u64>,
    /// Pack documents of about this many tokens into each window, each attending only
    /// within itself (`spec.data.packing: documents`); `None`: one sequence a window.
    pub documents: Option<i64>,
}

/// The end-of-text token of the benchmark's documents.
const EOS: i64 = 0;

/// The learning rate every benchmark step uses.
pub(super) const LR: f64 = 3e-4;

/// The AdamW settings of every benchmark step (`torch_reference.py`'s).
pub(super) const OPTIMIZER: ResolvedOptimizer =
    ResolvedOptimizer { weight_decay: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, grad_clip: 1.0 };

/// Peak resident memory of this process (VmHWM), GiB; Linux only.
pub fn peak_rss_gib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / (1024.0 * 1024.0))
}

#[cfg(feature = "cuda")]
fn reset_peak_cuda_memory() -> Result<(), Error> {
    crate::ffi::cuda_reset_peak_memory(0)
}

#[cfg(not(feature = "cuda"))]
fn reset_peak_cuda_memory() -> Result<(), Error> {
    Ok(())
}

pub fn run(o: &BenchOptions) -> Result<Value, Error> {
    let mut model_cfg = o.model.clone();
    model_cfg.max_seq_len = model_cfg.max_seq_len.max(o.seq as u32);
    if let Some(n) = o.checkpointed_blocks
        && (!o.gradient_checkpointing || n == 0 || n > model_cfg.n_layer)
    {
        return Err(Error::InvalidSpec(format!(
            "--checkpointed-blocks {n}: needs --gradient-checkpointing and 1 to the model's {} blocks",
            model_cfg.n_layer
        )));
    }
    if o.host_memory {
        crate::ffi::host_memory_count(true)?;
        crate::ffi::host_memory_limit(o.host_memory_limit)?;
    } else if o.host_memory_limit.is_some() {
        return Err(Error::InvalidSpec("--host-memory-limit-gib needs --host-memory".into()));
    }
    let (kind, autocast, _) = precision_plan(o.precision, o.device);
    let act = matmul_kind(kind, autocast, o.device)?;
    let kinds = RunKinds { weights: kind, matmuls: act, autocast };
    let kernels = choose_kernels(o.kernels, &model_cfg, o.micro_batch, o.seq, kinds, o.device, None)?;
    let attention = kernels.attention;
    tch::manual_seed(0);
    let mut vs = VarStore::new(Device::Cpu);
    let mut model = Model::new(&vs.root(), &model_cfg, o.device)?;
    model.set_attention(attention);
    if kind == Kind::BFloat16 {
        vs.bfloat16();
    }
    vs.set_device(o.device);
    let mut opt = AdamW::new(sorted_variables(&vs), &OPTIMIZER)?;
    sdp::set_sdp_backend(attention)?;
    let backend = sdp::attention_backend(&model_cfg, attention, o.micro_batch, o.seq, act, o.device)?;

    let recompute =
        crds::config::recomputed_blocks(o.gradient_checkpointing, o.checkpointed_blocks, model_cfg.n_layer) as usize;
    let loss_chunk = match o.loss_chunk {
        Some(c) if c > 0 || recompute == 0 => c.max(0),
        _ => model.loss_chunk(),
    };
    let ddp = if o.ddp { Some(data_parallel(o.device, &vs.trainable_variables())?) } else { None };

    if let Some(gib) = o.memory_limit_gib {
        limit_cuda_memory(o.device, gib)?;
    }
    if o.cuda_graph && (ddp.is_some() || !o.device.is_cuda()) {
        return Err(Error::InvalidSpec("--cuda-graph needs --device cuda and no --ddp".into()));
    }
    if o.cuda_graph && o.documents.is_some() {
        return Err(Error::InvalidSpec("--cuda-graph: --documents reads the document lengths on the host".into()));
    }
    let vocab = model_cfg.vocab_size as i64;
    let packing = if o.documents.is_some() { Packing::Documents } else { Packing::Concat };
    // Random tokens; with documents, an end-of-text token with probability 1/length.
    let batch = || -> Result<Tensor, tch::TchError> {
        let Some(length) = o.documents else {
            return Tensor::f_randint(vocab, [o.micro_batch, o.seq + 1], (Kind::Int64, o.device));
        };
        let idx = Tensor::f_randint_low(EOS + 1, vocab, [o.micro_batch, o.seq + 1], (Kind::Int64, o.device))?;
        let ends = Tensor::f_rand([o.micro_batch, o.seq + 1], (Kind::Float, o.device))?.f_lt(1.0 / length as f64)?;
        idx.f_masked_fill(&ends, EOS)
    };
    let documents_check = match o.documents {
        Some(_) => Some(check_documents(&model, &batch()?.f_narrow(1, 0, o.seq)?, autocast, o.device)?),
        None => None,
    };
    // One training step on (B, T + 1) tokens, as training takes it.
    let mut step = |idx: &Tensor, lr: optim::Lr| -> Result<Tensor, Error> {
        if let Some((_, reducer)) = &ddp {
            reducer.prepare()?;
        }
        let (x, y) = (idx.f_narrow(1, 0, o.seq)?, idx.f_narrow(1, 1, o.seq)?);
        let (docs, y) = Documents::pack(packing, &x, &y, EOS)?;
        let loss = crate::ffi::autocast(o.device, autocast, || -> Result<Tensor, Error> {
            if loss_chunk == 0 {
                let loss = model.loss(&x, &y, docs.as_ref())?;
                loss.f_backward()?;
                return Ok(loss);
            }
            model.backward_with(&x, &y, 1.0, loss_chunk, recompute, &Resident, docs.as_ref())
        })?;
        let norm = match &ddp {
            Some((_, reducer)) => {
                reducer.finish()?;
                Some(reducer.grad_norm()?)
            }
            None => None,
        };
        // As training does: the NaN check stays on the device.
        let _ = opt.clip_and_step(&loss, 1.0, lr, norm)?;
        opt.zero_grad()?;
        Ok(loss)
    };
    let sync = || {
        if o.device.is_cuda() {
            tch::Cuda::synchronize(0);
        }
    };
    let mut graphed = None;
    if o.cuda_graph {
        graphed = Some(capture_step(o, &mut step, &batch)?);
    } else {
        for _ in 0..o.warmup {
            let _ = step(&batch()?, optim::Lr::Value(LR))?;
        }
    }
    sync();
    if o.device.is_cuda() {
        reset_peak_cuda_memory()?;
    }
    let resident = crate::ffi::host_memory()?.current;
    crate::ffi::host_memory_reset_peak()?;
    // Each step is timed on the CPU; on CUDA only the whole loop, as syncing each step
    // would stall the launch queue.
    let mut step_times_ms = Vec::new();
    let t0 = Instant::now();
    let mut loss = Tensor::f_zeros([], (Kind::Float, o.device))?;
    for _ in 0..o.steps {
        let started = Instant::now();
        loss = match &mut graphed {
            Some(g) => g.step(&batch()?)?,
            None => step(&batch()?, optim::Lr::Value(LR))?,
        };
        if !o.device.is_cuda() {
            step_times_ms.push(1000.0 * started.elapsed().as_secs_f64());
        }
    }
    sync();
    let dt = t0.elapsed().as_secs_f64();
    let host_peak = crate::ffi::host_memory()?.peak;
    if o.host_memory {
        crate::ffi::host_memory_limit(None)?;
    }
    let tok_s = o.steps as f64 * (o.micro_batch * o.seq) as f64 / dt;
    let counts = model_cfg.param_counts();
    // Peak bytes allocated by libtorch's CUDA caching allocator, as the reference reports.
    let peak_mem = crate::ffi::device_memory(o.device)?.map(|m| m.peak_allocated as f64 / (1u64 << 30) as f64);
    let round = |v: f64, d: i32| (v * 10f64.powi(d)).round() / 10f64.powi(d);
    let mut report = json!({
        "impl": "trainer",
        "preset": model_cfg.preset,
        "device": if o.device.is_cuda() { "cuda" } else { "cpu" },
        "torch": "2.11.0 (libtorch via tch 0.24.0)",
        "precision": serde_json::to_value(o.precision).expect("precision serializes"),
        "micro_batch": o.micro_batch,
        "seq": o.seq,
        "params": counts.total,
        "params_without_norms": counts.without_norms,
        "matmul_params": counts.matmul,
        "step_ms": 1000.0 * dt / o.steps as f64,
        "step_ms_median": median(&step_times_ms),
        "step_times_ms": step_times_ms.iter().map(|&t| round(t, 2)).collect::<Vec<_>>(),
        "host_peak_bytes": o.host_memory.then_some(host_peak),
        "host_resident_bytes": o.host_memory.then_some(resident),
        "tokens_per_s": round(tok_s, 1),
        "mfu": round(model_cfg.mfu(o.seq as u32, tok_s, H100_PEAK_BF16_FLOPS), 4),
        "peak_mem_gib": peak_mem.map(|g| round(g, 2)),
        "peak_rss_gib": peak_rss_gib().map(|g| round(g, 3)),
        "final_loss": loss.f_double_value(&[])?,
        "attention_backend": format!("{backend:?}"),
        "attention": attention.name(),
        "attention_trials": kernels.attention_trials.map(|c| c.trials),
        "matmul_dtype": format!("{act:?}"),
        "gradient_checkpointing": o.gradient_checkpointing,
        "recomputed_blocks": recompute,
        "loss_chunk": loss_chunk,
        "cuda_graph": o.cuda_graph,
        "memory_limit_gib": o.memory_limit_gib,
        "threads": tch::get_num_threads(),
        "packing": serde_json::to_value(packing).expect("packing serializes"),
        "document_tokens": o.documents,
        "document_attention": o.documents.map(|_| DocumentAttention::of(act, model_cfg.d_head as i64, o.device).name()),
        "documents_max_rel_diff": documents_check,
        "ddp": ddp.as_ref().map(|(g, r)| json!({
            "backend": format!("{:?}", g.backend()).to_lowercase(),
            "world_size": g.world_size(),
            "buckets": r.n_buckets(),
            "bf16_allreduce": "ok",
        })),
    });
    // "<op>" and "<op>_trials" for each op the model runs ("swiglu", "rope", "norm",
    // "loss"; GPT-2 only "loss").
    for f in &kernels.fused {
        report[f.op.name()] = json!(f.kernels.name());
        report[format!("{}_trials", f.op.name())] = json!(f.trials.as_ref().map(|c| &c.trials));
    }
    Ok(report)
}

/// How far the logits of a packed window `x` (B, T) with per-document attention are
/// from each of row 0's documents run alone, in the run's dtypes: the largest |Δ| over
/// the largest |logit|. Fails above 5e-2 (bf16 rounding is about 1e-2).
fn check_documents(model: &Model, x: &Tensor, autocast: bool, device: Device) -> Result<f64, Error> {
    let row = x.f_narrow(0, 0, 1)?;
    let packed = tch::no_grad(|| -> Result<Tensor, Error> {
        let docs = Documents::of(&row, EOS)?;
        Ok(crate::ffi::autocast(device, autocast, || model.logits_of(&row, Some(&docs)))?.f_to_kind(Kind::Float)?)
    })?;
    let ids = Vec::<i64>::try_from(row.f_reshape([-1])?.f_to_device(Device::Cpu)?)?;
    // A document of a few tokens alone may be too short for the backend the run forced.
    let _any = sdp::AllSdpBackends::enable()?;
    let (mut worst, mut largest, mut start) = (0.0f64, 0.0f64, 0usize);
    for end in 0..ids.len() {
        if ids[end] != EOS && end + 1 < ids.len() {
            continue;
        }
        let doc = row.f_narrow(1, start as i64, (end + 1 - start) as i64)?;
        let alone = tch::no_grad(|| crate::ffi::autocast(device, autocast, || model.logits(&doc)))?;
        let here = packed.f_narrow(1, start as i64, (end + 1 - start) as i64)?;
        worst = worst.max(alone.f_to_kind(Kind::Float)?.f_sub(&here)?.f_abs()?.f_max()?.f_double_value(&[])?);
        largest = largest.max(here.f_abs()?.f_max()?.f_double_value(&[])?);
        start = end + 1;
    }
    let rel = worst / largest.max(1e-30);
    if rel > 5e-2 {
        return Err(Error::InvalidSpec(format!(
            "--documents: the packed logits differ from each document's alone by {rel:.2e} of the largest"
        )));
    }
    Ok(rel)
}

/// The middle value (the mean of the two middle ones); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

#[cfg(feature = "cuda")]
fn limit_cuda_memory(device: Device, gib: f64) -> Result<(), Error> {
    if !device.is_cuda() {
        return Err(Error::InvalidSpec("--memory-limit-gib needs --device cuda".into()));
    }
    let total = crate::ffi::cuda_limit_memory(device_index(device), gib * (1u64 << 30) as f64)?;
    tracing::info!("CUDA memory capped at {gib} GiB of {:.1} GiB", total as f64 / (1u64 << 30) as f64);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn limit_cuda_memory(_: Device, _: f64) -> Result<(), Error> {
    Err(Error::InvalidSpec("--memory-limit-gib needs a trainer built with --features cuda and --device cuda".into()))
}

/// A training step captured as a CUDA graph: its input tokens and learning rate are
/// the captured tensors, refilled before each replay.
struct GraphedStep {
    #[cfg(feature = "cuda")]
    graph: crate::ffi::CudaGraph,
    idx: Tensor,
    lr: Tensor,
    loss: Tensor,
}

impl GraphedStep {
    /// Replays the step on `idx`'s tokens; returns its loss (the captured tensor,
    /// which the next replay overwrites).
    fn step(&mut self, idx: &Tensor) -> Result<Tensor, Error> {
        self.idx.f_copy_(idx)?;
        let _ = self.lr.f_fill_(LR)?;
        #[cfg(feature = "cuda")]
        self.graph.replay()?;
        Ok(self.loss.shallow_clone())
    }
}

/// Runs `o.warmup` steps (at least one) on the graph's side stream, then captures
/// one, as `torch.cuda.graph`'s recipe does: nothing the capture records may be
/// first-time work (cuBLAS handles, autograd buffers, the grads themselves).
#[cfg(feature = "cuda")]
fn capture_step(
    o: &BenchOptions,
    step: &mut impl FnMut(&Tensor, optim::Lr) -> Result<Tensor, Error>,
    batch: &impl Fn() -> Result<Tensor, tch::TchError>,
) -> Result<GraphedStep, Error> {
    let mut graph = crate::ffi::CudaGraph::new(device_index(o.device))?;
    let idx = batch()?;
    let lr = Tensor::f_full([], LR, (Kind::Float, o.device))?;
    graph.on_side_stream(|| {
        for _ in 0..o.warmup.max(1) {
            let _ = step(&idx, optim::Lr::Tensor(&lr))?;
        }
        Ok(())
    })?;
    let loss = graph.capture(|| step(&idx, optim::Lr::Tensor(&lr)))?;
    Ok(GraphedStep { graph, idx, lr, loss })
}

#[cfg(not(feature = "cuda"))]
fn capture_step(
    _: &BenchOptions,
    _: &mut impl FnMut(&Tensor, optim::Lr) -> Result<Tensor, Error>,
    _: &impl Fn() -> Result<Tensor, tch::TchError>,
) -> Result<GraphedStep, Error> {
    Err(Error::InvalidSpec("--cuda-graph needs a trainer built with --features cuda".into()))
}

/// A world-size-1 group on `device` (NCCL on CUDA) that has all-reduced a bf16 tensor
/// correctly, and a gradient reducer over `params`.
fn data_parallel(device: Device, params: &[Tensor]) -> Result<(Arc<ProcessGroup>, GradReducer), Error> {
    let group = Arc::new(ProcessGroup::new(&GroupOptions {
        backend: Backend::for_device(device),
        master_addr: "127.0.0.1".into(),
        master_port: crate::dist::free_port()?,
        rank: 0,
        world_size: 1,
        timeouts: crate::dist::Timeouts::both(std::time::Duration::from_secs(300)),
        gloo_device: GlooDevice::Host("127.0.0.1".into()),
        cuda_device: device_index(device),
    })?);
    let t = Tensor::f_full([1 << 20], 3.0, (Kind::BFloat16, device))?;
    group.allreduce(&t, ReduceOp::Avg)?.wait()?;
    if t.f_eq(3.0)?.f_all()?.f_int64_value(&[])? == 0 {
        return Err(Error::Shim(format!("{:?} all-reduce of a bf16 tensor of 3s did not give 3s", group.backend())));
    }
    let reducer = GradReducer::new(group.clone(), params, &vec![0; params.len()], DEFAULT_BUCKET_CAP_BYTES)?;
    Ok((group, reducer))
}

fn device_index(device: Device) -> usize {
    match device {
        Device::Cuda(i) => i,
        _ => 0,
    }
}
