//! Step 4: what the cluster says: the run's Jobs and pods, the run it starts from,
//! and rank 0's `/status`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crds::config::ResolvedInit;
use crds::contract::{CONFIG_KEY, LINK_PROBE_BYTES, LINK_PROBE_PATH, STATUS_PORT, TrainerStatus, clip};
use crds::{RunConfig, TrainingRun};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::header::CONTENT_LENGTH;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};

use crate::clock::seconds_between;
use crate::plausible::plausible;
use crate::resources::{QueuedWorkload, RUN_LABEL, applied_hash, configmap_name, job_name, pvc_name, workload};
use crate::{Error, Verb};

pub use crate::observed::{InitRun, LinkProbe, Observed, link_targets, rank0_running};

/// The most of an answer to `GET /status` the operator reads. A trainer's document is
/// a few KiB plus about 90 bytes per rank, so this serves ten thousand ranks and stops
/// a pod that answers without end.
pub const STATUS_BODY_LIMIT: usize = 1024 * 1024;
/// The longest piece of a parse error kept in a message: serde quotes what it did not
/// expect, and that text is the pod's.
const QUOTED: usize = 200;

/// Why a poll of rank 0 brought no document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollError {
    /// No answer in time, or an HTTP error: usual while rank 0 starts or restarts.
    Unanswered(String),
    /// An answer the operator will not use: larger than [`STATUS_BODY_LIMIT`], not a
    /// status document, or one no trainer of the run could give ([`plausible`]).
    Refused(String),
}

impl std::fmt::Display for PollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollError::Unanswered(m) | PollError::Refused(m) => f.write_str(m),
        }
    }
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

    /// The document at `url`, read within the client's timeout and up to
    /// [`STATUS_BODY_LIMIT`] bytes.
    pub async fn get(&self, url: &str) -> Result<TrainerStatus, PollError> {
        self.get_json(url, "trainer status").await
    }

    /// The JSON document `what` at `url`, read as [`Self::get`] reads one.
    pub async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str, what: &str) -> Result<T, PollError> {
        let uri: hyper::Uri = url.parse().map_err(|e| PollError::Unanswered(format!("{url}: {e}")))?;
        let unanswered = |e: &dyn std::fmt::Display| PollError::Unanswered(format!("GET {url}: {e}"));
        let refused = |why: String| PollError::Refused(format!("GET {url}: refused: {why}"));
        let fetch = async {
            let resp = self.http.get(uri).await.map_err(|e| unanswered(&e))?;
            let code = resp.status();
            if !code.is_success() {
                return Err(unanswered(&format!("HTTP {code}")));
            }
            let announced = resp.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if let Some(n) = announced.filter(|n| *n > STATUS_BODY_LIMIT as u64) {
                return Err(refused(format!("Content-Length {n} is over the {STATUS_BODY_LIMIT}-byte limit")));
            }
            let body = match Limited::new(resp.into_body(), STATUS_BODY_LIMIT).collect().await {
                Ok(body) => body.to_bytes(),
                Err(e) if e.is::<LengthLimitError>() => {
                    return Err(refused(format!("the body is over the {STATUS_BODY_LIMIT}-byte limit")));
                }
                Err(e) => return Err(unanswered(&e)),
            };
            serde_json::from_slice(&body)
                .map_err(|e| refused(format!("not a {what} document: {}", clip(&e.to_string(), QUOTED))))
        };
        tokio::time::timeout(self.timeout, fetch)
            .await
            .map_err(|_| PollError::Unanswered(format!("GET {url}: no answer within {:?}", self.timeout)))?
    }

    /// [`Self::get`], refusing a document no trainer of the run under `cfg` could give.
    pub async fn poll(&self, url: &str, cfg: &RunConfig) -> Result<TrainerStatus, PollError> {
        let t = self.get(url).await?;
        plausible(&t, cfg)
            .map_err(|why| PollError::Refused(format!("GET {url}: refused: implausible status: {why}")))?;
        Ok(t)
    }
}

