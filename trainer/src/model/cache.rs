//! Keys and values of every layer for incremental decoding. Rows may be left-padded
//! to a common prompt length: each row has its own positions, and padding is never
//! attended to. Besides the host's count of tokens held, the cache keeps the same count
//! on the device (its cursor), so that the one-token step of [`KvCache::prepare_static`]
//! reads and writes only device tensors in place, and a CUDA graph that captured it
//! replays at the next position.

use tch::{Device, Kind, TchError, Tensor};

use super::dims::Dims;

/// Where a step's new tokens go in the cache.
pub enum Start<'a> {
    /// At this index (the host's count).
    At(i64),
    /// At the cache's device cursor (a 1-element int64 tensor): one token a row.
    Cursor(&'a Tensor),
}

/// One decoding call's view of the cache for the blocks: where the new tokens sit.
pub struct Step<'a> {
    /// (B, T_new) position of each new token in its own row (RoPE / learned positions).
    pub positions: &'a Tensor,
    /// (B, 1, T_new, keys) true where a new token may attend to a key.
    pub mask: &'a Tensor,
    /// Where the first new token goes.
    pub start: Start<'a>,
    /// The keys attended: the cache's first `keys` slots (its capacity, or a bucket of it).
    pub keys: i64,
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
    /// (1) int64: `len` on the device.
    cursor: Tensor,
    /// (1, capacity) int64: 0, 1, … capacity − 1, each key's slot.
    slots: Tensor,
    /// Whether a static step has moved the cursor past the host count.
    stepped_static: bool,
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
            cursor: Tensor::f_zeros([1], (Kind::Int64, device))?,
            slots: Tensor::f_arange(capacity, (Kind::Int64, device))?.f_unsqueeze(0)?,
            stepped_static: false,
        })
    }

    /// The tokens it can hold.
    pub fn capacity(&self) -> i64 {
        self.capacity
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
        if self.stepped_static {
            return Err(TchError::Shape("this KV cache was advanced by static steps; only they may go on".into()));
        }
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

    pub(super) fn commit(&mut self, t: i64) -> Result<(), TchError> {
        self.len += t;
        let _ = self.cursor.f_fill_(self.len)?;
        Ok(())
    }

    /// One real token a row at the device cursor, which the caller knows to be at
    /// `position`, attending to the first `keys` slots (past the position, at most the
    /// capacity): returns the new tokens' positions (B, 1) and attention mask
    /// (B, 1, 1, keys); [`Self::advance_static`] afterwards. Only in-place writes to the
    /// cache's own tensors, no host sync and no shape that depends on the position: the
    /// step a CUDA graph captures once per `keys` and replays at later positions. The
    /// host count stays at what eager decoding left, so [`Self::prepare`] refuses from
    /// then on.
    pub(super) fn prepare_static(&mut self, position: i64, keys: i64) -> Result<(Tensor, Tensor), TchError> {
        if position < self.len || position >= keys || keys > self.capacity {
            return Err(TchError::Shape(format!(
                "a decoding step over {keys} keys cannot write slot {position} of a KV cache of {} tokens \
                 ({} written eagerly)",
                self.capacity, self.len
            )));
        }
        self.stepped_static = true;
        // (B, 1), a copy: seen moves on below.
        let mut positions = self.seen.f_unsqueeze(1)?.f_empty_like()?;
        positions.f_copy_(&self.seen.f_unsqueeze(1)?)?;
        let _ = self.valid.f_index_fill_(1, &self.cursor, 1i64)?;
        let causal = self.slots.f_narrow(1, 0, keys)?.f_le_tensor(&self.cursor)?; // (1, keys)
        let mask = self.valid.f_narrow(1, 0, keys)?.f_logical_and(&causal)?; // (B, keys)
        let _ = self.seen.f_add_scalar_(1)?;
        Ok((positions, mask.f_unsqueeze(1)?.f_unsqueeze(1)?))
    }

    /// The device cursor, for [`Start::Cursor`].
    pub(super) fn cursor(&self) -> Tensor {
        self.cursor.shallow_clone()
    }

    /// After a step of [`Self::prepare_static`]: the device cursor moves on, in place.
    pub(super) fn advance_static(&mut self) -> Result<(), TchError> {
        let _ = self.cursor.f_add_scalar_(1)?;
        Ok(())
    }

    /// Whether `other` holds the same keys, values, positions and cursor.
    #[cfg(test)]
    pub(crate) fn same_as(&self, other: &KvCache) -> Result<bool, TchError> {
        let close = |a: &Tensor, b: &Tensor| -> Result<bool, TchError> {
            Ok(a.size() == b.size()
                && a.f_to_kind(Kind::Double)?
                    .f_sub(&b.f_to_kind(Kind::Double)?)?
                    .f_abs()?
                    .f_max()?
                    .f_double_value(&[])?
                    < 1e-5)
        };
        for ((k, v), (k2, v2)) in self.layers.iter().zip(&other.layers) {
            if !close(k, k2)? || !close(v, v2)? {
                return Ok(false);
            }
        }
        Ok(self.valid.equal(&other.valid) && self.seen.equal(&other.seen) && self.cursor.equal(&other.cursor))
    }
}

/// Writes `k`, `v` (B, H, T, d_head) where `step` puts them and returns the buffers' first
/// `step.keys` slots (B, H, keys, d_head), which [`Step::mask`] covers.
pub(super) fn extend(
    kv: &mut (Tensor, Tensor),
    k: &Tensor,
    v: &Tensor,
    step: &Step,
) -> Result<(Tensor, Tensor), TchError> {
    match step.start {
        Start::At(start) => {
            let t = k.size()[2];
            kv.0.f_narrow(2, start, t)?.f_copy_(k)?;
            kv.1.f_narrow(2, start, t)?.f_copy_(v)?;
        }
        Start::Cursor(cursor) => {
            let _ = kv.0.f_index_copy_(2, cursor, k)?;
            let _ = kv.1.f_index_copy_(2, cursor, v)?;
        }
    }
    Ok((kv.0.f_narrow(2, 0, step.keys)?, kv.1.f_narrow(2, 0, step.keys)?))
}
