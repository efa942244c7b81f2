//! Rollbacks after a non-finite step (`failurePolicy.onNaN: rollback`), pure arithmetic
//! over the rollbacks below the run's config: the samples the run's data order passes
//! over, the learning rate's factor at a step, and how the rollbacks a checkpoint
//! recorded join the ones the operator asks for ([`crate::RunConfig::rollback_plan`]
//! decides the next one). The
//! data order is a function of (seed, position, rollbacks) alone, so a run that rolled
//! back trains exactly what an uninterrupted run with the same rollbacks would.

use std::ops::Range;

use crate::contract::FailedSamples;
use crate::types::Rollback;

/// A step whose loss or gradient norm was not finite, as its trainer reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NonFinite {
    /// `None`: unknown (the pods that said are gone).
    pub step: Option<u64>,
    /// Its place in the sample order; `None`: unknown, and nothing is skipped.
    pub samples: Option<FailedSamples>,
}

/// Where a batch that would start at global sample `position` starts: past every
/// skipped range that holds it.
pub fn skip_past(rollbacks: &[Rollback], mut position: u64) -> u64 {
    while let Some(r) = rollbacks.iter().find(|r| r.skip_from <= position && position < r.skip_to) {
        position = r.skip_to;
    }
    position
}

/// The skipped samples below `position`, as disjoint ranges in order.
pub fn skipped_below(rollbacks: &[Rollback], position: u64) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> =
        rollbacks.iter().map(|r| r.skip_from..r.skip_to.min(position)).filter(|r| !r.is_empty()).collect();
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// The learning rate's factor at optimizer step `step` (1-based): the product of the
/// factors of the rollbacks whose window, after the checkpoint rolled back to through
/// `lr_until_step`, holds it. A rollback the trainer has not resumed from yet applies
/// nowhere.
pub fn lr_factor_at(rollbacks: &[Rollback], step: u64) -> f64 {
    rollbacks
        .iter()
        .filter(|r| r.from_step.is_some_and(|from| from < step) && step <= r.lr_until_step)
        .map(|r| r.lr_factor)
        .product()
}

/// Whether `a` and `b` are the same rollback (one non-finite step of one attempt).
fn same(a: &Rollback, b: &Rollback) -> bool {
    (a.step, a.attempt) == (b.step, b.attempt)
}

/// The rollbacks a run resuming a checkpoint goes on with: every one the checkpoint
/// `recorded` (as recorded, with the step it resumed from), then those of `wanted` it
/// has not seen, oldest attempt first.
pub fn merge(wanted: &[Rollback], recorded: &[Rollback]) -> Vec<Rollback> {
    let mut out = recorded.to_vec();
    out.extend(wanted.iter().filter(|w| !recorded.iter().any(|r| same(r, w))).cloned());
    out.sort_by_key(|r| (r.attempt, r.step));
    out
}

