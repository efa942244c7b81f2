//! The decoder-only transformer of every preset, in tch. Parameter paths are the
//! Hugging Face names (`model.layers.{i}.self_attn.q_proj.weight`,
//! `transformer.h.{i}.attn.c_attn.weight`, …), so a VarStore is a checkpoint.

pub mod cache;
pub mod dims;
pub mod documents;
pub mod gpt2;
pub mod layers;
pub mod llama;
pub mod residency;

use crds::presets::{Arch, ModelConfig};
use tch::nn::Path;
use tch::{Device, Kind, Reduction, TchError, Tensor};

use crate::kernels::rope::Rope;
use crate::kernels::sdp::{AllSdpBackends, expands_kv};
use cache::{KvCache, Start, Step};
pub use dims::{Dims, INIT_STD};
pub use documents::Documents;
use gpt2::Gpt2Block;
use layers::{Embedding, LayerNorm, Linear, RmsNorm};
use llama::LlamaBlock;
pub use residency::{Residency, Resident, Unit};

pub use crds::presets::{LOSS_CHUNK_BYTES, loss_chunk_tokens};

#[derive(Debug)]
enum Block {
    Llama(LlamaBlock),
    Gpt2(Gpt2Block),
}

#[derive(Debug)]
enum FinalNorm {
    Rms(RmsNorm),
    Layer(LayerNorm),
}

/// A decoder-only language model.
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    dims: Dims,
    embed_tokens: Embedding,
    /// Learned positions (GPT-2).
    wpe: Option<Embedding>,
    blocks: Vec<Block>,
    norm: FinalNorm,
    /// `None` when tied to the token embedding.
    lm_head: Option<Linear>,
    /// RoPE tables (LLaMA and Qwen3).
    rope: Option<Rope>,
}

impl Model {
    /// Creates the parameters under `root` (normally `vs.root()`), initialised with
    /// the global torch RNG. RoPE tables are built on `device`.
    pub fn new(root: &Path, cfg: &ModelConfig, device: Device) -> Result<Self, TchError> {
        let dims = Dims::of(cfg);
        let (d, v) = (dims.d_model, dims.vocab);
        let model = match cfg.arch {
            Arch::Llama | Arch::Qwen3 => {
                let m = root / "model";
                let blocks = (0..dims.n_layer)
                    .map(|i| LlamaBlock::new(&m / "layers" / i, dims, cfg.arch == Arch::Qwen3).map(Block::Llama))
                    .collect::<Result<_, _>>()?;
                Model {
                    cfg: cfg.clone(),
                    dims,
                    embed_tokens: Embedding::new(&m / "embed_tokens", v, d, INIT_STD)?,
                    wpe: None,
                    blocks,
                    norm: FinalNorm::Rms(RmsNorm::new(&m / "norm", d, dims.eps)?),
                    lm_head: None,
                    rope: Some(Rope::new(dims.d_head, dims.max_seq, cfg.rope_theta, device)?),
                }
            }
            Arch::Gpt2 => {
                let m = root / "transformer";
                let blocks = (0..dims.n_layer)
                    .map(|i| Gpt2Block::new(&m / "h" / i, dims).map(Block::Gpt2))
                    .collect::<Result<_, _>>()?;
                Model {
                    cfg: cfg.clone(),
                    dims,
                    embed_tokens: Embedding::new(&m / "wte", v, d, INIT_STD)?,
                    wpe: Some(Embedding::new(&m / "wpe", dims.max_seq, d, INIT_STD)?),
                    blocks,
                    norm: FinalNorm::Layer(LayerNorm::new(&m / "ln_f", d, dims.eps)?),
                    lm_head: None,
                    rope: None,
                }
            }
        };
        let lm_head =
            if cfg.tied_embeddings { None } else { Some(Linear::new(root / "lm_head", d, v, false, INIT_STD)?) };
        Ok(Model { lm_head, ..model })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn n_layer(&self) -> usize {
        self.blocks.len()
    }

    /// Tokens per chunk of the training loss ([`loss_chunk_tokens`] of the vocabulary).
    pub fn loss_chunk(&self) -> i64 {
        loss_chunk_tokens(self.dims.vocab)
    }

    /// Repeats K/V per query head in training attention when `attention` is cuDNN and the
    /// model has grouped-query attention (see [`expands_kv`]).
    pub fn set_attention(&mut self, attention: crds::types::Attention) {
        let expand = expands_kv(attention, &self.cfg);
        self.dims.expand_kv = expand;
        for b in &mut self.blocks {
            if let Block::Llama(b) = b {
                b.set_expand_kv(expand);
            }
        }
    }

    /// `idx`: (B, T) token ids → (B, T, d_model); GPT-2's learned positions count from
    /// the window's start, or from each of its `docs`'.
    pub fn embed(&self, idx: &Tensor, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        let t = idx.size()[1];
        if t > self.dims.max_seq {
            return Err(TchError::Shape(format!(
                "sequence of {t} tokens exceeds the model's context of {} (model.seqLength)",
                self.dims.max_seq
            )));
        }
        let x = self.embed_tokens.forward(idx)?;
        match (&self.wpe, docs) {
            (Some(wpe), Some(d)) => x.f_add(&wpe.forward(&d.positions)?),
            (Some(wpe), None) => x.f_add(&wpe.forward(&Tensor::f_arange(t, (Kind::Int64, idx.device()))?)?),
            (None, _) => Ok(x),
        }
    }

    /// Block `i`: (B, T, d_model) → (B, T, d_model), attending within `docs` if given.
    pub fn block(&self, i: usize, x: &Tensor, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        match &self.blocks[i] {
            Block::Llama(b) => b.forward(x, self.rope.as_ref().expect("LLaMA models have RoPE tables"), docs),
            Block::Gpt2(b) => b.forward(x, docs),
        }
    }

    /// Final norm and lm_head: (B, T, d_model) → logits (B, T, vocab).
    pub fn head(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let h = match &self.norm {
            FinalNorm::Rms(n) => n.forward_stream(x)?,
            FinalNorm::Layer(n) => n.forward(x)?,
        };
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => h.f_linear(&self.embed_tokens.weight, None::<Tensor>),
        }
    }

