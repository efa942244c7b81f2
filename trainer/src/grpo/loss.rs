//! The GRPO objective, as TRL's `GRPOTrainer` computes it: group-relative advantages,
//! the clipped importance ratio, the k3 KL estimator against a frozen reference, and
//! the `grpo` / `bnpo` / `dr_grpo` aggregations. Two additions from DeepSeek-V3.2 are
//! optional: the KL weighted by the importance ratio (unbiased when the batch is
//! reused) and off-policy sequence masking.

use crds::types::{LossType, ScaleRewards};
use tch::{Kind, TchError, Tensor};

/// Added to the standard deviation before dividing (TRL's 1e-4).
pub const STD_EPS: f64 = 1e-4;

/// Unbiased (n − 1) standard deviation, as `torch.std`.
pub fn std_unbiased(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// Advantages of `rewards` (consecutive groups of `group`): `r − mean_group`, divided
/// by `std + 1e-4` of the group (`Group`), of the whole batch (`Batch`, `batch_std`
/// measured over every rank) or not at all. Also says, per completion, whether its
/// group's rewards are all equal: such a group carries no learning signal.
pub fn advantages(rewards: &[f64], group: usize, scale: ScaleRewards, batch_std: f64) -> (Vec<f64>, Vec<bool>) {
    let mut adv = Vec::with_capacity(rewards.len());
    let mut flat = Vec::with_capacity(rewards.len());
    for g in rewards.chunks(group) {
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let std = std_unbiased(g);
        let equal = g.iter().all(|r| (r - g[0]).abs() <= 1e-12);
        for r in g {
            let a = r - mean;
            adv.push(match scale {
                ScaleRewards::Group => a / (std + STD_EPS),
                ScaleRewards::Batch => a / (batch_std + STD_EPS),
                ScaleRewards::None => a,
            });
            flat.push(equal);
        }
    }
    (adv, flat)
}

/// Log-probabilities (B, T) in f32 of `targets` (B, T) under `logits / temperature`
/// (B, T, V).
pub fn token_logps(logits: &Tensor, targets: &Tensor, temperature: f64) -> Result<Tensor, TchError> {
    let scaled = logits.f_to_kind(Kind::Float)?.f_div_scalar(temperature)?;
    let picked = scaled.f_gather(-1, &targets.f_unsqueeze(-1)?, false)?.f_squeeze_dim(-1)?;
    picked.f_sub(&scaled.f_logsumexp(&[-1i64][..], false)?)
}

/// Rows of logits an entropy chunk holds: its f32 copies stay near `ENTROPY_ROWS × V`
/// elements however long the batch.
const ENTROPY_ROWS: i64 = 512;

/// Sum over the positions where `mask` (B, T) is set of the entropy (nats) of
/// `softmax(logits / temperature)` (`logits` (B, T, V)), taken a chunk of positions at
/// a time so that no (B, T, V) f32 copy is made; 0-dim f32.
pub fn masked_entropy_sum(logits: &Tensor, mask: &Tensor, temperature: f64) -> Result<Tensor, TchError> {
    let vocab = *logits.size().last().expect("logits have a vocabulary dimension");
    let rows =
        logits.f_reshape([-1, vocab])?.f_index_select(0, &mask.f_reshape([-1])?.f_nonzero()?.f_squeeze_dim(1)?)?;
    let mut total = Tensor::f_zeros([], (Kind::Float, logits.device()))?;
    for chunk in rows.f_split(ENTROPY_ROWS, 0)? {
        let logp = chunk.f_to_kind(Kind::Float)?.f_div_scalar(temperature)?.f_log_softmax(-1, Kind::Float)?;
        total = total.f_sub(&logp.f_exp()?.f_mul(&logp)?.f_sum(Kind::Float)?)?;
    }
    Ok(total)
}

/// The loss's settings (from `spec.grpo`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossSettings {
    pub epsilon_low: f64,
    pub epsilon_high: f64,
    pub beta: f64,
    pub loss_type: LossType,
    /// Weight the k3 KL by the importance ratio π_θ / π_old (DeepSeek-V3.2).
    pub unbiased_kl: bool,
    /// Drop a sequence with a negative advantage whose mean log(π_old / π_θ) exceeds this.
    pub off_policy_threshold: Option<f64>,
    /// `maxNewTokens`, the constant denominator of `dr_grpo`.
    pub max_completion_length: i64,
}

/// What the loss is normalized by. TRL uses one micro-batch's own counts; the trainer
/// passes the whole step's counts on its rank, so that micro-batch size does not change
/// the gradient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalizer {
    pub sequences: f64,
    pub tokens: f64,
}

