//! One reconcile of a live TrainingRun: gather (reads only) → plan (pure, in
//! `decide`) → execute (the plan's writes, in its order).

mod execute;
mod gather;

use std::sync::Arc;
use std::time::Duration;

use crds::TrainingRun;
use kube::runtime::controller::Action;

use crate::Error;
use crate::context::Context;
use crate::decide;

pub use execute::execute;
pub use gather::{Gathered, gather};

/// When a deferred reconcile runs at the latest: the store's event it waits for
/// triggers it sooner.
pub const DEFERRED_RECHECK: Duration = Duration::from_secs(2);

/// Reconciles a live run (the finalizer in `controller` routes its deletion elsewhere).
pub async fn pipeline(cached: Arc<TrainingRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let now = ctx.clock.now();
    let observed = match gather(&ctx, &cached, now).await? {
        Gathered::Observed(o) => o,
        Gathered::Gone => return Ok(Action::await_change()),
        Gathered::Deferred => return Ok(Action::requeue(DEFERRED_RECHECK)),
    };
    let plan = decide::plan(&observed, &ctx.settings, now);
    execute(&ctx, &observed.run, &plan).await
}
