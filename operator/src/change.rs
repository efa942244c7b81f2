//! A change to a live run's spec, pure: whether the run takes it, and what it costs.
//!
//! The run's ConfigMap holds the config its attempts run under, the accepted one. A
//! spec that resolves to another config is compared with it:
//! - only the failure policy (the operator's own): the ConfigMap is rewritten and
//!   nothing restarts;
//! - the topology: the gang restarts at the new size from its last checkpoint, as a
//!   new attempt not counted against `maxRestarts` (`Resized`);
//! - the budget, a cadence, the sharding, the micro-batch, recomputation or the
//!   attention kernel: the same restart (`Reconfigured`). The trainer checkpoints when
//!   it is stopped, so the restart loses no steps, only the minute of a start;
//! - what no checkpoint resumes under (the global batch, the data, the optimizer...),
//!   a budget below what was trained, GRPO on another world size, or a topology the
//!   checkpoint claim cannot serve: refused (`ChangeRefused`, Accepted=False naming
//!   the fields). The running attempt goes on under the accepted config, and so do its
//!   restarts, until the spec is changed back.

use crds::RunConfig;
use crds::config::spec_field;
use crds::contract::RunReason;

/// The run's live checkpoint claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub name: String,
    /// Its access modes.
    pub modes: Vec<String>,
    /// The access mode the wanted spec gives it.
    pub wanted: String,
}

