//! The C++ shim (csrc/shim.cpp): ATen calls that tch 0.24 does not expose.
//!
//! The raw declarations stay private; every wrapper turns the shim's error string
//! into [`Error::Shim`]. Tensors cross as tch's `C_tensor`, which is an `at::Tensor*`.

use std::ffi::c_int;

use tch::{Device, Kind, TchError, Tensor};
use torch_sys::C_tensor;

use crate::Error;

mod raw {
    use std::ffi::{c_char, c_int};

    use torch_sys::C_tensor;

    unsafe extern "C" {
        pub fn shim_backward(roots: *const *mut C_tensor, grads: *const *mut C_tensor, n: usize) -> *mut c_char;
        #[allow(clippy::too_many_arguments)]
        pub fn shim_fused_adamw(
            params: *const *mut C_tensor,
            grads: *const *mut C_tensor,
            exp_avgs: *const *mut C_tensor,
            exp_avg_sqs: *const *mut C_tensor,
            steps: *const *mut C_tensor,
            n: usize,
            lr_tensor: *const C_tensor,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
            found_inf: *const C_tensor,
        ) -> *mut c_char;
        pub fn shim_clip_grads_by_norm(
            grads: *const *mut C_tensor,
            n: usize,
            norm: *const C_tensor,
            max_norm: f64,
        ) -> *mut c_char;
        pub fn shim_clip_grad_norm(
            grads: *const *mut C_tensor,
            n: usize,
            max_norm: f64,
            out_norm: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn shim_sdp_set_enabled(flash: c_int, mem_efficient: c_int, math: c_int, cudnn: c_int) -> *mut c_char;
        pub fn shim_sdp_get_enabled(
            flash: *mut c_int,
            mem_efficient: *mut c_int,
            math: *mut c_int,
            cudnn: *mut c_int,
        ) -> *mut c_char;
        pub fn shim_sdp_choice(
            q: *const C_tensor,
            k: *const C_tensor,
            v: *const C_tensor,
            is_causal: c_int,
            enable_gqa: c_int,
            out: *mut i64,
        ) -> *mut c_char;
        pub fn shim_built_with_cuda() -> c_int;
        pub fn shim_clear_grads(params: *const *mut C_tensor, n: usize) -> *mut c_char;
        pub fn shim_pin_memory(t: *const C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn shim_swiglu(
            a: *const C_tensor,
            b: *const C_tensor,
            fused: c_int,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn shim_rope(
            x: *const C_tensor,
            tables: *const *const C_tensor,
            fused: c_int,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
        pub fn shim_autocast_enter(cuda: c_int, prev_enabled: *mut c_int, prev_dtype: *mut c_int) -> *mut c_char;
        pub fn shim_autocast_exit(cuda: c_int, prev_enabled: c_int, prev_dtype: c_int) -> *mut c_char;
        pub fn shim_autocast_state(cuda: c_int, enabled: *mut c_int, dtype: *mut c_int) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_graph_new(device: c_int, out: *mut *mut std::ffi::c_void) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_graph_free(g: *mut std::ffi::c_void);
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_graph_side_begin(g: *mut std::ffi::c_void) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_graph_side_end(g: *mut std::ffi::c_void) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_graph_capture_begin(g: *mut std::ffi::c_void) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_graph_capture_end(g: *mut std::ffi::c_void) -> *mut c_char;
        #[cfg(feature = "cuda")]
        pub fn shim_cuda_graph_replay(g: *mut std::ffi::c_void) -> *mut c_char;
    }
}

mod memory;
mod message;
pub mod rows;
mod timing;
pub mod varlen;

pub use memory::*;
pub(crate) use message::{check, ptrs, take_message};
pub use timing::StreamMark;

/// `torch.autograd.backward(roots, grads)`: backpropagates `grads[i]` from `roots[i]`
/// (a leaf too) in one engine pass, so a parameter reached from several roots gets a
/// single accumulation of their sum, as in one `loss.backward()`.
pub fn backward(roots: &[Tensor], grads: &[Tensor]) -> Result<(), TchError> {
    assert_eq!(roots.len(), grads.len(), "one gradient per root");
    let (r, g) = (ptrs(roots), ptrs(grads));
    // SAFETY: parallel lists of live tensors; the shim only reads them.
    let err = unsafe { raw::shim_backward(r.as_ptr(), g.as_ptr(), r.len()) };
    take_message(err).map_or(Ok(()), |m| Err(TchError::Torch(format!("backward: {m}"))))
}

/// A learning rate: a number, or a 0-dim f32 tensor read on the device (what a
/// captured CUDA graph replays with new values).
#[derive(Clone, Copy, Debug)]
pub enum Lr<'a> {
    Value(f64),
    Tensor(&'a Tensor),
}

/// AdamW hyperparameters for one fused call.
#[derive(Debug)]
pub struct AdamWParams<'a> {
    pub lr: Lr<'a>,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Decoupled weight decay; the param is scaled by `1 - lr * weight_decay`.
    pub weight_decay: f64,
    /// Added to the denominator's square root.
    pub eps: f64,
}

/// One AdamW step (`at::_fused_adamw_`, amsgrad and maximize off) over parallel
/// lists, in place. `steps` are f32 0-dim tensors on each param's device; the shim
/// increments them before the update, as torch.optim.AdamW does. Where `found_inf`
/// (0-dim f32) is 1 on the device the step changes nothing, step counts included.
pub fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    steps: &[Tensor],
    hp: &AdamWParams,
    found_inf: Option<&Tensor>,
) -> Result<(), Error> {
    let n = params.len();
    if [grads.len(), exp_avgs.len(), exp_avg_sqs.len(), steps.len()].iter().any(|&l| l != n) {
        return Err(Error::Shim("fused_adamw: tensor lists differ in length".into()));
    }
    if n == 0 {
        return Ok(());
    }
    let (p, g, m, v, s) = (ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs), ptrs(steps));
    let (lr_tensor, lr) = match hp.lr {
        Lr::Value(v) => (std::ptr::null(), v),
        Lr::Tensor(t) => (t.as_ptr(), f64::NAN),
    };
    // SAFETY: every pointer is a live at::Tensor owned by a borrowed tch Tensor; the
    // shim copies the handles and checks definedness.
    let err = unsafe {
        raw::shim_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            s.as_ptr(),
            n,
            lr_tensor,
            lr,
            hp.beta1,
            hp.beta2,
            hp.weight_decay,
            hp.eps,
            found_inf.map_or(std::ptr::null(), |t| t.as_ptr()),
        )
    };
    check("fused_adamw", err)
}

