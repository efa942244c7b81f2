//! Step 4: what the cluster says: the run's Jobs and pods, the run it starts from,
//! and rank 0's `/status`.

use std::time::Duration;

use bytes::Bytes;
use crds::config::ResolvedInit;
use crds::contract::CONFIG_KEY;
use crds::contract::TrainerStatus;
use crds::types::RunPhase;
use crds::{RunConfig, TrainingRun};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::failure::completion_index;
use crate::resources::{ATTEMPT_LABEL, RUN_LABEL, configmap_name, pvc_name};
use crate::{Error, Verb};

/// State of the run named by `initFrom.trainingRun`.
#[derive(Clone, Debug, PartialEq)]
pub enum InitRun {
    Missing,
    Phase(Option<RunPhase>),
}

/// What the observe step saw.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Every Job of the run, all attempts.
    pub jobs: Vec<Job>,
    /// Every pod of the run, all attempts.
    pub pods: Vec<Pod>,
    pub init_run: Option<InitRun>,
    /// Rank 0's `/status`, when it was polled in this reconcile.
    pub trainer: Option<TrainerStatus>,
}

/// Reads rank 0's `GET /status` over plain HTTP inside the cluster.
#[derive(Clone)]
pub struct StatusClient {
    http: HttpClient<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl StatusClient {
    pub fn new(timeout: Duration) -> StatusClient {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        StatusClient { http: HttpClient::builder(TokioExecutor::new()).build(connector), timeout }
    }

    pub async fn get(&self, url: &str) -> Result<TrainerStatus, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let fetch = async {
            let resp = self.http.get(uri).await.map_err(|e| format!("GET {url}: {e}"))?;
            let code = resp.status();
            let body = resp.into_body().collect().await.map_err(|e| format!("GET {url}: {e}"))?.to_bytes();
            if !code.is_success() {
                return Err(format!("GET {url}: HTTP {code}"));
            }
            serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not a trainer status document: {e}"))
        };
        tokio::time::timeout(self.timeout, fetch)
            .await
            .map_err(|_| format!("GET {url}: no answer within {:?}", self.timeout))?
    }
}

/// Lists the run's Jobs and pods (every attempt) and the state of its init run.
pub async fn observe(client: &Client, run: &TrainingRun, cfg: &RunConfig) -> Result<Observed, Error> {
    let ns = run.namespace().unwrap_or_default();
    let name = run.name_any();
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={name}"));
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let jobs = jobs.list(&lp).await.map_err(Error::kube(Verb::List, "Job", &ns, &name))?.items;
    let pods = pods.list(&lp).await.map_err(Error::kube(Verb::List, "Pod", &ns, &name))?.items;
    let init_run = match &cfg.init_from {
        Some(ResolvedInit::TrainingRun { name: init }) => {
            let runs: Api<TrainingRun> = Api::namespaced(client.clone(), &ns);
            let other = runs.get_opt(init).await.map_err(Error::kube(Verb::Get, "TrainingRun", &ns, init))?;
            Some(match other {
                None => InitRun::Missing,
                Some(o) => InitRun::Phase(o.status.and_then(|s| s.phase)),
            })
        }
        _ => None,
    };
    Ok(Observed { jobs, pods, init_run, trainer: None })
}

/// What the run's attempts run under: its ConfigMap's config, and its checkpoint
/// claim's access modes.
#[derive(Clone, Debug, Default)]
pub struct Accepted {
    /// `None` before the ConfigMap exists (or when it does not parse, logged).
    pub config: Option<RunConfig>,
    /// `None` before the claim exists.
    pub claim: Option<Vec<String>>,
}

/// Reads the run's ConfigMap and checkpoint claim.
pub async fn accepted(client: &Client, run: &TrainingRun) -> Result<Accepted, Error> {
    let ns = run.namespace().unwrap_or_default();
    let name = run.name_any();
    let cm_name = configmap_name(&name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = cms.get_opt(&cm_name).await.map_err(Error::kube(Verb::Get, "ConfigMap", &ns, &cm_name))?;
    let text = cm.and_then(|c| c.data).and_then(|mut d| d.remove(CONFIG_KEY));
    let config = text.and_then(|t| match serde_json::from_str::<RunConfig>(&t) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(run = %name, "ConfigMap {cm_name} does not hold a config this operator reads ({e}); rewriting it");
            None
        }
    });
    let claim_name = pvc_name(&name);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims
        .get_opt(&claim_name)
        .await
        .map_err(Error::kube(Verb::Get, "PersistentVolumeClaim", &ns, &claim_name))?
        .map(|c| c.spec.and_then(|s| s.access_modes).unwrap_or_default());
    Ok(Accepted { config, claim })
}

/// Whether rank 0 of `attempt` is running, so that its `/status` can answer.
pub fn rank0_running(obs: &Observed, attempt: u32) -> bool {
    obs.pods.iter().any(|p| {
        p.labels().get(ATTEMPT_LABEL) == Some(&attempt.to_string())
            && completion_index(p) == Some(0)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
}

/// Reads rank 0's `/status` at `url` into `obs.trainer` when rank 0 of `attempt` is
/// running. Returns whether it asked, answered or not. A failed poll is only logged;
/// the next one is due after the poll interval.
pub async fn poll_rank0(status: &StatusClient, obs: &mut Observed, attempt: u32, url: &str, run: &str) -> bool {
    if !rank0_running(obs, attempt) {
        return false;
    }
    match status.get(url).await {
        Ok(t) => obs.trainer = Some(t),
        Err(e) => tracing::info!(run = %run, "rank 0 status: {e}"),
    }
    true
}
