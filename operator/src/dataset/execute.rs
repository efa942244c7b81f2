//! A dataset plan's writes, made in the plan's order; the first that fails stops the
//! rest (the controller retries, planning again from what is then live).

use crds::types::TrainingDataset;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::plan::{Plan, Step};
use crate::context::Context;
use crate::{Error, apply};

pub async fn execute(ctx: &Context, ds: &TrainingDataset, plan: &Plan) -> Result<Action, Error> {
    let ns = ds.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    for step in &plan.steps {
        match step {
            Step::Status(status) => {
                apply::write_status(&ctx.client, ds, &**status).await?;
            }
            Step::Publish(note) => ctx.publish(ds, note.warning, &note.reason, &note.message).await,
            Step::DeleteJob(name) => apply::delete(&jobs, &ns, name).await?,
            Step::ApplyJob(job) => {
                apply::write(&jobs, (**job).clone()).await?;
            }
        }
    }
    Ok(Action::requeue(plan.requeue))
}