/// Records that the run resumed from the checkpoint of `step` (0: none) for every
/// rollback that has not resumed yet; returns those.
pub fn resumed_at(rollbacks: &mut [Rollback], step: u64) -> Vec<Rollback> {
    let mut started = Vec::new();
    for r in rollbacks.iter_mut().filter(|r| r.from_step.is_none()) {
        r.from_step = Some(step);
        started.push(r.clone());
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunConfig;

    /// A 2-node run checkpointing every 100 steps, under failure policy `policy`.
    fn config(policy: &str) -> RunConfig {
        let yaml = format!(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: llm}}\nspec:\n  \
             model: {{preset: tiny}}\n  tokens: 64M\n  data:\n    mix: [{{name: web, weight: 1.0, uri: \"embedded:textbook\"}}]\n  \
             topology: {{nodes: 2, gpusPerNode: 4}}\n  batch: {{globalTokens: 262144, microBatch: 8, seqLength: 1024}}\n  \
             checkpoint: {{everySteps: 100}}\n  failurePolicy:\n{policy}"
        );
        crate::resolve(&crate::manifest::from_yaml(&yaml, "test").unwrap()).unwrap()
    }

    #[test]
    fn the_policy_decides_what_a_rollback_skips_and_lowers() {
        let at = NonFinite { step: Some(13), samples: Some(FailedSamples { from: 1536, to: 1664, checkpoint: 1280 }) };
        let earlier = config("    onNaN: rollback\n").rollback_plan(&[], 1, at, 12).unwrap();
        struct Case {
            policy: &'static str,
            done: usize,
            at: NonFinite,
            want: Result<(u64, u64, f64, u64), &'static str>,
        }
        let cases = [
            Case { policy: "    maxRestarts: 3\n", done: 0, at, want: Err("") },
            // The defaults: the failing step's batch, half the rate for one checkpoint interval (100).
            Case { policy: "    onNaN: rollback\n", done: 0, at, want: Ok((1536, 1664, 0.5, 113)) },
            Case {
                policy: "    onNaN: rollback\n    rollbackSkip: sinceCheckpoint\n    rollbackLrFactor: 0.25\n    rollbackLrSteps: 5\n",
                done: 0,
                at,
                want: Ok((1280, 1664, 0.25, 18)),
            },
            Case { policy: "    onNaN: rollback\n", done: 1, at, want: Ok((1536, 1664, 0.5, 113)) },
            Case {
                policy: "    onNaN: rollback\n",
                done: 2,
                at,
                want: Err("; no rollbacks left after 2 (failurePolicy.maxRollbacks 2)"),
            },
            Case {
                policy: "    onNaN: rollback\n    maxRollbacks: 0\n",
                done: 0,
                at,
                want: Err("; no rollbacks left after 0 (failurePolicy.maxRollbacks 0)"),
            },
            // Pods gone: the step from status, nothing skipped.
            Case { policy: "    onNaN: rollback\n", done: 0, at: NonFinite::default(), want: Ok((0, 0, 0.5, 113)) },
        ];
        for c in cases {
            let done = vec![earlier.clone(); c.done];
            let got = config(c.policy)
                .rollback_plan(&done, 2, c.at, 12)
                .map(|r| (r.skip_from, r.skip_to, r.lr_factor, r.lr_until_step));
            assert_eq!(got, c.want.map_err(String::from), "{}", c.policy);
        }
        assert_eq!((earlier.step, earlier.attempt, earlier.from_step), (13, 1, None));
    }

    fn rb(step: u64, attempt: u32, skip: Range<u64>, until: u64, from: Option<u64>) -> Rollback {
        Rollback {
            step,
            attempt,
            skip_from: skip.start,
            skip_to: skip.end,
            lr_factor: 0.5,
            lr_until_step: until,
            from_step: from,
        }
    }

    #[test]
    fn positions_skip_past_every_range_they_fall_in() {
        // Two rollbacks whose ranges touch, and one apart.
        let rs = [rb(13, 1, 96..104, 20, Some(10)), rb(14, 2, 104..112, 22, Some(10)), rb(30, 3, 200..208, 40, None)];
        let cases =
            [(0, 0), (95, 95), (96, 112), (100, 112), (104, 112), (111, 112), (112, 112), (200, 208), (208, 208)];
        for (position, want) in cases {
            assert_eq!(skip_past(&rs, position), want, "position {position}");
        }
        assert_eq!(skip_past(&[], 7), 7);
    }

    #[test]
    fn skipped_ranges_below_a_position_are_disjoint_and_clipped() {
        let rs = [rb(30, 3, 200..208, 40, None), rb(13, 1, 96..104, 20, Some(10)), rb(14, 2, 100..112, 22, None)];
        let cases: [(u64, &[(u64, u64)]); 4] =
            [(96, &[]), (100, &[(96, 100)]), (150, &[(96, 112)]), (300, &[(96, 112), (200, 208)])];
        for (position, want) in cases {
            let got: Vec<(u64, u64)> = skipped_below(&rs, position).iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(got, want, "below {position}");
        }
    }

    #[test]
    fn the_factor_holds_from_the_checkpoint_through_its_last_step() {
        let mut second = rb(18, 2, 0..0, 24, Some(16));
        second.lr_factor = 0.25;
        let rs = [rb(13, 1, 0..0, 20, Some(10)), second, rb(40, 3, 0..0, 50, None)];
        let cases = [
            (10, 1.0),   // the checkpoint's own step was trained before the rollback
            (11, 0.5),   // the first step trained again
            (13, 0.5),   // the failing step
            (16, 0.5),   // the second rollback's checkpoint step
            (17, 0.125), // both
            (20, 0.125), // the first one's last step
            (21, 0.25),  // the second alone
            (24, 0.25),  // its last
            (25, 1.0),   // back to the schedule
            (45, 1.0),   // a rollback not resumed from yet
        ];
        for (step, want) in cases {
            assert_eq!(lr_factor_at(&rs, step), want, "step {step}");
        }
    }

    #[test]
    fn a_checkpoints_record_wins_and_new_rollbacks_join_it() {
        let recorded = [rb(13, 1, 96..104, 20, Some(10))];
        let wanted = [rb(13, 1, 96..104, 20, None), rb(18, 2, 136..144, 24, None)];
        let mut merged = merge(&wanted, &recorded);
        assert_eq!(merged, [recorded[0].clone(), wanted[1].clone()]);
        // The operator's status lost nothing the checkpoint knows, and the reverse.
        assert_eq!(merge(&[], &recorded), recorded);
        assert_eq!(merge(&wanted[1..], &recorded), merged);
        let started = resumed_at(&mut merged, 16);
        assert_eq!(started, [rb(18, 2, 136..144, 24, Some(16))]);
        assert_eq!(merged[0].from_step, Some(10), "a rollback resumed earlier keeps its step");
        assert!(resumed_at(&mut merged, 20).is_empty());
    }
}
