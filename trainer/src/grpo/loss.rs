//! The GRPO objective, as TRL's `GRPOTrainer` computes it (proved against TRL itself by
//! `tests/trl_parity.rs`): group-relative advantages, the clipped importance ratio, the
//! k3 KL estimator against a frozen reference, the `grpo` / `bnpo` / `dr_grpo` / `dapo`
//! aggregations, the KL weighted by the importance ratio and off-policy sequence
//! masking (DeepSeek-V3.2, both in TRL too).

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
/// group's rewards are all equal: its advantages are 0, so only its KL term trains.
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

/// What the loss is normalized by: this rank's whole step, so that the split into
/// micro-batches changes nothing but `bnpo`, whose definition (TRL's) is per micro-batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalizer {
    /// Completions on this rank in the step (`grpo` averages over them, `dr_grpo`
    /// divides by them × `maxNewTokens`).
    pub sequences: f64,
    /// Completion tokens in the loss over every rank, divided by the rank count (`dapo`;
    /// the gradient all-reduce averages over ranks).
    pub tokens: f64,
    /// Micro-batches in the step on this rank (`bnpo` averages their token means).
    pub micro_batches: f64,
}

impl Normalizer {
    /// One micro-batch as the whole step on one rank.
    pub fn of(mask: &Tensor) -> Result<Normalizer, TchError> {
        Ok(Normalizer {
            sequences: mask.size()[0] as f64,
            tokens: mask.f_sum(Kind::Float)?.f_double_value(&[])?,
            micro_batches: 1.0,
        })
    }
}

/// The loss and its diagnostics over the micro-batch; the sums are 0-dim tensors, so
/// nothing waits for the device until the step's metrics are read.
pub struct LossParts {
    pub loss: Tensor,
    /// Each token's loss before aggregation (B, T), detached (TRL's `per_token_loss`).
    pub per_token: Tensor,
    /// Each token's k3 KL (B, T), detached; zeros when β = 0.
    pub per_token_kl: Tensor,
    /// Σ mask · k3 KL.
    pub kl_sum: Tensor,
    /// Tokens clipped at 1 − ε_low with A < 0, and at 1 + ε_high with A > 0.
    pub clipped_low: Tensor,
    pub clipped_high: Tensor,
    /// Sequences whose policy term off-policy masking dropped.
    pub off_policy_masked: Tensor,
}