    /// Forward and backward of the mean next-token cross-entropy with the final norm,
    /// the lm_head and the loss computed `chunk` tokens at a time (torchtitan's chunked
    /// loss, llm.c's fused classifier): the full (tokens, vocab) logits never exist.
    /// Gradients accumulate exactly as `(loss * scale).backward()` would, each
    /// parameter's in one accumulation (what data parallelism's hooks count on);
    /// returns the unscaled loss, detached.
    pub fn backward_chunked(
        &self,
        idx: &Tensor,
        targets: &Tensor,
        scale: f64,
        chunk: i64,
        docs: Option<&Documents>,
    ) -> Result<Tensor, TchError> {
        let mut x = self.embed(idx, docs)?;
        for i in 0..self.blocks.len() {
            x = self.block(i, &x, docs)?;
        }
        let (loss, grad, head) = self.head_backward_chunked(&x.f_detach()?, targets, scale, chunk)?;
        backward_from(x, grad, head)?;
        Ok(loss)
    }

    /// The parameters of [`Self::head`] that train, each with whether it is the token
    /// embedding (tied), in a fixed order.
    fn head_parameters(&self) -> Vec<(Tensor, bool)> {
        let mut ps = match &self.norm {
            FinalNorm::Rms(n) => vec![(n.weight.shallow_clone(), false)],
            FinalNorm::Layer(n) => vec![(n.weight.shallow_clone(), false), (n.bias.shallow_clone(), false)],
        };
        ps.push(match &self.lm_head {
            Some(head) => (head.weight.shallow_clone(), false),
            None => (self.embed_tokens.weight.shallow_clone(), true),
        });
        ps.retain(|(p, _)| p.requires_grad());
        ps
    }

