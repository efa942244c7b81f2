//! Watch streams: the current state or the change log replayed, then live changes.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::error::FakeError;
use super::json::{ResponseBody, to_partial};
use super::request::Req;
use super::selectors::Filter;
use super::store::{Change, ChangeKind, State};

/// Watch duration when the client sends no `timeoutSeconds`.
const DEFAULT_WATCH_SECONDS: u64 = 1800;
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

impl State {
    pub(super) fn watch(&self, req: &Req) -> Result<Watch, FakeError> {
        let filter = Filter::new(&req.target, req)?;
        let timeout = req.q("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()).unwrap_or(DEFAULT_WATCH_SECONDS);
        let send_initial = req.flag("sendInitialEvents");
        let rx = self.tx.subscribe();
        let mut lines = VecDeque::new();
        let mut expired = false;
        let as_meta = req.wants_metadata();
        // Without a resourceVersion (or with "0") a watch starts with the current state.
        match req.q("resourceVersion").filter(|rv| *rv != "0" && !send_initial) {
            None => {
                for (_, obj) in self.selected(&filter) {
                    lines.push_back(event_line("ADDED", &obj, as_meta));
                }
                if send_initial {
                    let bookmark = json!({
                        "kind": self.kind_for(&filter.res),
                        "apiVersion": filter.res.api_version(),
                        "metadata": {
                            "resourceVersion": self.rv.to_string(),
                            "annotations": {INITIAL_EVENTS_END: "true"},
                        },
                    });
                    lines.push_back(event_line("BOOKMARK", &bookmark, false));
                }
            }
            Some(rv) => {
                let from: u64 =
                    rv.parse().map_err(|_| FakeError::BadRequest(format!("invalid resourceVersion {rv:?}")))?;
                if from < self.log_floor {
                    // In-stream 410, so kube's watcher re-lists instead of retrying the same version.
                    let gone = FakeError::Expired(format!("too old resource version: {from} ({})", self.log_floor));
                    lines.push_back(event_line("ERROR", &gone.to_status(), false));
                    expired = true;
                } else {
                    for change in self.log.iter().filter(|c| c.rv > from) {
                        if let Some((ty, obj)) = event(&filter, change) {
                            lines.push_back(event_line(ty, obj, as_meta));
                        }
                    }
                }
            }
        }
        Ok(Watch {
            lines,
            rx,
            last_rv: self.rv,
            deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(timeout),
            filter,
            as_meta,
            done: expired,
        })
    }
}

pub(super) struct Watch {
    /// Events to send before live ones.
    lines: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Change>>,
    /// Changes up to this resourceVersion were covered by `lines`.
    last_rv: u64,
    deadline: tokio::time::Instant,
    filter: Filter,
    as_meta: bool,
    /// End after `lines` (expired resourceVersion).
    done: bool,
}

impl Watch {
    async fn next_line(&mut self) -> Option<Bytes> {
        if let Some(line) = self.lines.pop_front() {
            return Some(line);
        }
        // The server closes the stream at the deadline, whatever is pending.
        if self.done || tokio::time::Instant::now() >= self.deadline {
            return None;
        }
        loop {
            match tokio::time::timeout_at(self.deadline, self.rx.recv()).await {
                // timeoutSeconds elapsed, the fake was dropped, or this watcher lagged:
                // end the stream and let the client resume or re-list.
                Err(_) | Ok(Err(_)) => return None,
                Ok(Ok(change)) => {
                    if change.rv <= self.last_rv {
                        continue;
                    }
                    self.last_rv = change.rv;
                    if let Some((ty, obj)) = event(&self.filter, &change) {
                        return Some(event_line(ty, obj, self.as_meta));
                    }
                }
            }
        }
    }

    pub(super) fn into_response(self) -> Response<ResponseBody> {
        let stream = futures::stream::unfold(self, |mut watch| async move {
            let line = watch.next_line().await?;
            // `Full::frame` is the way to a data frame without naming `http_body::Frame`.
            let frame = Full::new(line).frame().await?;
            Some((frame, watch))
        });
        let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// The event a watcher with `filter` sees for a change, if any: objects
/// that start matching are ADDED, those that stop matching DELETED.
fn event<'c>(filter: &Filter, change: &'c Change) -> Option<(&'static str, &'c Value)> {
    let now = filter.matches(&change.key, &change.obj);
    let before = change.old.as_ref().is_some_and(|o| filter.matches(&change.key, o));
    match change.kind {
        ChangeKind::Added => now.then_some(("ADDED", &change.obj)),
        ChangeKind::Deleted => (now || before).then_some(("DELETED", &change.obj)),
        ChangeKind::Modified => match (before, now) {
            (true, true) => Some(("MODIFIED", &change.obj)),
            (false, true) => Some(("ADDED", &change.obj)),
            (true, false) => Some(("DELETED", &change.obj)),
            (false, false) => None,
        },
    }
}

fn event_line(ty: &str, obj: &Value, as_meta: bool) -> Bytes {
    let obj = if as_meta { to_partial(obj) } else { obj.clone() };
    let mut line = serde_json::to_vec(&json!({"type": ty, "object": obj})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}
