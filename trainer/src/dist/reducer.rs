//! Gradient synchronization for data parallelism: parameters are grouped into flat
//! buckets of about `bucket_cap` bytes in reverse definition order (the order backward
//! produces their gradients), and each bucket goes out from an AccumulateGrad hook in
//! the shim as soon as it is full, overlapping communication with the rest of
//! backward.
//!
//! Under DDP and ZeRO-1 each bucket is all-reduced and every rank gets every averaged
//! gradient back in `.grad`; only the last micro-step of an accumulation is
//! synchronized. Under ZeRO-2 ([`GradReducer::scattering`]) every gradient is added
//! into its bucket and freed as soon as autograd produces it, on every micro-step, and
//! on the last one each bucket is reduce-scattered as it fills: each rank keeps only
//! its shard of the average. The buckets accumulate as autograd would, and Gloo's
//! reduce-scatter sums as its all-reduce does, so the shards hold DDP's values bit for
//! bit.
//!
//! Every strategy clips by [`GradReducer::grad_norm`], the norm of the per-shard norms
//! of the buckets, which each can compute from the same values in the same order.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

use super::group::{ProcessGroup, ReduceOp};
use super::shard::{ShardLayout, cache_line_alignment};
use crate::Error;
use crate::ffi::{StreamMark, ptrs, take_message};

mod raw {
    use std::ffi::{c_char, c_int, c_void};

    use torch_sys::C_tensor;

    unsafe extern "C" {
        pub fn shim_reducer_new(
            g: *mut c_void,
            params: *const *mut C_tensor,
            bucket_of: *const i64,
            offset_of: *const i64,
            n: usize,
            bucket_len: *const i64,
            shard_grads: *const *mut C_tensor,
            n_buckets: usize,
            out: *mut *mut c_void,
        ) -> *mut c_char;
        pub fn shim_reducer_free(r: *mut c_void);
        pub fn shim_reducer_prepare(r: *mut c_void, sync: c_int) -> *mut c_char;
        pub fn shim_reducer_shard_norms(r: *mut c_void, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn shim_reducer_finish(r: *mut c_void) -> *mut c_char;
    }
}

/// torch DDP's default bucket size.
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;

/// What bucketing needs to know of a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketItem {
    pub bytes: usize,
    pub kind: Kind,
    pub device: Device,
    /// The group of parameters it belongs to (fsdp's units: the head, each block, the
    /// embedding); a bucket never spans two, so every strategy can share one layout.
    pub unit: usize,
}

impl BucketItem {
    /// `p` in `unit`.
    pub fn of(p: &Tensor, unit: usize) -> BucketItem {
        BucketItem { bytes: p.numel() * p.kind().elt_size_in_bytes(), kind: p.kind(), device: p.device(), unit }
    }
}

/// Bucket of each parameter, given in definition order: walk them in reverse, start a
/// new bucket when the next one would pass `cap_bytes` or changes dtype, device or
/// unit. Bucket 0 holds the last-defined parameters.
pub fn assign_buckets(params: &[BucketItem], cap_bytes: usize) -> Vec<i64> {
    let mut bucket_of = vec![0; params.len()];
    let (mut bucket, mut filled, mut key) = (-1i64, 0usize, None);
    for i in (0..params.len()).rev() {
        let p = params[i];
        let k = (p.kind, p.device, p.unit);
        if bucket < 0 || key != Some(k) || (filled > 0 && filled + p.bytes > cap_bytes) {
            bucket += 1;
            filled = 0;
            key = Some(k);
        }
        filled += p.bytes;
        bucket_of[i] = bucket;
    }
    bucket_of
}

/// Averages gradients over the ranks of a group.
pub struct GradReducer {
    raw: NonNull<c_void>,
    n_buckets: usize,
    scattering: bool,
    /// Where the parameters (and so the backward pass) live.
    device: Device,
    /// Where this rank's own work of the last accumulation ended: marked as
    /// [`Self::finish`] starts to wait for the buckets, before any peer can slow it.
    compute_end: std::sync::Mutex<Option<StreamMark>>,
    // The shim keeps a raw pointer to the group: it must outlive the reducer.
    _group: Arc<ProcessGroup>,
}

// SAFETY: the shim's reducer locks its own state.
unsafe impl Send for GradReducer {}

