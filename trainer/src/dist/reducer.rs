//! Gradient synchronization for data parallelism: parameters are grouped into flat
//! buckets of about `bucket_cap` bytes in reverse definition order (the order backward
//! produces their gradients), and each bucket is all-reduced from an AccumulateGrad
//! hook in the shim as soon as it is full, overlapping communication with the rest of
//! backward. Only the last micro-step of an accumulation is synchronized.

use std::ffi::{c_char, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

use super::group::ProcessGroup;
use crate::Error;
use crate::ffi::{ptrs, take_message};

mod raw {
    use super::*;

    unsafe extern "C" {
        pub fn shim_reducer_new(
            g: *mut c_void,
            params: *const *mut C_tensor,
            bucket_of: *const i64,
            n: usize,
            n_buckets: usize,
            out: *mut *mut c_void,
        ) -> *mut c_char;
        pub fn shim_reducer_free(r: *mut c_void);
        pub fn shim_reducer_prepare(r: *mut c_void) -> *mut c_char;
        pub fn shim_reducer_finish(r: *mut c_void) -> *mut c_char;
    }
}

/// torch DDP's default bucket size.
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;

/// Bucket of each parameter, given `(bytes, kind, device)` in definition order: walk
/// them in reverse, start a new bucket when the next one would pass `cap_bytes` or
/// changes dtype or device. Bucket 0 holds the last-defined parameters.
pub fn assign_buckets(params: &[(usize, Kind, Device)], cap_bytes: usize) -> Vec<i64> {
    let mut bucket_of = vec![0; params.len()];
    let (mut bucket, mut filled, mut key) = (-1i64, 0usize, None);
    for i in (0..params.len()).rev() {
        let (bytes, kind, device) = params[i];
        if bucket < 0 || key != Some((kind, device)) || (filled > 0 && filled + bytes > cap_bytes) {
            bucket += 1;
            filled = 0;
            key = Some((kind, device));
        }
        filled += bytes;
        bucket_of[i] = bucket;
    }
    bucket_of
}

/// Averages gradients over the ranks of a group.
pub struct GradReducer {
    raw: NonNull<c_void>,
    n_buckets: usize,
    // The shim keeps a raw pointer to the group: it must outlive the reducer.
    _group: Arc<ProcessGroup>,
}

// SAFETY: the shim's reducer locks its own state.
unsafe impl Send for GradReducer {}

impl GradReducer {
    /// `params` in definition order (leaves that require grad). Buckets go out from
    /// hooks during backward, so between `prepare` and `finish` each parameter must
    /// get its whole gradient in one accumulation, as the model's backward passes do
    /// (a second one is an error).
    pub fn new(group: Arc<ProcessGroup>, params: &[Tensor], bucket_cap_bytes: usize) -> Result<GradReducer, Error> {
        let sizes: Vec<_> =
            params.iter().map(|p| (p.numel() * p.kind().elt_size_in_bytes(), p.kind(), p.device())).collect();
        let bucket_of = assign_buckets(&sizes, bucket_cap_bytes.max(1));
        let n_buckets = bucket_of.iter().max().map_or(0, |&b| b as usize + 1);
        let p = ptrs(params);
        let mut out = std::ptr::null_mut();
        // SAFETY: live tensors and a parallel bucket list; the shim keeps its own references.
        let err = unsafe {
            raw::shim_reducer_new(group.as_raw(), p.as_ptr(), bucket_of.as_ptr(), p.len(), n_buckets, &mut out)
        };
        if let Some(m) = take_message(err) {
            return Err(Error::Shim(format!("gradient reducer: {m}")));
        }
        Ok(GradReducer { raw: NonNull::new(out).expect("the shim returns a reducer"), n_buckets, _group: group })
    }

    pub fn n_buckets(&self) -> usize {
        self.n_buckets
    }

    /// Arms the reducer: the next backward pass's gradients are synchronized.
    pub fn prepare(&self) -> Result<(), Error> {
        // SAFETY: a live reducer.
        let err = unsafe { raw::shim_reducer_prepare(self.raw.as_ptr()) };
        take_message(err).map_or(Ok(()), |m| Err(self.error(m)))
    }

    /// After the armed backward: waits for every bucket and leaves each parameter's
    /// gradient averaged over the ranks.
    pub fn finish(&self) -> Result<(), Error> {
        // SAFETY: a live reducer.
        let err = unsafe { raw::shim_reducer_finish(self.raw.as_ptr()) };
        take_message(err).map_or(Ok(()), |m| Err(self.error(m)))
    }

    fn error(&self, message: String) -> Error {
        Error::Collective {
            op: "gradient all-reduce".into(),
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

    const F: (Kind, Device) = (Kind::Float, Device::Cpu);

    #[test]
    fn buckets_fill_in_reverse_definition_order_up_to_the_cap() {
        let p = |bytes| (bytes, F.0, F.1);
        // Reverse order: 40 (b0) 30 → 70 ≤ 100 (b0) 50 → 120 > 100 (b1) 60 → 110 > 100 (b2) 10 (b2)
        let b = assign_buckets(&[p(10), p(60), p(50), p(30), p(40)], 100);
        assert_eq!(b, vec![2, 2, 1, 0, 0]);
    }

    #[test]
    fn a_parameter_larger_than_the_cap_gets_its_own_bucket() {
        let p = |bytes| (bytes, F.0, F.1);
        assert_eq!(assign_buckets(&[p(1), p(500), p(1)], 100), vec![2, 1, 0]);
    }

    #[test]
    fn dtypes_never_share_a_bucket() {
        let b = assign_buckets(
            &[(4, Kind::Float, Device::Cpu), (2, Kind::BFloat16, Device::Cpu), (4, Kind::Float, Device::Cpu)],
            1 << 20,
        );
        assert_eq!(b, vec![2, 1, 0]);
    }

    #[test]
    fn no_parameters_no_buckets() {
        assert!(assign_buckets(&[], 100).is_empty());
    }
}