/// `torch.nn.utils.clip_grad_norm_(grads, max_norm)` with f32 norm accumulation:
/// scales the grads in place by `min(1, max_norm / (norm + 1e-6))` and returns the
/// pre-clip total L2 norm as a 0-dim f32 tensor on the first grad's device, without
/// syncing. A non-finite norm is returned as is.
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f64) -> Result<Tensor, Error> {
    let g = ptrs(grads);
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: as in fused_adamw; on success the shim hands us a new at::Tensor*.
    let err = unsafe { raw::shim_clip_grad_norm(g.as_ptr(), g.len(), max_norm, &mut out) };
    check("clip_grad_norm", err)?;
    // SAFETY: out is a heap at::Tensor that tch's Tensor takes ownership of (freed by at_free).
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// [`clip_grad_norm`]'s scaling with a norm computed elsewhere: each gradient is
/// multiplied by min(1, max_norm / (norm + 1e-6)).
pub fn clip_grads_by_norm(grads: &[Tensor], norm: &Tensor, max_norm: f64) -> Result<(), Error> {
    let g = ptrs(grads);
    // SAFETY: live tensors.
    check("clip_grads_by_norm", unsafe { raw::shim_clip_grads_by_norm(g.as_ptr(), g.len(), norm.as_ptr(), max_norm) })
}

/// Leaves every tensor in `params` without a `.grad` (torch's `zero_grad(set_to_none=True)`).
pub fn clear_grads(params: &[Tensor]) -> Result<(), Error> {
    let p = ptrs(params);
    // SAFETY: a list of live tensors.
    check("clear_grads", unsafe { raw::shim_clear_grads(p.as_ptr(), p.len()) })
}

/// A copy of CPU tensor `t` in page-locked memory, from which a host-to-device copy can
/// run asynchronously (`Tensor.pin_memory()`). An error where no accelerator is present.
pub fn pin_memory(t: &Tensor) -> Result<Tensor, Error> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: a live tensor; on success the shim hands us a new at::Tensor*.
    check("pin_memory", unsafe { raw::shim_pin_memory(t.as_ptr(), &mut out) })?;
    // SAFETY: out is a heap at::Tensor that tch's Tensor takes ownership of.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// `silu(a) · b` as one autograd node that saves only `a` and `b` (two nodes would also
/// keep `silu(a)`). Unfused, its value and gradients equal `a.silu() * b`'s bit for bit;
/// `fused` runs one jiterator kernel each way, CUDA only.
pub fn swiglu(a: &Tensor, b: &Tensor, fused: bool) -> Result<Tensor, TchError> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors; on success the shim hands us a new at::Tensor*.
    let err = unsafe { raw::shim_swiglu(a.as_ptr(), b.as_ptr(), fused.into(), &mut out) };
    take_message(err).map_or(Ok(()), |m| Err(TchError::Torch(format!("swiglu: {m}"))))?;
    // SAFETY: out is a heap at::Tensor that tch's Tensor takes ownership of.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// RoPE of `x` (…, d) as one autograd node that saves no activation: `x` viewed
/// (…, 2, d/2) with halves `lo`, `hi` broadcast over the pair dimension gives
/// `lo·a + hi·b`, and its gradient is the same map with `a_back`, `b_back`; each table
/// broadcasts to (…, 2, d/2) and has x's dtype ([`crate::kernels::rope::RopeTables`]).
/// Unfused, values and gradients equal eager rotate-half's bit for bit; `fused` runs one
/// jiterator kernel each way, CUDA only.
pub fn rope(x: &Tensor, [a, b, a_back, b_back]: [&Tensor; 4], fused: bool) -> Result<Tensor, TchError> {
    let tables = [a.as_ptr(), b.as_ptr(), a_back.as_ptr(), b_back.as_ptr()];
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensors; on success the shim hands us a new at::Tensor*.
    let err = unsafe { raw::shim_rope(x.as_ptr(), tables.as_ptr(), fused.into(), &mut out) };
    take_message(err).map_or(Ok(()), |m| Err(TchError::Torch(format!("rope: {m}"))))?;
    // SAFETY: out is a heap at::Tensor that tch's Tensor takes ownership of.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Which SDPA backends `scaled_dot_product_attention` may use (process-wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdpEnabled {
    /// FlashAttention (CUDA, and ATen's CPU flash kernel).
    pub flash: bool,
    /// Memory-efficient attention (CUDA).
    pub mem_efficient: bool,
    /// The unfused reference implementation.
    pub math: bool,
    /// cuDNN attention (CUDA).
    pub cudnn: bool,
}

/// Sets the process-wide SDPA backend switches in `at::globalContext()`.
pub fn set_sdp_enabled(e: SdpEnabled) -> Result<(), Error> {
    // SAFETY: plain flag setters.
    let err =
        unsafe { raw::shim_sdp_set_enabled(e.flash.into(), e.mem_efficient.into(), e.math.into(), e.cudnn.into()) };
    check("sdp_set_enabled", err)
}

/// Reads the process-wide SDPA backend switches.
pub fn sdp_enabled() -> Result<SdpEnabled, Error> {
    let (mut f, mut m, mut ma, mut c) = (0, 0, 0, 0);
    // SAFETY: the shim writes four ints.
    let err = unsafe { raw::shim_sdp_get_enabled(&mut f, &mut m, &mut ma, &mut c) };
    check("sdp_get_enabled", err)?;
    Ok(SdpEnabled { flash: f != 0, mem_efficient: m != 0, math: ma != 0, cudnn: c != 0 })
}

/// An SDPA backend, as `at::SDPBackend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SdpBackend {
    /// No enabled backend can run these inputs.
    Error,
    /// The unfused reference implementation.
    Math,
    /// FlashAttention.
    Flash,
    /// Memory-efficient attention.
    Efficient,
    /// cuDNN attention.
    CuDnn,
    /// A backend registered by an out-of-tree device.
    Overrideable,
}