    /// The head's part of [`Self::backward_chunked`] on the last block's output `top`
    /// (B, T, d_model), detached. Returns the loss, d(loss·scale)/d`top`, and
    /// d(loss·scale)/dp for each of [`Self::head_parameters`], summed over the chunks
    /// but not yet accumulated into `.grad`.
    fn head_backward_chunked(
        &self,
        top: &Tensor,
        targets: &Tensor,
        scale: f64,
        chunk: i64,
    ) -> Result<(Tensor, Tensor, HeadGrads), TchError> {
        let d = *top.size().last().expect("hidden states have a model dimension");
        let flat = top.f_reshape([-1, d])?; // (N, d_model)
        let tgt = targets.f_reshape([-1])?; // (N)
        let n = flat.size()[0];
        // Mean over the targets that count, kept on the device (no host sync).
        let counted = tgt.f_ne(-100)?.f_sum(Kind::Float)?.f_clamp_min(1.0)?;
        let grad = Tensor::f_zeros_like(&flat)?;
        let mut total = Tensor::f_zeros([], (Kind::Float, top.device()))?;
        let params = self.head_parameters();
        let mut sums: Vec<Option<Tensor>> = params.iter().map(|_| None).collect();
        for start in (0..n).step_by(chunk.max(1) as usize) {
            let len = chunk.min(n - start);
            let leaf = flat.f_narrow(0, start, len)?.f_detach()?.f_requires_grad_(true)?;
            let (loss, mut grads) = self.head_chunk(&leaf, &tgt.f_narrow(0, start, len)?, &counted, scale)?;
            grad.f_narrow(0, start, len)?.f_copy_(&grads.remove(0))?;
            for (sum, g) in sums.iter_mut().zip(grads) {
                // In place: a new sum per chunk would hold a third copy of the lm_head's
                // gradient (1.2 GB at Qwen3's vocabulary) for a moment.
                match sum {
                    Some(s) => drop(s.f_add_(&g)?),
                    None => *sum = Some(g),
                }
            }
            total = total.f_add(&loss)?;
        }
        let head = params.into_iter().zip(sums).filter_map(|((p, tied), g)| Some((p, g?, tied))).collect();
        Ok((total, grad.f_view_as(top)?, head))
    }

    /// One chunk of [`Self::head_backward_chunked`]: the loss of `leaf` (len, d_model)
    /// against `tgt` (len), divided by `counted`, and the gradients of `scale` times it
    /// for `leaf` and each of [`Self::head_parameters`], in that order.
    ///
    /// The final norm goes through autograd; the lm_head and the cross-entropy are done
    /// by hand, so that one (len, vocab) buffer holds the logits and then, in place,
    /// their gradient `softmax − one-hot` ([`crate::kernels::loss`]: llm.c's fused
    /// classifier; inductor fuses the same). Autograd's cross-entropy would hold the
    /// logits, their log-softmax and two gradients of that size at once.
    fn head_chunk(
        &self,
        leaf: &Tensor,
        tgt: &Tensor,
        counted: &Tensor,
        scale: f64,
    ) -> Result<(Tensor, Vec<Tensor>), TchError> {
        let (h, norm_params) = match &self.norm {
            FinalNorm::Rms(n) => (n.forward_stream(leaf)?, vec![n.weight.shallow_clone()]),
            FinalNorm::Layer(n) => (n.forward(leaf)?, vec![n.weight.shallow_clone(), n.bias.shallow_clone()]),
        }; // (len, d_model)
        let w = match &self.lm_head {
            Some(head) => &head.weight,
            None => &self.embed_tokens.weight,
        }; // (vocab, d_model)
        let (loss, grad_h, grad_w) = tch::no_grad(|| -> Result<_, TchError> {
            let h = h.f_detach()?;
            // Under autocast the matmul runs in its dtype.
            let logits = h.f_linear(w, None::<Tensor>)?; // (len, vocab)
            let chunk = crate::kernels::loss::cross_entropy_chunk(logits, tgt, counted, scale)?;
            // The gradient in the weights' dtype, unless autocast casts it for the matmuls.
            let g = if w.kind() == Kind::Float { chunk.grad } else { chunk.grad.f_to_kind(w.kind())? };
            let grad_h = g.f_matmul(w)?.f_to_kind(h.kind())?; // (len, d_model)
            let grad_w =
                if w.requires_grad() { Some(g.f_transpose(0, 1)?.f_matmul(&h)?.f_to_kind(w.kind())?) } else { None };
            Ok((chunk.loss, grad_h, grad_w))
        })?;
        let mut inputs = vec![leaf.shallow_clone()];
        inputs.extend(norm_params.into_iter().filter(Tensor::requires_grad));
        // The norm's backward for grad_h: the gradient of ⟨h, grad_h⟩.
        let mut grads = Tensor::f_run_backward(&[h.f_mul(&grad_h)?.f_sum(Kind::Float)?], &inputs, false, false)?;
        grads.extend(grad_w);
        Ok((loss, grads))
    }

    /// (B, T) token ids → logits (B, T, vocab).
    pub fn logits(&self, idx: &Tensor) -> Result<Tensor, TchError> {
        self.logits_of(idx, None)
    }

    /// [`Self::logits`] of a window whose `docs` attend each within itself.
    pub fn logits_of(&self, idx: &Tensor, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        let mut x = self.embed(idx, docs)?;
        for i in 0..self.blocks.len() {
            x = self.block(i, &x, docs)?;
        }
        self.head(&x)
    }