impl Claim {
    /// Whether the claim serves the wanted mode: a ReadWriteMany claim serves one node too.
    fn serves(&self) -> bool {
        self.modes.contains(&self.wanted)
            || (self.wanted == "ReadWriteOnce" && self.modes.iter().any(|m| m == "ReadWriteMany"))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// The run's first config, or the accepted one.
    Unchanged,
    /// Only what the operator reads: written to the ConfigMap, nothing restarts.
    Operator { changes: Vec<String> },
    /// The gang restarts under the new config (Resized or Reconfigured).
    Restart { reason: RunReason, summary: String, changes: Vec<String> },
    /// The run cannot take it; it goes on under the accepted config.
    Refused { message: String },
}

fn refused(problems: &[String], accepted: &RunConfig) -> Change {
    Change::Refused {
        message: format!(
            "refused: {}. The run goes on as accepted ({} on {}, {} steps); change these back to lift this",
            problems.join("; "),
            accepted.model.preset,
            accepted.topology.display,
            accepted.schedule.total_steps
        ),
    }
}

/// A spec that no longer resolves, for a run that has an accepted config: refused like
/// any change it cannot take, naming the fields, so the running attempt goes on.
pub fn unresolvable(invalid: &crds::InvalidSpec, accepted: &RunConfig) -> Change {
    let problems: Vec<String> = invalid.0.iter().map(|e| e.to_string()).collect();
    refused(&problems, accepted)
}

/// What the change from `accepted` (the ConfigMap's config; `None` before there is
/// one) to `wanted` (the spec, resolved) does, for a run that has trained
/// `trained_tokens` tokens and whose checkpoint claim is `claim` (`None` before it
/// exists).
pub fn admit(accepted: Option<&RunConfig>, wanted: &RunConfig, claim: Option<&Claim>, trained_tokens: u64) -> Change {
    let Some(accepted) = accepted else { return Change::Unchanged };
    let mut changes = wanted.record_differences(accepted);
    // Warmup is history: a resumed run keeps its own, whatever a new budget's default.
    changes.retain(|c| spec_field(c) != "spec.optimizer.warmupTokens");
    if changes.is_empty() {
        return Change::Unchanged;
    }
    let mut problems = refused_fields(&wanted.resume_differences(accepted));
    let (was, now) = (&accepted.topology, &wanted.topology);
    if wanted.grpo.is_some() && was.world_size != now.world_size {
        problems.push(format!(
            "spec.topology ({} → {}): GRPO resumes on the world size it started with, {} processes (its rollouts are \
             drawn per rank)",
            was.display, now.display, was.world_size
        ));
    }
    if wanted.schedule.total_tokens < trained_tokens {
        problems.push(format!(
            "spec.tokens: the run would train {} tokens, fewer than the {trained_tokens} it has trained",
            wanted.schedule.total_tokens
        ));
    }
    if let Some(c) = claim.filter(|c| !c.serves()) {
        problems.push(format!(
            "spec.topology.nodes ({} → {}): the checkpoint claim {} is {}, and {} nodes need {}; a claim's access \
             modes cannot change, so create the run with spec.checkpoint.accessMode: ReadWriteMany when it may grow \
             past one node",
            was.nodes,
            now.nodes,
            c.name,
            c.modes.join(", "),
            now.nodes,
            c.wanted
        ));
    }
    if !problems.is_empty() {
        return refused(&problems, accepted);
    }
    if changes.iter().all(|c| spec_field(c) == "spec.failurePolicy") {
        return Change::Operator { changes };
    }
    let resized = (was.nodes, was.gpus_per_node) != (now.nodes, now.gpus_per_node);
    if resized {
        Change::Restart {
            reason: RunReason::Resized,
            summary: format!("resized {} → {}", was.display, now.display),
            changes,
        }
    } else {
        let fields: std::collections::BTreeSet<&str> = changes.iter().map(|c| spec_field(c)).collect();
        Change::Restart {
            reason: RunReason::Reconfigured,
            summary: format!("reconfigured {}", fields.into_iter().collect::<Vec<_>>().join(", ")),
            changes,
        }
    }
}

/// `spec.field (path: was → now, ...)`, one per spec field, for differences no
/// checkpoint resumes under.
fn refused_fields(differences: &[String]) -> Vec<String> {
    let mut by_field: Vec<(&str, Vec<&str>)> = Vec::new();
    for d in differences {
        let field = spec_field(d);
        match by_field.iter_mut().find(|(f, _)| *f == field) {
            Some((_, ds)) => ds.push(d),
            None => by_field.push((field, vec![d])),
        }
    }
    by_field.into_iter().map(|(field, ds)| format!("{field} ({})", ds.join(", "))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, GRPO_SPEC, run};

    fn resolved(spec: &str) -> RunConfig {
        crds::resolve(&run(spec)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// GPU_SPEC (2 nodes × 4 GPUs, 256 sequences a step) with a learning rate, a
    /// checkpoint cadence and a failure policy.
    fn spec() -> String {
        format!(
            "{GPU_SPEC}  optimizer: {{lr: 3.0e-4}}\n  checkpoint: {{everySteps: 500}}\n  failurePolicy: {{maxRestarts: 3}}\n"
        )
    }

    fn claim(modes: &[&str], wanted: &str) -> Claim {
        Claim {
            name: "llm-checkpoints".into(),
            modes: modes.iter().map(|m| m.to_string()).collect(),
            wanted: wanted.into(),
        }
    }

    /// Each edit of [`spec`]: what it does to a run that trained
    /// `trained` tokens, and what the change names.
    #[test]
    fn each_change_is_taken_or_refused_naming_what_changed() {
        struct Case {
            name: &'static str,
            from: &'static str,
            to: &'static str,
            claim: Option<Claim>,
            trained: u64,
            want: &'static str,
            names: &'static [&'static str],
        }
        let rwx = || Some(claim(&["ReadWriteMany"], "ReadWriteMany"));
        let cases = [
            Case { name: "no change", from: "", to: "", claim: rwx(), trained: 0, want: "unchanged", names: &[] },
            Case {
                name: "fewer nodes",
                from: "nodes: 2",
                to: "nodes: 1",
                claim: rwx(),
                trained: 1 << 20,
                want: "Resized",
                names: &["resized 2x4 → 1x4"],
            },
            Case {
                name: "fewer GPUs per node",
                from: "gpusPerNode: 4",
                to: "gpusPerNode: 2",
                claim: rwx(),
                trained: 0,
                want: "Resized",
                names: &["resized 2x4 → 2x2"],
            },
            Case {
                name: "a larger budget",
                from: "tokens: 64M",
                to: "tokens: 80M",
                claim: rwx(),
                trained: 1 << 20,
                want: "Reconfigured",
                names: &["reconfigured spec.tokens"],
            },
            Case {
                name: "a cadence",
                from: "everySteps: 500",
                to: "everySteps: 100",
                claim: rwx(),
                trained: 0,
                want: "Reconfigured",
                names: &["spec.checkpoint"],
            },
            Case {
                name: "the failure policy",
                from: "maxRestarts: 3",
                to: "maxRestarts: 5",
                claim: rwx(),
                trained: 0,
                want: "operator",
                names: &[],
            },
            Case {
                name: "another global batch",
                from: "globalTokens: 262144",
                to: "globalTokens: 524288",
                claim: rwx(),
                trained: 0,
                want: "refused",
                names: &["spec.batch.globalTokens (batch.globalSequences: 256 → 512"],
            },
            Case {
                name: "another learning rate",
                from: "lr: 3.0e-4",
                to: "lr: 1.0e-3",
                claim: rwx(),
                trained: 0,
                want: "refused",
                names: &["spec.optimizer.lr (schedule.lr: 0.0003 → 0.001)"],
            },
            Case {
                name: "a budget below what was trained",
                from: "tokens: 64M",
                to: "tokens: 16M",
                claim: rwx(),
                trained: 32_000_000,
                want: "refused",
                names: &["spec.tokens: the run would train", "32000000 it has trained"],
            },
            Case {
                name: "many nodes on a ReadWriteOnce claim",
                from: "nodes: 2",
                to: "nodes: 4",
                claim: Some(claim(&["ReadWriteOnce"], "ReadWriteMany")),
                trained: 0,
                want: "refused",
                names: &["spec.topology.nodes (2 → 4)", "llm-checkpoints is ReadWriteOnce"],
            },
        ];
        for c in cases {
            let accepted = resolved(&spec());
            assert!(spec().contains(c.from), "{}: the spec has {}", c.name, c.from);
            let wanted = resolved(&spec().replace(c.from, c.to));
            let change = admit(Some(&accepted), &wanted, c.claim.as_ref(), c.trained);
            let (kind, text) = match &change {
                Change::Unchanged => ("unchanged", String::new()),
                Change::Operator { changes } => ("operator", changes.join(", ")),
                Change::Restart { reason, summary, changes } => (reason.as_str(), format!("{summary}: {changes:?}")),
                Change::Refused { message } => ("refused", message.clone()),
            };
            assert_eq!(kind, c.want, "{}: {change:?}", c.name);
            for n in c.names {
                assert!(text.contains(n), "{}: {n:?} not in {text}", c.name);
            }
        }
        assert_eq!(admit(None, &resolved(GPU_SPEC), None, 0), Change::Unchanged, "the first config");
    }

    #[test]
    fn grpo_keeps_its_world_size() {
        let accepted = resolved(GRPO_SPEC);
        let (from, to) = ("nodes: 1", "nodes: 2");
        assert!(GRPO_SPEC.contains(from));
        let change = admit(Some(&accepted), &resolved(&GRPO_SPEC.replace(from, to)), None, 0);
        let Change::Refused { message } = change else { panic!("{change:?}") };
        assert!(message.contains("spec.topology") && message.contains("GRPO"), "{message}");
    }
}