impl SdpBackend {
    /// Maps an `at::SDPBackend` integer; unknown values are an error.
    pub fn from_raw(v: i64) -> Result<Self, Error> {
        Ok(match v {
            -1 => SdpBackend::Error,
            0 => SdpBackend::Math,
            1 => SdpBackend::Flash,
            2 => SdpBackend::Efficient,
            3 => SdpBackend::CuDnn,
            4 => SdpBackend::Overrideable,
            _ => return Err(Error::Shim(format!("unknown at::SDPBackend value {v}"))),
        })
    }
}

/// The backend SDPA would pick for `q`, `k`, `v` (`at::_fused_sdp_choice`, no mask,
/// no dropout, default scale) under the current switches. Inputs no enabled backend
/// accepts give `Ok(SdpBackend::Error)` where ATen reports that, or `Err` where it
/// throws instead.
pub fn sdp_choice(q: &Tensor, k: &Tensor, v: &Tensor, is_causal: bool, enable_gqa: bool) -> Result<SdpBackend, Error> {
    let mut out = -1i64;
    // SAFETY: borrowed live tensors; the shim writes one i64.
    let err = unsafe {
        raw::shim_sdp_choice(q.as_ptr(), k.as_ptr(), v.as_ptr(), is_causal.into(), enable_gqa.into(), &mut out)
    };
    check("sdp_choice", err)?;
    SdpBackend::from_raw(out)
}

