//! Stall policy, pure: a Running run whose step has not advanced for
//! `failurePolicy.stallTimeout` is Stalled.

use jiff::Timestamp;

use crate::clock::seconds_between;

#[derive(Clone, Debug, PartialEq)]
pub struct Stall {
    /// When the step last advanced (the stall clock), to keep in status.
    pub last_progress: Timestamp,
    /// Seconds without progress, when over the timeout.
    pub stalled_for: Option<u64>,
}

/// `was_running`: the run was already Running before this reconcile; a run that
/// just started running starts a fresh clock, and so does a step past the one in
/// status (`advanced`).
pub fn check(
    was_running: bool,
    last_progress: Option<Timestamp>,
    advanced: bool,
    now: Timestamp,
    timeout_seconds: u64,
) -> Stall {
    let last_progress = match last_progress {
        Some(t) if was_running && !advanced => t,
        _ => now,
    };
    let idle = seconds_between(last_progress, now);
    Stall { last_progress, stalled_for: (idle > timeout_seconds).then_some(idle) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        format!("2026-01-01T{s}Z").parse().unwrap()
    }

    #[test]
    fn the_clock_starts_when_running_starts_and_resets_on_progress() {
        let s = check(false, Some(t("00:00:00")), false, t("01:00:00"), 1800);
        assert_eq!(s, Stall { last_progress: t("01:00:00"), stalled_for: None });
        let s = check(true, Some(t("01:00:00")), true, t("02:00:00"), 1800);
        assert_eq!(s, Stall { last_progress: t("02:00:00"), stalled_for: None });
    }

    #[test]
    fn no_progress_past_the_timeout_is_a_stall() {
        let s = check(true, Some(t("01:00:00")), false, t("01:30:00"), 1800);
        assert_eq!(s.stalled_for, None, "exactly the timeout is not yet a stall");
        let s = check(true, Some(t("01:00:00")), false, t("01:30:01"), 1800);
        assert_eq!(s, Stall { last_progress: t("01:00:00"), stalled_for: Some(1801) });
    }
}
