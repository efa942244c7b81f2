//! The API server's audit log: every request it completed, by whom, with the body of
//! each write to a TrainingRun. How a test counts one client's requests apart from the
//! controllers', the kubelets' and its own.

use std::path::Path;

use serde::Deserialize;

use super::Error;

/// The audit policy: the metadata of every request, the body too of writes to
/// TrainingRuns (whether the operator ever writes a spec); one event per request, when
/// it completes.
pub const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Request
    verbs: [create, update, patch]
    resources: [{group: training.puretransformer.dev, resources: [trainingruns]}]
  - level: Metadata
"#;

/// One completed request.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub verb: String,
    pub user: User,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    /// The request's body, for the writes the policy records it of.
    #[serde(default)]
    pub request_object: Option<serde_json::Value>,
    pub stage_timestamp: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct User {
    pub username: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
}

impl Request {
    /// Whether the request changed something (or tried to).
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }

    /// `resource` or `resource/subresource`, `-` for a request on no object.
    pub fn resource(&self) -> String {
        match &self.object_ref {
            Some(o) if !o.subresource.is_empty() => format!("{}/{}", o.resource, o.subresource),
            Some(o) => o.resource.clone(),
            None => "-".into(),
        }
    }
}

/// Every request in the audit log at `path`, in the order they completed. A line the API
/// server is still writing is left for the next read.
pub fn read(path: &Path) -> Result<Vec<Request>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    Ok(text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect())
}