/// Whether the shim was compiled with its CUDA code paths (feature `cuda`).
pub fn shim_built_with_cuda() -> bool {
    // SAFETY: no arguments.
    unsafe { raw::shim_built_with_cuda() != 0 }
}

/// Whether autocast is on for `device`'s type on this thread, and its lower-precision
/// type (what it casts matmuls and attention to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutocastState {
    pub enabled: bool,
    pub dtype: Kind,
}

fn autocast_device(device: Device) -> Result<c_int, Error> {
    match device {
        Device::Cpu => Ok(0),
        Device::Cuda(_) => Ok(1),
        other => Err(Error::Shim(format!("autocast: unsupported device {other:?}"))),
    }
}

/// This thread's autocast state for `device`'s type.
pub fn autocast_state(device: Device) -> Result<AutocastState, Error> {
    let cuda = autocast_device(device)?;
    let (mut enabled, mut dtype) = (0, 0);
    // SAFETY: the shim writes two ints.
    check("autocast_state", unsafe { raw::shim_autocast_state(cuda, &mut enabled, &mut dtype) })?;
    let dtype = match dtype {
        5 => Kind::Half,
        6 => Kind::Float,
        15 => Kind::BFloat16,
        other => return Err(Error::Shim(format!("autocast_state: unexpected at::ScalarType {other}"))),
    };
    Ok(AutocastState { enabled: enabled != 0, dtype })
}

/// The type autocast casts to on `device` now, if it is on there (a KV cache
/// allocated in it is not re-cast on every decoding step).
pub fn autocast_kind(device: Device) -> Result<Option<Kind>, Error> {
    let s = autocast_state(device)?;
    Ok(s.enabled.then_some(s.dtype))
}

