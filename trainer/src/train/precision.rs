//! The dtypes a `spec.precision` trains in on a device.

use crds::types::Precision;
use tch::{Device, Kind, Tensor};

use crate::Error;

/// The device and dtype a precision runs with, and a plain description.
pub fn precision_plan(precision: Precision, device: Device) -> (Kind, bool, &'static str) {
    match (precision, device.is_cuda()) {
        (Precision::F32, _) => (Kind::Float, false, "f32"),
        (Precision::Bf16, _) => (Kind::BFloat16, false, "bf16 weights, gradients and optimizer state"),
        (Precision::Bf16Mixed, true) => (Kind::Float, true, "f32 master weights, bf16 autocast"),
        (Precision::Bf16Mixed, false) => (
            Kind::Float,
            false,
            "f32 (bf16-mixed autocasts on CUDA only: bf16 matmuls are slower than f32 on most CPUs)",
        ),
    }
}

/// The dtype the model's matmuls run in on `device`: the weights' `kind`, or what
/// autocast casts them to. Read from a probe matmul, so logs and benchmarks report what
/// libtorch does, and a `bf16-mixed` that would not run bf16 is an error.
pub fn matmul_kind(kind: Kind, autocast: bool, device: Device) -> Result<Kind, Error> {
    let a = Tensor::f_ones([2, 2], (kind, device))?;
    let got = crate::ffi::autocast(device, autocast, || a.f_matmul(&a))?.kind();
    if autocast && got != Kind::BFloat16 {
        return Err(Error::Shim(format!("bf16 autocast on {device:?} ran a probe matmul in {got:?}")));
    }
    Ok(got)
}
