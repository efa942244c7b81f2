//! `spec.attention: auto` on CUDA: each SDPA backend is timed on the run's own attention
//! shapes, forward and backward, checked against f32 math attention, and the fastest
//! exact one is kept. libtorch's own choice takes the first backend that can run
//! (flash before cuDNN), which on Hopper is often not the fastest for training shapes.

use std::time::Instant;

use crds::presets::ModelConfig;
use crds::types::Attention;
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::dist::{ProcessGroup, ReduceOp};
use crate::{Error, optim};

/// The backends `auto` tries on CUDA; the first wins a tie.
pub const CUDA_CANDIDATES: [Attention; 2] = [Attention::Flash, Attention::Cudnn];

const WARMUP: usize = 2;
const TIMED: usize = 8;

/// The largest error allowed against f32 math attention, relative to the largest
/// magnitude of each of the output and the three gradients.
pub fn tolerance(kind: Kind) -> f64 {
    match kind {
        Kind::Float | Kind::Double => 1e-4,
        _ => 3e-2,
    }
}

/// One backend's trial.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trial {
    pub attention: Attention,
    /// Forward and backward of one layer's attention (K/V expansion included), the
    /// fastest of the timed repetitions, the slowest rank's; `None` when rejected.
    pub ms: Option<f64>,
    /// The largest relative error of the output and the q/k/v gradients against f32 math.
    pub error: Option<f64>,
    /// Why the backend was not a candidate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// What `auto` chose and what each backend measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice {
    /// The fastest exact backend, or `Auto` (libtorch's own choice) when none was.
    pub attention: Attention,
    pub trials: Vec<Trial>,
}