/// Runs `f` under bf16 autocast for `device`'s type when `enabled`, as
/// `torch.autocast(device, dtype=torch.bfloat16)`: matmuls and attention run in bf16,
/// softmax-like ops and reductions in f32, and f32 weights stay the master copy.
/// (`tch::autocast` turns CUDA autocast on with its default type, float16.)
pub fn autocast<T, E>(device: Device, enabled: bool, f: impl FnOnce() -> Result<T, E>) -> Result<T, Error>
where
    Error: From<E>,
{
    if !enabled {
        return Ok(f()?);
    }
    let cuda = autocast_device(device)?;
    let (mut prev_enabled, mut prev_dtype) = (0, 0);
    // SAFETY: the shim writes two ints.
    check("autocast_enter", unsafe { raw::shim_autocast_enter(cuda, &mut prev_enabled, &mut prev_dtype) })?;
    // Restores the previous state also when `f` panics.
    struct Exit {
        cuda: c_int,
        prev_enabled: c_int,
        prev_dtype: c_int,
        done: bool,
    }
    impl Exit {
        fn exit(&mut self) -> Result<(), Error> {
            self.done = true;
            // SAFETY: plain values.
            check("autocast_exit", unsafe { raw::shim_autocast_exit(self.cuda, self.prev_enabled, self.prev_dtype) })
        }
    }
    impl Drop for Exit {
        fn drop(&mut self) {
            if !self.done {
                let _ = self.exit();
            }
        }
    }
    let mut guard = Exit { cuda, prev_enabled, prev_dtype, done: false };
    let out = f();
    guard.exit()?;
    Ok(out?)
}

/// A CUDA graph (`at::cuda::CUDAGraph`) with its own side stream, as
/// `torch.cuda.graph` uses: warm the work up with [`CudaGraph::on_side_stream`],
/// record it once with [`CudaGraph::capture`], then [`CudaGraph::replay`] it: one
/// launch for all of its kernels. The captured work must not sync with the host,
/// and replays read and write the same tensors (the captured ones), so inputs are
/// copied into them and outputs read from them.
#[cfg(feature = "cuda")]
type GraphCall = unsafe extern "C" fn(*mut std::ffi::c_void) -> *mut std::ffi::c_char;

#[cfg(feature = "cuda")]
pub struct CudaGraph {
    raw: *mut std::ffi::c_void,
}

#[cfg(feature = "cuda")]
impl CudaGraph {
    /// A graph for CUDA device `device`; an error where it does not exist.
    pub fn new(device: usize) -> Result<Self, Error> {
        let dev = c_int::try_from(device).map_err(|_| Error::Shim(format!("cuda device {device} out of range")))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the shim writes a heap pointer that Drop frees.
        check("cuda_graph_new", unsafe { raw::shim_cuda_graph_new(dev, &mut raw) })?;
        Ok(CudaGraph { raw })
    }

    /// Runs `f` with the graph's side stream current (the stream capture uses), as
    /// warm-up before capturing; the previous stream waits for its work afterwards.
    pub fn on_side_stream<T>(&mut self, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
        self.between(
            ("cuda_graph_side_begin", raw::shim_cuda_graph_side_begin),
            ("cuda_graph_side_end", raw::shim_cuda_graph_side_end),
            f,
        )
    }

    /// Records the work `f` launches instead of running it; returns what `f`
    /// returns (tensors the replays write). A graph is captured once.
    pub fn capture<T>(&mut self, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
        self.between(
            ("cuda_graph_capture_begin", raw::shim_cuda_graph_capture_begin),
            ("cuda_graph_capture_end", raw::shim_cuda_graph_capture_end),
            f,
        )
    }

