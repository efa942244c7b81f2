//! The TrainingRun operator (and its TrainingDataset controller, [`dataset`]): a
//! reconcile gathers what it reads ([`reconcile`]), plans its writes purely
//! ([`decide::plan`]) and executes them in the plan's order.

pub mod apply;
pub mod cache;
pub mod change;
pub mod clock;
pub mod context;
pub mod controller;
pub mod dataset;
pub mod decide;
pub mod dependents;
pub mod events;
pub mod failure;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod mix_datasets;
pub mod observe;
pub mod observed;
pub mod reconcile;
pub mod resources;
pub mod settings;
pub mod status;
pub mod validate;

/// Field manager of every server-side apply, and the event reporter.
pub const MANAGER: &str = "trainingrun-operator";

/// The API call that failed, in [`Error::Kube`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    /// Server-side apply of a child.
    Apply,
    /// Server-side apply of a run's status.
    ApplyStatus,
    /// A JSON merge patch of a few fields (a Job's suspension).
    Patch,
    Delete,
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Apply => "apply",
            Verb::ApplyStatus => "apply status",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{verb} {kind} {namespace}/{name}: {source}")]
    Kube {
        verb: Verb,
        kind: String,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("TrainingRun {0} has no namespace")]
    NoNamespace(String),
    #[error("TrainingDataset {name} is in use by TrainingRuns {runs:?}; its deletion waits for them to end")]
    InUse { name: String, runs: Vec<String> },
    #[error("finalizer of TrainingRun {name}: {message}")]
    Finalizer { name: String, message: String },
    #[error(
        "the CRD {crd} is not installed ({source}); install it with `kubectl apply -f crds/` or `helm install trainingrun-operator charts/trainingrun-operator`"
    )]
    CrdMissing {
        crd: String,
        #[source]
        source: kube::Error,
    },
    #[error("connecting to the Kubernetes API: {0}")]
    Connect(#[source] kube::Error),
    #[error("leader election on Lease {lease}: {message}")]
    Leader { lease: String, message: String },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("HTTP server on {addr}: {source}")]
    Http {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag}: {message}")]
    Flag { flag: &'static str, message: String },
}

impl Error {
    /// The Event reason this error is reported under. A request that got no answer (the
    /// API server unreachable, the connection lost) is an `ApiError` whatever it asked:
    /// only an answer says that a write itself failed.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } if !matches!(source, kube::Error::Api(_)) => "ApiError",
            Error::Kube { verb: Verb::Apply | Verb::Patch, .. } => "ApplyFailed",
            Error::Kube { verb: Verb::Delete, .. } => "DeleteFailed",
            Error::Kube { verb: Verb::ApplyStatus, .. } => "StatusUpdateFailed",
            Error::Kube { verb: Verb::Get | Verb::List, .. } => "ApiError",
            Error::NoNamespace(_) => "InvalidSpec",
            Error::Finalizer { .. } => "FinalizerFailed",
            Error::InUse { .. } => crds::contract::prepare::DatasetReason::InUse.as_str(),
            Error::CrdMissing { .. } | Error::Connect(_) => "ApiError",
            Error::Leader { .. } => "LeaderElectionFailed",
            Error::Metrics(_) | Error::Http { .. } | Error::Flag { .. } => "OperatorError",
        }
    }

    /// A write refused because the object changed since it was read (409): planned on
    /// an older object, which the next reconcile reads again; nothing to report.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }

    pub(crate) fn kube(
        verb: Verb,
        kind: impl Into<String>,
        namespace: &str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> Error {
        let (kind, namespace, name) = (kind.into(), namespace.to_string(), name.to_string());
        move |source| Error::Kube { verb, kind, namespace, name, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kube_error(verb: Verb, source: kube::Error) -> Error {
        Error::kube(verb, "TrainingRun", "ml", "a")(source)
    }

    fn answered(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("refused", "Invalid").with_code(code).boxed())
    }

    #[test]
    fn a_write_the_api_server_refused_is_named_by_its_verb_and_one_never_answered_is_an_api_error() {
        let unanswered = || kube::Error::Service(std::io::Error::other("client error (Connect)").into());
        let table = [
            (Verb::ApplyStatus, answered(422), "StatusUpdateFailed"),
            (Verb::ApplyStatus, unanswered(), "ApiError"),
            (Verb::Apply, answered(409), "ApplyFailed"),
            (Verb::Apply, unanswered(), "ApiError"),
            (Verb::Delete, answered(403), "DeleteFailed"),
            (Verb::Delete, unanswered(), "ApiError"),
            (Verb::Get, answered(500), "ApiError"),
            (Verb::List, unanswered(), "ApiError"),
        ];
        for (verb, source, reason) in table {
            let shown = format!("{verb:?} {source}");
            assert_eq!(kube_error(verb, source).reason(), reason, "{shown}");
        }
    }
}
