//! Operator settings: what the command line and the environment configure.

use std::time::Duration;

/// Everything the reconcile pipeline needs besides the API.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Trainer image for runs that set no `spec.image`.
    pub trainer_image: String,
    /// Where rank 0's `/status` is, with `{job}`, `{service}`, `{namespace}`, `{run}`
    /// and `{port}` filled in.
    pub status_url: String,
    /// Poll rank 0 at most this often per run.
    pub status_poll_interval: Duration,
    /// Write progress-only status changes at most this often per run.
    pub status_write_interval: Duration,
    /// Requeue a run with nothing in flight after this long (a safety net; watches
    /// drive reconciles).
    pub requeue_interval: Duration,
    /// A pod that cannot be scheduled or pull its image for this long is reported.
    pub pending_timeout: Duration,
    /// A pod still terminating this long after its deletion deadline is on a lost node.
    pub lost_node_timeout: Duration,
    /// Timeout of one rank-0 status request.
    pub status_timeout: Duration,
    /// Reconciles in flight at once; bounds memory with thousands of runs.
    pub concurrency: u16,
    /// Give every run a NetworkPolicy admitting only its own pods and, on the status
    /// port, the operator's pods in this namespace.
    pub network_policy: Option<String>,
    /// With `network_policy`: a namespace (Prometheus') whose pods may also reach the
    /// status port, to scrape the trainers' `/metrics`.
    pub scrape_namespace: Option<String>,
}

/// The trainer image of this operator's own release (the chart's `appVersion`): a
/// tag, not `latest`, so that a kubelet uses the image it has and the runs of one
/// operator version all run one trainer.
pub const DEFAULT_TRAINER_IMAGE: &str = concat!("ghcr.io/puretransformer/trainer:", env!("CARGO_PKG_VERSION"));

pub const DEFAULT_STATUS_URL: &str = "http://{job}-0.{service}.{namespace}.svc:{port}/status";

impl Default for Settings {
    fn default() -> Self {
        Settings {
            trainer_image: DEFAULT_TRAINER_IMAGE.into(),
            status_url: DEFAULT_STATUS_URL.into(),
            status_poll_interval: Duration::from_secs(20),
            status_write_interval: Duration::from_secs(30),
            requeue_interval: Duration::from_secs(300),
            pending_timeout: Duration::from_secs(600),
            lost_node_timeout: Duration::from_secs(60),
            status_timeout: Duration::from_secs(5),
            concurrency: 16,
            network_policy: None,
            scrape_namespace: None,
        }
    }
}

impl Settings {
    pub fn status_url_for(&self, run: &str, namespace: &str, job: &str, service: &str) -> String {
        self.status_url
            .replace("{job}", job)
            .replace("{service}", service)
            .replace("{namespace}", namespace)
            .replace("{run}", run)
            .replace("{port}", &crds::contract::STATUS_PORT.to_string())
    }
}