impl GradReducer {
    /// An all-reducing reducer. `params` in definition order (leaves that require
    /// grad), each in `units[i]` ([`BucketItem::unit`]). Buckets go out from hooks
    /// during backward, so between `prepare` and `finish` each parameter must get its
    /// whole gradient in one accumulation, as the model's backward passes do (a second
    /// one is an error).
    pub fn new(
        group: Arc<ProcessGroup>,
        params: &[Tensor],
        units: &[usize],
        bucket_cap_bytes: usize,
    ) -> Result<GradReducer, Error> {
        let items: Vec<BucketItem> = params.iter().zip(units).map(|(p, &u)| BucketItem::of(p, u)).collect();
        let bucket_of = assign_buckets(&items, bucket_cap_bytes.max(1));
        let numels: Vec<i64> = params.iter().map(|p| p.numel() as i64).collect();
        // ZeRO's layout, so every strategy sums each element over the ranks in the same
        // order (a ring all-reduce's order depends on where an element lies).
        let align = cache_line_alignment(params.iter().map(Tensor::kind));
        let layout = ShardLayout::new(&numels, &bucket_of, group.world_size(), group.rank(), align);
        Self::build(group, params, &layout, None)
    }

    /// A reduce-scattering reducer (ZeRO-2) over `layout`, built for `params` on this
    /// rank of `group`: the last micro-step of each accumulation leaves this rank's
    /// shard of bucket `b`'s averaged gradients in `shard_grads[b]`
    /// (`layout.buckets[b].shard_len()` elements).
    pub fn scattering(
        group: Arc<ProcessGroup>,
        params: &[Tensor],
        layout: &ShardLayout,
        shard_grads: &[Tensor],
    ) -> Result<GradReducer, Error> {
        if shard_grads.len() != layout.buckets.len() || layout.world != group.world_size() {
            return Err(Error::Shim(format!(
                "gradient reducer: {} gradient shards for {} buckets of a {}-rank layout, in a {}-rank group",
                shard_grads.len(),
                layout.buckets.len(),
                layout.world,
                group.world_size()
            )));
        }
        Self::build(group, params, layout, Some(shard_grads))
    }

    fn build(
        group: Arc<ProcessGroup>,
        params: &[Tensor],
        layout: &ShardLayout,
        shard_grads: Option<&[Tensor]>,
    ) -> Result<GradReducer, Error> {
        let (mut bucket_of, mut offset_of) = (vec![-1i64; params.len()], vec![0i64; params.len()]);
        for (b, bucket) in layout.buckets.iter().enumerate() {
            for m in &bucket.members {
                bucket_of[m.param] = b as i64;
                offset_of[m.param] = m.offset;
            }
        }
        if bucket_of.contains(&-1) {
            return Err(Error::Shim("gradient reducer: the layout does not place every parameter".into()));
        }
        let bucket_len: Vec<i64> = layout.buckets.iter().map(|b| b.padded_len).collect();
        let p = ptrs(params);
        let shards = shard_grads.map(ptrs);
        let mut out = std::ptr::null_mut();
        // SAFETY: live tensors and parallel lists; the shim keeps its own references.
        let err = unsafe {
            raw::shim_reducer_new(
                group.as_raw(),
                p.as_ptr(),
                bucket_of.as_ptr(),
                offset_of.as_ptr(),
                p.len(),
                bucket_len.as_ptr(),
                shards.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                bucket_len.len(),
                &mut out,
            )
        };
        if let Some(m) = take_message(err) {
            return Err(Error::Shim(format!("gradient reducer: {m}")));
        }
        Ok(GradReducer {
            raw: NonNull::new(out).expect("the shim returns a reducer"),
            n_buckets: bucket_len.len(),
            scattering: shard_grads.is_some(),
            device: params.first().map_or(Device::Cpu, Tensor::device),
            compute_end: std::sync::Mutex::new(None),
            _group: group,
        })
    }

    /// Whether the reducer takes part in a micro-step: the last of an accumulation,
    /// and every one when scattering (which keeps no `.grad` between them).
    fn arms(&self, last: bool) -> bool {
        last || self.scattering
    }

    /// Before one micro-step's backward passes; `last`: the accumulation's last.
    pub fn begin_micro_step(&self, last: bool) -> Result<(), Error> {
        if self.arms(last) { self.arm(last) } else { Ok(()) }
    }

    /// After one micro-step's backward passes; on the last, waits for every bucket.
    pub fn end_micro_step(&self, last: bool) -> Result<(), Error> {
        if self.arms(last) { self.finish() } else { Ok(()) }
    }

