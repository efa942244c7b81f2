//! What libtorch this binary runs on.

use serde_json::{Value, json};
use tch::{Cuda, Device, Kind, Tensor};

/// Versions, devices and a checked matmul on every available device.
pub fn describe() -> Result<Value, tch::TchError> {
    let mut devices = vec![Device::Cpu];
    devices.extend((0..Cuda::device_count()).map(|i| Device::Cuda(i as usize)));
    let checks: Vec<Value> = devices
        .iter()
        .map(|&d| matmul_check(d).map(|ok| json!({"device": format!("{d:?}"), "bf16MatmulOk": ok})))
        .collect::<Result<_, _>>()?;
    Ok(json!({
        "torchCrate": "tch 0.24.0",
        "cudaFeature": cfg!(feature = "cuda"),
        "cudaAvailable": Cuda::is_available(),
        "cudaDevices": Cuda::device_count(),
        "cudnnAvailable": Cuda::cudnn_is_available(),
        "threads": tch::get_num_threads(),
        "devices": checks,
    }))
}

/// bf16 matmul of known values on `device`, compared with the exact result.
pub fn matmul_check(device: Device) -> Result<bool, tch::TchError> {
    let a = Tensor::f_arange(6, (Kind::Float, device))?.f_reshape([2, 3])?;
    let b = Tensor::f_ones([3, 2], (Kind::Float, device))?;
    let got = a.f_to_kind(Kind::BFloat16)?.f_matmul(&b.f_to_kind(Kind::BFloat16)?)?.f_to_kind(Kind::Float)?;
    let want = Tensor::from_slice(&[3.0f32, 3.0, 12.0, 12.0]).f_reshape([2, 2])?.f_to_device(device)?;
    got.f_allclose(&want, 0.0, 0.0, false)
}
