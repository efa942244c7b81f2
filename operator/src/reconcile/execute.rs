//! A plan's writes, made in the plan's order; the first that fails stops the rest
//! (the controller retries the reconcile, which plans again from what is then live).

use crds::TrainingRun;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch};
use kube::runtime::controller::Action;

use crate::context::Context;
use crate::decide::{Child, Plan, Step};
use crate::resources::workload;
use crate::{Error, Verb, apply};

/// Makes `plan`'s writes about `run`, in order; the requeue it asks for.
pub async fn execute(ctx: &Context, run: &TrainingRun, plan: &Plan) -> Result<Action, Error> {
    let (ns, name) = (run.namespace().unwrap_or_default(), run.name_any());
    for step in &plan.steps {
        match step {
            Step::Apply(child) => apply_child(ctx, &ns, child).await?,
            Step::Status { status, write, checkpoint_every_tokens } => {
                if *write {
                    apply::write_status(&ctx.client, run, &**status).await?;
                }
                ctx.remember(&run.uid().unwrap_or_default(), plan.memory.clone());
                // The gauges follow the status just written, before the events take their
                // round trips.
                ctx.metrics.observe_run(&ns, &name, status, *checkpoint_every_tokens);
            }
            Step::Publish(note) => ctx.publish(run, note.warning, &note.reason, &note.message).await,
            Step::DeleteJob(job) => apply::delete(&Api::<Job>::namespaced(ctx.client.clone(), &ns), &ns, job).await?,
            Step::DeletePod(pod) => apply::delete(&Api::<Pod>::namespaced(ctx.client.clone(), &ns), &ns, pod).await?,
            Step::SuspendJob(job) => {
                apply::write(&Api::<Job>::namespaced(ctx.client.clone(), &ns), (**job).clone()).await?
            }
            Step::ActivateWorkload { name, active } => {
                let workloads =
                    Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &workload::api_resource());
                let activation = workload::activation(name, &ns, *active);
                workloads.patch(name, &apply::params(), &Patch::Apply(activation)).await.map_err(Error::kube(
                    Verb::Apply,
                    "Workload",
                    &ns,
                    name,
                ))?;
            }
        }
    }
    Ok(Action::requeue(plan.requeue))
}

async fn apply_child(ctx: &Context, ns: &str, child: &Child) -> Result<(), Error> {
    let client = ctx.client.clone();
    match child {
        Child::ConfigMap(c) => apply::write(&Api::<ConfigMap>::namespaced(client, ns), (**c).clone()).await,
        Child::Service(s) => apply::write(&Api::<Service>::namespaced(client, ns), (**s).clone()).await,
        Child::Claim(c) => apply::write(&Api::<PersistentVolumeClaim>::namespaced(client, ns), (**c).clone()).await,
        Child::NetworkPolicy(p) => apply::write(&Api::<NetworkPolicy>::namespaced(client, ns), (**p).clone()).await,
        Child::Job(j) => apply::write(&Api::<Job>::namespaced(client, ns), (**j).clone()).await,
    }
}
