//! What GRPO reports: a step's metric sums and statistics.

use bytemuck::{Pod, Zeroable};

/// This rank's sums for the step's metrics; one all-reduce of the struct
/// ([`crate::dist::allreduce_sum`]) adds them over ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct Sums {
    pub completions: f64,
    pub reward: f64,
    pub correct: f64,
    pub unparsed: f64,
    pub completion_tokens: f64,
    pub kl: f64,
    pub clipped: f64,
    pub off_policy_masked: f64,
    pub sampled_tokens: f64,
    pub trained_tokens: f64,
    /// Prompt groups, and those whose completions all got the same reward.
    pub groups: f64,
    pub flat_groups: f64,
    /// The policy's entropy summed over completion tokens, and those tokens (the
    /// generated batch's first step; later steps of it repeat the measurement).
    pub entropy: f64,
    pub entropy_tokens: f64,
    /// Completion tokens in the loss: all of them unless maskTruncatedCompletions
    /// leaves some out. The KL and clip fraction are means over them, as TRL's.
    pub loss_tokens: f64,
}

/// A step's GRPO metrics, over all ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpoStats {
    pub reward: f64,
    pub accuracy: f64,
    pub unparsed_fraction: f64,
    pub completion_length: f64,
    pub kl: f64,
    pub clip_fraction: f64,
    /// Completions left out by off-policy masking.
    pub off_policy_masked: f64,
    pub sampling_tokens_per_second: f64,
    pub training_tokens_per_second: f64,
    /// Prompt groups whose completions all got the same reward (advantage 0: only
    /// their KL term trains), as a fraction of the step's groups.
    pub frac_reward_zero_std: f64,
    /// Mean entropy (nats) of the policy over completion tokens.
    pub entropy: f64,
    /// Steps in a row, up to this one, whose `frac_reward_zero_std` reached
    /// [`crds::contract::NO_SIGNAL_FRACTION`].
    pub no_signal_steps: u64,
}

impl GrpoStats {
    /// From the sums over ranks and this rank's sampling and training seconds (the
    /// ranks run in lockstep).
    pub fn from_sums(s: &Sums, sampling_seconds: f64, training_seconds: f64) -> GrpoStats {
        let per = |x: f64, n: f64| if n > 0.0 { x / n } else { 0.0 };
        GrpoStats {
            reward: per(s.reward, s.completions),
            accuracy: per(s.correct, s.completions),
            unparsed_fraction: per(s.unparsed, s.completions),
            completion_length: per(s.completion_tokens, s.completions),
            kl: per(s.kl, s.loss_tokens),
            clip_fraction: per(s.clipped, s.loss_tokens),
            off_policy_masked: s.off_policy_masked,
            sampling_tokens_per_second: per(s.sampled_tokens, sampling_seconds),
            training_tokens_per_second: per(s.trained_tokens, training_seconds),
            frac_reward_zero_std: per(s.flat_groups, s.groups),
            entropy: per(s.entropy, s.entropy_tokens),
            no_signal_steps: 0,
        }
    }

    /// These stats after `before` steps in a row without learning signal.
    pub fn after(self, before: u64) -> GrpoStats {
        let silent = self.frac_reward_zero_std >= crds::contract::NO_SIGNAL_FRACTION;
        GrpoStats { no_signal_steps: if silent { before + 1 } else { 0 }, ..self }
    }
}
