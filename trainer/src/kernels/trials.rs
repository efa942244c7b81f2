//! Choosing a kernel by measurement on the run's own shapes: each candidate is checked
//! against an exact answer, timed, and the fastest exact one is kept (`attention: auto`'s
//! SDPA backends, SwiGLU's kernels). Every failure rejects a candidate rather than
//! failing the run, and with several ranks the slowest rank's times count, so all ranks
//! choose the same.

use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::dist::{ProcessGroup, ReduceOp};

const WARMUP: usize = 2;
const TIMED: usize = 8;

/// What is being chosen between: an SDPA backend, a kernel implementation.
pub trait Candidate: Copy + PartialEq + Serialize {
    /// The name the logs and the spec use.
    fn name(self) -> &'static str;
}

/// The largest error allowed against the f32 reference, relative to the largest
/// magnitude of each output and gradient.
pub fn tolerance(kind: Kind) -> f64 {
    match kind {
        Kind::Float | Kind::Double => 1e-4,
        _ => 3e-2,
    }
}

/// One candidate's trial.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trial<K> {
    pub candidate: K,
    /// The fastest of the timed repetitions, the slowest rank's; `None` when rejected.
    pub ms: Option<f64>,
    /// The largest relative error of its outputs against the f32 reference.
    pub error: Option<f64>,
    /// Why the candidate was not one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

impl<K: Candidate> Trial<K> {
    pub fn rejected(candidate: K, why: String) -> Self {
        Trial { candidate, ms: None, error: None, rejected: Some(why) }
    }

    /// Runs `run` once and measures its error with `error`; if within `tolerance(kind)`,
    /// times it (the best of several runs after a warm-up). Anything failing rejects.
    pub fn measure<R>(
        candidate: K,
        kind: Kind,
        device: Device,
        mut run: impl FnMut() -> Result<R, Error>,
        error: impl FnOnce(R) -> Result<f64, Error>,
    ) -> Self {
        let sync = || {
            if let Device::Cuda(i) = device {
                tch::Cuda::synchronize(i as i64);
            }
        };
        let attempt = || -> Result<Trial<K>, Error> {
            let error = error(run()?)?;
            if error.is_nan() || error > tolerance(kind) {
                let why = format!("error {error:.2e} above {:.0e}", tolerance(kind));
                return Ok(Trial { error: Some(error), ..Trial::rejected(candidate, why) });
            }
            for _ in 1..WARMUP {
                drop(run()?);
            }
            let mut best = f64::INFINITY;
            for _ in 0..TIMED {
                sync();
                let t0 = Instant::now();
                drop(run()?);
                sync();
                best = best.min(t0.elapsed().as_secs_f64() * 1e3);
            }
            Ok(Trial { candidate, ms: Some(best), error: Some(error), rejected: None })
        };
        attempt().unwrap_or_else(|e| Trial::rejected(candidate, format!("failed: {e}")))
    }
}

/// What a trial chose and what each candidate measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice<K> {
    pub chosen: K,
    pub trials: Vec<Trial<K>>,
}

impl<K: Candidate> Choice<K> {
    /// One line for the log: `flash: 3.410 ms (error 1.0e-3); cudnn: rejected (…)`.
    pub fn summary(&self) -> String {
        summary(&self.trials)
    }
}

/// The fastest trial that ran and was exact; the earlier one on a tie; `None` when none.
pub fn fastest<K: Candidate>(trials: &[Trial<K>]) -> Option<K> {
    trials
        .iter()
        .filter(|t| t.rejected.is_none())
        .filter_map(|t| t.ms.map(|ms| (ms, t.candidate)))
        .fold(None, |best: Option<(f64, K)>, (ms, k)| match best {
            Some((b, _)) if b <= ms => best,
            _ => Some((ms, k)),
        })
        .map(|(_, k)| k)
}

