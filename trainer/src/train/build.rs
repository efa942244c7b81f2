//! The trainer assembled from its parts, each built by its own constructor: the
//! runtime (device, precision, process group), the data, the model, the optimizer,
//! the phase, and the gang's reducer and shards.

use std::sync::Arc;
use std::time::Duration;

use crds::config::{Device as RunDevice, RunConfig};
use crds::types::{Attention, Parallelism};
use tch::nn::VarStore;
use tch::{Device, Kind};

use super::faults::Faults;
use super::options::RunOptions;
use super::phase::{GrpoPhase, Phase, Pretrain};
use super::precision::{matmul_kind, precision_plan};
use super::restore::{self, reference_model};
use super::trainer::{DataCursor, Progress, StepClock, Stop, Trainer};
use crate::Error;
use crate::checkpoint::resume::{named_in_definition_order, sorted_variables};
use crate::data::corpus::Split;
use crate::data::mix::Mix;
use crate::data::sources;
use crate::data::tokenizer::Tokenizer;
use crate::dist::fsdp::ShardedParams;
use crate::dist::reducer::BucketItem;
use crate::dist::{self, GradReducer, Placement, ProcessGroup, Timeouts};
use crate::grpo::step::Grpo;
use crate::kernels::choice::KernelRequest;
use crate::kernels::sdp;
use crate::kernels::tune::{RunKinds, choose_kernels};
use crate::model::documents::DocumentAttention;
use crate::model::{Model, Unit};
use crate::optim::zero::{ShardedAdamW, ZeroStage};
use crate::optim::{AdamW, Optimizer};
use crate::parallel::{DataParallel, FullyShard, OneRank, Replicated};
use crate::rng::GLOBAL_RNG;

/// Where the process computes, in what precision, and with whom.
struct Runtime {
    device: Device,
    /// The parameters' kind.
    kind: Kind,
    autocast: bool,
    /// The kind matmuls run in.
    matmuls: Kind,
    group: Option<Arc<ProcessGroup>>,
}

impl Runtime {
    /// Picks the device and precision and joins the group first: a rank that cannot
    /// meet the others fails before the slow setup.
    fn start(cfg: &RunConfig, p: &Placement) -> Result<Runtime, Error> {
        if p.world_size != cfg.topology.world_size {
            return Err(Error::InvalidSpec(format!(
                "this process is rank {} of {} but spec.topology asks for {} processes",
                p.rank, p.world_size, cfg.topology.world_size
            )));
        }
        let device = device(cfg.topology.device, p.local_rank)?;
        let (kind, autocast, what) = precision_plan(cfg.precision, device);
        let matmuls = matmul_kind(kind, autocast, device)?;
        if p.rank == 0 {
            tracing::info!("precision: {what}; matmuls run in {matmuls:?}");
        }
        let group = if p.world_size > 1 { Some(join(cfg, p, device)?) } else { None };
        Ok(Runtime { device, kind, autocast, matmuls, group })
    }
}

fn device(wanted: RunDevice, local_rank: u32) -> Result<Device, Error> {
    let visible = tch::Cuda::device_count();
    match wanted {
        RunDevice::Cuda if i64::from(local_rank) < visible => Ok(Device::Cuda(local_rank as usize)),
        RunDevice::Cuda if tch::Cuda::is_available() => Err(Error::InvalidSpec(format!(
            "local rank {local_rank} needs CUDA device {local_rank} but only {visible} are visible"
        ))),
        RunDevice::Cuda => Err(Error::InvalidSpec(
            "spec.topology.gpusPerNode > 0 but no CUDA device is visible (or this trainer was built without the `cuda` feature)".into(),
        )),
        RunDevice::Cpu => Ok(Device::Cpu),
    }
}

fn join(cfg: &RunConfig, p: &Placement, device: Device) -> Result<Arc<ProcessGroup>, Error> {
    let timeouts = Timeouts {
        rendezvous: Duration::from_secs(cfg.topology.rendezvous_timeout_seconds()),
        collective: Duration::from_secs(cfg.topology.collective_timeout_seconds),
    };
    let group = Arc::new(p.join(device, timeouts)?);
    if p.rank == 0 {
        tracing::info!(
            "joined a {:?} group of {} ranks at {}:{}",
            group.backend(),
            p.world_size,
            p.master_addr,
            p.master_port
        );
    }
    Ok(group)
}

