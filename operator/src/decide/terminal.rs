//! A run that ended stays ended, pure: its phase, reason and message carry over.

use crds::types::{RunPhase, TrainingRunStatus};

use super::context::Ctx;
use super::outcome::Outcome;
use crate::status;

/// A Succeeded or Failed run keeps its outcome (more tokens for a finished run are
/// decided before this).
pub(super) fn stays(ctx: &Ctx) -> Option<Outcome> {
    status::is_terminal(&ctx.old).then(|| {
        Outcome::new(
            ctx.old.phase.unwrap_or(RunPhase::Failed),
            ctx.old.reason.as_deref().unwrap_or(""),
            main_message(&ctx.old),
        )
    })
}

/// The message of the condition that names the run's phase.
fn main_message(s: &TrainingRunStatus) -> String {
    let main = match s.phase {
        Some(RunPhase::Succeeded) => "Succeeded",
        Some(RunPhase::Failed) => "Failed",
        Some(RunPhase::Restarting) => "Restarting",
        Some(RunPhase::Suspended) => "Suspended",
        _ => "Running",
    };
    status::condition(s, main).map(|c| c.message.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::{Scene, condition};
    use crate::resources::testing::GPU_SPEC;

    #[test]
    fn only_an_ended_run_stays() {
        // (phase, the condition that holds its message, stays)
        let cases = [
            (Some(RunPhase::Succeeded), "Succeeded", true),
            (Some(RunPhase::Failed), "Failed", true),
            (Some(RunPhase::Running), "Running", false),
            (Some(RunPhase::Restarting), "Restarting", false),
            (None, "Running", false),
        ];
        for (phase, type_, ends) in cases {
            let scene = Scene::new(GPU_SPEC).status(|s| {
                s.phase = phase;
                s.reason = Some("Why".into());
                s.conditions.push(condition(type_, "True", "Why", "what happened"));
            });
            let o = stays(&scene.ctx());
            assert_eq!(o.is_some(), ends, "{phase:?}");
            if let Some(o) = o {
                assert_eq!((Some(o.phase), o.reason.as_str(), o.message.as_str()), (phase, "Why", "what happened"));
            }
        }
    }
}
