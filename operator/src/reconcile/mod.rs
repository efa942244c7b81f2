//! One reconcile of a live TrainingRun: gather (reads only) → plan (pure, in
//! `decide`) → execute (the plan's writes, in its order).

mod execute;
mod gather;

use std::sync::Arc;

use crds::TrainingRun;
use kube::runtime::controller::Action;

use crate::Error;
use crate::context::Context;
use crate::decide;

pub use execute::execute;
pub use gather::gather;

/// Reconciles a live run (the finalizer in `controller` routes its deletion elsewhere).
pub async fn pipeline(cached: Arc<TrainingRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let now = ctx.clock.now();
    let Some(observed) = gather(&ctx, &cached, now).await? else {
        return Ok(Action::await_change());
    };
    let plan = decide::plan(&observed, &ctx.settings, now);
    execute(&ctx, &observed.run, &plan).await
}