/// The model, seeded by the run, in the parameters' kind on the device.
fn build_model(cfg: &RunConfig, rt: &Runtime, attention: Attention) -> Result<(VarStore, Model), Error> {
    let mut vs = VarStore::new(Device::Cpu);
    let mut model = {
        let _rng = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(cfg.seed as i64);
        Model::new(&vs.root(), &cfg.model, rt.device)?
    };
    model.set_attention(attention);
    if rt.kind == Kind::BFloat16 {
        vs.bfloat16();
    }
    vs.set_device(rt.device);
    Ok((vs, model))
}

/// How gradients are bucketed. Every strategy buckets the same way, a bucket never
/// spanning two of fsdp's units, so each sums every gradient over the ranks in the
/// same order.
struct Buckets {
    /// Each parameter's unit, in definition order.
    units: Vec<usize>,
    cap_bytes: usize,
}

impl Buckets {
    fn of(cfg: &RunConfig, vs: &VarStore) -> Buckets {
        let n_layer = cfg.model.n_layer as usize;
        let units =
            named_in_definition_order(vs).iter().map(|(name, _)| Unit::of(name).backward_index(n_layer)).collect();
        Buckets { units, cap_bytes: (cfg.topology.bucket_cap_mb as usize * 1024 * 1024).max(1) }
    }
}

/// AdamW, replicated or sharded over the group by `spec.parallelism`.
fn build_optimizer(cfg: &RunConfig, rt: &Runtime, vs: &VarStore, buckets: &Buckets) -> Result<Optimizer, Error> {
    let stage = match cfg.parallelism {
        Parallelism::Zero1 => ZeroStage::One,
        Parallelism::Zero2 => ZeroStage::Two,
        Parallelism::Fsdp => ZeroStage::Three,
        _ => return Ok(Optimizer::Replicated(AdamW::new(sorted_variables(vs), &cfg.optimizer)?)),
    };
    let Some(group) = &rt.group else {
        return Ok(Optimizer::Replicated(AdamW::new(sorted_variables(vs), &cfg.optimizer)?));
    };
    let named = named_in_definition_order(vs);
    let items: Vec<BucketItem> = named.iter().zip(&buckets.units).map(|((_, p), &u)| BucketItem::of(p, u)).collect();
    let bucket_of = dist::reducer::assign_buckets(&items, buckets.cap_bytes);
    Ok(Optimizer::Sharded(ShardedAdamW::new(named, &bucket_of, group.clone(), &cfg.optimizer, stage)?))
}

/// Pretraining's mix, or GRPO's questions with the reference policy.
fn build_phase(
    cfg: &RunConfig,
    opts: &RunOptions,
    rt: &Runtime,
    tokenizer: &Tokenizer,
    attention: Attention,
) -> Result<Phase, Error> {
    let Some(g) = &cfg.grpo else {
        let mix = Arc::new(Mix::new(
            sources::source_tokens(cfg, tokenizer, Split::Train)?,
            cfg.batch.seq_len as usize,
            cfg.seed,
        )?);
        let source_epochs = vec![0; mix.sources().len()];
        return Ok(Phase::Pretrain(Pretrain { mix, loader: None, source_epochs }));
    };
    let questions = crate::grpo::data::load(cfg, g)?;
    if opts.placement.rank == 0 {
        tracing::info!(
            "GRPO: {} training questions, {} held out",
            questions.train.len(),
            questions.held_out.records.len()
        );
    }
    let reference =
        if g.beta > 0.0 { Some(reference_model(cfg, &opts.init_dir, rt.device, attention, rt.kind)?) } else { None };
    let grpo = Grpo::new(cfg, questions, reference)?;
    Ok(Phase::Grpo(Box::new(GrpoPhase { grpo, last: None, no_signal_steps: 0 })))
}

