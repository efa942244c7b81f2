//! The row kernels (csrc/rows.cpp, csrc/row_kernels.h): the residual add with the RMSNorm
//! after it as one autograd node, and the loss chunk's logits turned into their gradient
//! in place. CUDA only; elsewhere each call is an error naming the device.

use std::ffi::{c_char, c_int};

use tch::{Kind, TchError, Tensor};
use torch_sys::C_tensor;

use super::message::take_message;

unsafe extern "C" {
    fn shim_residual_rms_norm(
        x: *const C_tensor,
        branch: *const C_tensor,
        weight: *const C_tensor,
        eps: f64,
        out_dtype: c_int,
        out: *mut *mut C_tensor,
        sum: *mut *mut C_tensor,
    ) -> *mut c_char;
    fn shim_cross_entropy_chunk(
        logits: *mut C_tensor,
        targets: *const C_tensor,
        ignore_index: i64,
        grad_scale: *const C_tensor,
        loss: *mut *mut C_tensor,
    ) -> *mut c_char;
}

/// `kind` as its `at::ScalarType` value (tch keeps its own conversion private).
fn scalar_type(kind: Kind) -> c_int {
    match kind {
        Kind::Uint8 => 0,
        Kind::Int8 => 1,
        Kind::Int16 => 2,
        Kind::Int => 3,
        Kind::Int64 => 4,
        Kind::Half => 5,
        Kind::Float => 6,
        Kind::Double => 7,
        Kind::ComplexHalf => 8,
        Kind::ComplexFloat => 9,
        Kind::ComplexDouble => 10,
        Kind::Bool => 11,
        Kind::QInt8 => 12,
        Kind::QUInt8 => 13,
        Kind::QInt32 => 14,
        Kind::BFloat16 => 15,
        _ => -1,
    }
}

/// What [`residual_rms_norm`] returns.
#[derive(Debug)]
pub struct Normed {
    /// RMSNorm(x + branch)·weight over the last dimension, in the requested dtype.
    pub out: Tensor,
    /// x + branch in x's dtype (the residual stream the next layer adds to); `None`
    /// without a branch.
    pub sum: Option<Tensor>,
}

/// RMSNorm of `x + branch` (or of `x`) over the last dimension with `weight`, as one
/// autograd node on the fused row kernels: the sum rounded to x's dtype as eager's add,
/// the norm in f32, stored once in `out` (autocast's dtype, where eager would store f32
/// and cast again). x, branch and weight are f32 or bf16, each its own.
pub fn residual_rms_norm(
    x: &Tensor,
    branch: Option<&Tensor>,
    weight: &Tensor,
    eps: f64,
    out: Kind,
) -> Result<Normed, TchError> {
    let (mut normed, mut sum): (*mut C_tensor, *mut C_tensor) = (std::ptr::null_mut(), std::ptr::null_mut());
    let branch = branch.map_or(std::ptr::null(), |b| b.as_ptr());
    // SAFETY: live tensors or null for the branch; on success the shim hands us new
    // at::Tensor*s (sum only with a branch).
    let err = unsafe {
        shim_residual_rms_norm(x.as_ptr(), branch, weight.as_ptr(), eps, scalar_type(out), &mut normed, &mut sum)
    };
    take_message(err).map_or(Ok(()), |m| Err(TchError::Torch(format!("residual_rms_norm: {m}"))))?;
    // SAFETY: heap at::Tensors that tch's Tensor takes ownership of.
    let out = unsafe { Tensor::from_ptr(normed) };
    let sum = (!sum.is_null()).then(|| unsafe { Tensor::from_ptr(sum) });
    Ok(Normed { out, sum })
}

