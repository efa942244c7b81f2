//! The learning-rate schedule: a pure `lr_at`, and how it continues when a resumed
//! run's budget changed.

use crate::config::{DEFAULT_DECAY_FRACTION, LrAnchor, ResolvedSchedule, WsdDecay};
use crate::types::{DecayShape, Schedule};

impl ResolvedSchedule {
    /// Learning rate after `tokens` tokens: linear warmup to `lr`, then cosine to
    /// `min_lr` at `total_tokens`, constant, or wsd's stable `lr` and decay. From an
    /// [`LrAnchor`] on, cosine and wsd start from the anchor's rate instead of `lr`.
    pub fn lr_at(&self, tokens: u64) -> f64 {
        if tokens < self.warmup_tokens {
            return self.lr * (tokens + 1) as f64 / self.warmup_tokens as f64;
        }
        let (peak, from) = match self.anchor {
            Some(a) if tokens >= a.tokens => (a.lr, a.tokens),
            _ => (self.lr, self.warmup_tokens),
        };
        match self.kind {
            Schedule::Constant => peak,
            Schedule::Cosine => {
                let span = self.total_tokens.saturating_sub(from).max(1);
                let done = (tokens - from).min(span) as f64 / span as f64;
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * done).cos());
                self.min_lr + (peak - self.min_lr) * cosine
            }
            Schedule::Wsd => {
                let decay =
                    self.decay.unwrap_or(WsdDecay { fraction: DEFAULT_DECAY_FRACTION, shape: DecayShape::Linear });
                let after_warmup = self.total_tokens.saturating_sub(self.warmup_tokens);
                let span = ((after_warmup as f64 * decay.fraction).round() as u64).max(1);
                // An anchor inside the decay window starts a shorter decay there.
                let start = self.total_tokens.saturating_sub(span).max(from);
                if tokens < start {
                    return peak;
                }
                let span = self.total_tokens.saturating_sub(start).max(1);
                let p = ((tokens - start) as f64 / span as f64).min(1.0);
                let fall = match decay.shape {
                    DecayShape::Linear => p,
                    DecayShape::OneMinusSqrt => p.sqrt(),
                };
                peak - (peak - self.min_lr) * fall
            }
        }
    }

    /// This schedule (a new budget's) continuing a run that trained `tokens` tokens
    /// under `was`: warmup is history, so `was`'s is kept; where the two schedules give
    /// different rates at `tokens`, the new one is anchored (replacing an earlier anchor:
    /// the schedule is exact from the latest anchor on, which is all a run still needs) at the rate the run had
    /// reached, so the rate never jumps. Fails, naming `spec.tokens`, when the new
    /// budget trains fewer tokens than were trained.
    pub fn continued(&self, was: &ResolvedSchedule, tokens: u64) -> Result<ResolvedSchedule, String> {
        if self.total_tokens < tokens {
            return Err(format!(
                "spec.tokens: the new budget trains {} tokens ({} steps), fewer than the {tokens} already trained",
                self.total_tokens, self.total_steps
            ));
        }
        let mut next = self.clone();
        next.warmup_tokens = was.warmup_tokens;
        next.anchor = was.anchor;
        let (before, after) = (was.lr_at(tokens), next.lr_at(tokens));
        if (before - after).abs() > 1e-12 * before.abs() {
            next.anchor = Some(LrAnchor { tokens, lr: before });
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(kind: Schedule, total_steps: u64) -> ResolvedSchedule {
        let per_step = 1000;
        ResolvedSchedule {
            budget_tokens: total_steps * per_step,
            total_tokens: total_steps * per_step,
            total_steps,
            warmup_tokens: 10_000,
            lr: 1e-3,
            min_lr: 1e-4,
            kind,
            decay: (kind == Schedule::Wsd).then_some(WsdDecay { fraction: 0.2, shape: DecayShape::Linear }),
            anchor: None,
        }
    }

    /// Rates of `s` at each step's first token.
    fn rates(s: &ResolvedSchedule, steps: std::ops::Range<u64>) -> Vec<f64> {
        steps.map(|step| s.lr_at(step * 1000)).collect()
    }

    /// Each (schedule, budget change at a step) case: the rate right after the change
    /// is the one the old plan had reached, the new plan ends at minLr, no step moves
    /// the rate by more than the largest step of either plan, and where the change
    /// needs no anchor the curve is the one planned at the new budget from the start.
    #[test]
    fn a_budget_change_continues_the_rate_without_a_jump() {
        struct Case {
            kind: Schedule,
            steps: u64,
            new_steps: u64,
            at: u64,
            same_as_planned: bool,
        }
        let cases = [
            Case { kind: Schedule::Constant, steps: 100, new_steps: 150, at: 60, same_as_planned: true },
            Case { kind: Schedule::Constant, steps: 100, new_steps: 70, at: 60, same_as_planned: true },
            Case { kind: Schedule::Cosine, steps: 100, new_steps: 150, at: 60, same_as_planned: false },
            Case { kind: Schedule::Cosine, steps: 100, new_steps: 70, at: 60, same_as_planned: false },
            Case { kind: Schedule::Cosine, steps: 100, new_steps: 150, at: 5, same_as_planned: true },
            Case { kind: Schedule::Wsd, steps: 100, new_steps: 150, at: 60, same_as_planned: true },
            Case { kind: Schedule::Wsd, steps: 100, new_steps: 150, at: 90, same_as_planned: false },
            Case { kind: Schedule::Wsd, steps: 100, new_steps: 65, at: 60, same_as_planned: false },
        ];
        for c in cases {
            let name = format!("{:?} {} → {} steps at step {}", c.kind, c.steps, c.new_steps, c.at);
            let was = schedule(c.kind, c.steps);
            let planned = schedule(c.kind, c.new_steps);
            let now = planned.continued(&was, c.at * 1000).unwrap();
            let (after, before) = (now.lr_at(c.at * 1000), was.lr_at(c.at * 1000));
            assert!((after - before).abs() <= 1e-12 * before, "{name}: the rate at the change, {after} vs {before}");
            let mut curve = rates(&was, 0..c.at);
            curve.extend(rates(&now, c.at..c.new_steps + 1));
            let end = if c.kind == Schedule::Constant { now.lr } else { now.min_lr };
            assert!((curve[c.new_steps as usize] - end).abs() < 1e-15, "{name}: ends at {end}");
            let largest = |r: &[f64]| r.windows(2).skip(12).map(|w| (w[1] - w[0]).abs()).fold(0.0, f64::max);
            let allowed = largest(&rates(&was, 0..c.steps + 1)).max(largest(&rates(&planned, 0..c.new_steps + 1)));
            let worst = largest(&curve[c.at as usize - 1..]);
            assert!(worst <= allowed * 1.0001 + 1e-18, "{name}: a step of {worst} > {allowed}");
            let same = curve == rates(&planned, 0..c.new_steps + 1);
            assert_eq!(same, c.same_as_planned, "{name}: the same curve as planned at the new budget");
            assert_eq!(now.anchor.is_none(), c.same_as_planned, "{name}: anchored only where needed");
        }
    }

    /// A second change anchors where the first curve had reached: the rate stays continuous.
    #[test]
    fn changes_compose() {
        let first = schedule(Schedule::Cosine, 150).continued(&schedule(Schedule::Cosine, 100), 60_000).unwrap();
        let second = schedule(Schedule::Cosine, 200).continued(&first, 120_000).unwrap();
        assert!((second.lr_at(120_000) - first.lr_at(120_000)).abs() <= 1e-12 * first.lr_at(120_000));
        assert!((second.lr_at(200_000) - second.min_lr).abs() <= 1e-15);
        let same = schedule(Schedule::Cosine, 150).continued(&first, 120_000).unwrap();
        assert_eq!(same, first, "an unchanged budget keeps the anchor and adds none");
    }

    #[test]
    fn shrinking_below_what_was_trained_is_refused_naming_the_field() {
        let err = schedule(Schedule::Wsd, 50).continued(&schedule(Schedule::Wsd, 100), 60_000).unwrap_err();
        assert!(err.starts_with("spec.tokens:") && err.contains("60000 already trained"), "{err}");
        // Down to exactly what was trained: the run is complete.
        let done = schedule(Schedule::Wsd, 60).continued(&schedule(Schedule::Wsd, 100), 60_000).unwrap();
        assert_eq!(done.total_steps, 60);
    }

    /// Warmup is history: the new budget's default warmup does not apply.
    #[test]
    fn warmup_is_kept() {
        let was = schedule(Schedule::Cosine, 100);
        let mut bigger = schedule(Schedule::Cosine, 200);
        bigger.warmup_tokens = 20_000;
        let now = bigger.continued(&was, 5_000).unwrap();
        assert_eq!(now.warmup_tokens, 10_000);
        assert_eq!(now.lr_at(5_000), was.lr_at(5_000));
    }
}
