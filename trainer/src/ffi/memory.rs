//! Memory counters: the CUDA caching allocator's, and an allocator-level count of host
//! tensor memory per thread (what a CPU run's peak is measured with).

use std::ffi::c_int;

use tch::Device;

use super::message::check;
use crate::Error;

mod raw {
    use std::ffi::{c_char, c_int};

    unsafe extern "C" {
        pub fn shim_host_memory_count(on: c_int) -> *mut c_char;
        pub fn shim_host_memory(current: *mut i64, peak: *mut i64) -> *mut c_char;
        pub fn shim_host_memory_reset_peak() -> *mut c_char;
        pub fn shim_host_memory_limit(bytes: i64) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_memory_stats(
            device: c_int,
            allocated: *mut i64,
            reserved: *mut i64,
            peak_allocated: *mut i64,
            total: *mut i64,
        ) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_reset_peak_memory(device: c_int) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_limit_memory(device: c_int, bytes: f64, total: *mut i64) -> *mut c_char;
    }
}

/// Host tensor memory counted for this thread, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// Held now by tensors this thread allocated while counting.
    pub current: i64,
    /// The most held at once since counting started or [`host_memory_reset_peak`].
    pub peak: i64,
}

/// Starts counting this thread's host tensor allocations from zero (`on`), or stops.
/// Tensors allocated before are not counted, nor are other threads'.
pub fn host_memory_count(on: bool) -> Result<(), Error> {
    // SAFETY: no pointers.
    check("host_memory_count", unsafe { raw::shim_host_memory_count(c_int::from(on)) })
}

/// This thread's counters (zeros when it is not counting).
pub fn host_memory() -> Result<HostMemory, Error> {
    let (mut current, mut peak) = (0, 0);
    // SAFETY: the shim writes two i64s.
    check("host_memory", unsafe { raw::shim_host_memory(&mut current, &mut peak) })?;
    Ok(HostMemory { current, peak })
}

/// Makes this thread's peak what it holds now.
pub fn host_memory_reset_peak() -> Result<(), Error> {
    // SAFETY: no pointers.
    check("host_memory_reset_peak", unsafe { raw::shim_host_memory_reset_peak() })
}

/// Caps what this thread may hold at `bytes` (`None`: no cap): an allocation past it
/// fails as out of memory, as on a machine with that much. The thread must be counting.
pub fn host_memory_limit(bytes: Option<u64>) -> Result<(), Error> {
    let bytes = i64::try_from(bytes.unwrap_or(0)).unwrap_or(i64::MAX);
    // SAFETY: no pointers.
    check("host_memory_limit", unsafe { raw::shim_host_memory_limit(bytes) })
}

/// CUDA caching-allocator counters for one device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaMemory {
    /// Held by live tensors now.
    pub allocated: i64,
    /// Reserved from the driver by the caching allocator.
    pub reserved: i64,
    /// Peak of `allocated` since the last [`cuda_reset_peak_memory`].
    pub peak_allocated: i64,
    /// The device's memory.
    pub total: i64,
}

/// Reads the caching allocator's counters for CUDA device `device`.
#[cfg(feature = "cuda")]
pub fn cuda_memory(device: usize) -> Result<CudaMemory, Error> {
    let (mut a, mut r, mut p, mut t) = (0, 0, 0, 0);
    let dev = c_int::try_from(device).map_err(|_| Error::Shim(format!("cuda device {device} out of range")))?;
    // SAFETY: the shim writes four i64s; a bad index throws and comes back as Err.
    let err = unsafe { raw::shim_cuda_memory_stats(dev, &mut a, &mut r, &mut p, &mut t) };
    check("cuda_memory", err)?;
    Ok(CudaMemory { allocated: a, reserved: r, peak_allocated: p, total: t })
}

/// [`cuda_memory`] of `device` where it is a CUDA device and the shim has CUDA;
/// `None` elsewhere.
pub fn device_memory(device: Device) -> Result<Option<CudaMemory>, Error> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(i) = device {
        return cuda_memory(i).map(Some);
    }
    let _ = device;
    Ok(None)
}

