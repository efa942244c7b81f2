//! AdamW over ATen's fused kernel, global-norm gradient clipping, and the SDPA
//! backend choice.

use std::collections::HashMap;

use crds::config::ResolvedOptimizer;
use crds::types::Attention;
use tch::{Kind, Tensor};

use crate::Error;
pub use crate::ffi::Lr;
use crate::ffi::{self, AdamWParams, SdpEnabled};
pub use crate::ffi::{SdpBackend, sdp_choice};

/// One parameter and its AdamW state.
struct Slot {
    name: String,
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// f32 0-dim on the param's device, as torch's fused AdamW keeps it.
    step: Tensor,
}

/// AdamW (decoupled weight decay, as torch.optim.AdamW with `fused=True`).
///
/// Weight decay applies only to parameters with two or more dimensions (matmul
/// weights, embeddings); norms and biases get none. State tensors have the dtype and
/// device of their parameter.
pub struct AdamW {
    config: ResolvedOptimizer,
    /// Sorted by name, so state and checkpoint order never depend on a HashMap.
    decay: Vec<Slot>,
    no_decay: Vec<Slot>,
}

impl AdamW {
    /// Builds the optimizer over `named` parameters (e.g. `VarStore::variables()`);
    /// parameters that do not require grad are left out.
    pub fn new(named: impl IntoIterator<Item = (String, Tensor)>, config: &ResolvedOptimizer) -> Result<Self, Error> {
        let mut named: Vec<(String, Tensor)> = named.into_iter().filter(|(_, t)| t.requires_grad()).collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
        for (name, param) in named {
            let exp_avg = param.f_zeros_like()?;
            let exp_avg_sq = param.f_zeros_like()?;
            let step = Tensor::f_zeros([], (Kind::Float, param.device()))?;
            let slot = Slot { name, param, exp_avg, exp_avg_sq, step };
            if slot.param.dim() >= 2 { decay.push(slot) } else { no_decay.push(slot) }
        }
        Ok(AdamW { config: config.clone(), decay, no_decay })
    }

    /// The hyperparameters this optimizer was built with.
    pub fn config(&self) -> &ResolvedOptimizer {
        &self.config
    }

    fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.decay.iter().chain(&self.no_decay)
    }

    /// Grads of all parameters that have one.
    fn grads(&self) -> Result<Vec<Tensor>, Error> {
        let mut out = Vec::new();
        for s in self.slots() {
            let g = s.param.f_grad()?;
            if g.defined() {
                out.push(g);
            }
        }
        Ok(out)
    }

    /// One AdamW step at learning rate `lr`: one fused call for the decayed group and
    /// one for the rest. Parameters without a grad are skipped, as torch does, and
    /// their step count does not advance.
    pub fn step(&mut self, lr: f64) -> Result<(), Error> {
        self.fused_step(Lr::Value(lr), None)
    }

    /// [`Self::step`], except that nothing changes (moments and step counts included)
    /// where `skip` (0-dim f32 on the device) is 1. Nothing syncs with the device.
    pub fn step_unless(&mut self, lr: Lr, skip: &Tensor) -> Result<(), Error> {
        self.fused_step(lr, Some(skip))
    }

    /// The training step's update: clips the gradients to `max_norm` and steps unless
    /// `loss` or the gradient norm is not finite, all on the device. Returns the
    /// pre-clip norm and the skip flag (0-dim f32: 1 where the step was skipped).
    pub fn clip_and_step(&mut self, loss: &Tensor, max_norm: f64, lr: Lr) -> Result<(Tensor, Tensor), Error> {
        let norm = self.clip_grad_norm(max_norm)?;
        let skip = nonfinite(&[loss, &norm])?;
        self.step_unless(lr, &skip)?;
        Ok((norm, skip))
    }

    fn fused_step(&mut self, lr: Lr, found_inf: Option<&Tensor>) -> Result<(), Error> {
        let c = &self.config;
        for (slots, weight_decay) in [(&self.decay, c.weight_decay), (&self.no_decay, 0.0)] {
            let (mut p, mut g, mut m, mut v, mut s) = (vec![], vec![], vec![], vec![], vec![]);
            for slot in slots {
                let grad = slot.param.f_grad()?;
                if !grad.defined() {
                    continue;
                }
                p.push(slot.param.shallow_clone());
                g.push(grad);
                m.push(slot.exp_avg.shallow_clone());
                v.push(slot.exp_avg_sq.shallow_clone());
                s.push(slot.step.shallow_clone());
            }
            let hp = AdamWParams { lr, beta1: c.beta1, beta2: c.beta2, weight_decay, eps: c.eps };
            ffi::fused_adamw(&p, &g, &m, &v, &s, &hp, found_inf)?;
        }
        Ok(())
    }

    /// Scales all grads so their global L2 norm is at most `max_norm`
    /// (torch.nn.utils.clip_grad_norm_ semantics) and returns the pre-clip norm as a
    /// 0-dim f32 tensor, without syncing the device. With no grads it returns 0.
    pub fn clip_grad_norm(&self, max_norm: f64) -> Result<Tensor, Error> {
        let grads = self.grads()?;
        if grads.is_empty() {
            let device = self.slots().next().map_or(tch::Device::Cpu, |s| s.param.device());
            return Ok(Tensor::f_zeros([], (Kind::Float, device))?);
        }
        ffi::clip_grad_norm(&grads, max_norm)
    }

    /// Drops every grad, as `zero_grad(set_to_none=True)`: between steps the gradients
    /// hold no memory, so the next forward's activations can use it (zeroed grads
    /// would add the model's size in gradients to the peak at the start of backward).
    pub fn zero_grad(&mut self) -> Result<(), Error> {
        let params: Vec<Tensor> = self.slots().map(|s| s.param.shallow_clone()).collect();
        ffi::clear_grads(&params)
    }

    /// Optimizer state for checkpoints, named `<param>.exp_avg`, `<param>.exp_avg_sq`
    /// and `<param>.step`, sorted by parameter name. The tensors share storage with
    /// the live state: copy them before the next step if they must not change.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut slots: Vec<&Slot> = self.slots().collect();
        slots.sort_by(|a, b| a.name.cmp(&b.name));
        slots
            .into_iter()
            .flat_map(|s| {
                [
                    (format!("{}.exp_avg", s.name), s.exp_avg.shallow_clone()),
                    (format!("{}.exp_avg_sq", s.name), s.exp_avg_sq.shallow_clone()),
                    (format!("{}.step", s.name), s.step.shallow_clone()),
                ]
            })
            .collect()
    }

    /// Copies saved state (as from [`AdamW::state_tensors`], on any device) into the
    /// optimizer. The names must be exactly this optimizer's, each with the same shape
    /// and dtype; otherwise nothing is copied and the error names the first mismatch.
    pub fn load_state(&mut self, named: &HashMap<String, Tensor>) -> Result<(), Error> {
        let want = self.state_tensors();
        for (name, live) in &want {
            let saved = named.get(name).ok_or_else(|| Error::OptimizerState(format!("{name} is missing")))?;
            if saved.size() != live.size() {
                return Err(Error::OptimizerState(format!(
                    "{name} has shape {:?}, the model needs {:?}",
                    saved.size(),
                    live.size()
                )));
            }
            if saved.kind() != live.kind() {
                return Err(Error::OptimizerState(format!(
                    "{name} has dtype {:?}, the model needs {:?}",
                    saved.kind(),
                    live.kind()
                )));
            }
        }
        if named.len() != want.len() {
            let known: std::collections::HashSet<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
            let mut extra: Vec<&String> = named.keys().filter(|n| !known.contains(n.as_str())).collect();
            extra.sort();
            if let Some(name) = extra.first() {
                return Err(Error::OptimizerState(format!("{name} is not a parameter of this model")));
            }
        }
        let _guard = tch::no_grad_guard();
        for (name, mut live) in want {
            live.f_copy_(&named[&name])?;
        }
        Ok(())
    }
}

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

