//! The process-wide SDPA switches that `spec.attention` sets, and the probe of the
//! backend libtorch picks for the model's shapes.

use crds::presets::ModelConfig;
use crds::types::Attention;
use tch::{Kind, Tensor};

use crate::Error;
use crate::ffi::{self, SdpEnabled};
pub use crate::ffi::{SdpBackend, sdp_choice};

/// Sets the process-wide SDPA backends for `spec.attention`: `auto` enables all of
/// them and lets ATen choose; `flash`, `cudnn` and `math` enable only that one. Call
/// [`check_sdp_backend`] with the model's shapes afterwards to learn whether the
/// forced backend can run them.
pub fn set_sdp_backend(attention: Attention) -> Result<(), Error> {
    let only = |flash, cudnn, math| SdpEnabled { flash, mem_efficient: false, math, cudnn };
    ffi::set_sdp_enabled(match attention {
        Attention::Auto => ALL_SDP_BACKENDS,
        Attention::Flash => only(true, false, false),
        Attention::Cudnn => only(false, true, false),
        Attention::Math => only(false, false, true),
    })
}

const ALL_SDP_BACKENDS: SdpEnabled = SdpEnabled { flash: true, mem_efficient: true, math: true, cudnn: true };

/// Every SDPA backend enabled until dropped, then the switches as they were: for the
/// masked attention of KV-cache decoding, which a backend forced for training may not
/// run (CUDA flash takes no mask).
pub struct AllSdpBackends(SdpEnabled);

impl AllSdpBackends {
    pub fn enable() -> Result<Self, Error> {
        let before = ffi::sdp_enabled()?;
        ffi::set_sdp_enabled(ALL_SDP_BACKENDS)?;
        Ok(AllSdpBackends(before))
    }
}

impl Drop for AllSdpBackends {
    fn drop(&mut self) {
        let _ = ffi::set_sdp_enabled(self.0);
    }
}

/// The backend SDPA picks for these inputs under the current switches, checked
/// against `spec.attention`: an error names `spec.attention` when no backend can run
/// them, or when a forced backend is not the one picked.
pub fn check_sdp_backend(
    attention: Attention,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    is_causal: bool,
    enable_gqa: bool,
) -> Result<SdpBackend, Error> {
    let name = match attention {
        Attention::Auto => "auto",
        Attention::Flash => "flash",
        Attention::Cudnn => "cudnn",
        Attention::Math => "math",
    };
    let what = || format!("q {:?} {:?} on {:?}, causal={is_causal}, gqa={enable_gqa}", q.size(), q.kind(), q.device());
    let choice = match sdp_choice(q, k, v, is_causal, enable_gqa) {
        Ok(c) => c,
        Err(e) => {
            return Err(Error::InvalidSpec(format!("spec.attention={name}: no SDPA backend can run {}: {e}", what())));
        }
    };
    let expected = match attention {
        Attention::Auto => None,
        Attention::Flash => Some(SdpBackend::Flash),
        Attention::Cudnn => Some(SdpBackend::CuDnn),
        Attention::Math => Some(SdpBackend::Math),
    };
    if choice == SdpBackend::Error || expected.is_some_and(|b| b != choice) {
        return Err(Error::InvalidSpec(format!(
            "spec.attention={name}: SDPA cannot use that backend for {} (it would pick {choice:?})",
            what()
        )));
    }
    Ok(choice)
}

/// Whether training attention repeats K/V per query head: for cuDNN SDPA (which has no
/// grouped-query path) on a model with fewer K/V heads than query heads.
pub fn expands_kv(attention: Attention, cfg: &ModelConfig) -> bool {
    attention == Attention::Cudnn && cfg.n_kv_head != cfg.n_head
}
/// The SDPA backend libtorch picks for the model's attention at this batch shape,
/// under `attention`; an error names `spec.attention` when it cannot run.
pub fn attention_backend(
    m: &ModelConfig,
    attention: Attention,
    micro_batch: i64,
    seq: i64,
    kind: Kind,
    device: tch::Device,
) -> Result<SdpBackend, Error> {
    let q = Tensor::f_zeros([micro_batch, m.n_head as i64, seq, m.d_head as i64], (kind, device))?;
    // Expanded K/V (cuDNN) have a head per query head and need no GQA path.
    let expand = expands_kv(attention, m);
    let kv_heads = if expand { m.n_head } else { m.n_kv_head };
    let k = Tensor::f_zeros([micro_batch, kv_heads as i64, seq, m.d_head as i64], (kind, device))?;
    check_sdp_backend(attention, &q, &k, &k, true, !expand && m.n_kv_head != m.n_head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// All SDPA switch checks live in one test: the switches are process-wide and
    /// tests run in parallel threads.
    #[test]
    fn sdp_backend_switches_and_choice() {
        let opts = (Kind::Float, Device::Cpu);
        let q = Tensor::ones([2, 4, 16, 32], opts);
        let k = Tensor::ones([2, 4, 16, 32], opts);
        let v = Tensor::ones([2, 4, 16, 32], opts);

        set_sdp_backend(Attention::Math).unwrap();
        let on = ffi::sdp_enabled().unwrap();
        assert_eq!(on, SdpEnabled { flash: false, mem_efficient: false, math: true, cudnn: false });
        assert_eq!(sdp_choice(&q, &k, &v, true, false).unwrap(), SdpBackend::Math);
        assert_eq!(check_sdp_backend(Attention::Math, &q, &k, &v, true, false).unwrap(), SdpBackend::Math);

        set_sdp_backend(Attention::Flash).unwrap();
        assert_eq!(check_sdp_backend(Attention::Flash, &q, &k, &v, true, false).unwrap(), SdpBackend::Flash);
        // CPU flash needs the last dim contiguous; with math off nothing can run this.
        let q_strided = Tensor::ones([2, 4, 32, 16], opts).transpose(-1, -2);
        let e = check_sdp_backend(Attention::Flash, &q_strided, &k, &v, true, false).unwrap_err();
        assert!(e.to_string().contains("spec.attention=flash"), "{e}");
        assert_eq!(e.reason(), Some(crds::contract::FailureReason::InvalidConfig));

        // cuDNN attention is CUDA-only.
        set_sdp_backend(Attention::Cudnn).unwrap();
        let e = check_sdp_backend(Attention::Cudnn, &q, &k, &v, true, false).unwrap_err();
        assert!(e.to_string().contains("spec.attention=cudnn"), "{e}");

        set_sdp_backend(Attention::Auto).unwrap();
        let on = ffi::sdp_enabled().unwrap();
        assert_eq!(on, SdpEnabled { flash: true, mem_efficient: true, math: true, cudnn: true });
        assert_eq!(check_sdp_backend(Attention::Auto, &q, &k, &v, true, false).unwrap(), SdpBackend::Flash);
        // Grouped-query attention: 4 query heads over 2 kv heads.
        let kv = Tensor::ones([2, 2, 16, 32], opts);
        let c = check_sdp_backend(Attention::Auto, &q, &kv, &kv, true, true).unwrap();
        assert!(matches!(c, SdpBackend::Flash | SdpBackend::Math), "{c:?}");
        assert!(SdpBackend::from_raw(7).is_err());
    }
}