    /// The global norm of the averaged gradients after the last micro-step: the norm
    /// of every rank's shard norm of every bucket, bucket-major. A collective when
    /// scattering (each rank has its own shards' norms), so every rank calls it.
    pub fn grad_norm(&self) -> Result<Tensor, Error> {
        let mut out: *mut C_tensor = std::ptr::null_mut();
        // SAFETY: a live reducer; on success the shim hands us a new at::Tensor*.
        let err = unsafe { raw::shim_reducer_shard_norms(self.raw.as_ptr(), &mut out) };
        if let Some(m) = take_message(err) {
            return Err(self.error(m));
        }
        // SAFETY: out is a heap at::Tensor that tch's Tensor takes ownership of.
        let table = unsafe { Tensor::from_ptr(out) };
        if self.scattering {
            self._group.allreduce(&table, ReduceOp::Sum)?.wait()?;
        }
        Ok(table.f_view([-1])?.f_norm_scalaropt_dtype(2, Kind::Float)?)
    }

    pub fn n_buckets(&self) -> usize {
        self.n_buckets
    }

    /// Where this rank's own work ended in the last [`Self::finish`] (once): the end of
    /// its compute, before the wait for its peers. Under zero2, which waits at every
    /// micro-step, the earlier micro-steps' waits fall before it.
    pub fn take_compute_end(&self) -> Option<StreamMark> {
        self.compute_end.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Arms the reducer: the next backward pass's gradients are synchronized.
    pub fn prepare(&self) -> Result<(), Error> {
        self.arm(true)
    }

    /// Arms the reducer for the next backward pass, which sends the buckets if `sync`
    /// (otherwise, scattering, it only gathers the gradients into them).
    fn arm(&self, sync: bool) -> Result<(), Error> {
        // SAFETY: a live reducer.
        let err = unsafe { raw::shim_reducer_prepare(self.raw.as_ptr(), c_int::from(sync)) };
        take_message(err).map_or(Ok(()), |m| Err(self.error(m)))
    }

    /// After the armed backward: waits for every bucket and leaves each parameter's
    /// gradient averaged over the ranks (scattering: this rank's shards of the average).
    pub fn finish(&self) -> Result<(), Error> {
        *self.compute_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(StreamMark::now(self.device)?);
        // SAFETY: a live reducer.
        let err = unsafe { raw::shim_reducer_finish(self.raw.as_ptr()) };
        take_message(err).map_or(Ok(()), |m| Err(self.error(m)))
    }

    fn error(&self, message: String) -> Error {
        Error::Collective {
            op: if self.scattering { "gradient reduce-scatter" } else { "gradient all-reduce" }.into(),
            rank: self._group.rank(),
            timeout: self._group.timeout(),
            message,
        }
    }
}

impl Drop for GradReducer {
    fn drop(&mut self) {
        // SAFETY: created by shim_reducer_new, freed once; unregisters its hooks.
        unsafe { raw::shim_reducer_free(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(bytes: usize) -> BucketItem {
        BucketItem { bytes, kind: Kind::Float, device: Device::Cpu, unit: 0 }
    }

    #[test]
    fn buckets_fill_in_reverse_definition_order_up_to_the_cap() {
        // Reverse order: 40 (b0) 30 → 70 ≤ 100 (b0) 50 → 120 > 100 (b1) 60 → 110 > 100 (b2) 10 (b2)
        let b = assign_buckets(&[p(10), p(60), p(50), p(30), p(40)], 100);
        assert_eq!(b, vec![2, 2, 1, 0, 0]);
    }

    #[test]
    fn a_parameter_larger_than_the_cap_gets_its_own_bucket() {
        assert_eq!(assign_buckets(&[p(1), p(500), p(1)], 100), vec![2, 1, 0]);
    }

    #[test]
    fn dtypes_and_units_never_share_a_bucket() {
        let bf16 = BucketItem { kind: Kind::BFloat16, ..p(2) };
        assert_eq!(assign_buckets(&[p(4), bf16, p(4)], 1 << 20), vec![2, 1, 0]);
        let unit = |unit| BucketItem { unit, ..p(4) };
        assert_eq!(assign_buckets(&[unit(2), unit(1), unit(1), unit(0)], 1 << 20), vec![2, 1, 1, 0]);
    }

    #[test]
    fn no_parameters_no_buckets() {
        assert!(assign_buckets(&[], 100).is_empty());
    }
}