    /// An empty KV cache for `batch` rows of up to `capacity` tokens, in the model's dtype
    /// or, under autocast, in autocast's (attention would re-cast an f32 cache every step).
    pub fn new_cache(&self, batch: i64, capacity: i64) -> Result<KvCache, TchError> {
        let w = &self.embed_tokens.weight;
        let kind = match crate::ffi::autocast_kind(w.device()) {
            Ok(Some(low)) if w.kind() == Kind::Float => low,
            Ok(_) => w.kind(),
            Err(e) => return Err(TchError::Torch(e.to_string())),
        };
        KvCache::new(&self.dims, batch, capacity.min(self.dims.max_seq), kind, w.device())
    }

    /// Incremental decoding: feeds `idx` (B, T) (`real` (B, T) false at left padding)
    /// after the tokens already in `cache`, and returns the logits of the last new
    /// position (B, vocab).
    pub fn decode(&self, idx: &Tensor, real: &Tensor, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let t = idx.size()[1];
        let (positions, mask) = cache.prepare(real)?;
        let step = Step { positions: &positions, mask: &mask, start: Start::At(cache.len()), keys: cache.capacity() };
        let logits = self.decode_blocks(idx, &step, cache)?;
        cache.commit(t)?;
        Ok(logits)
    }

    /// One token a row (`idx` (B, 1)) at the cache's device cursor, which is at slot
    /// `position`, attending to its first `keys` slots ([`KvCache::prepare_static`]): the
    /// logits (B, vocab) of the step a CUDA graph captures. Every write goes in place into
    /// the cache's own tensors.
    pub fn decode_static(
        &self,
        idx: &Tensor,
        cache: &mut KvCache,
        position: i64,
        keys: i64,
    ) -> Result<Tensor, TchError> {
        let (positions, mask) = cache.prepare_static(position, keys)?;
        let cursor = cache.cursor();
        let step = Step { positions: &positions, mask: &mask, start: Start::Cursor(&cursor), keys };
        let logits = self.decode_blocks(idx, &step, cache)?;
        cache.advance_static()?;
        Ok(logits)
    }