    /// Runs `f` between two shim calls on this graph; the second runs even when `f`
    /// fails, and `f`'s error comes first.
    fn between<T>(
        &mut self,
        begin: (&str, GraphCall),
        end: (&str, GraphCall),
        f: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        // SAFETY: self.raw is live until Drop.
        check(begin.0, unsafe { (begin.1)(self.raw) })?;
        let out = f();
        let ended = check(end.0, unsafe { (end.1)(self.raw) });
        let out = out?;
        ended.map(|_| out)
    }

    /// Launches the captured work on the current stream, without waiting for it.
    pub fn replay(&self) -> Result<(), Error> {
        // SAFETY: self.raw is live until Drop.
        check("cuda_graph_replay", unsafe { raw::shim_cuda_graph_replay(self.raw) })
    }
}

#[cfg(feature = "cuda")]
impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: allocated by shim_cuda_graph_new, freed once.
        unsafe { raw::shim_cuda_graph_free(self.raw) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn shim_cuda_paths_follow_the_feature() {
        assert_eq!(shim_built_with_cuda(), cfg!(feature = "cuda"));
        assert_eq!(device_memory(Device::Cpu).unwrap(), None, "no GPU memory to report on CPU");
    }

    /// `autocast` sets bf16 for its device type, where CUDA's own default is float16
    /// (what `tch::autocast` leaves), nests, and restores the state after, also after
    /// an error. The state is thread-local, so CUDA's can be read without a GPU.
    #[test]
    fn autocast_is_bf16_for_its_device_type_and_restores_the_previous_state() {
        let cuda = Device::Cuda(0);
        let off = autocast_state(cuda).unwrap();
        assert_eq!(off, AutocastState { enabled: false, dtype: Kind::Half }, "libtorch's CUDA default");
        let on = AutocastState { enabled: true, dtype: Kind::BFloat16 };
        autocast(cuda, true, || -> Result<(), Error> {
            assert_eq!(autocast_state(cuda)?, on);
            assert_eq!(autocast_kind(cuda)?, Some(Kind::BFloat16));
            assert_eq!(autocast_kind(Device::Cpu)?, None, "CPU autocast stays off");
            autocast(cuda, true, || autocast_state(cuda).map(|s| assert_eq!(s, on)))?;
            assert_eq!(autocast_state(cuda)?, on, "an inner exit keeps the outer autocast");
            Ok(())
        })
        .unwrap();
        assert_eq!(autocast_state(cuda).unwrap(), off);
        let failed = autocast(cuda, true, || Err::<(), _>(Error::InvalidSpec("inside".into())));
        assert!(matches!(failed, Err(Error::InvalidSpec(_))));
        assert_eq!(autocast_state(cuda).unwrap(), off, "restored after an error");
        autocast(cuda, false, || autocast_state(cuda).map(|s| assert_eq!(s, off))).unwrap();
    }

    /// Pinning needs an accelerator: with one, a pinned copy of equal values; without,
    /// a clear error (the loader pins only for CUDA runs).
    #[test]
    fn pin_memory_copies_into_page_locked_memory_or_says_it_cannot() {
        let t = Tensor::arange(6, (Kind::Int64, Device::Cpu)).view([2, 3]);
        match pin_memory(&t) {
            Ok(p) => {
                assert!(tch::Cuda::is_available());
                assert!(p.is_pinned(Device::Cuda(0)) && p.equal(&t) && p.device() == Device::Cpu);
            }
            Err(e) => {
                assert!(!tch::Cuda::is_available(), "{e}");
                assert!(e.to_string().starts_with("libtorch shim: pin_memory: "), "{e}");
            }
        }
    }

    /// [y, d(input)…] of `y = f(inputs)` for y's gradient `g`, through `sum(y · g)`.
    pub(crate) fn value_and_grads(inputs: &[&Tensor], g: &Tensor, f: impl Fn(&[Tensor]) -> Tensor) -> Vec<Tensor> {
        let xs: Vec<Tensor> = inputs.iter().map(|x| x.detach().requires_grad_(true)).collect();
        let y = f(&xs);
        let mut out = vec![y.detach()];
        out.extend(Tensor::run_backward(&[(&y * g).sum(Kind::Float)], xs.as_slice(), false, false));
        out
    }

    fn swiglu_grads(a: &Tensor, b: &Tensor, g: &Tensor, f: impl Fn(&Tensor, &Tensor) -> Tensor) -> Vec<Tensor> {
        value_and_grads(&[a, b], g, |x| f(&x[0], &x[1]))
    }

    /// Asserts each pair equal to the bit, in `kind`.
    pub(crate) fn assert_bitwise(got: &[Tensor], want: &[Tensor], kind: Kind, what: &str) {
        assert_eq!(got.len(), want.len());
        for (i, (got, want)) in got.iter().zip(want).enumerate() {
            assert_eq!(got.kind(), kind, "{what} output {i}");
            assert!(
                got.equal(want),
                "{what} {kind:?} output {i}: max diff {}",
                (got - want).abs().max().double_value(&[])
            );
        }
    }

    /// The largest relative difference of each pair, in f32.
    #[cfg(feature = "cuda")]
    pub(crate) fn assert_close(got: &[Tensor], want: &[Tensor], tol: f64, what: &str) {
        for (i, (f, c)) in got.iter().zip(want).enumerate() {
            let (f, c) = (f.to_kind(Kind::Float), c.to_kind(Kind::Float));
            let rel = (&f - &c).abs().max().double_value(&[]) / c.abs().max().double_value(&[]);
            assert!(rel <= tol, "{what} output {i}: relative error {rel}");
        }
    }

    /// Unfused, one node gives eager's two nodes' value and gradients to the bit, in f32
    /// and bf16, and keeps working without autograd (decoding).
    #[test]
    fn swiglu_equals_silu_times_up_bit_for_bit() {
        for kind in [Kind::Float, Kind::BFloat16] {
            let x = |seed| {
                tch::manual_seed(seed);
                Tensor::randn([3, 5, 96], (Kind::Float, Device::Cpu)).to_kind(kind) * 4
            };
            let (a, b, g) = (x(1), x(2), x(3));
            let got = swiglu_grads(&a, &b, &g, |a, b| swiglu(a, b, false).unwrap());
            let want = swiglu_grads(&a, &b, &g, |a, b| a.silu() * b);
            assert_bitwise(&got, &want, kind, "swiglu");
            let y = tch::no_grad(|| swiglu(&a.detach().requires_grad_(true), &b, false).unwrap());
            assert!(!y.requires_grad() && y.equal(&want[0]), "{kind:?} under no_grad");
        }
    }

    #[test]
    fn swiglu_rejects_unequal_inputs_and_fused_kernels_off_cuda() {
        let a = Tensor::ones([2, 4], (Kind::Float, Device::Cpu));
        let e = swiglu(&a, &Tensor::ones([2, 3], (Kind::Float, Device::Cpu)), false).unwrap_err().to_string();
        assert!(e.contains("swiglu: gate [2, 4] and up [2, 3] differ in shape"), "{e}");
        let e = swiglu(&a, &a.to_kind(Kind::BFloat16), false).unwrap_err().to_string();
        assert!(e.contains("swiglu: gate Float and up BFloat16 differ in dtype"), "{e}");
        let e = swiglu(&a, &a, true).unwrap_err().to_string();
        let why = if shim_built_with_cuda() {
            "the fused kernels run on CUDA only, not on cpu"
        } else {
            "need the trainer built with the cuda feature"
        };
        assert!(e.contains(why), "{e}");
    }

    /// On a GPU the fused kernels agree with the composed ones to rounding (they round
    /// once where eager rounds twice).
    #[cfg(feature = "cuda")]
    #[test]
    fn fused_swiglu_matches_the_composed_kernels_on_cuda() {
        if !tch::Cuda::is_available() {
            return;
        }
        for (kind, tol) in [(Kind::Float, 1e-5), (Kind::BFloat16, 2e-2)] {
            let x = |seed| {
                tch::manual_seed(seed);
                Tensor::randn([4, 33, 130], (Kind::Float, Device::Cuda(0))).to_kind(kind) * 4
            };
            let (a, b, g) = (x(1), x(2), x(3));
            let fused = swiglu_grads(&a, &b, &g, |a, b| swiglu(a, b, true).unwrap());
            let composed = swiglu_grads(&a, &b, &g, |a, b| swiglu(a, b, false).unwrap());
            assert_close(&fused, &composed, tol, &format!("swiglu {kind:?}"));
        }
    }

    /// On CPU the same switch really casts: matmuls run in bf16, the loss stays f32.
    #[test]
    fn autocast_runs_matmuls_in_bf16_and_keeps_the_loss_in_f32() {
        let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([5, 8], (Kind::Float, Device::Cpu));
        let (y, loss) = autocast(Device::Cpu, true, || -> Result<_, TchError> {
            let y = x.f_linear(&w, None::<Tensor>)?;
            let loss = y.f_log_softmax(-1, Kind::Float)?.f_mean(Kind::Float)?;
            Ok((y, loss))
        })
        .unwrap();
        assert_eq!((y.kind(), loss.kind()), (Kind::BFloat16, Kind::Float));
        let plain = autocast(Device::Cpu, false, || x.f_linear(&w, None::<Tensor>)).unwrap();
        assert_eq!(plain.kind(), Kind::Float);
        let d = (y.to_kind(Kind::Float) - &plain).abs().max().double_value(&[]);
        assert!(d > 0.0 && d < 0.1, "bf16 rounding, not another result: {d}");
        assert!(autocast(Device::Mps, true, || Ok::<_, Error>(())).is_err());
    }

    /// On a GPU: a captured step replays with new inputs and gives eager's result;
    /// without one, creating a graph is a clear error.
    #[cfg(feature = "cuda")]
    #[test]
    fn a_cuda_graph_replays_its_captured_work_or_is_an_error_without_a_device() {
        if !tch::Cuda::is_available() {
            let e = CudaGraph::new(0).err().expect("no device, no graph");
            assert!(e.to_string().contains("CUDA device 0 does not exist"), "{e}");
            return;
        }
        let opts = (tch::Kind::Float, tch::Device::Cuda(0));
        let x = Tensor::zeros([64, 64], opts);
        let w = Tensor::randn([64, 64], opts);
        let mut g = CudaGraph::new(0).unwrap();
        let work = || Ok(x.matmul(&w).relu().sum(tch::Kind::Float));
        drop(g.on_side_stream(work).unwrap());
        let y = g.capture(work).unwrap();
        let mut x2 = x.shallow_clone();
        for seed in 0..3 {
            let input = Tensor::randn([64, 64], opts) * (seed + 1);
            x2.copy_(&input);
            g.replay().unwrap();
            let want = input.matmul(&w).relu().sum(tch::Kind::Float);
            assert!(
                (y.double_value(&[]) - want.double_value(&[])).abs() <= 1e-3 * want.double_value(&[]).abs().max(1.0)
            );
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_memory_is_an_error_without_a_device() {
        if tch::Cuda::is_available() {
            let t = Tensor::ones([1024], (tch::Kind::Float, tch::Device::Cuda(0)));
            let m = cuda_memory(0).unwrap();
            assert!(m.allocated >= 4096 && m.peak_allocated >= m.allocated && m.reserved >= m.allocated, "{m:?}");
            assert!(m.total >= m.reserved && m.total > 1 << 30, "{m:?}");
            assert_eq!(device_memory(tch::Device::Cuda(0)).unwrap().map(|d| d.total), Some(m.total));
            drop(t);
            cuda_reset_peak_memory(0).unwrap();
        } else {
            assert!(matches!(cuda_memory(0), Err(Error::Shim(_))));
            assert!(device_memory(tch::Device::Cuda(0)).is_err());
        }
    }
}