/// Restarts the peak counter of [`cuda_memory`] for CUDA device `device`.
#[cfg(feature = "cuda")]
pub fn cuda_reset_peak_memory(device: usize) -> Result<(), Error> {
    let dev = c_int::try_from(device).map_err(|_| Error::Shim(format!("cuda device {device} out of range")))?;
    // SAFETY: as above.
    let err = unsafe { raw::shim_cuda_reset_peak_memory(dev) };
    check("cuda_reset_peak_memory", err)
}

/// Caps the caching allocator on CUDA device `device` at `bytes` (beyond it
/// allocations fail as out of memory, as on a smaller GPU); returns the device's
/// total memory in bytes.
#[cfg(feature = "cuda")]
pub fn cuda_limit_memory(device: usize, bytes: f64) -> Result<i64, Error> {
    let dev = c_int::try_from(device).map_err(|_| Error::Shim(format!("cuda device {device} out of range")))?;
    let mut total = 0;
    // SAFETY: the shim writes one i64; a bad device throws and comes back as Err.
    check("cuda_limit_memory", unsafe { raw::shim_cuda_limit_memory(dev, bytes, &mut total) })?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::*;

    #[test]
    fn a_thread_counts_what_its_tensors_hold_and_its_peak_and_not_other_threads() {
        std::thread::spawn(|| {
            host_memory_count(true).unwrap();
            let zero = host_memory().unwrap();
            assert_eq!(zero, HostMemory { current: 0, peak: 0 });
            let a = Tensor::zeros([1 << 18], (Kind::Float, Device::Cpu)); // 1 MiB
            let b = Tensor::zeros([1 << 17], (Kind::Float, Device::Cpu)); // 512 KiB
            assert_eq!(host_memory().unwrap(), HostMemory { current: 3 << 19, peak: 3 << 19 });
            drop(a);
            assert_eq!(host_memory().unwrap(), HostMemory { current: 1 << 19, peak: 3 << 19 });
            host_memory_reset_peak().unwrap();
            assert_eq!(host_memory().unwrap().peak, 1 << 19);
            // Another thread's tensors, and this thread's freeing them, do not count.
            let other = std::thread::spawn(|| Tensor::zeros([1 << 20], (Kind::Float, Device::Cpu))).join().unwrap();
            drop(other);
            // A tensor freed on another thread is still charged to this one until then.
            let c = Tensor::zeros([1 << 16], (Kind::Float, Device::Cpu));
            std::thread::spawn(move || drop(c)).join().unwrap();
            drop(b);
            assert_eq!(host_memory().unwrap(), HostMemory { current: 0, peak: (1 << 19) + (1 << 18) });
            host_memory_count(false).unwrap();
            assert_eq!(host_memory().unwrap(), HostMemory { current: 0, peak: 0 });
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_allocation_past_the_cap_fails_as_out_of_memory_and_holds_nothing() {
        std::thread::spawn(|| {
            assert!(host_memory_limit(Some(1 << 20)).unwrap_err().to_string().contains("not counting"));
            host_memory_count(true).unwrap();
            host_memory_limit(Some(3 << 19)).unwrap();
            let a = Tensor::zeros([1 << 18], (Kind::Float, Device::Cpu)); // 1 MiB of 1.5
            let refused = Tensor::f_zeros([1 << 18], (Kind::Float, Device::Cpu)).unwrap_err().to_string();
            assert!(refused.contains("host memory limit") && refused.contains("1572864"), "{refused}");
            assert_eq!(host_memory().unwrap(), HostMemory { current: 1 << 20, peak: 1 << 20 });
            // Exactly up to the cap fits; lifting it lets anything through again.
            let b = Tensor::zeros([1 << 17], (Kind::Float, Device::Cpu));
            host_memory_limit(None).unwrap();
            let c = Tensor::zeros([1 << 20], (Kind::Float, Device::Cpu));
            drop((a, b, c));
            host_memory_count(false).unwrap();
        })
        .join()
        .unwrap();
    }
}
