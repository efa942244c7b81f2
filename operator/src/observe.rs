//! Step 4: what the cluster says: the run's Jobs and pods, the run it starts from,
//! and rank 0's `/status`.

use std::time::Duration;

use bytes::Bytes;
use crds::config::ResolvedInit;
use crds::contract::TrainerStatus;
use crds::{RunConfig, TrainingRun};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::decide::{InitRun, Observed};
use crate::resources::RUN_LABEL;

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
    let jobs = jobs.list(&lp).await.map_err(Error::kube("list", "Job", &ns, &name))?.items;
    let pods = pods.list(&lp).await.map_err(Error::kube("list", "Pod", &ns, &name))?.items;
    let init_run = match &cfg.init_from {
        Some(ResolvedInit::TrainingRun { name: init }) => {
            let runs: Api<TrainingRun> = Api::namespaced(client.clone(), &ns);
            let other = runs.get_opt(init).await.map_err(Error::kube("get", "TrainingRun", &ns, init))?;
            Some(match other {
                None => InitRun::Missing,
                Some(o) => InitRun::Phase(o.status.and_then(|s| s.phase)),
            })
        }
        _ => None,
    };
    Ok(Observed { jobs, pods, init_run, trainer: None })
}
