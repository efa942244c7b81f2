//! A plan's writes, made in the plan's order; the first that fails stops the rest
//! (the controller retries the reconcile, which plans again from what is then live).

use crds::TrainingRun;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch};
use kube::runtime::controller::Action;

use crate::cache::{Expected, Kind};
use crate::context::Context;
use crate::decide::{Child, Plan, Step};
use crate::resources::workload;
use crate::{Error, Verb, apply};

/// Makes `plan`'s writes about `run`, in order, and expects the next reconcile to see
/// each; the requeue it asks for.
pub async fn execute(ctx: &Context, run: &TrainingRun, plan: &Plan) -> Result<Action, Error> {
    let (ns, name) = (run.namespace().unwrap_or_default(), run.name_any());
    let uid = run.uid().unwrap_or_default();
    let expect = |e: Expected| ctx.expectations.expect(&uid, e);
    for step in &plan.steps {
        match step {
            Step::Apply(child) => {
                let (kind, child_name, rv) = apply_child(ctx, &ns, child).await?;
                expect(Expected::written(kind, &child_name, rv.as_deref()));
            }
            Step::Status { status, write, checkpoint_every_tokens } => {
                if *write {
                    match apply::write_status(&ctx.client, run, &**status).await {
                        Ok(rv) => expect(Expected::written(Kind::Run, &name, rv.as_deref())),
                        Err(e) => {
                            // Refused as planned on an older run (409): the next plan
                            // reads the run from the API.
                            expect(Expected::Live);
                            return Err(e);
                        }
                    }
                }
                ctx.remember(&uid, plan.memory.clone());
                // The gauges follow the status just written, before the events take their
                // round trips.
                ctx.metrics.observe_run(&ns, &name, status, *checkpoint_every_tokens);
            }
            Step::Publish(note) => ctx.publish(run, note.warning, &note.reason, &note.message).await,
            Step::DeleteJob(job) => {
                apply::delete(&Api::<Job>::namespaced(ctx.client.clone(), &ns), &ns, job).await?;
                expect(Expected::Gone { kind: Kind::Job, name: job.clone() });
            }
            Step::DeletePod(pod) => {
                apply::delete(&Api::<Pod>::namespaced(ctx.client.clone(), &ns), &ns, pod).await?;
                expect(Expected::Gone { kind: Kind::Pod, name: pod.clone() });
            }
            Step::SuspendJob(s) => {
                let rv =
                    apply::merge(&Api::<Job>::namespaced(ctx.client.clone(), &ns), &ns, &s.job, &s.patch()).await?;
                expect(Expected::written(Kind::Job, &s.job, rv.as_deref()));
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

/// Applies a child: its kind, name and the resourceVersion it was written at.
async fn apply_child(ctx: &Context, ns: &str, child: &Child) -> Result<(Kind, String, Option<String>), Error> {
    let client = ctx.client.clone();
    Ok(match child {
        Child::ConfigMap(c) => (
            Kind::ConfigMap,
            c.name_any(),
            apply::write(&Api::<ConfigMap>::namespaced(client, ns), (**c).clone()).await?,
        ),
        Child::Service(s) => {
            (Kind::Service, s.name_any(), apply::write(&Api::<Service>::namespaced(client, ns), (**s).clone()).await?)
        }
        Child::Claim(c) => {
            let api = Api::<PersistentVolumeClaim>::namespaced(client, ns);
            (Kind::Claim, c.name_any(), apply::write(&api, (**c).clone()).await?)
        }
        Child::NetworkPolicy(p) => {
            let api = Api::<NetworkPolicy>::namespaced(client, ns);
            (Kind::NetworkPolicy, p.name_any(), apply::write(&api, (**p).clone()).await?)
        }
        Child::Job(j) => {
            (Kind::Job, j.name_any(), apply::write(&Api::<Job>::namespaced(client, ns), (**j).clone()).await?)
        }
    })
}
