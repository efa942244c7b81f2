//! A dataset plan's writes, made in the plan's order; the first that fails stops the
//! rest (the controller retries, planning again from what is then live).

use crds::types::{TrainingDataset, TrainingDatasetStatus};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::plan::{Plan, Step};
use crate::context::Context;
use crate::{Error, Verb, apply};

pub async fn execute(ctx: &Context, ds: &TrainingDataset, plan: &Plan) -> Result<Action, Error> {
    let ns = ds.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    for step in &plan.steps {
        match step {
            Step::Status(status) => write_status(ctx, ds, status).await?,
            Step::Publish(note) => ctx.publish(ds, note.warning, &note.reason, &note.message).await,
            Step::DeleteJob(name) => apply::delete(&jobs, &ns, name).await?,
            Step::ApplyJob(job) => apply::write(&jobs, (**job).clone()).await?,
        }
    }
    Ok(Action::requeue(plan.requeue))
}

/// Server-side apply of the dataset's status, conditional on the resourceVersion it was
/// planned from.
pub async fn write_status(ctx: &Context, ds: &TrainingDataset, status: &TrainingDatasetStatus) -> Result<(), Error> {
    let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    let patch = json!({
        "apiVersion": TrainingDataset::api_version(&()),
        "kind": TrainingDataset::kind(&()),
        "metadata": {"name": name, "resourceVersion": ds.resource_version()},
        "status": status,
    });
    Api::<TrainingDataset>::namespaced(ctx.client.clone(), &ns)
        .patch_status(&name, &apply::params(), &Patch::Apply(&patch))
        .await
        .map_err(Error::kube(Verb::ApplyStatus, "TrainingDataset", &ns, &name))?;
    Ok(())
}
