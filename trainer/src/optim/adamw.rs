//! AdamW replicated on every rank: one fused call per weight-decay group.

use std::collections::HashMap;

use crds::config::ResolvedOptimizer;
use tch::{Kind, Tensor};

use crate::Error;
use crate::ffi::{self, AdamWParams, Lr};

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
    /// `loss` or the gradient norm is not finite, all on the device. The norm is
    /// `norm` where the gradient reducer computed it, otherwise the gradients'. Returns
    /// the pre-clip norm and the skip flag (0-dim f32: 1 where the step was skipped).
    pub fn clip_and_step(
        &mut self,
        loss: &Tensor,
        max_norm: f64,
        lr: Lr,
        norm: Option<Tensor>,
    ) -> Result<(Tensor, Tensor), Error> {
        let norm = match norm {
            None => self.clip_grad_norm(max_norm)?,
            Some(norm) => {
                ffi::clip_grads_by_norm(&self.grads()?, &norm, max_norm)?;
                norm
            }
        };
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

    /// Bytes of state this optimizer holds (both moments and the step counts).
    pub fn state_bytes(&self) -> usize {
        self.slots().map(|s| [&s.exp_avg, &s.exp_avg_sq, &s.step].iter().map(|t| bytes(t)).sum::<usize>()).sum()
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
        check_state(want.iter().map(|(name, t)| (name.clone(), t.size(), t.kind())), named)?;
        let _guard = tch::no_grad_guard();
        for (name, mut live) in want {
            live.f_copy_(&named[&name])?;
        }
        Ok(())
    }
}

/// Checks saved optimizer state against what an optimizer holds, `(name, shape,
/// dtype)` per tensor: every name present with its shape and dtype, and no other. The
/// error names the first mismatch.
pub(super) fn check_state(
    want: impl IntoIterator<Item = (String, Vec<i64>, Kind)>,
    named: &HashMap<String, Tensor>,
) -> Result<(), Error> {
    let mut known = std::collections::HashSet::new();
    for (name, shape, kind) in want {
        let saved = named.get(&name).ok_or_else(|| Error::OptimizerState(format!("{name} is missing")))?;
        if saved.size() != shape {
            return Err(Error::OptimizerState(format!(
                "{name} has shape {:?}, the model needs {shape:?}",
                saved.size()
            )));
        }
        if saved.kind() != kind {
            return Err(Error::OptimizerState(format!(
                "{name} has dtype {:?}, the model needs {kind:?}",
                saved.kind()
            )));
        }
        known.insert(name);
    }
    let mut extra: Vec<&String> = named.keys().filter(|n| !known.contains(*n)).collect();
    extra.sort();
    match extra.first() {
        Some(name) => Err(Error::OptimizerState(format!("{name} is not a parameter of this model"))),
        None => Ok(()),
    }
}

/// Bytes of a tensor's elements.
pub(super) fn bytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
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
mod tests;