impl Normalizer {
    /// A micro-batch's own counts (TRL's normalization).
    pub fn of(mask: &Tensor) -> Result<Normalizer, TchError> {
        Ok(Normalizer { sequences: mask.size()[0] as f64, tokens: mask.f_sum(Kind::Float)?.f_double_value(&[])? })
    }
}

/// The loss and its diagnostics, all summed over the micro-batch (0-dim tensors, so
/// nothing waits for the device until the step's metrics are read).
pub struct LossParts {
    pub loss: Tensor,
    /// Σ mask · k3 KL (per-token KL summed; zero when β = 0).
    pub kl_sum: Tensor,
    /// Tokens clipped at 1 − ε_low with A < 0, and at 1 + ε_high with A > 0.
    pub clipped_low: Tensor,
    pub clipped_high: Tensor,
    /// Sequences dropped by off-policy masking.
    pub off_policy_masked: Tensor,
}

/// The GRPO loss of one micro-batch. `logp`, `old`, `reference`, `mask`: (B, T) over
/// completion tokens (`old` = `logp` detached when the batch is fresh); `adv`: (B);
/// `keep`: (B) 1 for a sequence that trains, 0 for one that must not (a group with
/// equal rewards, a truncated completion when those are masked).
#[allow(clippy::too_many_arguments)]
pub fn policy_loss(
    logp: &Tensor,
    old: Option<&Tensor>,
    reference: Option<&Tensor>,
    adv: &Tensor,
    mask: &Tensor,
    keep: &Tensor,
    s: &LossSettings,
    norm: Normalizer,
) -> Result<LossParts, TchError> {
    let old = match old {
        Some(o) => o.shallow_clone(),
        None => logp.f_detach()?,
    };
    let a = adv.f_to_kind(Kind::Float)?.f_unsqueeze(1)?; // (B, 1)
    let coef_1 = logp.f_sub(&old)?.f_exp()?; // π_θ / π_old, (B, T)
    let coef_2 = coef_1.f_clamp(1.0 - s.epsilon_low, 1.0 + s.epsilon_high)?;
    let mut per_token = coef_1.f_mul(&a)?.f_minimum(&coef_2.f_mul(&a)?)?.f_neg()?;
    let mut kl_sum = Tensor::f_zeros([], (Kind::Float, logp.device()))?;
    if s.beta != 0.0 {
        let reference =
            reference.ok_or_else(|| TchError::Kind("β > 0 needs the reference model's log-probabilities".into()))?;
        let d = reference.f_sub(logp)?;
        let mut kl = d.f_exp()?.f_sub(&d)?.f_sub_scalar(1.0)?; // k3
        if s.unbiased_kl {
            kl = kl.f_mul(&coef_1)?;
        }
        kl_sum = kl.f_detach()?.f_mul(mask)?.f_sum(Kind::Float)?;
        per_token = per_token.f_add(&kl.f_mul_scalar(s.beta)?)?;
    }
    let mut keep = keep.f_to_kind(Kind::Float)?;
    let mut off_policy_masked = Tensor::f_zeros([], (Kind::Float, logp.device()))?;
    if let Some(delta) = s.off_policy_threshold {
        let lengths = mask.f_sum_dim_intlist(1, false, Kind::Float)?.f_clamp_min(1.0)?;
        let drift =
            old.f_sub(&logp.f_detach()?)?.f_mul(mask)?.f_sum_dim_intlist(1, false, Kind::Float)?.f_div(&lengths)?;
        let drop = drift.f_gt(delta)?.f_logical_and(&adv.f_lt(0.0)?)?.f_to_kind(Kind::Float)?;
        off_policy_masked = drop.f_mul(&keep)?.f_sum(Kind::Float)?;
        keep = keep.f_mul(&drop.f_neg()?.f_add_scalar(1.0)?)?;
    }
    let weighted = per_token.f_mul(mask)?.f_mul(&keep.f_unsqueeze(1)?)?; // (B, T)
    let loss = match s.loss_type {
        LossType::Grpo => {
            let lengths = mask.f_sum_dim_intlist(1, false, Kind::Float)?.f_clamp_min(1.0)?;
            weighted
                .f_sum_dim_intlist(1, false, Kind::Float)?
                .f_div(&lengths)?
                .f_sum(Kind::Float)?
                .f_div_scalar(norm.sequences)?
        }
        LossType::Bnpo => weighted.f_sum(Kind::Float)?.f_div_scalar(norm.tokens.max(1.0))?,
        LossType::DrGrpo => {
            weighted.f_sum(Kind::Float)?.f_div_scalar(norm.sequences * s.max_completion_length as f64)?
        }
    };
    let counted = |t: Tensor| -> Result<Tensor, TchError> { t.f_to_kind(Kind::Float)?.f_mul(mask)?.f_sum(Kind::Float) };
    let coef = coef_1.f_detach()?;
    let clipped_low = counted(coef.f_lt(1.0 - s.epsilon_low)?.f_logical_and(&a.f_lt(0.0)?)?)?;
    let clipped_high = counted(coef.f_gt(1.0 + s.epsilon_high)?.f_logical_and(&a.f_gt(0.0)?)?)?;
    Ok(LossParts { loss, kl_sum, clipped_low, clipped_high, off_policy_masked })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Written by scripts/goldens/grpo.py from TRL's formulas in torch.
    const GOLDEN: &str = include_str!("../../tests/goldens/grpo.json");
    const B: i64 = 8;
    const T: i64 = 5;
    const LENGTHS: [i64; 8] = [5, 3, 1, 4, 5, 2, 0, 3];
    const REWARDS: [f64; 8] = [0.99, 0.0, -0.02, 0.97, 0.0, 0.98, 0.0, -0.01];
    const ADV_REWARDS: [f64; 12] = [1.0, 0.0, 0.98, 0.0, 0.5, 0.5, 0.5, 0.5, 0.99, 0.0, 0.0, 0.96];

    /// The script's `grid`: element (b, t) is f(b, t), computed in f64, stored f32.
    fn grid(f: impl Fn(f64, f64) -> f64) -> Tensor {
        let v: Vec<f64> =
            (0..B).flat_map(|b| (0..T).map(move |t| (b, t))).map(|(b, t)| f(b as f64, t as f64)).collect();
        Tensor::from_slice(&v).view([B, T]).to_kind(Kind::Float)
    }

    fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol, "{what}[{i}]: {g} vs {w}");
        }
    }

    fn floats(v: &Value) -> Vec<f64> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
    }

    #[test]
    fn advantages_match_trl() {
        let g: Value = serde_json::from_str(GOLDEN).unwrap();
        let batch_std = std_unbiased(&ADV_REWARDS);
        for (name, scale) in
            [("group", ScaleRewards::Group), ("batch", ScaleRewards::Batch), ("none", ScaleRewards::None)]
        {
            let (adv, flat) = advantages(&ADV_REWARDS, 4, scale, batch_std);
            close(&adv, &floats(&g["advantages"][name]), 1e-5, name);
            assert_eq!(flat, [[false; 4], [true; 4], [false; 4]].concat(), "the middle group has equal rewards");
        }
    }

    #[test]
    fn loss_gradient_and_diagnostics_match_trl() {
        let g: Value = serde_json::from_str(GOLDEN).unwrap();
        let logp0 = grid(|b, t| -0.5 - 0.3 * (0.7 * b + 1.1 * t).sin().abs());
        let old = grid(|b, t| 0.25 * (1.3 * b - 0.4 * t).sin()) + &logp0;
        let reference = grid(|b, t| 0.3 * (0.9 * b + 0.5 * t).cos()) + &logp0;
        let mask = grid(|b, t| if (t as i64) < LENGTHS[b as usize] { 1.0 } else { 0.0 });
        let (adv, _) = advantages(&REWARDS, 4, ScaleRewards::Group, 0.0);
        let adv = Tensor::from_slice(&adv).to_kind(Kind::Float);
        let keep = Tensor::ones([B], (Kind::Float, tch::Device::Cpu));
        let cases = g["loss"].as_array().unwrap();
        assert_eq!(cases.len(), 11);
        for c in cases {
            let name = c["name"].as_str().unwrap();
            let s = LossSettings {
                epsilon_low: c["eps_low"].as_f64().unwrap(),
                epsilon_high: c["eps_high"].as_f64().unwrap(),
                beta: c["beta"].as_f64().unwrap(),
                loss_type: serde_json::from_value(c["loss_type"].clone()).unwrap(),
                unbiased_kl: c["unbiased_kl"].as_bool().unwrap(),
                off_policy_threshold: c["delta"].as_f64(),
                max_completion_length: 6,
            };
            let logp = logp0.copy().set_requires_grad(true);
            let old = c["old"].as_bool().unwrap().then_some(&old);
            let parts =
                policy_loss(&logp, old, Some(&reference), &adv, &mask, &keep, &s, Normalizer::of(&mask).unwrap())
                    .unwrap();
            parts.loss.backward();
            let scalar = |t: &Tensor| t.double_value(&[]);
            close(&[scalar(&parts.loss)], &[c["loss"].as_f64().unwrap()], 1e-6, name);
            close(
                &Vec::<f64>::try_from(logp.grad().to_kind(Kind::Double).view([-1])).unwrap(),
                &floats(&c["grad"]),
                1e-6,
                name,
            );
            close(&[scalar(&parts.kl_sum)], &[c["kl_sum"].as_f64().unwrap()], 1e-5, name);
            let counts = [scalar(&parts.clipped_low), scalar(&parts.clipped_high), scalar(&parts.off_policy_masked)];
            let want = ["clipped_low", "clipped_high", "off_policy_masked"].map(|k| c[k].as_f64().unwrap());
            assert_eq!(counts, want, "{name}");
        }
    }

    /// Masked sequences (keep = 0) get no gradient, and the rest are untouched.
    #[test]
    fn kept_out_sequences_get_no_gradient() {
        let logp = grid(|b, t| -1.0 - 0.1 * (b + t).sin()).set_requires_grad(true);
        let reference = grid(|b, t| -1.2 + 0.05 * (b * t).cos());
        let mask = Tensor::ones([B, T], (Kind::Float, tch::Device::Cpu));
        let adv = Tensor::from_slice(&[1.0f32, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0]);
        let keep = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        let s = LossSettings {
            epsilon_low: 0.2,
            epsilon_high: 0.2,
            beta: 0.04,
            loss_type: LossType::Grpo,
            unbiased_kl: false,
            off_policy_threshold: None,
            max_completion_length: T,
        };
        let parts =
            policy_loss(&logp, None, Some(&reference), &adv, &mask, &keep, &s, Normalizer::of(&mask).unwrap()).unwrap();
        parts.loss.backward();
        let grad = logp.grad();
        assert_eq!(grad.narrow(0, 4, 4).abs().sum(Kind::Float).double_value(&[]), 0.0);
        assert!(grad.narrow(0, 0, 4).abs().min().double_value(&[]) > 0.0);
    }

    #[test]
    fn token_logps_match_log_softmax() {
        let g: Value = serde_json::from_str(GOLDEN).unwrap();
        let v: Vec<f64> = (0..2)
            .flat_map(|b| {
                (0..3).flat_map(move |t| {
                    (0..7).map(move |v| 2.0 * (0.3 * b as f64 + 0.7 * t as f64 + 1.1 * v as f64).sin())
                })
            })
            .collect();
        let logits = Tensor::from_slice(&v).view([2, 3, 7]).to_kind(Kind::Float);
        let targets = Tensor::from_slice(&[0i64, 2, 4, 1, 3, 5]).view([2, 3]);
        let got = token_logps(&logits, &targets, 0.7).unwrap();
        close(
            &Vec::<f64>::try_from(got.to_kind(Kind::Double).view([-1])).unwrap(),
            &floats(&g["token_logps"]),
            1e-5,
            "token_logps",
        );
    }

    /// Chunked over masked positions, the entropy sum equals −Σ p log p computed whole,
    /// over a batch longer than one chunk, and masked positions count for nothing.
    #[test]
    fn masked_entropy_sum_matches_the_whole_computation() {
        let _rng = crate::rng::GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(3);
        let logits = Tensor::randn([3, 400, 11], (Kind::Float, tch::Device::Cpu)).f_mul_scalar(3.0).unwrap();
        let mask =
            Tensor::rand([3, 400], (Kind::Float, tch::Device::Cpu)).f_gt(0.3).unwrap().f_to_kind(Kind::Float).unwrap();
        let logp = logits.f_div_scalar(0.7).unwrap().f_log_softmax(-1, Kind::Float).unwrap();
        let per_position = logp
            .f_exp()
            .unwrap()
            .f_mul(&logp)
            .unwrap()
            .f_sum_dim_intlist(&[-1i64][..], false, Kind::Float)
            .unwrap()
            .f_neg()
            .unwrap();
        let want = per_position.f_mul(&mask).unwrap().f_sum(Kind::Float).unwrap().double_value(&[]);
        let got = masked_entropy_sum(&logits, &mask, 0.7).unwrap().double_value(&[]);
        assert!(mask.f_sum(Kind::Float).unwrap().double_value(&[]) > ENTROPY_ROWS as f64, "more than one chunk");
        assert!((got - want).abs() <= 1e-4 * want.abs(), "{got} vs {want}");
        let none = masked_entropy_sum(&logits, &mask.f_zeros_like().unwrap(), 0.7).unwrap().double_value(&[]);
        assert_eq!(none, 0.0);
    }
}
