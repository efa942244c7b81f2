//! Keys and values of every layer for incremental decoding. Rows may be left-padded
//! to a common prompt length: each row has its own positions, and padding is never
//! attended to.

use tch::{Device, Kind, TchError, Tensor};

use super::dims::Dims;

/// One decoding call's view of the cache for the blocks: where the new tokens sit.
pub struct Step<'a> {
    /// (B, T_new) position of each new token in its own row (RoPE / learned positions).
    pub positions: &'a Tensor,
    /// (B, 1, T_new, capacity) true where a new token may attend to a key.
    pub mask: &'a Tensor,
    /// Index of the first new token in the cache.
    pub start: i64,
}

/// Preallocated K/V buffers `(B, n_kv_head, capacity, d_head)` per layer.
pub struct KvCache {
    pub(super) layers: Vec<(Tensor, Tensor)>,
    len: i64,
    capacity: i64,
    /// (B, capacity) true where the key is a real token.
    valid: Tensor,
    /// (B) real tokens seen so far in each row: the next token's position.
    seen: Tensor,
}

impl KvCache {
    pub fn new(dims: &Dims, batch: i64, capacity: i64, kind: Kind, device: Device) -> Result<KvCache, TchError> {
        let shape = [batch, dims.n_kv_head, capacity, dims.d_head];
        let layers = (0..dims.n_layer)
            .map(|_| Ok((Tensor::f_zeros(shape, (kind, device))?, Tensor::f_zeros(shape, (kind, device))?)))
            .collect::<Result<_, TchError>>()?;
        Ok(KvCache {
            layers,
            len: 0,
            capacity,
            valid: Tensor::f_zeros([batch, capacity], (Kind::Bool, device))?,
            seen: Tensor::f_zeros([batch], (Kind::Int64, device))?,
        })
    }

    /// Tokens held so far (padding included).
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `t` tokens per row, `real` (B, t) marking which are not padding, and
    /// returns their positions and attention mask; [`Self::commit`] afterwards.
    pub(super) fn prepare(&mut self, real: &Tensor) -> Result<(Tensor, Tensor), TchError> {
        let t = real.size()[1];
        if self.len + t > self.capacity {
            return Err(TchError::Shape(format!(
                "KV cache of {} tokens cannot take {} more after {}",
                self.capacity, t, self.len
            )));
        }
        let device = real.device();
        let real_i = real.f_to_kind(Kind::Int64)?;
        // (B, T_new): the row's position of each token; padding borrows its neighbour's.
        let positions =
            real_i.f_cumsum(1, Kind::Int64)?.f_add(&self.seen.f_unsqueeze(1)?)?.f_sub_scalar(1)?.f_clamp_min(0)?;
        self.valid.f_narrow(1, self.len, t)?.f_copy_(real)?;
        let total = self.len + t;
        // Attention spans the whole capacity, the keys not yet written masked by
        // causality: every decoding step has the same shapes, so backends that plan per
        // shape (cuDNN's) plan once, and a captured step can be replayed.
        let keys = &self.valid; // (B, capacity)
        let q_index = Tensor::f_arange_start(self.len, total, (Kind::Int64, device))?.f_unsqueeze(1)?; // (T_new, 1)
        let k_index = Tensor::f_arange(self.capacity, (Kind::Int64, device))?.f_unsqueeze(0)?; // (1, capacity)
        let causal = k_index.f_le_tensor(&q_index)?; // (T_new, capacity)
        // A padding query attends to itself alone, so no row of the softmax is empty.
        let own = k_index.f_eq_tensor(&q_index)?;
        let mask = causal.f_unsqueeze(0)?.f_logical_and(&keys.f_unsqueeze(1)?)?.f_logical_or(&own.f_unsqueeze(0)?)?;
        self.seen = self.seen.f_add(&real_i.f_sum_dim_intlist(1, false, Kind::Int64)?)?;
        Ok((positions, mask.f_unsqueeze(1)?))
    }

    pub(super) fn commit(&mut self, t: i64) {
        self.len += t;
    }
}

/// Writes `k`, `v` (B, H, T, d_head) at `start` and returns the whole buffers
/// (B, H, capacity, d_head), which [`Step::mask`] covers.
pub(super) fn extend(
    kv: &mut (Tensor, Tensor),
    k: &Tensor,
    v: &Tensor,
    start: i64,
) -> Result<(Tensor, Tensor), TchError> {
    let t = k.size()[2];
    kv.0.f_narrow(2, start, t)?.f_copy_(k)?;
    kv.1.f_narrow(2, start, t)?.f_copy_(v)?;
    Ok((kv.0.shallow_clone(), kv.1.shallow_clone()))
}