/// The GRPO loss of one micro-batch, as TRL's `_compute_loss`. `logp`, `old`,
/// `reference`, `mask`: (B, T) over completion tokens (`old` = `logp` detached when
/// the batch is fresh; `mask` 0 on a completion left out of the loss); `adv`: (B).
pub fn policy_loss(
    logp: &Tensor,
    old: Option<&Tensor>,
    reference: Option<&Tensor>,
    adv: &Tensor,
    mask: &Tensor,
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
    let mut off_policy_masked = Tensor::f_zeros([], (Kind::Float, logp.device()))?;
    if let Some(delta) = s.off_policy_threshold {
        let lengths = mask.f_sum_dim_intlist(1, false, Kind::Float)?.f_clamp_min(1.0)?;
        let drift =
            old.f_sub(&logp.f_detach()?)?.f_mul(mask)?.f_sum_dim_intlist(1, false, Kind::Float)?.f_div(&lengths)?;
        let drop = drift.f_gt(delta)?.f_logical_and(&adv.f_lt(0.0)?)?.f_to_kind(Kind::Float)?; // (B)
        off_policy_masked = drop.f_sum(Kind::Float)?;
        per_token = per_token.f_mul(&drop.f_neg()?.f_add_scalar(1.0)?.f_unsqueeze(1)?)?;
    }
    let mut per_token_kl = logp.f_zeros_like()?;
    if s.beta != 0.0 {
        let reference =
            reference.ok_or_else(|| TchError::Kind("β > 0 needs the reference model's log-probabilities".into()))?;
        let d = reference.f_sub(logp)?;
        per_token_kl = d.f_exp()?.f_sub(&d)?.f_sub_scalar(1.0)?; // k3
        if s.unbiased_kl {
            per_token_kl = per_token_kl.f_mul(&coef_1)?;
        }
        per_token = per_token.f_add(&per_token_kl.f_mul_scalar(s.beta)?)?;
    }
    let kl_sum = per_token_kl.f_detach()?.f_mul(mask)?.f_sum(Kind::Float)?;
    let weighted = per_token.f_mul(mask)?; // (B, T)
    let loss = match s.loss_type {
        LossType::Grpo => {
            let lengths = mask.f_sum_dim_intlist(1, false, Kind::Float)?.f_clamp_min(1.0)?;
            weighted
                .f_sum_dim_intlist(1, false, Kind::Float)?
                .f_div(&lengths)?
                .f_sum(Kind::Float)?
                .f_div_scalar(norm.sequences)?
        }
        LossType::Bnpo => weighted
            .f_sum(Kind::Float)?
            .f_div(&mask.f_sum(Kind::Float)?.f_clamp_min(1.0)?)?
            .f_div_scalar(norm.micro_batches)?,
        LossType::DrGrpo => {
            weighted.f_sum(Kind::Float)?.f_div_scalar(norm.sequences * s.max_completion_length as f64)?
        }
        LossType::Dapo => weighted.f_sum(Kind::Float)?.f_div_scalar(norm.tokens.max(1.0))?,
    };
    let counted = |t: Tensor| -> Result<Tensor, TchError> { t.f_to_kind(Kind::Float)?.f_mul(mask)?.f_sum(Kind::Float) };
    let coef = coef_1.f_detach()?;
    let clipped_low = counted(coef.f_lt(1.0 - s.epsilon_low)?.f_logical_and(&a.f_lt(0.0)?)?)?;
    let clipped_high = counted(coef.f_gt(1.0 + s.epsilon_high)?.f_logical_and(&a.f_gt(0.0)?)?)?;
    Ok(LossParts {
        loss,
        per_token: per_token.f_detach()?,
        per_token_kl: per_token_kl.f_detach()?,
        kl_sum,
        clipped_low,
        clipped_high,
        off_policy_masked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: i64 = 8;
    const T: i64 = 5;

    /// Element (b, t) is f(b, t), computed in f64, stored f32.
    fn grid(f: impl Fn(f64, f64) -> f64) -> Tensor {
        let v: Vec<f64> =
            (0..B).flat_map(|b| (0..T).map(move |t| (b, t))).map(|(b, t)| f(b as f64, t as f64)).collect();
        Tensor::from_slice(&v).view([B, T]).to_kind(Kind::Float)
    }

    fn settings(loss_type: LossType, off_policy_threshold: Option<f64>) -> LossSettings {
        LossSettings {
            epsilon_low: 0.2,
            epsilon_high: 0.28,
            beta: 0.04,
            loss_type,
            unbiased_kl: true,
            off_policy_threshold,
            max_completion_length: T,
        }
    }

    /// The loss's gradient with respect to `logp`, and the loss.
    fn gradient(
        logp: &Tensor,
        old: &Tensor,
        reference: &Tensor,
        adv: &[f32],
        mask: &Tensor,
        s: &LossSettings,
    ) -> (Tensor, LossParts) {
        let logp = logp.copy().set_requires_grad(true);
        let adv = Tensor::from_slice(adv);
        let parts =
            policy_loss(&logp, Some(old), Some(reference), &adv, mask, s, Normalizer::of(mask).unwrap()).unwrap();
        parts.loss.backward();
        (logp.grad(), parts)
    }

    /// Rewards (1, 0, 0, 1) in a group: mean 0.5 and unbiased std √(1/3); a group of
    /// equal rewards has advantages 0 and is flagged.
    #[test]
    fn advantages_are_group_relative() {
        let rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5];
        let scaled = 0.5 / ((1.0f64 / 3.0).sqrt() + STD_EPS);
        let cases = [
            (ScaleRewards::Group, 0.0, [scaled, -scaled]),
            (ScaleRewards::Batch, 0.25, [0.5 / (0.25 + STD_EPS), -0.5 / (0.25 + STD_EPS)]),
            (ScaleRewards::None, 0.0, [0.5, -0.5]),
        ];
        for (scale, batch_std, [hi, lo]) in cases {
            let (adv, flat) = advantages(&rewards, 4, scale, batch_std);
            let want = [hi, lo, lo, hi, 0.0, 0.0, 0.0, 0.0];
            assert!(adv.iter().zip(want).all(|(a, w)| (a - w).abs() < 1e-12), "{scale:?}: {adv:?}");
            assert_eq!(flat, [[false; 4], [true; 4]].concat(), "{scale:?}");
        }
    }

    /// Off-policy masking drops a sequence's policy term only: its gradient is the one
    /// it gets with advantage 0 and no masking (its β·KL term), and it is counted.
    #[test]
    fn off_policy_masking_keeps_the_kl_term() {
        let logp = grid(|b, t| -0.5 - 0.3 * (0.7 * b + 1.1 * t).sin().abs());
        let old = grid(|b, t| if b < 2.0 { 0.5 } else { 0.02 * (b - t).sin() }) + &logp;
        let reference = grid(|b, t| 0.3 * (0.9 * b + 0.5 * t).cos()) + &logp;
        let mask = Tensor::ones([B, T], (Kind::Float, tch::Device::Cpu));
        let adv = [-1.0f32, 1.0, -1.0, 1.0, -0.5, 0.5, -0.5, 0.5];
        for loss_type in [LossType::Grpo, LossType::Bnpo, LossType::DrGrpo, LossType::Dapo] {
            let (masked, parts) = gradient(&logp, &old, &reference, &adv, &mask, &settings(loss_type, Some(0.1)));
            assert_eq!(parts.off_policy_masked.double_value(&[]), 1.0, "row 0 alone drifted with A < 0");
            let mut zeroed = adv;
            zeroed[0] = 0.0;
            let (want, _) = gradient(&logp, &old, &reference, &zeroed, &mask, &settings(loss_type, None));
            let diff = (&masked - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-7, "{loss_type:?}: {diff}");
            assert!(masked.get(0).abs().min().double_value(&[]) > 0.0, "{loss_type:?}: the KL term trains row 0");
        }
    }

    /// A completion whose mask is 0 gets no gradient and leaves the token counts: the
    /// loss is the one of the batch without it, for the token-normalized losses.
    #[test]
    fn masked_out_completions_leave_the_loss() {
        let logp = grid(|b, t| -1.0 - 0.1 * (b + t).sin());
        let old = grid(|b, t| 0.1 * (b * t).cos()) + &logp;
        let reference = grid(|b, t| -0.2 + 0.05 * (b * t).cos()) + &logp;
        let adv = [1.0f32, -1.0, 0.5, -0.5, 0.3, -0.3, 0.2, -0.2];
        let lengths = [5, 3, 1, 4, 5, 2, 4, 3];
        let mask = grid(|b, t| if (t as i64) < lengths[b as usize] && b != 3.0 { 1.0 } else { 0.0 });
        let rest: Vec<i64> = (0..B).filter(|&b| b != 3).collect();
        let rest = Tensor::from_slice(&rest);
        for loss_type in [LossType::Bnpo, LossType::Dapo] {
            let s = settings(loss_type, None);
            let (grad, parts) = gradient(&logp, &old, &reference, &adv, &mask, &s);
            assert_eq!(grad.get(3).abs().sum(Kind::Float).double_value(&[]), 0.0, "{loss_type:?}");
            let without: Vec<f32> = adv.iter().enumerate().filter(|&(i, _)| i != 3).map(|(_, a)| *a).collect();
            let pick = |t: &Tensor| t.index_select(0, &rest);
            let (_, want) = gradient(&pick(&logp), &pick(&old), &pick(&reference), &without, &pick(&mask), &s);
            let (got, want) = (parts.loss.double_value(&[]), want.loss.double_value(&[]));
            assert!((got - want).abs() < 1e-7, "{loss_type:?}: {got} vs {want}");
        }
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
