//! SwiGLU's elementwise part, `silu(gate) · up`, as one autograd node
//! ([`ffi::swiglu`]): it keeps one (tokens, d_ff) activation per layer less than eager's
//! two nodes. On CUDA a run also chooses between ATen's kernels and jiterator-fused ones
//! by timing both on its own shapes ([`tune`]).

use std::sync::atomic::{AtomicU8, Ordering};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, TchError, Tensor};

use crate::dist::ProcessGroup;
use crate::trials::{self, Candidate, Choice, Trial, relative_error};
use crate::{Error, ffi};

/// The [`Kernels`] [`forward`] runs, as its discriminant; process-wide, like the SDPA
/// switches.
static CURRENT: AtomicU8 = AtomicU8::new(Kernels::Composed as u8);

/// The rows of the trial's inputs that are checked against f32.
const REFERENCE_ROWS: i64 = 256;

/// Which kernels compute SwiGLU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Kernels {
    /// `silu(gate) * up` as two autograd nodes, which keep silu(gate) as well: eager
    /// PyTorch's graph, the baseline `trainer bench --swiglu eager` measures against.
    Eager,
    /// ATen's silu and mul (and their backward) kernels: eager's values to the bit.
    Composed,
    /// One jiterator kernel each way, CUDA only: each input read once, rounded once.
    Fused,
}

impl Candidate for Kernels {
    fn name(self) -> &'static str {
        match self {
            Kernels::Eager => "eager",
            Kernels::Composed => "composed",
            Kernels::Fused => "fused",
        }
    }
}

/// The kernels a CUDA run tries; the first wins a tie.
pub const CUDA_CANDIDATES: [Kernels; 2] = [Kernels::Composed, Kernels::Fused];

/// Every variant, in discriminant order.
const ALL: [Kernels; 3] = [Kernels::Eager, Kernels::Composed, Kernels::Fused];

/// Sets the kernels [`forward`] uses, for the whole process.
pub fn set(k: Kernels) {
    CURRENT.store(k as u8, Ordering::Relaxed);
}

/// The kernels [`forward`] uses.
pub fn current() -> Kernels {
    ALL[CURRENT.load(Ordering::Relaxed) as usize]
}

/// `silu(gate) · up` with the process's kernels; both (…, d_ff), same dtype.
pub fn forward(gate: &Tensor, up: &Tensor) -> Result<Tensor, TchError> {
    with(current(), gate, up)
}

fn with(k: Kernels, gate: &Tensor, up: &Tensor) -> Result<Tensor, TchError> {
    match k {
        Kernels::Eager => gate.f_silu()?.f_mul(up),
        Kernels::Composed | Kernels::Fused => ffi::swiglu(gate, up, k == Kernels::Fused),
    }
}

/// Times `candidates` on SwiGLU of `tokens` × `d_ff` in `kind` on `device`, forward and
/// backward, each checked against f32 on the first rows, and [`set`]s the fastest exact
/// one. With a `group`, every rank times and all choose the same.
pub fn tune(
    tokens: i64,
    d_ff: i64,
    kind: Kind,
    device: Device,
    candidates: &[Kernels],
    group: Option<&ProcessGroup>,
) -> Result<Choice<Kernels>, Error> {
    let rows = tokens.min(REFERENCE_ROWS);
    let first_rows = |ts: &[Tensor]| -> Result<Vec<Tensor>, Error> { Ok(ts.iter().map(|t| t.f_narrow(0, 0, rows)).collect::<Result<_, _>>()?) };
    // Every failure is a rejection, never an error: the other ranks wait for this rank's times.
    let prepared = (|| -> Result<_, Error> {
        let randn = || Tensor::f_randn([tokens, d_ff], (kind, device));
        // gate spread wider than N(0, 1), so silu's curved part is exercised.
        let x = [randn()?.f_mul_scalar(3.0)?, randn()?, randn()?];
        let f32 = first_rows(&x)?.iter().map(|t| t.f_to_kind(Kind::Float)).collect::<Result<Vec<_>, _>>()?;
        let reference = forward_backward(&f32[0], &f32[1], &f32[2], Kernels::Composed)?;
        Ok((x, reference))
    })();
    let mut trials: Vec<Trial<Kernels>> = match &prepared {
        Ok(([a, b, g], reference)) => candidates
            .iter()
            .map(|&k| Trial::measure(k, kind, device, || forward_backward(a, b, g, k), |out| relative_error(&first_rows(&out)?, reference)))
            .collect(),
        Err(e) => candidates.iter().map(|&k| Trial::rejected(k, format!("no inputs or f32 reference: {e}"))).collect(),
    };
    drop(prepared);
    if let Some(g) = group {
        trials::agree(g, &mut trials, device)?;
    }
    let kernels = trials::fastest(&trials).unwrap_or(Kernels::Composed);
    set(kernels);
    Ok(Choice { chosen: kernels, trials })
}

/// `y = silu(a) · b` and the gradients of a and b for y's gradient `g`: [y, da, db].
fn forward_backward(a: &Tensor, b: &Tensor, g: &Tensor, k: Kernels) -> Result<[Tensor; 3], Error> {
    let (a, b) = (a.f_detach()?.f_requires_grad_(true)?, b.f_detach()?.f_requires_grad_(true)?);
    let y = with(k, &a, &b)?;
    ffi::backward(std::slice::from_ref(&y), std::slice::from_ref(g))?;
    Ok([y.f_detach()?, a.grad(), b.grad()])
}