impl Trainer {
    /// Builds everything and resumes from the newest valid checkpoint in the output
    /// directory, or loads `initFrom` weights.
    pub fn new(cfg: &RunConfig, opts: RunOptions) -> Result<Trainer, Error> {
        let mut cfg = cfg.clone();
        let rt = Runtime::start(&cfg, &opts.placement)?;
        let resume = restore::find_resume(&mut cfg, &opts, rt.group.as_deref())?;
        let b = &cfg.batch;
        let request = KernelRequest::auto(cfg.attention);
        let (micro, seq) = (b.micro_batch as i64, b.seq_len as i64);
        let kinds = RunKinds { weights: rt.kind, matmuls: rt.matmuls, autocast: rt.autocast };
        let kernels = choose_kernels(request, &cfg.model, micro, seq, kinds, rt.device, rt.group.as_deref())?;
        if opts.placement.rank == 0 {
            kernels.log(b.micro_batch, b.seq_len);
        }
        let attention = kernels.attention;
        let tokenizer = sources::load_tokenizer(&cfg)?;
        let eval_every = cfg.data.as_ref().map_or(0, |d| d.eval_every_steps);
        let val = if eval_every > 0 { sources::validation_mixes(&cfg, &tokenizer)? } else { Vec::new() };
        let (vs, model) = build_model(&cfg, &rt, attention)?;
        let buckets = Buckets::of(&cfg, &vs);
        let opt = build_optimizer(&cfg, &rt, &vs, &buckets)?;
        sdp::set_sdp_backend(attention)?;
        let phase = build_phase(&cfg, &opts, &rt, &tokenizer, attention)?;
        let mut trainer = Trainer {
            faults: Faults::from_env(opts.placement.rank, cfg.attempt),
            sync_every: opts.sync_every(cfg.grpo.is_some(), rt.device),
            cfg,
            opts,
            device: rt.device,
            autocast: rt.autocast,
            attention,
            vs,
            model,
            opt,
            phase,
            val,
            tokenizer,
            parallel: Box::new(OneRank),
            progress: Progress::default(),
            data: DataCursor::default(),
            stop: Stop::default(),
            pending: Vec::new(),
            snapshot: None,
            clock: StepClock::default(),
        };
        trainer.check_attention(rt.matmuls)?;
        let loaded = trainer.restore(resume)?;
        let epochs = trainer.phase.mix().map(|mix| trainer.phase.epochs(&mix.counts_at(trainer.data.position)));
        if let (Phase::Pretrain(p), Some(epochs)) = (&mut trainer.phase, epochs) {
            p.source_epochs = epochs;
        }
        if let Some(group) = rt.group {
            trainer.parallel = trainer.gang(group, &buckets, loaded)?;
        }
        Ok(trainer)
    }

    /// Logs the SDPA backend libtorch picks for the run's shapes with activations of
    /// `kind`, and fails when a forced `spec.attention` backend cannot run them.
    fn check_attention(&self, kind: Kind) -> Result<(), Error> {
        let b = &self.cfg.batch;
        let (micro, seq) = (b.micro_batch as i64, b.seq_len as i64);
        let backend = sdp::attention_backend(&self.cfg.model, self.attention, micro, seq, kind, self.device)?;
        if self.rank0() && (self.device.is_cuda() || self.attention != Attention::Auto) {
            tracing::info!("attention: SDPA runs the {backend:?} backend in {kind:?}");
        }
        if self.rank0() && self.cfg.data.as_ref().is_some_and(|d| d.packing == crds::types::Packing::Documents) {
            let within = DocumentAttention::of(kind, i64::from(self.cfg.model.d_head), self.device);
            tracing::info!("packing documents: attention within each runs as {}", within.name());
        }
        Ok(())
    }

    /// Joins the restored parameters to the gang: checks that every rank resumed the
    /// same weights (`loaded`: from where), broadcasts rank 0's, and builds the
    /// strategy: the gradient reducer (the sharded optimizer's, or DDP's buckets), with
    /// fsdp's shards.
    fn gang(
        &self,
        group: Arc<ProcessGroup>,
        buckets: &Buckets,
        loaded: Option<String>,
    ) -> Result<Box<dyn DataParallel>, Error> {
        // Definition order: the reducer buckets it in reverse, as backward runs.
        let params = self.vs.trainable_variables();
        if let Some(origin) = loaded {
            dist::check_parameters_agree(&group, &params, &origin)?;
        }
        dist::broadcast_parameters(&group, &params)?;
        let reducer = match self.opt.gradient_reducer()? {
            Some(scattering) => scattering,
            None => GradReducer::new(group.clone(), &params, &buckets.units, buckets.cap_bytes)?,
        };
        if self.rank0() {
            tracing::info!(
                "data parallel: {} ranks, {} gradient buckets of up to {} MiB",
                group.world_size(),
                reducer.n_buckets(),
                self.cfg.topology.bucket_cap_mb
            );
        }
        let Some((layout, shards)) = self.opt.fsdp_shards() else {
            return Ok(Box::new(Replicated::new(group, reducer)));
        };
        // After the reducer, whose hooks capture the parameters' whole shapes.
        let named = named_in_definition_order(&self.vs);
        let shards = ShardedParams::new(group.clone(), named, &buckets.units, layout, shards)?;
        Ok(Box::new(FullyShard::new(group, reducer, shards, self.model.n_layer())))
    }
}