/// 1.0 (0-dim f32, on the first tensor's device) where any element of `ts` is NaN
/// or infinite, else 0.0; computed on the device without syncing.
pub fn nonfinite(ts: &[&Tensor]) -> Result<Tensor, Error> {
    let first = ts.first().ok_or_else(|| Error::Shim("nonfinite needs at least one tensor".into()))?;
    let bad = ts
        .iter()
        .map(|t| Ok(t.f_isfinite()?.f_logical_not()?.f_any()?.f_to_device(first.device())?))
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Tensor::f_stack(&bad, 0)?.f_any()?.f_to_kind(Kind::Float)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::time::Instant;
    use tch::Device;

    const GOLDEN: &str = include_str!("../tests/goldens/adamw.json");

    /// The param formulas of scripts/goldens/adamw.py, in its order.
    fn init_value(name: &str, i: usize) -> f64 {
        let x = i as f64;
        match name {
            "proj.weight" => 0.5 * (0.37 * x + 0.1).sin(),
            "norm.weight" => 1.0 + 0.1 * (0.5 * x).cos(),
            "proj.bias" => 0.05 * x - 0.15,
            "unused.weight" => 0.25 - 0.1 * x,
            _ => unreachable!("{name}"),
        }
    }

    const NAMES: [&str; 4] = ["proj.weight", "norm.weight", "proj.bias", "unused.weight"];

    fn golden() -> Value {
        serde_json::from_str(GOLDEN).unwrap()
    }

    fn floats(v: &Value) -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    }

    fn shape(g: &Value, name: &str) -> Vec<i64> {
        g["init"][name]["shape"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
    }

    fn fill(shape: &[i64], kind: Kind, f: impl Fn(usize) -> f64) -> Tensor {
        let n: i64 = shape.iter().product();
        let vals: Vec<f32> = (0..n as usize).map(|i| f(i) as f32).collect();
        Tensor::from_slice(&vals).reshape(shape).to_kind(kind)
    }

    fn config(g: &Value) -> ResolvedOptimizer {
        let c = &g["config"];
        ResolvedOptimizer {
            weight_decay: c["weight_decay"].as_f64().unwrap(),
            beta1: c["beta1"].as_f64().unwrap(),
            beta2: c["beta2"].as_f64().unwrap(),
            eps: c["eps"].as_f64().unwrap(),
            grad_clip: c["max_norm"].as_f64().unwrap(),
        }
    }

    fn golden_params(g: &Value, kind: Kind) -> Vec<(String, Tensor)> {
        NAMES
            .iter()
            .map(|&n| (n.to_string(), fill(&shape(g, n), kind, |i| init_value(n, i)).set_requires_grad(true)))
            .collect()
    }

    /// Gives every param but `unused.weight` the golden grad of `step` (1-based) through
    /// a backward pass, so the unused param's grad stays undefined.
    fn set_golden_grads(g: &Value, params: &[(String, Tensor)], opt: &mut AdamW, step: usize) {
        opt.zero_grad().unwrap();
        let scale = g["config"]["grad_scales"][step - 1].as_f64().unwrap();
        let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for (k, (name, p)) in params.iter().enumerate() {
            if name == "unused.weight" {
                continue;
            }
            let grad =
                fill(&p.size(), p.kind(), |i| scale * (0.23 * i as f64 + 0.7 * step as f64 + 1.3 * k as f64).cos());
            loss += (p * grad).sum(Kind::Float);
        }
        loss.backward();
    }

    fn max_abs_diff(t: &Tensor, want: &[f32]) -> f64 {
        let want = Tensor::from_slice(want).reshape(t.size());
        (t.to_kind(Kind::Float) - want).abs().max().double_value(&[])
    }

    fn run_golden(kind: Kind) -> (Vec<f64>, Vec<Vec<f64>>) {
        let g = golden();
        let params = golden_params(&g, kind);
        let mut opt = AdamW::new(params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
        let lr = g["config"]["lr"].as_f64().unwrap();
        let max_norm = g["config"]["max_norm"].as_f64().unwrap();
        let (mut norm_diffs, mut param_diffs) = (vec![], vec![]);
        for (s, want) in g["steps"].as_array().unwrap().iter().enumerate() {
            set_golden_grads(&g, &params, &mut opt, s + 1);
            let norm = opt.clip_grad_norm(max_norm).unwrap();
            assert_eq!(norm.kind(), Kind::Float);
            assert_eq!(norm.dim(), 0);
            norm_diffs.push((norm.double_value(&[]) - want["pre_clip_norm"].as_f64().unwrap()).abs());
            opt.step(lr).unwrap();
            param_diffs
                .push(params.iter().map(|(n, p)| max_abs_diff(p, &floats(&want["params"][n.as_str()]))).collect());
        }
        (norm_diffs, param_diffs)
    }

    #[test]
    fn golden_inputs_match_the_python_formulas() {
        let g = golden();
        for (name, p) in golden_params(&g, Kind::Float) {
            assert_eq!(max_abs_diff(&p, &floats(&g["init"][name.as_str()]["values"])), 0.0, "{name}");
        }
    }

    #[test]
    fn fused_adamw_and_clip_match_torch_f32() {
        let (norm_diffs, param_diffs) = run_golden(Kind::Float);
        eprintln!("pre-clip norm diffs {norm_diffs:?}, param diffs {param_diffs:?}");
        for (s, d) in norm_diffs.iter().enumerate() {
            assert!(*d <= 1e-6, "step {}: pre-clip norm off by {d}", s + 1);
        }
        for (s, diffs) in param_diffs.iter().enumerate() {
            for (name, d) in NAMES.iter().zip(diffs) {
                assert!(*d <= 1e-6, "step {}: {name} off by {d}", s + 1);
            }
        }
    }

    #[test]
    fn bf16_params_step_without_nan_and_track_f32() {
        let (norm_diffs, param_diffs) = run_golden(Kind::BFloat16);
        // bf16 grads carry ~3 significant digits; the norm itself is accumulated in f32.
        for (s, d) in norm_diffs.iter().enumerate() {
            assert!(d.is_finite() && *d <= 0.05, "step {}: pre-clip norm off by {d}", s + 1);
        }
        for (s, diffs) in param_diffs.iter().enumerate() {
            for (name, d) in NAMES.iter().zip(diffs) {
                assert!(d.is_finite() && *d <= 1e-2, "step {}: {name} off by {d}", s + 1);
            }
        }
    }

    #[test]
    fn bf16_state_keeps_param_dtype_and_stays_finite() {
        let g = golden();
        let params = golden_params(&g, Kind::BFloat16);
        let mut opt = AdamW::new(params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
        for s in 1..=3 {
            set_golden_grads(&g, &params, &mut opt, s);
            let _ = opt.clip_grad_norm(1.0).unwrap();
            opt.step(1e-3).unwrap();
        }
        for (name, t) in opt.state_tensors() {
            let want = if name.ends_with(".step") { Kind::Float } else { Kind::BFloat16 };
            assert_eq!(t.kind(), want, "{name}");
            let t = t.to_kind(Kind::Float);
            assert!(t.isfinite().all().int64_value(&[]) == 1, "{name} not finite");
            let nonzero = t.abs().sum(Kind::Float).double_value(&[]) > 0.0;
            assert_eq!(nonzero, !name.starts_with("unused."), "{name}");
        }
    }

    #[test]
    fn unused_params_are_skipped_and_weight_decay_is_grouped() {
        let g = golden();
        let (_, param_diffs) = run_golden(Kind::Float);
        assert!(param_diffs.iter().all(|d| d[3] == 0.0), "unused.weight moved");
        let params = golden_params(&g, Kind::Float);
        let opt = AdamW::new(params, &config(&g)).unwrap();
        let decay: Vec<&str> = opt.decay.iter().map(|s| s.name.as_str()).collect();
        let no_decay: Vec<&str> = opt.no_decay.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(decay, ["proj.weight", "unused.weight"]);
        assert_eq!(no_decay, ["norm.weight", "proj.bias"]);
    }

    fn deep_copy(named: Vec<(String, Tensor)>) -> HashMap<String, Tensor> {
        named.into_iter().map(|(n, t)| (n, t.detach().copy())).collect()
    }

    #[test]
    fn state_round_trips_through_state_tensors() {
        let g = golden();
        let pa = golden_params(&g, Kind::Float);
        let mut a = AdamW::new(pa.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
        for s in 1..=2 {
            set_golden_grads(&g, &pa, &mut a, s);
            a.step(1e-3).unwrap();
        }
        let names: Vec<String> = a.state_tensors().into_iter().map(|(n, _)| n).collect();
        assert_eq!(&names[..3], ["norm.weight.exp_avg", "norm.weight.exp_avg_sq", "norm.weight.step"]);
        assert_eq!(names.len(), 12);
        let saved = deep_copy(a.state_tensors());
        assert_eq!(saved["proj.weight.step"].double_value(&[]), 2.0);
        assert_eq!(saved["unused.weight.step"].double_value(&[]), 0.0);

        // A fresh optimizer on copies of the params, with the saved state loaded,
        // must take the same third step.
        let pb: Vec<(String, Tensor)> =
            pa.iter().map(|(n, t)| (n.clone(), t.detach().copy().set_requires_grad(true))).collect();
        let mut b = AdamW::new(pb.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &config(&g)).unwrap();
        b.load_state(&saved).unwrap();
        for (opt, params) in [(&mut a, &pa), (&mut b, &pb)] {
            set_golden_grads(&g, params, opt, 3);
            opt.step(1e-3).unwrap();
        }
        for ((name, x), (_, y)) in pa.iter().zip(&pb) {
            assert!(x.equal(y), "{name} differs after resume");
        }
        for ((name, x), (_, y)) in a.state_tensors().iter().zip(b.state_tensors().iter()) {
            assert!(x.equal(y), "{name} differs after resume");
        }
    }

    #[test]
    fn load_state_names_the_first_mismatch() {
        let g = golden();
        let mut opt = AdamW::new(golden_params(&g, Kind::Float), &config(&g)).unwrap();
        let good = deep_copy(opt.state_tensors());
        let before = deep_copy(opt.state_tensors());
        let err = |m: HashMap<String, Tensor>, opt: &mut AdamW| opt.load_state(&m).unwrap_err().to_string();

        let mut m = deep_copy(opt.state_tensors());
        m.insert("proj.bias.exp_avg_sq".into(), Tensor::zeros([8], (Kind::Float, Device::Cpu)));
        m.insert("proj.weight.exp_avg".into(), Tensor::ones([7, 5], (Kind::Float, Device::Cpu)));
        let e = err(m, &mut opt);
        assert!(e.contains("proj.bias.exp_avg_sq") && e.contains("[8]") && e.contains("[7]"), "{e}");
        // Nothing was copied: proj.weight.exp_avg (valid, but in a rejected load) is unchanged.
        for (n, t) in opt.state_tensors() {
            assert!(t.equal(&before[&n]), "{n} changed by a failed load");
        }

        let mut m = good.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect::<HashMap<_, _>>();
        m.insert("proj.weight.step".into(), Tensor::zeros([], (Kind::Double, Device::Cpu)));
        let e = err(m, &mut opt);
        assert!(e.contains("proj.weight.step") && e.contains("Double"), "{e}");

        let mut m = good.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect::<HashMap<_, _>>();
        m.remove("norm.weight.exp_avg");
        assert!(err(m, &mut opt).contains("norm.weight.exp_avg is missing"));

        let mut m = good.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect::<HashMap<_, _>>();
        m.insert("head.weight.exp_avg".into(), Tensor::zeros([1], (Kind::Float, Device::Cpu)));
        let e = opt.load_state(&m).unwrap_err();
        assert!(matches!(e, Error::OptimizerState(_)));
        assert!(e.to_string().contains("head.weight.exp_avg is not a parameter"), "{e}");
        assert_eq!(e.reason(), Some(crds::contract::FailureReason::InvalidConfig));

        opt.load_state(&good).unwrap();
    }

    /// Two parameters (one decayed, one not) and an optimizer over them.
    fn toy() -> (Vec<(String, Tensor)>, AdamW) {
        let cfg = ResolvedOptimizer { weight_decay: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, grad_clip: 1.0 };
        let params = vec![
            ("a.weight".to_string(), fill(&[3, 4], Kind::Float, |i| (0.3 * i as f64).sin()).set_requires_grad(true)),
            ("b.bias".to_string(), fill(&[4], Kind::Float, |i| 0.1 * i as f64).set_requires_grad(true)),
        ];
        let opt = AdamW::new(params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())), &cfg).unwrap();
        (params, opt)
    }

    /// Backpropagates a loss whose gradient differs per step.
    fn toy_backward(params: &[(String, Tensor)], opt: &mut AdamW, step: usize) {
        drop(toy_loss_backward(params, opt, step, 1.0));
    }

    /// [`toy_backward`] with every gradient scaled by `poison`; returns the loss.
    fn toy_loss_backward(params: &[(String, Tensor)], opt: &mut AdamW, step: usize, poison: f64) -> Tensor {
        opt.zero_grad().unwrap();
        let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for (k, (_, p)) in params.iter().enumerate() {
            let w = fill(&p.size(), Kind::Float, |i| (0.7 * i as f64 + step as f64 + k as f64).cos());
            loss += (p * w).sum(Kind::Float) * poison;
        }
        loss.backward();
        loss.detach()
    }

    /// Parameters and optimizer state, copied.
    fn snapshot(params: &[(String, Tensor)], opt: &AdamW) -> Vec<Tensor> {
        params
            .iter()
            .map(|(_, p)| p.detach().copy())
            .chain(opt.state_tensors().into_iter().map(|(_, t)| t.copy()))
            .collect()
    }

    fn same(a: &[Tensor], b: &[Tensor]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.equal(y))
    }

    /// zero_grad drops the gradients (no memory held between steps), and the next
    /// backward starts from nothing rather than adding to the last one.
    #[test]
    fn zero_grad_drops_the_gradients() {
        let (params, mut opt) = toy();
        toy_backward(&params, &mut opt, 1);
        let first: Vec<Tensor> = params.iter().map(|(_, p)| p.grad().copy()).collect();
        opt.zero_grad().unwrap();
        assert!(params.iter().all(|(_, p)| !p.grad().defined()));
        opt.zero_grad().unwrap();
        toy_backward(&params, &mut opt, 1);
        for ((_, p), g) in params.iter().zip(&first) {
            assert!(p.grad().equal(g), "a fresh gradient, not a sum");
        }
    }

    #[test]
    fn nonfinite_flags_nan_and_inf_anywhere() {
        let ok = Tensor::from_slice(&[1.0f32, -3.0]);
        let nan = Tensor::from_slice(&[1.0f32, f32::NAN]);
        let inf = Tensor::from(f32::NEG_INFINITY);
        let flag = |ts: &[&Tensor]| nonfinite(ts).unwrap();
        assert_eq!(flag(&[&ok]).kind(), Kind::Float);
        assert_eq!(flag(&[&ok]).dim(), 0);
        assert_eq!(flag(&[&ok, &Tensor::from(2.5f32)]).double_value(&[]), 0.0);
        assert_eq!(flag(&[&ok, &nan]).double_value(&[]), 1.0);
        assert_eq!(flag(&[&inf, &ok]).double_value(&[]), 1.0);
        assert!(nonfinite(&[]).is_err());
    }

    #[test]
    fn a_tensor_learning_rate_and_a_zero_skip_flag_step_exactly_as_step_does() {
        let (pa, mut a) = toy();
        let (pb, mut b) = toy();
        let lr = Tensor::from(2e-2f32);
        let zero = Tensor::from(0.0f32);
        for step in 1..=3 {
            toy_backward(&pa, &mut a, step);
            a.step(f64::from(2e-2f32)).unwrap();
            toy_backward(&pb, &mut b, step);
            b.step_unless(Lr::Tensor(&lr), &zero).unwrap();
        }
        assert!(same(&snapshot(&pa, &a), &snapshot(&pb, &b)));
        assert_eq!(b.state_tensors().iter().find(|(n, _)| n == "a.weight.step").unwrap().1.double_value(&[]), 3.0);
    }

    #[test]
    fn a_skipped_step_changes_nothing_and_training_goes_on_as_if_it_never_happened() {
        let (pa, mut a) = toy();
        let (pb, mut b) = toy();
        let one = Tensor::from(1.0f32);
        toy_backward(&pa, &mut a, 1);
        a.step(1e-2).unwrap();
        toy_backward(&pb, &mut b, 1);
        b.step(1e-2).unwrap();
        // b also sees a step whose update is skipped, step counts included.
        let before = snapshot(&pb, &b);
        toy_backward(&pb, &mut b, 7);
        b.step_unless(Lr::Value(1e-2), &one).unwrap();
        assert!(same(&before, &snapshot(&pb, &b)));
        toy_backward(&pa, &mut a, 2);
        a.step(1e-2).unwrap();
        toy_backward(&pb, &mut b, 2);
        b.step(1e-2).unwrap();
        assert!(same(&snapshot(&pa, &a), &snapshot(&pb, &b)));
    }

    #[test]
    fn clip_and_step_skips_a_non_finite_loss_or_gradient_on_the_device() {
        // A finite step is clip_grad_norm then step.
        let (pa, mut a) = toy();
        let (pb, mut b) = toy();
        toy_backward(&pa, &mut a, 1);
        let norm_a = a.clip_grad_norm(1.0).unwrap();
        a.step(1e-2).unwrap();
        let loss = toy_loss_backward(&pb, &mut b, 1, 1.0);
        let (norm_b, skip) = b.clip_and_step(&loss, 1.0, Lr::Value(1e-2)).unwrap();
        assert_eq!(skip.double_value(&[]), 0.0);
        assert!(norm_a.equal(&norm_b));
        assert!(same(&snapshot(&pa, &a), &snapshot(&pb, &b)));

        // NaN gradients (and so a NaN norm), or only a NaN loss: nothing changes.
        for (poison, loss_override) in [(f64::NAN, None), (1.0, Some(f32::NAN)), (f64::INFINITY, None)] {
            let before = snapshot(&pb, &b);
            let loss = toy_loss_backward(&pb, &mut b, 2, poison);
            let loss = loss_override.map_or(loss, Tensor::from);
            let (norm, skip) = b.clip_and_step(&loss, 1.0, Lr::Value(1e-2)).unwrap();
            assert_eq!(skip.double_value(&[]), 1.0, "poison {poison}, loss {loss_override:?}");
            assert_eq!(norm.double_value(&[]).is_finite(), poison.is_finite());
            assert!(same(&before, &snapshot(&pb, &b)), "poison {poison}, loss {loss_override:?}");
        }
    }

    #[test]
    fn clip_returns_non_finite_norms() {
        let g = Tensor::from_slice(&[3.0f32, 4.0]);
        let h = Tensor::from_slice(&[12.0f32]);
        let norm = ffi::clip_grad_norm(&[g.shallow_clone(), h.shallow_clone()], 1.0).unwrap();
        assert!((norm.double_value(&[]) - 13.0).abs() < 1e-5);
        assert!((g.double_value(&[1]) - 4.0 / (13.0 + 1e-6)).abs() < 1e-6);
        // Below max_norm nothing is scaled.
        let n2 = ffi::clip_grad_norm(&[g.shallow_clone()], 100.0).unwrap();
        assert!((g.double_value(&[0]) - 3.0 / 13.0).abs() < 1e-6, "{}", n2.double_value(&[]));

        let bad = Tensor::from_slice(&[1.0f32, f32::INFINITY]);
        assert_eq!(ffi::clip_grad_norm(&[bad], 1.0).unwrap().double_value(&[]), f64::INFINITY);
        let nan = Tensor::from_slice(&[f32::NAN]);
        assert!(ffi::clip_grad_norm(&[nan], 1.0).unwrap().double_value(&[]).is_nan());
    }

    #[test]
    fn shim_errors_come_back_as_errors() {
        let e = ffi::clip_grad_norm(&[], 1.0).unwrap_err();
        assert!(matches!(e, Error::Shim(_)) && e.to_string().contains("at least one gradient"), "{e}");
        let undefined = Tensor::new();
        let e = ffi::clip_grad_norm(&[undefined], 1.0).unwrap_err();
        assert!(e.to_string().contains("grads[0] is undefined"), "{e}");
        // A param and grad of different sizes are rejected by ATen, not a crash.
        let p = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
        let grad = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let m = p.zeros_like();
        let v = p.zeros_like();
        let s = Tensor::zeros([], (Kind::Float, Device::Cpu));
        let hp = AdamWParams { lr: Lr::Value(1e-3), beta1: 0.9, beta2: 0.95, weight_decay: 0.0, eps: 1e-8 };
        let e = ffi::fused_adamw(&[p], &[grad], &[m], &[v], &[s], &hp, None).unwrap_err();
        assert!(matches!(e, Error::Shim(_)) && e.to_string().contains("fused_adamw: param 0 is [2, 3]"), "{e}");
    }

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

    /// ms/step of the fused AdamW against tch's nn::AdamW (libtorch's C++ optimizer)
    /// on ~10M f32 params on CPU: `cargo test -p trainer --release --lib -- --ignored
    /// --nocapture bench_fused_adamw`.
    #[test]
    #[ignore]
    fn bench_fused_adamw_vs_tch() {
        use tch::nn::{self, OptimizerConfig};
        let shapes: Vec<Vec<i64>> = std::iter::once(vec![4096, 512])
            .chain((0..8).map(|_| vec![512, 1536]))
            .chain((0..6).map(|_| vec![512, 512]))
            .chain((0..16).map(|_| vec![512]))
            .collect();
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for (i, s) in shapes.iter().enumerate() {
            let p = root.var(&format!("p{i}"), s, nn::Init::Uniform { lo: -0.1, up: 0.1 });
            loss += (&p * p.randn_like()).sum(Kind::Float);
        }
        loss.backward();
        let n: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
        let cfg = ResolvedOptimizer { weight_decay: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, grad_clip: 1.0 };
        let mut fused = AdamW::new(vs.variables(), &cfg).unwrap();
        let mut tch_opt =
            nn::AdamW { beta1: 0.9, beta2: 0.95, wd: 0.1, eps: 1e-8, amsgrad: false }.build(&vs, 1e-4).unwrap();
        // Interleaved single-step timings, so a noisy shared machine slows both alike;
        // the minimum and the median are reported.
        let ms = |f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        };
        let (mut f_ms, mut t_ms, mut c_ms) = (vec![], vec![], vec![]);
        for i in 0..33 {
            let (f, t, c) = (
                ms(&mut || fused.step(1e-4).unwrap()),
                ms(&mut || tch_opt.step()),
                ms(&mut || drop(fused.clip_grad_norm(1e9).unwrap())),
            );
            if i >= 3 {
                f_ms.push(f);
                t_ms.push(t);
                c_ms.push(c);
            }
        }
        let stats = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            format!("min {:.2} / median {:.2} ms", v[0], v[v.len() / 2])
        };
        println!(
            "{n} f32 params, {} threads: fused AdamW {}, tch nn::AdamW {}, clip_grad_norm {}",
            tch::get_num_threads(),
            stats(&mut f_ms),
            stats(&mut t_ms),
            stats(&mut c_ms),
        );
    }
}