/// The loss chunk in one kernel: `logits` (rows, vocab), contiguous, are overwritten by
/// their gradient `(softmax − one-hot(target))·grad_scale` (zero where the target is
/// `ignore_index`); returns each row's loss `logsumexp − logit[target]` in f32 (0 where
/// ignored). `grad_scale` is a 0-dim f32 tensor on the device, so nothing syncs.
pub fn cross_entropy_chunk(
    logits: &mut Tensor,
    targets: &Tensor,
    ignore_index: i64,
    grad_scale: &Tensor,
) -> Result<Tensor, TchError> {
    let mut loss: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors, logits borrowed mutably for the in-place write; on success
    // the shim hands us a new at::Tensor*.
    let err = unsafe {
        shim_cross_entropy_chunk(logits.as_mut_ptr(), targets.as_ptr(), ignore_index, grad_scale.as_ptr(), &mut loss)
    };
    take_message(err).map_or(Ok(()), |m| Err(TchError::Torch(format!("cross_entropy_chunk: {m}"))))?;
    // SAFETY: a heap at::Tensor that tch's Tensor takes ownership of.
    Ok(unsafe { Tensor::from_ptr(loss) })
}

/// Compiling the row kernels through the launch path's own NVRTC, which needs no GPU.
#[cfg(feature = "cuda")]
pub mod compile {
    use std::ffi::{CString, c_char, c_int};

    use tch::Kind;

    use super::super::message::check;
    use crate::Error;

    unsafe extern "C" {
        #[allow(clippy::too_many_arguments)]
        fn shim_row_kernel_compile(
            name: *const c_char,
            stream: c_int,
            branch: c_int,
            weight: c_int,
            out: c_int,
            capability: c_int,
            bytes: *mut usize,
            target: *mut c_char,
            target_len: usize,
        ) -> *mut c_char;
    }

    /// The dtypes one kernel is compiled for: the residual stream, the branch added to it,
    /// the norm's weight, the norm's output (the loss chunk's logits).
    #[derive(Clone, Copy, Debug)]
    pub struct RowKinds {
        pub stream: Kind,
        pub branch: Kind,
        pub weight: Kind,
        pub out: Kind,
    }

    /// What NVRTC produced: the binary's size and its target (`sm_90` for a CUBIN,
    /// `compute_90` for PTX the driver finishes).
    #[derive(Debug)]
    pub struct Compiled {
        pub bytes: usize,
        pub target: String,
    }

