//! Errors as the API server reports them: a `Status` body with its code and reason.

use serde_json::{Value, json};

use super::resource::Key;

/// An error of the fake, as the API server would report it (see [`FakeError::to_status`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum FakeError {
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String },
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String },
    #[error("{message}")]
    Conflict { resource: String, name: String, message: String, causes: Vec<Value> },
    #[error("{0}")]
    BadRequest(String),
    #[error("{resource} \"{name}\" is invalid: {message}")]
    Invalid { resource: String, name: String, message: String },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Expired(String),
    #[error("injected failure ({code})")]
    Injected { code: u16 },
}

impl FakeError {
    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            FakeError::NotFound { .. } => 404,
            FakeError::AlreadyExists { .. } | FakeError::Conflict { .. } => 409,
            FakeError::BadRequest(_) => 400,
            FakeError::Invalid { .. } => 422,
            FakeError::UnsupportedMediaType(_) => 415,
            FakeError::MethodNotAllowed(_) => 405,
            FakeError::Expired(_) => 410,
            FakeError::Injected { code } => *code,
        }
    }

    /// The `Status.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            FakeError::AlreadyExists { .. } => "AlreadyExists",
            e => reason_for_code(e.code()),
        }
    }

    /// The `meta/v1` `Status` body the API server would answer with.
    pub fn to_status(&self) -> Value {
        let details = match self {
            FakeError::NotFound { resource, name }
            | FakeError::AlreadyExists { resource, name }
            | FakeError::Invalid { resource, name, .. } => Some(details(resource, name, &[])),
            FakeError::Conflict { resource, name, causes, .. } => Some(details(resource, name, causes)),
            _ => None,
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if let (Some(d), Some(map)) = (details, status.as_object_mut()) {
            map.insert("details".into(), d);
        }
        status
    }
}

/// `details` of a Status; `resource` is `plural[.group]`.
pub(super) fn details(resource: &str, name: &str, causes: &[Value]) -> Value {
    let (kind, group) = resource.split_once('.').unwrap_or((resource, ""));
    let mut d = json!({"name": name, "kind": kind});
    if let Some(map) = d.as_object_mut() {
        if !group.is_empty() {
            map.insert("group".into(), json!(group));
        }
        if !causes.is_empty() {
            map.insert("causes".into(), Value::Array(causes.to_vec()));
        }
    }
    d
}

fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

pub(super) fn not_found(key: &Key) -> FakeError {
    FakeError::NotFound { resource: key.res.qualified(), name: key.name.clone() }
}

pub(super) fn invalid(key: &Key, message: &str) -> FakeError {
    FakeError::Invalid { resource: key.res.qualified(), name: key.name.clone(), message: message.to_string() }
}

pub(super) fn conflict(key: &Key, message: String) -> FakeError {
    FakeError::Conflict { resource: key.res.qualified(), name: key.name.clone(), message, causes: Vec::new() }
}

pub(super) fn stale(key: &Key) -> FakeError {
    conflict(
        key,
        format!(
            "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
            key.res.qualified(),
            key.name
        ),
    )
}
