//! Server-side apply with one field manager, merge patches under it, and deletion.
//! Each child carries the hash of what was last applied to it ([`APPLIED_HASH`]), so a
//! child whose desired state has not changed is not written at all.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::resources::{APPLIED_HASH, applied_hash, hash_of};
use crate::{Error, MANAGER, Verb};

pub fn params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Applies `obj` unless the live object carries the same applied-hash. Returns
/// whether it wrote.
pub async fn ensure<K>(api: &Api<K>, obj: K) -> Result<bool, Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Serialize + DeserializeOwned + Clone + Debug,
    K::DynamicType: Default,
{
    let name = obj.name_any();
    let ns = obj.namespace().unwrap_or_default();
    let live = api.get_opt(&name).await.map_err(Error::kube(Verb::Get, kind_of::<K>(), &ns, &name))?;
    ensure_over(api, live.as_ref().and_then(applied_hash), obj).await
}

/// [`ensure`] against the applied-hash of the live object read earlier in this
/// reconcile (`None`: absent, or without one), instead of reading it again.
pub async fn ensure_over<K>(api: &Api<K>, live_hash: Option<String>, obj: K) -> Result<bool, Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Serialize + DeserializeOwned + Clone + Debug,
    K::DynamicType: Default,
{
    if live_hash.as_deref() == Some(hash_of(&obj).as_str()) {
        return Ok(false);
    }
    write(api, obj).await?;
    Ok(true)
}

/// Applies `obj` with its applied-hash, whatever the live object carries: for a
/// change decided from the live object, which others may have changed since. Returns
/// the resourceVersion the API server answered with.
pub async fn write<K>(api: &Api<K>, mut obj: K) -> Result<Option<String>, Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Serialize + DeserializeOwned + Clone + Debug,
    K::DynamicType: Default,
{
    let name = obj.name_any();
    let ns = obj.namespace().unwrap_or_default();
    let digest = hash_of(&obj);
    obj.annotations_mut().insert(APPLIED_HASH.into(), digest);
    let written = api.patch(&name, &params(), &Patch::Apply(&obj)).await.map_err(Error::kube(
        Verb::Apply,
        kind_of::<K>(),
        &ns,
        &name,
    ))?;
    Ok(written.resource_version())
}

/// A JSON merge patch of `name` under the operator's field manager, for a change of a
/// few fields of an object whose others the operator must leave as they are. Returns
/// the resourceVersion the API server answered with.
pub async fn merge<K>(
    api: &Api<K>,
    namespace: &str,
    name: &str,
    patch: &serde_json::Value,
) -> Result<Option<String>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    let written = api.patch(name, &params, &Patch::Merge(patch)).await.map_err(Error::kube(
        Verb::Patch,
        kind_of::<K>(),
        namespace,
        name,
    ))?;
    Ok(written.resource_version())
}

/// Server-side apply of `obj`'s status, conditional on the resourceVersion `obj` was
/// read at: an object changed since is planned again. Returns the resourceVersion the
/// API server answered with.
pub async fn write_status<K, S>(client: &kube::Client, obj: &K, status: &S) -> Result<Option<String>, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
    S: Serialize,
{
    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name, "resourceVersion": obj.resource_version()},
        "status": status,
    });
    let api: Api<K> = Api::namespaced(client.clone(), &ns);
    let written = api.patch_status(&name, &params(), &Patch::Apply(&patch)).await.map_err(Error::kube(
        Verb::ApplyStatus,
        K::kind(&()),
        &ns,
        &name,
    ))?;
    Ok(written.resource_version())
}

/// Deletes a child and, in the background, what it owns (a Job's pods).
pub async fn delete<K>(api: &Api<K>, namespace: &str, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let dp = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(Verb::Delete, kind_of::<K>(), namespace, name)(e)),
    }
}

fn kind_of<K: Resource>() -> String
where
    K::DynamicType: Default,
{
    K::kind(&K::DynamicType::default()).into_owned()
}