/// One line for the log: `flash: 3.410 ms (error 1.0e-3); cudnn: rejected (…)`.
pub fn summary<K: Candidate>(trials: &[Trial<K>]) -> String {
    trials
        .iter()
        .map(|t| {
            let name = t.candidate.name();
            match (&t.rejected, t.ms) {
                (Some(why), _) => format!("{name}: rejected ({why})"),
                (None, Some(ms)) => format!("{name}: {ms:.3} ms (error {:.1e})", t.error.unwrap_or(0.0)),
                (None, None) => format!("{name}: not timed"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The largest of `max|got − want| / max|want|` over the pairs of tensors.
pub fn relative_error(got: &[Tensor], want: &[Tensor]) -> Result<f64, Error> {
    let mut error = 0f64;
    for (got, want) in got.iter().zip(want) {
        let (got, want) = (got.f_to_kind(Kind::Float)?, want.f_to_kind(Kind::Float)?);
        let scale = want.f_abs()?.f_max()?.f_double_value(&[])?.max(f64::MIN_POSITIVE);
        let diff = got.f_sub(&want)?.f_abs()?.f_max()?.f_double_value(&[])?;
        error = error.max(diff / scale);
    }
    Ok(error)
}

/// Each candidate's trial on what `prepared` holds (the inputs and the f32 answer), every
/// candidate rejected when preparing failed, then with a `group` the ranks' agreement
/// ([`agree`]). Every failure is a rejection, never an error: the other ranks wait for
/// this rank's times.
pub fn run_all<K: Candidate, P>(
    candidates: &[K],
    prepared: Result<P, Error>,
    trial: impl Fn(&P, K) -> Trial<K>,
    group: Option<&ProcessGroup>,
    device: Device,
) -> Result<Vec<Trial<K>>, Error> {
    let mut trials: Vec<Trial<K>> = match &prepared {
        Ok(p) => candidates.iter().map(|&k| trial(p, k)).collect(),
        Err(e) => candidates.iter().map(|&k| Trial::rejected(k, format!("no inputs or f32 reference: {e}"))).collect(),
    };
    drop(prepared); // the inputs' memory, before waiting on the other ranks
    if let Some(g) = group {
        agree(g, &mut trials, device)?;
    }
    Ok(trials)
}

/// Every rank's times, the slowest kept; a candidate rejected anywhere is rejected everywhere.
pub fn agree<K: Candidate>(group: &ProcessGroup, trials: &mut [Trial<K>], device: Device) -> Result<(), Error> {
    let local: Vec<f64> = trials
        .iter()
        .map(|t| if t.rejected.is_some() { f64::INFINITY } else { t.ms.unwrap_or(f64::INFINITY) })
        .collect();
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

    #[derive(Clone, Copy, Debug, PartialEq, Serialize)]
    enum K {
        A,
        B,
    }

    impl Candidate for K {
        fn name(self) -> &'static str {
            match self {
                K::A => "a",
                K::B => "b",
            }
        }
    }

    fn t(candidate: K, ms: Option<f64>, rejected: Option<&str>) -> Trial<K> {
        Trial { candidate, ms, error: ms.map(|_| 1e-3), rejected: rejected.map(String::from) }
    }

    #[test]
    fn fastest_exact_candidate_wins() {
        assert_eq!(fastest(&[t(K::A, Some(3.4), None), t(K::B, Some(1.8), None)]), Some(K::B));
        assert_eq!(fastest(&[t(K::A, Some(1.2), None), t(K::B, Some(1.8), None)]), Some(K::A));
        // A tie goes to the earlier candidate.
        assert_eq!(fastest(&[t(K::A, Some(2.0), None), t(K::B, Some(2.0), None)]), Some(K::A));
        // Rejected (inexact, cannot run, failed elsewhere) never wins, however fast.
        assert_eq!(fastest(&[t(K::A, Some(3.4), None), t(K::B, Some(0.1), Some("error 2e-1 above 3e-2"))]), Some(K::A));
        assert_eq!(fastest(&[t(K::A, None, Some("cannot run")), t(K::B, Some(5.0), None)]), Some(K::B));
        assert_eq!(fastest(&[t(K::A, None, Some("x")), t(K::B, None, Some("y"))]), None);
        assert_eq!(fastest::<K>(&[]), None);
    }

    /// Two Gloo ranks: the slower rank's time counts, and a candidate one rank rejected
    /// is rejected on both, so both choose the same.
    #[test]
    fn ranks_agree_on_the_slowest_times() {
        use crate::dist::loopback::{gloo, on_ranks};
        let chosen = on_ranks(2, |rank, port| {
            let group = gloo(rank, 2, port)?;
            let mut trials = match rank {
                0 => vec![t(K::A, Some(2.0), None), t(K::B, Some(1.0), None)],
                _ => vec![t(K::A, Some(2.5), None), t(K::B, None, Some("cannot run: x"))],
            };
            agree(&group, &mut trials, Device::Cpu)?;
            assert_eq!(trials[0].ms, Some(2.5), "rank {rank}");
            assert_eq!(trials[1].ms, None, "rank {rank}");
            let why = if rank == 0 { "rejected on another rank" } else { "cannot run: x" };
            assert_eq!(trials[1].rejected.as_deref(), Some(why), "rank {rank}");
            Ok(fastest(&trials))
        })
        .unwrap();
        assert_eq!(chosen, Some(K::A));
    }

    #[test]
    fn summary_names_each_candidate() {
        let trials = [t(K::A, Some(3.41), None), t(K::B, None, Some("cannot run: x"))];
        assert_eq!(summary(&trials), "a: 3.410 ms (error 1.0e-3); b: rejected (cannot run: x)");
    }

    #[test]
    fn relative_error_is_the_worst_tensor() {
        let want = [Tensor::from_slice(&[1.0f32, -2.0]), Tensor::from_slice(&[4.0f32, 0.5])];
        let got = [Tensor::from_slice(&[1.0f32, -2.02]), Tensor::from_slice(&[4.0f32, 0.9])];
        let e = relative_error(&got, &want).unwrap();
        assert!((e - 0.1).abs() < 1e-6, "{e}"); // 0.4 / 4 beats 0.02 / 2
        assert_eq!(relative_error(&want, &want).unwrap(), 0.0);
    }

    /// An inexact or failing run is rejected with the reason; an exact one is timed.
    #[test]
    fn measure_checks_before_it_times() {
        let ok = Trial::measure(K::A, Kind::Float, Device::Cpu, || Ok(()), |()| Ok(5e-5));
        assert!(ok.rejected.is_none() && ok.ms.unwrap() >= 0.0 && ok.error == Some(5e-5), "{ok:?}");
        let inexact = Trial::measure(K::A, Kind::Float, Device::Cpu, || Ok(()), |()| Ok(2e-4));
        assert_eq!((inexact.rejected.as_deref(), inexact.ms), (Some("error 2.00e-4 above 1e-4"), None));
        let nan = Trial::measure(K::A, Kind::BFloat16, Device::Cpu, || Ok(()), |()| Ok(f64::NAN));
        assert!(nan.rejected.unwrap().starts_with("error NaN"));
        let mut calls = 0;
        let failing = Trial::measure(
            K::B,
            Kind::Float,
            Device::Cpu,
            || {
                calls += 1;
                if calls > 1 { Err(Error::Shim("boom".into())) } else { Ok(()) }
            },
            |()| Ok(0.0),
        );
        assert_eq!(failing.rejected.as_deref(), Some("failed: libtorch shim: boom"));
    }
}