/// Link probes in flight at once: a thousand pods whose links are all dead take 63
/// timeouts to time, not a thousand.
const LINK_PROBES_AT_ONCE: usize = 16;

impl StatusClient {
    /// Seconds to fetch [`LINK_PROBE_PATH`] whole from a pod's status port at `addr`:
    /// the client's timeout when it was not all there by then; `None` when the pod
    /// refused or answered an error (its server is not up: no reading of its link).
    pub async fn time_link(&self, addr: SocketAddr) -> Option<f64> {
        let url = format!("http://{addr}{LINK_PROBE_PATH}");
        let uri: hyper::Uri = url.parse().ok()?;
        let start = Instant::now();
        let fetch = async {
            let resp = self.http.get(uri).await.ok().filter(|r| r.status().is_success())?;
            let body = Limited::new(resp.into_body(), LINK_PROBE_BYTES).collect().await.ok()?;
            (body.to_bytes().len() == LINK_PROBE_BYTES).then_some(())
        };
        match tokio::time::timeout(self.timeout, fetch).await {
            Ok(Some(())) => Some(start.elapsed().as_secs_f64()),
            Ok(None) => {
                tracing::debug!("link probe {url}: no full answer");
                None
            }
            Err(_) => Some(self.timeout.as_secs_f64()),
        }
    }
}

/// Times the links of `attempt`'s running pods ([`link_targets`]).
pub async fn probe_links(status: &StatusClient, obs: &Observed, attempt: u32) -> Vec<LinkProbe> {
    use futures::StreamExt;
    let targets: Vec<(LinkProbe, IpAddr)> = link_targets(obs, attempt)
        .into_iter()
        .map(|(node_rank, pod, ip)| {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            (LinkProbe { node_rank, pod: pod.name_any(), node, seconds: 0.0 }, ip)
        })
        .collect();
    let probes = futures::stream::iter(targets).map(|(probe, ip)| async move {
        let seconds = status.time_link(SocketAddr::new(ip, STATUS_PORT)).await?;
        Some(LinkProbe { seconds, ..probe })
    });
    let mut links: Vec<LinkProbe> =
        probes.buffer_unordered(LINK_PROBES_AT_ONCE).filter_map(|p| async { p }).collect().await;
    links.sort_by_key(|l| l.node_rank);
    links
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
    let workload = match &run.spec.queue_name {
        Some(_) => {
            let current = jobs.iter().find(|j| j.name_any() == job_name(&name, cfg.attempt));
            queued_workload(client, &ns, current).await?
        }
        None => None,
    };
    Ok(Observed { jobs, pods, init_run, trainer: None, links: None, workload })
}

/// The Kueue Workload of the current attempt's Job, by the label Kueue gives it. None
/// before the Job or its Workload exist, and where Kueue's API is not served.
async fn queued_workload(client: &Client, ns: &str, current: Option<&Job>) -> Result<Option<QueuedWorkload>, Error> {
    let Some(uid) = current.and_then(|j| j.metadata.uid.clone()) else { return Ok(None) };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &workload::api_resource());
    let lp = ListParams::default().labels(&format!("{}={uid}", workload::JOB_UID_LABEL));
    match api.list(&lp).await {
        Ok(list) => Ok(list.items.first().map(QueuedWorkload::read)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(Error::kube(Verb::List, "Workload", ns, &uid)(e)),
    }
}

/// What the run's attempts run under: its ConfigMap's config, and its checkpoint
/// claim's access modes.
#[derive(Clone, Debug, Default)]
pub struct Accepted {
    /// `None` before the ConfigMap exists (or when it does not parse, logged).
    pub config: Option<RunConfig>,
    /// `None` before the claim exists.
    pub claim: Option<Vec<String>>,
    /// The applied-hashes of the live ConfigMap and claim, so that step 3 need not
    /// read them again.
    pub configmap_hash: Option<String>,
    pub claim_hash: Option<String>,
}