impl Choice {
    /// One line for the log: `cudnn: 1.83 ms; flash: 3.41 ms; …`.
    pub fn summary(&self) -> String {
        self.trials
            .iter()
            .map(|t| {
                let name = name(t.attention);
                match (&t.rejected, t.ms) {
                    (Some(why), _) => format!("{name}: rejected ({why})"),
                    (None, Some(ms)) => format!("{name}: {ms:.3} ms (error {:.1e})", t.error.unwrap_or(0.0)),
                    (None, None) => format!("{name}: not timed"),
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// `spec.attention`'s spelling.
pub fn name(a: Attention) -> &'static str {
    match a {
        Attention::Auto => "auto",
        Attention::Flash => "flash",
        Attention::Cudnn => "cudnn",
        Attention::Math => "math",
    }
}

/// The fastest trial that ran and was exact; the earlier one on a tie; `Auto` when none.
pub fn fastest(trials: &[Trial]) -> Attention {
    trials
        .iter()
        .filter(|t| t.rejected.is_none())
        .filter_map(|t| t.ms.map(|ms| (ms, t.attention)))
        .fold(None, |best: Option<(f64, Attention)>, (ms, a)| match best {
            Some((b, _)) if b <= ms => best,
            _ => Some((ms, a)),
        })
        .map_or(Attention::Auto, |(_, a)| a)
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
) -> Result<Choice, Error> {
    let shapes = Shapes::of(m, micro_batch, seq);
    // Every failure is a rejection, never an error: the other ranks wait for this rank's times.
    let prepared = shapes.random(kind, device).and_then(|x| {
        let reference = shapes.reference(&x)?;
        Ok((x, reference))
    });
    let mut trials: Vec<Trial> = match &prepared {
        Ok((x, reference)) => candidates.iter().map(|&a| trial(m, &shapes, x, reference, a, kind, device)).collect(),
        Err(e) => candidates
            .iter()
            .map(|&attention| Trial { attention, ms: None, error: None, rejected: Some(format!("no inputs or f32 reference: {e}")) })
            .collect(),
    };
    drop(prepared);
    if let Some(g) = group {
        agree(g, &mut trials, device)?;
    }
    let attention = fastest(&trials);
    optim::set_sdp_backend(attention)?;
    Ok(Choice { attention, trials })
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
        optim::set_sdp_backend(Attention::Math)?;
        let f32 = |t: &Tensor, heads: i64| -> Result<Tensor, Error> { Ok(t.f_narrow(0, 0, 1)?.f_narrow(1, 0, heads)?.f_to_kind(Kind::Float)?) };
        let g = self.group();
        let (q, k, v, dy) = (f32(&x.q, g)?, f32(&x.k, 1)?, f32(&x.v, 1)?, f32(&x.g, g)?);
        Ok(Reference(forward_backward(&q, &k, &v, &dy, false)?))
    }
}

/// Causal SDPA of q, k, v (grouped when K/V have fewer heads, or K/V repeated per query
/// head when `expand`) and the gradients of `sum(y · g)`: [y, dq, dk, dv].
fn forward_backward(q: &Tensor, k: &Tensor, v: &Tensor, g: &Tensor, expand: bool) -> Result<[Tensor; 4], Error> {
    let (q, k, v) = (q.f_detach()?.f_requires_grad_(true)?, k.f_detach()?.f_requires_grad_(true)?, v.f_detach()?.f_requires_grad_(true)?);
    let (hq, hk) = (q.size()[1], k.size()[1]);
    let (ke, ve, gqa) = if expand && hq != hk {
        (k.f_repeat_interleave_self_int(hq / hk, 1, None)?, v.f_repeat_interleave_self_int(hq / hk, 1, None)?, false)
    } else {
        (k.shallow_clone(), v.shallow_clone(), hq != hk)
    };
    let y = Tensor::f_scaled_dot_product_attention(&q, &ke, &ve, None::<Tensor>, 0.0, true, None, gqa)?;
    let loss = y.f_mul(g)?.f_sum(Kind::Float)?;
    let grads = Tensor::f_run_backward(&[&loss], &[&q, &k, &v], false, false)?;
    let [dq, dk, dv]: [Tensor; 3] = grads.try_into().map_err(|_| Error::Shim("attention trial: expected 3 gradients".into()))?;
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
) -> Trial {
    let rejected = |why: String| Trial { attention, ms: None, error: None, rejected: Some(why) };
    let expand = crate::model::expands_kv(attention, m);
    let run = || forward_backward(&x.q, &x.k, &x.v, &x.g, expand);
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    let attempt = || -> Result<Trial, Error> {
        optim::set_sdp_backend(attention)?;
        if let Err(e) = crate::train::attention_backend(m, attention, s.b, s.t, kind, device) {
            return Ok(rejected(format!("cannot run: {e}")));
        }
        let error = relative_error(&s.slice(&run()?)?, &reference.0)?;
        if error.is_nan() || error > tolerance(kind) {
            return Ok(Trial { error: Some(error), ..rejected(format!("error {error:.2e} above {:.0e}", tolerance(kind))) });
        }
        for _ in 1..WARMUP {
            let _ = run()?;
        }
        let mut best = f64::INFINITY;
        for _ in 0..TIMED {
            sync();
            let t0 = Instant::now();
            let _ = run()?;
            sync();
            best = best.min(t0.elapsed().as_secs_f64() * 1e3);
        }
        Ok(Trial { attention, ms: Some(best), error: Some(error), rejected: None })
    };
    attempt().unwrap_or_else(|e| rejected(format!("failed: {e}")))
}

/// The largest of `max|got − want| / max|want|` over the pairs of tensors.
fn relative_error(got: &[Tensor], want: &[Tensor]) -> Result<f64, Error> {
    let mut error = 0f64;
    for (got, want) in got.iter().zip(want) {
        let got = got.f_to_kind(Kind::Float)?;
        let scale = want.f_abs()?.f_max()?.f_double_value(&[])?.max(f64::MIN_POSITIVE);
        let diff = got.f_sub(want)?.f_abs()?.f_max()?.f_double_value(&[])?;
        error = error.max(diff / scale);
    }
    Ok(error)
}

/// Every rank's times, the slowest kept; a backend rejected anywhere is rejected everywhere.
fn agree(group: &ProcessGroup, trials: &mut [Trial], device: Device) -> Result<(), Error> {
    let local: Vec<f64> = trials.iter().map(|t| if t.rejected.is_some() { f64::INFINITY } else { t.ms.unwrap_or(f64::INFINITY) }).collect();
    let times = Tensor::f_from_slice(&local)?.f_to_kind(Kind::Float)?.f_to_device(device)?;
    group.allreduce(&times, ReduceOp::Max)?.wait()?;
    let slowest = Vec::<f64>::try_from(times.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?)?;
    for (t, ms) in trials.iter_mut().zip(slowest) {
        if !ms.is_finite() && t.rejected.is_none() {
            t.rejected = Some("rejected on another rank".into());
            t.ms = None;
        } else if t.rejected.is_none() {
            t.ms = Some(ms);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(attention: Attention, ms: Option<f64>, rejected: Option<&str>) -> Trial {
        Trial { attention, ms, error: ms.map(|_| 1e-3), rejected: rejected.map(String::from) }
    }

    #[test]
    fn fastest_exact_backend_wins() {
        use Attention::{Auto, Cudnn, Flash};
        assert_eq!(fastest(&[t(Flash, Some(3.4), None), t(Cudnn, Some(1.8), None)]), Cudnn);
        assert_eq!(fastest(&[t(Flash, Some(1.2), None), t(Cudnn, Some(1.8), None)]), Flash);
        // A tie goes to the earlier candidate (flash: no K/V expansion, less memory).
        assert_eq!(fastest(&[t(Flash, Some(2.0), None), t(Cudnn, Some(2.0), None)]), Flash);
        // Rejected (inexact, cannot run, failed elsewhere) never wins, however fast.
        assert_eq!(fastest(&[t(Flash, Some(3.4), None), t(Cudnn, Some(0.1), Some("error 2e-1 above 3e-2"))]), Flash);
        assert_eq!(fastest(&[t(Flash, None, Some("cannot run")), t(Cudnn, Some(5.0), None)]), Cudnn);
        assert_eq!(fastest(&[t(Flash, None, Some("x")), t(Cudnn, None, Some("y"))]), Auto);
        assert_eq!(fastest(&[]), Auto);
    }

    /// Two Gloo ranks: the slower rank's time counts, and a backend one rank rejected is
    /// rejected on both, so both choose the same.
    #[test]
    fn ranks_agree_on_the_slowest_times() {
        use Attention::{Cudnn, Flash};
        use crate::dist::bench::{gloo, on_ranks};
        let chosen = on_ranks(2, |rank, port| {
            let group = gloo(rank, 2, port)?;
            let mut trials = match rank {
                0 => vec![t(Flash, Some(2.0), None), t(Cudnn, Some(1.0), None)],
                _ => vec![t(Flash, Some(2.5), None), t(Cudnn, None, Some("cannot run: x"))],
            };
            agree(&group, &mut trials, Device::Cpu)?;
            assert_eq!(trials[0].ms, Some(2.5), "rank {rank}");
            assert_eq!(trials[1].ms, None, "rank {rank}");
            let why = if rank == 0 { "rejected on another rank" } else { "cannot run: x" };
            assert_eq!(trials[1].rejected.as_deref(), Some(why), "rank {rank}");
            Ok(fastest(&trials))
        })
        .unwrap();
        assert_eq!(chosen, Flash);
    }

    #[test]
    fn summary_names_each_backend() {
        let c = Choice {
            attention: Attention::Cudnn,
            trials: vec![t(Attention::Flash, Some(3.41), None), t(Attention::Cudnn, None, Some("cannot run: x"))],
        };
        assert_eq!(c.summary(), "flash: 3.410 ms (error 1.0e-3); cudnn: rejected (cannot run: x)");
    }

    #[test]
    fn relative_error_is_the_worst_tensor() {
        let want = [Tensor::from_slice(&[1.0f32, -2.0]), Tensor::from_slice(&[4.0f32, 0.5])];
        let got = [Tensor::from_slice(&[1.0f32, -2.02]), Tensor::from_slice(&[4.0f32, 0.9])];
        let e = relative_error(&got, &want).unwrap();
        assert!((e - 0.1).abs() < 1e-6, "{e}"); // 0.4 / 4 beats 0.02 / 2
        assert_eq!(relative_error(&want, &want).unwrap(), 0.0);
    }
}