    /// Compiles `kernel` (its entry point's name) for `kinds` and compute capability
    /// `capability` (major·10 + minor).
    pub fn row_kernel(kernel: &str, kinds: RowKinds, capability: i32) -> Result<Compiled, Error> {
        let name = CString::new(kernel).map_err(|_| Error::Shim(format!("kernel name {kernel:?} has a NUL")))?;
        let (mut bytes, mut target) = (0usize, [0 as c_char; 32]);
        // SAFETY: a NUL-terminated name and a target buffer of the length given.
        let err = unsafe {
            shim_row_kernel_compile(
                name.as_ptr(),
                super::scalar_type(kinds.stream),
                super::scalar_type(kinds.branch),
                super::scalar_type(kinds.weight),
                super::scalar_type(kinds.out),
                capability,
                &mut bytes,
                target.as_mut_ptr(),
                target.len(),
            )
        };
        check("row_kernel_compile", err)?;
        // SAFETY: the shim wrote a NUL-terminated string within the buffer.
        let target = unsafe { std::ffi::CStr::from_ptr(target.as_ptr()) }.to_string_lossy().into_owned();
        Ok(Compiled { bytes, target })
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;

    fn randn(shape: &[i64], kind: Kind) -> Tensor {
        Tensor::randn(shape, (kind, Device::Cpu))
    }

    /// Bad arguments are refused with the argument named, before anything runs; on the CPU
    /// the kernels are refused with the device named.
    #[test]
    fn the_norm_names_what_is_wrong() {
        let (x, w) = (randn(&[3, 8], Kind::Float), randn(&[8], Kind::Float));
        let err = |r: Result<Normed, TchError>| r.unwrap_err().to_string();
        let cases = [
            (err(residual_rms_norm(&x.to_kind(Kind::Double), None, &w, 1e-5, Kind::Float)), "x is Double"),
            (err(residual_rms_norm(&x, None, &randn(&[7], Kind::Float), 1e-5, Kind::Float)), "weight [7] is not (8)"),
            (
                err(residual_rms_norm(&x, Some(&randn(&[3, 7], Kind::Float)), &w, 1e-5, Kind::Float)),
                "branch [3, 7] and x [3, 8] differ in shape",
            ),
            (err(residual_rms_norm(&x, None, &w, 1e-5, Kind::Half)), "the output dtype is Half"),
            (
                err(residual_rms_norm(
                    &randn(&[2, 20000], Kind::Float),
                    None,
                    &randn(&[20000], Kind::Float),
                    1e-5,
                    Kind::Float,
                )),
                "last dimension 20000 is outside",
            ),
        ];
        for (got, want) in cases {
            assert!(got.contains(want), "{got:?} does not say {want:?}");
        }
        let on_cpu = err(residual_rms_norm(&x, Some(&x), &w, 1e-5, Kind::BFloat16));
        let want = if cfg!(feature = "cuda") { "run on CUDA only, not on cpu" } else { "built with the cuda feature" };
        assert!(on_cpu.contains(want), "{on_cpu}");
    }

    #[test]
    fn the_loss_chunk_names_what_is_wrong() {
        let scale = Tensor::from(0.5f32);
        let targets = Tensor::from_slice(&[1i64, -100, 3]);
        let err = |mut logits: Tensor, targets: &Tensor, scale: &Tensor| {
            cross_entropy_chunk(&mut logits, targets, -100, scale).unwrap_err().to_string()
        };
        let cases = [
            (err(randn(&[3, 10], Kind::Float).transpose(0, 1), &targets, &scale), "logits must be contiguous"),
            (err(randn(&[3, 10], Kind::Float), &targets.narrow(0, 0, 2), &scale), "targets must be int64 (3)"),
            (err(randn(&[3, 10], Kind::Float), &targets, &Tensor::from_slice(&[0.5f32])), "grad_scale must be a 0-dim"),
            (err(randn(&[3, 10], Kind::Half), &targets, &scale), "logits is Half"),
        ];
        for (got, want) in cases {
            assert!(got.contains(want), "{got:?} does not say {want:?}");
        }
        let on_cpu = err(randn(&[3, 10], Kind::Float), &targets, &scale);
        let want = if cfg!(feature = "cuda") { "run on CUDA only, not on cpu" } else { "built with the cuda feature" };
        assert!(on_cpu.contains(want), "{on_cpu}");
    }

    /// Every kernel compiles through the shim's own NVRTC for every precision's dtypes, to
    /// a CUBIN for the GPUs this NVRTC knows (A100, H100) and to PTX for one it does not.
    #[cfg(feature = "cuda")]
    #[test]
    fn the_row_kernels_compile_through_the_launch_path() {
        use super::compile::{RowKinds, row_kernel};
        let (f, b) = (Kind::Float, Kind::BFloat16);
        let mixes = [
            RowKinds { stream: f, branch: f, weight: f, out: f },
            RowKinds { stream: b, branch: b, weight: b, out: b },
            RowKinds { stream: f, branch: b, weight: f, out: b },
        ];
        for kernel in ["residual_rms_norm_forward", "residual_rms_norm_backward", "cross_entropy_chunk"] {
            for kinds in mixes {
                for (capability, target) in [(80, "sm_80"), (90, "sm_90")] {
                    let c = row_kernel(kernel, kinds, capability).unwrap();
                    assert_eq!(c.target, target, "{kernel} {kinds:?}");
                    assert!(c.bytes > 1000, "{kernel} {kinds:?}: {c:?}");
                }
            }
        }
        // An architecture newer than any this NVRTC knows gets PTX for the newest it does.
        let c = row_kernel("cross_entropy_chunk", mixes[0], 990).unwrap();
        assert!(c.target.starts_with("compute_"), "{c:?}");
        let err = row_kernel("no_such_kernel", mixes[0], 90).unwrap_err().to_string();
        assert!(err.contains("no row kernel named no_such_kernel"), "{err}");
    }
}
