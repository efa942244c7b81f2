//! `spec.attention: auto` on CUDA: each SDPA backend is timed on the run's own attention
//! shapes, forward and backward, checked against f32 math attention, and the fastest
//! exact one is kept. libtorch's own choice takes the first backend that can run
//! (flash before cuDNN), which on Hopper is often not the fastest for training shapes.

use crds::presets::ModelConfig;
use crds::types::Attention;
use tch::{Device, Kind, Tensor};

use super::sdp;
use super::trials::{self, Candidate, Choice, Trial, relative_error};
use crate::Error;
use crate::dist::ProcessGroup;

/// The backends `auto` tries on CUDA; the first wins a tie.
pub const CUDA_CANDIDATES: [Attention; 2] = [Attention::Flash, Attention::Cudnn];

impl Candidate for Attention {
    /// `spec.attention`'s spelling.
    fn name(self) -> &'static str {
        match self {
            Attention::Auto => "auto",
            Attention::Flash => "flash",
            Attention::Cudnn => "cudnn",
            Attention::Math => "math",
        }
    }
}

/// The fastest exact backend; `Auto` when none was.
pub fn fastest(trials: &[Trial<Attention>]) -> Attention {
    trials::fastest(trials).unwrap_or(Attention::Auto)
}

/// Times `candidates` on attention of the model's shapes at this micro-batch and
/// sequence, in `kind` on `device`, and chooses. With a `group`, every rank times, the
/// slowest rank's time counts, and a backend rejected on any rank is rejected on all,
/// so every rank chooses the same. Leaves the SDPA switches on the chosen backend.
pub fn tune(
    m: &ModelConfig,
    micro_batch: i64,
    seq: i64,
    kind: Kind,
    device: Device,
    candidates: &[Attention],
    group: Option<&ProcessGroup>,
) -> Result<Choice<Attention>, Error> {
    let shapes = Shapes::of(m, micro_batch, seq);
    let prepared = shapes.random(kind, device).and_then(|x| {
        let reference = shapes.reference(&x)?;
        Ok((x, reference))
    });
    let trials = trials::run_all(
        candidates,
        prepared,
        |(x, reference), a| trial(m, &shapes, x, reference, a, kind, device),
        group,
        device,
    )?;
    let attention = fastest(&trials);
    sdp::set_sdp_backend(attention)?;
    Ok(Choice { chosen: attention, trials })
}

struct Shapes {
    b: i64,
    t: i64,
    hq: i64,
    hk: i64,
    dh: i64,
}

/// q (B, n_head, T, d_head), k and v (B, n_kv_head, T, d_head), and the output's
/// gradient g (B, n_head, T, d_head).
struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
}

/// Output and q/k/v gradients of batch row 0 and the first K/V head with its query
/// heads (all of the attention one K/V head serves), in f32.
struct Reference([Tensor; 4]);

impl Shapes {
    fn of(m: &ModelConfig, b: i64, t: i64) -> Shapes {
        Shapes { b, t, hq: m.n_head as i64, hk: m.n_kv_head as i64, dh: m.d_head as i64 }
    }

    fn random(&self, kind: Kind, device: Device) -> Result<Inputs, Error> {
        let randn = |h: i64| Tensor::f_randn([self.b, h, self.t, self.dh], (kind, device));
        Ok(Inputs { q: randn(self.hq)?, k: randn(self.hk)?, v: randn(self.hk)?, g: randn(self.hq)? })
    }

    /// Query heads per K/V head.
    fn group(&self) -> i64 {
        self.hq / self.hk
    }

    /// [y, dq, dk, dv] of a trial cut to what [`Reference`] holds.
    fn slice(&self, out: &[Tensor; 4]) -> Result<[Tensor; 4], Error> {
        let cut = |t: &Tensor, heads: i64| -> Result<Tensor, Error> { Ok(t.f_narrow(0, 0, 1)?.f_narrow(1, 0, heads)?) };
        Ok([cut(&out[0], self.group())?, cut(&out[1], self.group())?, cut(&out[2], 1)?, cut(&out[3], 1)?])
    }

    /// f32 math attention of row 0's first K/V group, the exact answer every backend is
    /// held to; one group keeps the f32 (T, T) scores small at long sequences.
    fn reference(&self, x: &Inputs) -> Result<Reference, Error> {
        sdp::set_sdp_backend(Attention::Math)?;
        let f32 = |t: &Tensor, heads: i64| -> Result<Tensor, Error> {
            Ok(t.f_narrow(0, 0, 1)?.f_narrow(1, 0, heads)?.f_to_kind(Kind::Float)?)
        };
        let g = self.group();
        let (q, k, v, dy) = (f32(&x.q, g)?, f32(&x.k, 1)?, f32(&x.v, 1)?, f32(&x.g, g)?);
        Ok(Reference(forward_backward(&q, &k, &v, &dy, false)?))
    }
}

/// Causal SDPA of q, k, v (grouped when K/V have fewer heads, or K/V repeated per query
/// head when `expand`) and the gradients of `sum(y · g)`: [y, dq, dk, dv].
fn forward_backward(q: &Tensor, k: &Tensor, v: &Tensor, g: &Tensor, expand: bool) -> Result<[Tensor; 4], Error> {
    let (q, k, v) = (
        q.f_detach()?.f_requires_grad_(true)?,
        k.f_detach()?.f_requires_grad_(true)?,
        v.f_detach()?.f_requires_grad_(true)?,
    );
    let (hq, hk) = (q.size()[1], k.size()[1]);
    let (ke, ve, gqa) = if expand && hq != hk {
        (k.f_repeat_interleave_self_int(hq / hk, 1, None)?, v.f_repeat_interleave_self_int(hq / hk, 1, None)?, false)
    } else {
        (k.shallow_clone(), v.shallow_clone(), hq != hk)
    };
    let y = Tensor::f_scaled_dot_product_attention(&q, &ke, &ve, None::<Tensor>, 0.0, true, None, gqa)?;
    let loss = y.f_mul(g)?.f_sum(Kind::Float)?;
    let grads = Tensor::f_run_backward(&[&loss], &[&q, &k, &v], false, false)?;
    let [dq, dk, dv]: [Tensor; 3] =
        grads.try_into().map_err(|_| Error::Shim("attention trial: expected 3 gradients".into()))?;
    Ok([y.f_detach()?, dq, dk, dv])
}

/// One backend's trial; anything that fails rejects it.
fn trial(
    m: &ModelConfig,
    s: &Shapes,
    x: &Inputs,
    reference: &Reference,
    attention: Attention,
    kind: Kind,
    device: Device,
) -> Trial<Attention> {
    let expand = super::sdp::expands_kv(attention, m);
    if let Err(e) = sdp::set_sdp_backend(attention) {
        return Trial::rejected(attention, format!("failed: {e}"));
    }
    if let Err(e) = super::sdp::attention_backend(m, attention, s.b, s.t, kind, device) {
        return Trial::rejected(attention, format!("cannot run: {e}"));
    }
    Trial::measure(
        attention,
        kind,
        device,
        || forward_backward(&x.q, &x.k, &x.v, &x.g, expand),
        |out| relative_error(&s.slice(&out)?, &reference.0),
    )
}
