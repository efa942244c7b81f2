//! GRPO's learning signal, pure: the NoLearningSignal condition.

use crds::contract::RunReason;
use crds::types::TrainingRunStatus;

use crate::status::{Cond, NO_LEARNING_SIGNAL};

/// GRPO's NoLearningSignal condition: True once `no_signal_steps` steps in a row had
/// at least 90% of their prompt groups with equal rewards.
pub(super) fn learning_signal(new: &TrainingRunStatus, no_signal_steps: u32) -> Cond {
    let m = new.metrics.as_ref();
    let streak = m.and_then(|m| m.no_signal_steps).unwrap_or(0);
    if streak < u64::from(no_signal_steps.max(1)) {
        return Cond {
            type_: NO_LEARNING_SIGNAL,
            status: false,
            reason: RunReason::LearningSignal.into(),
            message: String::new(),
        };
    }
    let frac = m.and_then(|m| m.frac_reward_zero_std).unwrap_or(1.0);
    Cond {
        type_: NO_LEARNING_SIGNAL,
        status: true,
        reason: RunReason::NoLearningSignal.into(),
        message: format!(
            "for {streak} steps in a row at least {:.0}% of the prompt groups got equal rewards for every completion \
             (now {:.0}%), so they give no gradient: the questions are too easy or too hard for the policy, or \
             sampling is too cold to vary (raise spec.grpo.temperature or generationsPerPrompt, or change the dataset)",
            100.0 * crds::contract::NO_SIGNAL_FRACTION,
            100.0 * frac
        ),
    }
}
