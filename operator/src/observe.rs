//! What the pods say: rank 0's `/status`, read and judged plausible, and the links of
//! a run's pods, timed from the operator's seat.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crds::RunConfig;
use crds::contract::{LINK_PROBE_BYTES, LINK_PROBE_PATH, STATUS_PORT, TrainerStatus, clip};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::header::CONTENT_LENGTH;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::ResourceExt;

use crate::decide::plausible::plausible;

pub use crate::observed::{Attempts, LinkProbe, Poll, PollError, link_targets, rank0_running};

/// The most of an answer to `GET /status` the operator reads. A trainer's document is
/// a few KiB plus about 90 bytes per rank, so this serves ten thousand ranks and stops
/// a pod that answers without end.
pub const STATUS_BODY_LIMIT: usize = 1024 * 1024;
/// The longest piece of a parse error kept in a message: serde quotes what it did not
/// expect, and that text is the pod's.
const QUOTED: usize = 200;

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
pub async fn probe_links(status: &StatusClient, obs: &Attempts, attempt: u32) -> Vec<LinkProbe> {
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

/// Reads rank 0's `/status` at `url` into `obs.trainer` when rank 0 of `cfg`'s attempt
/// is running. A failed poll leaves `obs.trainer` as it was and is logged; the next
/// one is due after the poll interval.
pub async fn poll_rank0(status: &StatusClient, obs: &mut Attempts, cfg: &RunConfig, url: &str, run: &str) -> Poll {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_keeps_characters_whole() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééé", 3), "é...");
        assert_eq!(clip(&"x".repeat(1000), QUOTED).len(), QUOTED + 3);
    }
}