/// Reads the run's ConfigMap and checkpoint claim.
pub async fn accepted(client: &Client, run: &TrainingRun) -> Result<Accepted, Error> {
    let ns = run.namespace().unwrap_or_default();
    let name = run.name_any();
    let cm_name = configmap_name(&name);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = cms.get_opt(&cm_name).await.map_err(Error::kube(Verb::Get, "ConfigMap", &ns, &cm_name))?;
    let configmap_hash = cm.as_ref().and_then(applied_hash);
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
    let live_claim =
        claims.get_opt(&claim_name).await.map_err(Error::kube(Verb::Get, "PersistentVolumeClaim", &ns, &claim_name))?;
    let claim_hash = live_claim.as_ref().and_then(applied_hash);
    let claim = live_claim.map(|c| c.spec.and_then(|s| s.access_modes).unwrap_or_default());
    Ok(Accepted { config, claim, configmap_hash, claim_hash })
}

/// What a poll of rank 0 came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Poll {
    /// Rank 0 of the attempt is not running: nothing to ask.
    NotAsked,
    /// The document is in `obs.trainer`.
    Answered,
    Failed(PollError),
}

impl Poll {
    pub fn asked(&self) -> bool {
        *self != Poll::NotAsked
    }
}

/// Reads rank 0's `/status` at `url` into `obs.trainer` when rank 0 of `cfg`'s attempt
/// is running. A failed poll leaves `obs.trainer` as it was and is logged; the next
/// one is due after the poll interval.
pub async fn poll_rank0(status: &StatusClient, obs: &mut Observed, cfg: &RunConfig, url: &str, run: &str) -> Poll {
    if !rank0_running(obs, cfg.attempt) {
        return Poll::NotAsked;
    }
    match status.poll(url, cfg).await {
        Ok(t) => {
            obs.trainer = Some(t);
            Poll::Answered
        }
        Err(e) => {
            if matches!(e, PollError::Refused(_)) {
                tracing::warn!(run = %run, "rank 0 status: {e}");
            } else {
                tracing::info!(run = %run, "rank 0 status: {e}");
            }
            Poll::Failed(e)
        }
    }
}

/// A refused answer raises a Warning event at most this often per run, so that a pod
/// answering garbage on every poll cannot flood the run's events; the log has each.
pub const REFUSAL_EVENT_INTERVAL: Duration = Duration::from_secs(600);
/// The reason of that Warning event.
pub const STATUS_REFUSED: &str = "TrainerStatusRefused";

/// Whether a refused answer at `now` raises a Warning event, the last one having been
/// raised at `last`.
pub fn refusal_event_due(last: Option<Timestamp>, now: Timestamp) -> bool {
    last.is_none_or(|t| seconds_between(t, now) >= REFUSAL_EVENT_INTERVAL.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_raise_an_event_at_most_every_ten_minutes() {
        let t = |s: &str| format!("2026-01-01T{s}Z").parse::<Timestamp>().unwrap();
        let cases = [
            (None, "00:00:00", true),
            (Some("00:00:00"), "00:00:20", false),
            (Some("00:00:00"), "00:09:59", false),
            (Some("00:00:00"), "00:10:00", true),
            (Some("00:00:00"), "01:00:00", true),
            // A clock that went back raises nothing until the interval has passed.
            (Some("00:10:00"), "00:05:00", false),
        ];
        for (last, now, due) in cases {
            assert_eq!(refusal_event_due(last.map(t), t(now)), due, "last {last:?}, now {now}");
        }
    }

    #[test]
    fn clipping_keeps_characters_whole() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééé", 3), "é...");
        assert_eq!(clip(&"x".repeat(1000), QUOTED).len(), QUOTED + 3);
    }
}
