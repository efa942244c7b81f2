//! Marks in a device's stream of work, to time what ran between two of them: CUDA
//! events on a GPU, where the host only enqueues the work; the host's clock on the
//! CPU, which runs it.

use std::time::Instant;

use tch::Device;

use crate::Error;

/// A point in the work of one device's current stream.
pub struct StreamMark {
    at: Instant,
    #[cfg(feature = "cuda")]
    event: Option<cuda::Event>,
}

impl StreamMark {
    /// Marks the work enqueued on `device` so far.
    pub fn now(device: Device) -> Result<StreamMark, Error> {
        #[cfg(feature = "cuda")]
        let event = match device {
            Device::Cuda(d) => Some(cuda::Event::record(d)?),
            _ => None,
        };
        #[cfg(not(feature = "cuda"))]
        let _ = device;
        Ok(StreamMark {
            at: Instant::now(),
            #[cfg(feature = "cuda")]
            event,
        })
    }

    /// Seconds of work from this mark to `later`: the events' elapsed time on CUDA,
    /// which both must have completed (read them after a sync), the host clock's
    /// elsewhere.
    pub fn seconds_until(&self, later: &StreamMark) -> Result<f64, Error> {
        #[cfg(feature = "cuda")]
        if let (Some(a), Some(b)) = (&self.event, &later.event) {
            return Ok(a.elapsed_ms(b)? / 1000.0);
        }
        Ok(later.at.saturating_duration_since(self.at).as_secs_f64())
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::ffi::{c_char, c_int, c_void};

    use super::super::message::check;
    use crate::Error;

    unsafe extern "C" {
        fn shim_cuda_event_new(out: *mut *mut c_void) -> *mut c_char;
        fn shim_cuda_event_free(e: *mut c_void);
        fn shim_cuda_event_record(e: *mut c_void, device: c_int) -> *mut c_char;
        fn shim_cuda_event_elapsed_ms(start: *mut c_void, end: *mut c_void, out: *mut f64) -> *mut c_char;
    }

    /// A timing CUDA event, recorded once.
    pub struct Event {
        raw: *mut c_void,
    }

    // SAFETY: a CUDA event may be used from any thread of the process.
    unsafe impl Send for Event {}

    impl Event {
        pub fn record(device: usize) -> Result<Event, Error> {
            let dev = c_int::try_from(device).map_err(|_| Error::Shim(format!("cuda device {device} out of range")))?;
            let mut raw = std::ptr::null_mut();
            // SAFETY: the shim writes a heap pointer that Drop frees.
            check("cuda_event_new", unsafe { shim_cuda_event_new(&mut raw) })?;
            let event = Event { raw };
            // SAFETY: a live event.
            check("cuda_event_record", unsafe { shim_cuda_event_record(event.raw, dev) })?;
            Ok(event)
        }

        pub fn elapsed_ms(&self, end: &Event) -> Result<f64, Error> {
            let mut ms = 0.0;
            // SAFETY: two live events; the shim writes one double.
            check("cuda_event_elapsed", unsafe { shim_cuda_event_elapsed_ms(self.raw, end.raw, &mut ms) })?;
            Ok(ms)
        }
    }

    impl Drop for Event {
        fn drop(&mut self) {
            // SAFETY: allocated by shim_cuda_event_new, freed once.
            unsafe { shim_cuda_event_free(self.raw) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_mark_times_the_host_clock() {
        let a = StreamMark::now(Device::Cpu).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = StreamMark::now(Device::Cpu).unwrap();
        let s = a.seconds_until(&b).unwrap();
        assert!((0.02..1.0).contains(&s), "{s}");
        assert_eq!(b.seconds_until(&a).unwrap(), 0.0, "never negative");
    }

    /// On a GPU the marks read the stream's timeline in seconds: the work between two,
    /// and the time the stream sat idle while the host slept. Returns at once without
    /// a GPU.
    #[cfg(feature = "cuda")]
    #[test]
    fn a_cuda_mark_times_the_streams_work() {
        if !tch::Cuda::is_available() {
            return;
        }
        let device = Device::Cuda(0);
        let x = tch::Tensor::randn([4096, 4096], (tch::Kind::Float, device));
        let a = StreamMark::now(device).unwrap();
        let y = x.matmul(&x).matmul(&x);
        let b = StreamMark::now(device).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let c = StreamMark::now(device).unwrap();
        tch::Cuda::synchronize(0);
        let work = a.seconds_until(&b).unwrap();
        let idle = b.seconds_until(&c).unwrap();
        assert!(work > 0.0 && work < 5.0 && y.numel() > 0, "{work}");
        assert!((0.1..1.0).contains(&idle), "the host slept 0.2 s between enqueueing: {idle}");
    }
}