    /// The blocks and the head over `idx` (B, T) placed by `step`: the last position's
    /// logits (B, vocab).
    fn decode_blocks(&self, idx: &Tensor, step: &Step, cache: &mut KvCache) -> Result<Tensor, TchError> {
        let _any_backend = AllSdpBackends::enable().map_err(|e| TchError::Torch(e.to_string()))?;
        let t = idx.size()[1];
        let mut x = self.embed_tokens.forward(idx)?;
        if let Some(wpe) = &self.wpe {
            x = x.f_add(&wpe.forward(step.positions)?)?;
        }
        for (block, kv) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = match block {
                Block::Llama(b) => {
                    b.forward_cached(&x, self.rope.as_ref().expect("LLaMA models have RoPE tables"), step, kv)?
                }
                Block::Gpt2(b) => b.forward_cached(&x, step, kv)?,
            };
        }
        self.head(&x.f_narrow(1, t - 1, 1)?)?.f_squeeze_dim(1)
    }

    /// Mean next-token cross-entropy in f32, over the targets that count.
    pub fn loss(&self, idx: &Tensor, targets: &Tensor, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        cross_entropy(&self.logits_of(idx, docs)?, targets)
    }

    /// Forward and backward with activation recomputation for the first `recompute`
    /// blocks: their forward keeps only each block's input, and backward recomputes them
    /// one at a time; the later blocks keep their activations as usual. The loss is
    /// chunked as in [`Self::backward_chunked`]. Gradients accumulate exactly as
    /// `(loss * scale).backward()` would, each parameter's in one accumulation; returns
    /// the unscaled loss, detached.
    pub fn backward_checkpointed(
        &self,
        idx: &Tensor,
        targets: &Tensor,
        scale: f64,
        chunk: i64,
        recompute: usize,
    ) -> Result<Tensor, TchError> {
        self.backward_with(idx, targets, scale, chunk, recompute, &Resident, None).map_err(|e| match e {
            crate::Error::Torch(e) => e,
            other => TchError::Torch(other.to_string()),
        })
    }

    /// [`Self::backward_checkpointed`] with the parameters held by `units`: each unit is
    /// gathered before it runs and released when its part of the pass is done, the
    /// next one prefetched. A recomputed block is gathered twice (its forward, then its
    /// recomputation and backward); a block that keeps its activations stays gathered
    /// from its forward to its backward; the embedding is gathered again for its
    /// gradient unless the head reads it (tied).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_with(
        &self,
        idx: &Tensor,
        targets: &Tensor,
        scale: f64,
        chunk: i64,
        recompute: usize,
        units: &dyn Residency,
        docs: Option<&Documents>,
    ) -> Result<Tensor, crate::Error> {
        let n = self.blocks.len();
        let r = recompute.min(n);
        if r == 0 && units.resident() {
            return Ok(self.backward_chunked(idx, targets, scale, chunk, docs)?);
        }
        let tied = self.lm_head.is_none();
        let after = |i: usize| if i + 1 < n { Unit::Block(i + 1) } else { Unit::Head };
        units.gather(Unit::Embedding)?;
        units.prefetch(if n > 0 { Unit::Block(0) } else { Unit::Head })?;
        let emb = self.embed(idx, docs)?;
        if !tied {
            units.release(Unit::Embedding)?;
        }
        let mut inputs = Vec::with_capacity(r);
        let mut x = emb.f_detach()?;
        {
            let _no_grad = tch::no_grad_guard();
            for i in 0..r {
                units.gather(Unit::Block(i))?;
                units.prefetch(after(i))?;
                let next = self.block(i, &x, docs)?;
                units.release(Unit::Block(i))?;
                inputs.push(std::mem::replace(&mut x, next));
            }
        }
        // Blocks r.. form one ordinary graph from a leaf at their input.
        let kept_in = x.f_detach()?.f_requires_grad_(true)?;
        let mut top = kept_in.shallow_clone();
        for i in r..n {
            units.gather(Unit::Block(i))?;
            units.prefetch(after(i))?;
            top = self.block(i, &top, docs)?;
        }
        units.gather(Unit::Head)?;
        let (loss, mut grad, head) = self.head_backward_chunked(&top.f_detach()?, targets, scale, chunk)?;
        // The head's own parameters go with the first backward pass, so data
        // parallelism can send them early; a tied embedding goes with the last.
        let (tied_grads, mut untied): (Vec<_>, Vec<_>) = head.into_iter().partition(|(_, _, tied)| *tied);
        let mut head_gathered = true;
        if r < n {
            if r > 0 {
                units.prefetch(Unit::Block(r - 1))?;
            }
            backward_from(top, grad, untied.drain(..))?;
            grad = kept_in.f_grad()?;
            units.release(Unit::Head)?;
            head_gathered = false;
            for i in r..n {
                units.release(Unit::Block(i))?;
            }
        }
        for (i, input) in inputs.iter().enumerate().rev() {
            units.gather(Unit::Block(i))?;
            units.prefetch(if i > 0 { Unit::Block(i - 1) } else { Unit::Embedding })?;
            let xi = input.f_detach()?.f_requires_grad_(true)?;
            backward_from(self.block(i, &xi, docs)?, grad, untied.drain(..))?;
            if head_gathered {
                units.release(Unit::Head)?;
                head_gathered = false;
            }
            units.release(Unit::Block(i))?;
            grad = xi.f_grad()?;
        }
        // Its gradient accumulates into the whole parameter.
        units.gather(Unit::Embedding)?;
        backward_from(emb, grad, untied.into_iter().chain(tied_grads))?;
        if head_gathered {
            units.release(Unit::Head)?;
        }
        units.release(Unit::Embedding)?;
        Ok(loss)
    }
}

/// The head's parameter gradients from [`Model::head_backward_chunked`]:
/// (parameter, gradient, whether it is the tied token embedding).
type HeadGrads = Vec<(Tensor, Tensor, bool)>;

/// One backward pass: `grad` from `out`, and each head parameter's gradient from the
/// parameter itself, which the engine sums with what reaches it through `out`.
fn backward_from(
    out: Tensor,
    grad: Tensor,
    head: impl IntoIterator<Item = (Tensor, Tensor, bool)>,
) -> Result<(), TchError> {
    let (mut roots, mut grads) = (vec![out], vec![grad]);
    for (p, g, _) in head {
        roots.push(p);
        grads.push(g);
    }
    crate::ffi::backward(&roots, &grads)
}

/// Mean cross-entropy of logits (B, T, V) against targets (B, T), in f32.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor, TchError> {
    let v = *logits.size().last().expect("logits have a vocab dimension");
    logits.f_to_kind(Kind::Float)?.f_view([-1, v])?.f_cross_entropy_loss(
        &targets.f_reshape([-1])?,
        None::<Tensor>,
        Reduction::Mean,
        -100,
        0.0,
    )
}

#[cfg(test)]
pub(crate) mod tests;
