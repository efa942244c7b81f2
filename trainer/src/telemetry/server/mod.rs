//! Rank 0's HTTP endpoint on the status port: `GET /status` (the operator's
//! [`TrainerStatus`] document), `GET /metrics` (Prometheus text) and `GET /healthz`.
//!
//! The training loop owns a [`SharedStatus`] and updates it after every step; the
//! [`StatusServer`] thread only reads it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use crds::config::RunConfig;
use crds::contract::{FailureReason, LINK_PROBE_BYTES, LINK_PROBE_PATH, TrainerPhase, TrainerStatus};
use crds::types::{CheckpointRef, RunMetrics};
use hyper::Method;
use prometheus::{Encoder, TextEncoder};

use crate::Error;
use crate::train::report::{Event, Sink, StepReport, unix_now};

pub mod http;
mod metrics;
mod state;

use metrics::metrics_registry;
pub use state::{RunInfo, StatusState, phase_name};

/// Cheap clonable handle on the status the training loop updates and the server reads.
#[derive(Clone, Debug)]
pub struct SharedStatus {
    inner: Arc<RwLock<StatusState>>,
}

impl SharedStatus {
    /// A handle serving `status`, with `info` as the labels of `trainer_info`.
    pub fn new(status: TrainerStatus, info: RunInfo) -> SharedStatus {
        let state = StatusState {
            status,
            info,
            last_step_time: None,
            val_loss_by_source: BTreeMap::new(),
            nonfinite_events: 0,
            failures: HashMap::new(),
            gpu_memory: None,
        };
        SharedStatus { inner: Arc::new(RwLock::new(state)) }
    }

    /// The initial status of a resolved run: phase `starting`, its attempt, step 0
    /// and the run's total steps and tokens.
    pub fn from_config(config: &RunConfig) -> SharedStatus {
        let status = TrainerStatus {
            phase: TrainerPhase::Starting,
            attempt: config.attempt,
            step: 0,
            total_steps: config.schedule.total_steps,
            tokens: 0,
            total_tokens: config.schedule.total_tokens,
            metrics: RunMetrics::default(),
            last_checkpoint: None,
            best_checkpoint: None,
            tokens_by_source: Default::default(),
            ranks: Vec::new(),
        };
        SharedStatus::new(status, RunInfo::from_config(config))
    }

    // A panic while holding the lock leaves the state consistent enough to serve.
    fn read(&self) -> RwLockReadGuard<'_, StatusState> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, StatusState> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the `/status` document.
    pub fn snapshot(&self) -> TrainerStatus {
        self.read().status.clone()
    }

    /// A copy of everything the endpoint serves.
    pub fn state(&self) -> StatusState {
        self.read().clone()
    }

    /// Changes the `/status` document in place.
    pub fn update<R>(&self, f: impl FnOnce(&mut TrainerStatus) -> R) -> R {
        f(&mut self.write().status)
    }

    /// Records a completed step: step, tokens, loss, lr, gradient norm, throughput and
    /// MFU, and the time of the step. A NaN/Inf loss or gradient norm counts as a
    /// non-finite event (do not also call [`Self::record_nonfinite`] for it) and is
    /// left out of the document, which is JSON and cannot hold it. The phase is
    /// unchanged: the loop sets it with [`Self::set_phase`].
    pub fn record_step(&self, report: &StepReport) {
        let now = unix_now();
        let mut state = self.write();
        let finite = |v: f64| v.is_finite().then_some(v);
        let status = &mut state.status;
        status.step = report.step;
        status.tokens = report.tokens;
        status.metrics.loss = finite(report.loss);
        status.metrics.grad_norm = finite(report.grad_norm);
        status.metrics.lr = finite(report.lr);
        status.metrics.tokens_per_second = finite(report.tokens_per_second).map(|t| t.max(0.0).round() as u64);
        status.metrics.mfu = report.mfu.and_then(finite);
        if let Some(g) = &report.grpo {
            let m = &mut status.metrics;
            m.reward = finite(g.reward);
            m.accuracy = finite(g.accuracy);
            m.unparsed_fraction = finite(g.unparsed_fraction);
            m.kl = finite(g.kl);
            m.clip_fraction = finite(g.clip_fraction);
            m.completion_length = finite(g.completion_length);
            m.frac_reward_zero_std = finite(g.frac_reward_zero_std);
            m.entropy = finite(g.entropy).filter(|h| *h > 0.0).or(m.entropy);
            m.no_signal_steps = Some(g.no_signal_steps);
            let rate = |v: f64| finite(v).filter(|v| *v > 0.0).map(|v| v.round() as u64);
            // A step that reuses its batch samples nothing: keep the last sampling rate.
            m.sampling_tokens_per_second = rate(g.sampling_tokens_per_second).or(m.sampling_tokens_per_second);
            m.training_tokens_per_second = rate(g.training_tokens_per_second);
        }
        if let Some(g) = report.gpu_memory {
            let gib = |v: f64| (v * 100.0).round() / 100.0;
            state.status.metrics.gpu_memory_peak_gib = Some(gib(g.peak_gib()));
            state.status.metrics.gpu_memory_total_gib = Some(gib(g.total_gib()));
            state.gpu_memory = Some(g);
        }
        if !report.tokens_by_source.is_empty() {
            state.status.tokens_by_source = report.tokens_by_source.iter().cloned().collect();
        }
        state.last_step_time = Some(now);
        if report.is_nonfinite() {
            state.nonfinite_events += 1;
        }
    }

    /// Records a held-out multiple-choice evaluation; `initial` before any GRPO step.
    pub fn record_accuracy(&self, set: &str, score: &crate::eval::McqScore, initial: bool) {
        let mut state = self.write();
        let m = &mut state.status.metrics;
        let a = &score.all;
        if set == crate::train::HELD_OUT {
            if initial {
                m.initial_eval_accuracy = Some(a.greedy);
            }
            m.eval_accuracy = Some(a.greedy);
            m.eval_accuracy_log_likelihood = Some(a.acc);
            return;
        }
        let entry = match m.eval_datasets.iter_mut().position(|d| d.dataset == set) {
            Some(i) => &mut m.eval_datasets[i],
            None => {
                m.eval_datasets.push(crds::types::EvalDatasetAccuracy { dataset: set.into(), ..Default::default() });
                m.eval_datasets.last_mut().expect("just pushed")
            }
        };
        entry.questions = a.questions;
        if initial {
            entry.initial_accuracy = Some(a.greedy);
        }
        entry.accuracy = Some(a.greedy);
        entry.accuracy_log_likelihood = Some(a.acc);
    }

    /// Records an evaluation: the mean validation loss and the loss of each source.
    pub fn record_eval(&self, val_loss: f64, per_source: Vec<(String, f64)>) {
        let mut state = self.write();
        state.status.metrics.val_loss = val_loss.is_finite().then_some(val_loss);
        state.val_loss_by_source = per_source.into_iter().collect();
    }

    /// Records a complete checkpoint.
    pub fn record_checkpoint(&self, checkpoint: CheckpointRef) {
        self.write().status.last_checkpoint = Some(checkpoint);
    }

    /// Sets the phase.
    pub fn set_phase(&self, phase: TrainerPhase) {
        self.write().status.phase = phase;
    }

    /// Records a failure: counts it under its reason and sets the phase to `failed`,
    /// which turns `/healthz` to 503.
    pub fn record_failure(&self, reason: FailureReason) {
        let mut state = self.write();
        *state.failures.entry(reason).or_default() += 1;
        state.status.phase = TrainerPhase::Failed;
    }

    /// Counts a NaN/Inf loss or gradient norm that was not reported through
    /// [`Self::record_step`], e.g. a step skipped because of it.
    pub fn record_nonfinite(&self) {
        self.write().nonfinite_events += 1;
    }

    /// The `/status` body.
    pub fn status_json(&self) -> String {
        serde_json::to_string(&self.read().status).expect("TrainerStatus serializes")
    }

    /// The `/metrics` body, in the Prometheus text exposition format.
    pub fn metrics_text(&self) -> String {
        let state = self.state();
        let registry = metrics_registry(&state);
        let mut buf = Vec::new();
        TextEncoder::new().encode(&registry.gather(), &mut buf).expect("metrics encode");
        String::from_utf8(buf).expect("metrics text is UTF-8")
    }
}

impl Sink for SharedStatus {
    fn record(&mut self, event: &Event) -> Result<(), Error> {
        match *event {
            Event::Started(start) => self.update(|s| {
                s.step = start.step;
                s.tokens = start.tokens;
            }),
            Event::Phase(phase) => self.set_phase(phase),
            Event::Step(report) => self.record_step(report),
            Event::Eval { val_loss, per_source, .. } => self.record_eval(val_loss, per_source.to_vec()),
            Event::Accuracy { set, score, initial, .. } => self.record_accuracy(set, score, initial),
            Event::Checkpoint(checkpoint) => self.record_checkpoint(checkpoint.clone()),
            Event::Best(best) => self.update(|s| s.best_checkpoint = Some(best.clone())),
            Event::Sample { .. } => {}
            Event::Ranks(ranks) => self.update(|s| s.ranks = ranks.to_vec()),
            Event::NonFinite { .. } => self.record_nonfinite(),
            Event::Failure(reason) => self.record_failure(reason),
        }
        Ok(())
    }
}

/// The HTTP server on rank 0's status port ([`http::HttpServer`] with its default
/// [`http::Limits`]). Serves until dropped; dropping it stops and joins its thread.
pub struct StatusServer {
    server: http::HttpServer,
}

impl StatusServer {
    /// Binds `addr` (port 0 picks a free port) and serves `state` on its own thread.
    pub fn start(addr: SocketAddr, state: SharedStatus) -> Result<StatusServer, Error> {
        let handler = move |method: &Method, path: &str| route(method, path, &state);
        let server = http::HttpServer::start(addr, http::Limits::default(), Arc::new(handler))
            .map_err(|e| Error::StatusServer { addr, message: e.to_string() })?;
        tracing::info!("status endpoint on http://{}/status", server.addr());
        Ok(StatusServer { server })
    }

    /// The address the server is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }
}

impl std::fmt::Debug for StatusServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusServer").field("addr", &self.addr()).finish()
    }
}

/// The body of `GET /link-probe`: the operator times it on every pod at every poll,
/// so it is served from the binary, never built per request.
static LINK_PROBE: [u8; LINK_PROBE_BYTES] = [b'0'; LINK_PROBE_BYTES];

/// The reply to a request for `path`.
fn route(method: &Method, path: &str, state: &SharedStatus) -> http::Reply {
    const TEXT: &str = "text/plain; charset=utf-8";
    let reply = |code, content_type, body: Bytes| http::Reply { code, content_type, body };
    let known = matches!(path, "/status" | "/metrics" | "/healthz" | LINK_PROBE_PATH);
    if !known {
        return reply(404, TEXT, format!("not found: {path}\n").into());
    }
    if *method != Method::GET {
        return reply(405, TEXT, format!("method {method} not allowed; use GET\n").into());
    }
    match path {
        "/status" => reply(200, "application/json", state.status_json().into()),
        "/metrics" => reply(200, prometheus::TEXT_FORMAT, state.metrics_text().into()),
        LINK_PROBE_PATH => reply(200, "application/octet-stream", Bytes::from_static(&LINK_PROBE)),
        _ if state.read().healthy() => reply(200, TEXT, Bytes::from_static(b"ok\n")),
        _ => reply(503, TEXT, Bytes::from_static(b"failed\n")),
    }
}

#[cfg(test)]
mod tests {
    use crate::train::report::GpuMemory;
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpStream};

    use super::*;

    fn shared() -> SharedStatus {
        let status = TrainerStatus {
            phase: TrainerPhase::Starting,
            attempt: 2,
            step: 0,
            total_steps: 100,
            tokens: 0,
            total_tokens: 819_200,
            metrics: RunMetrics::default(),
            last_checkpoint: None,
            best_checkpoint: None,
            tokens_by_source: Default::default(),
            ranks: Vec::new(),
        };
        let info =
            RunInfo { preset: "nano".into(), precision: "bf16-mixed".into(), device: "cpu".into(), world_size: 2 };
        SharedStatus::new(status, info)
    }

    fn start(state: &SharedStatus) -> StatusServer {
        StatusServer::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), state.clone()).unwrap()
    }

    /// Sends one HTTP/1.0 request and returns (status code, headers, body).
    fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
        let mut stream = TcpStream::connect(addr).unwrap();
        write!(stream, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").expect("header/body separator");
        let code = head.split(' ').nth(1).unwrap().parse().unwrap();
        (code, head.to_string(), body.to_string())
    }

    fn report(step: u64) -> StepReport {
        StepReport {
            step,
            tokens: step * 8192,
            loss: 3.25,
            lr: 3e-4,
            grad_norm: 0.75,
            tokens_per_second: 4096.4,
            mfu: Some(0.125),
            grpo: None,
            gpu_memory: None,
            tokens_by_source: Vec::new(),
        }
    }

    /// The sample of `name` (with its labels, as written) in a text exposition.
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn status_json_round_trips_into_the_contract_type() {
        let state = shared();
        let server = start(&state);
        state.set_phase(TrainerPhase::Training);
        state.record_step(&report(10));
        state.record_eval(3.5, vec![("web".into(), 3.25), ("code".into(), 3.75)]);
        let ckpt =
            CheckpointRef { step: 10, tokens: 81920, uri: "/checkpoints/step-10".into(), time: None, val_loss: None };
        state.record_checkpoint(ckpt.clone());

        let (code, head, body) = http(server.addr(), "GET", "/status");
        assert_eq!(code, 200, "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
        let got: TrainerStatus = serde_json::from_str(&body).unwrap();
        assert_eq!(got, state.snapshot());
        assert_eq!(got.phase, TrainerPhase::Training);
        assert_eq!((got.step, got.tokens, got.attempt), (10, 81920, 2));
        assert_eq!(got.metrics.loss, Some(3.25));
        assert_eq!(got.metrics.val_loss, Some(3.5));
        assert_eq!(got.metrics.tokens_per_second, Some(4096));
        assert_eq!(got.metrics.mfu, Some(0.125));
        assert_eq!(got.last_checkpoint, Some(ckpt));
    }

    /// A CUDA step's GPU memory shows in the status document (GiB, which the operator
    /// copies into the run's status) and in `/metrics` (bytes); a CPU step's does not.
    #[test]
    fn gpu_memory_shows_where_a_step_reports_it() {
        let state = shared();
        state.record_step(&report(1));
        assert_eq!(sample(&state.metrics_text(), "trainer_gpu_memory_peak_bytes"), None);
        assert_eq!(state.snapshot().metrics.gpu_memory_peak_gib, None);
        let g = GpuMemory { peak_bytes: 45 << 29, total_bytes: 85_520_809_984 };
        state.record_step(&StepReport { gpu_memory: Some(g), ..report(2) });
        let text = state.metrics_text();
        assert_eq!(sample(&text, "trainer_gpu_memory_peak_bytes"), Some((45u64 << 29) as f64));
        assert_eq!(sample(&text, "trainer_gpu_memory_total_bytes"), Some(85_520_809_984.0));
        let status: serde_json::Value = serde_json::from_str(&state.status_json()).unwrap();
        assert_eq!(
            (status["gpuMemoryPeakGiB"].as_f64(), status["gpuMemoryTotalGiB"].as_f64()),
            (Some(22.5), Some(79.65)),
            "{status}"
        );
        state.record_step(&report(3));
        assert_eq!(state.snapshot().metrics.gpu_memory_peak_gib, Some(22.5), "kept until the next reading");
    }

    #[test]
    fn metrics_expose_every_series() {
        let state = shared();
        let server = start(&state);
        state.set_phase(TrainerPhase::Evaluating);
        state.record_step(&report(10));
        state.record_eval(3.5, vec![("web".into(), 3.25)]);
        let by_source = vec![("web".to_string(), 61_440), ("code".to_string(), 20_480)];
        state.record_step(&StepReport { tokens_by_source: by_source, ..report(10) });
        state.record_checkpoint(CheckpointRef { step: 8, tokens: 65536, uri: "u".into(), time: None, val_loss: None });
        state.record_step(&StepReport { loss: f64::NAN, ..report(11) });
        state.record_nonfinite();

        let (code, head, text) = http(server.addr(), "GET", "/metrics");
        assert_eq!(code, 200);
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        assert_eq!(sample(&text, "trainer_step"), Some(11.0));
        assert_eq!(sample(&text, "trainer_total_steps"), Some(100.0));
        assert_eq!(sample(&text, "trainer_tokens_total"), Some(11.0 * 8192.0));
        assert_eq!(sample(&text, "trainer_loss"), None, "a NaN loss is not exported");
        assert_eq!(sample(&text, "trainer_val_loss"), Some(3.5));
        assert_eq!(sample(&text, r#"trainer_val_loss_by_source{source="web"}"#), Some(3.25));
        assert_eq!(sample(&text, r#"trainer_source_tokens{source="code"}"#), Some(20480.0));
        let status: serde_json::Value = serde_json::from_str(&state.status_json()).unwrap();
        assert_eq!(status["tokensBySource"]["web"], 61_440, "{status}");
        assert_eq!(sample(&text, "trainer_learning_rate"), Some(3e-4));
        assert_eq!(sample(&text, "trainer_grad_norm"), Some(0.75));
        assert_eq!(sample(&text, "trainer_tokens_per_second"), Some(4096.0));
        assert_eq!(sample(&text, "trainer_mfu"), Some(0.125));
        assert_eq!(sample(&text, "trainer_last_checkpoint_step"), Some(8.0));
        assert_eq!(sample(&text, "trainer_nonfinite_total"), Some(2.0));
        assert_eq!(sample(&text, "trainer_attempt"), Some(2.0));
        assert_eq!(sample(&text, r#"trainer_phase{phase="evaluating"}"#), Some(1.0));
        assert_eq!(sample(&text, r#"trainer_phase{phase="training"}"#), Some(0.0));
        assert_eq!(sample(&text, r#"trainer_failures_total{reason="NaNLoss"}"#), Some(0.0));
        assert_eq!(
            sample(&text, r#"trainer_info{device="cpu",precision="bf16-mixed",preset="nano",world_size="2"}"#),
            Some(1.0)
        );
        let stamp = sample(&text, "trainer_last_step_timestamp_seconds").unwrap();
        assert!((stamp - unix_now()).abs() < 600.0, "{stamp}");
        assert!(text.contains("# TYPE trainer_tokens_total counter"), "{text}");
        assert!(text.contains("# HELP trainer_last_step_timestamp_seconds Unix time"), "{text}");
        // Every sample line is `name{labels} value`, with a HELP and TYPE for its family.
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap_or_else(|_| panic!("bad value in {line}"));
            let family = series.split('{').next().unwrap();
            assert!(text.contains(&format!("# HELP {family} ")), "no HELP for {family}");
            assert!(text.contains(&format!("# TYPE {family} ")), "no TYPE for {family}");
        }
        // Every trainer series the chart's Grafana dashboard plots is one this exposes.
        let dashboard = include_str!("../../../../charts/trainingrun-operator/files/dashboard.json");
        let mut plotted = 0;
        for (at, _) in dashboard.match_indices("trainer_") {
            let name: String = dashboard[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            assert!(text.contains(&format!("# TYPE {name} ")), "the dashboard plots {name}, which /metrics lacks");
            plotted += 1;
        }
        assert!(plotted >= 4, "the dashboard plots the trainers' own series");
    }

    #[test]
    fn every_ranks_step_times_are_in_status_and_metrics() {
        let state = shared();
        let ranks = [
            crds::contract::RankTiming { rank: 0, compute_seconds: 0.25, data_wait_seconds: 0.01 },
            crds::contract::RankTiming { rank: 1, compute_seconds: 0.5, data_wait_seconds: 0.02 },
        ];
        let mut sink = state.clone();
        sink.record(&Event::Ranks(&ranks)).unwrap();
        assert_eq!(state.snapshot().ranks, ranks);
        let text = state.metrics_text();
        assert_eq!(sample(&text, r#"trainer_rank_compute_seconds{rank="1"}"#), Some(0.5), "{text}");
        assert_eq!(sample(&text, r#"trainer_rank_data_wait_seconds{rank="0"}"#), Some(0.01));
        let json: serde_json::Value = serde_json::from_str(&state.status_json()).unwrap();
        assert_eq!(json["ranks"][1]["computeSeconds"], 0.5);
    }

    #[test]
    fn metrics_before_the_first_step_leave_unknown_gauges_out() {
        let text = shared().metrics_text();
        assert_eq!(sample(&text, "trainer_step"), Some(0.0));
        assert_eq!(sample(&text, r#"trainer_phase{phase="starting"}"#), Some(1.0));
        for absent in ["trainer_loss", "trainer_last_step_timestamp_seconds", "trainer_last_checkpoint_step"] {
            assert!(!text.contains(&format!("\n{absent} ")), "{absent} present:\n{text}");
        }
        assert!(!text.contains("trainer_val_loss_by_source"));
    }

    #[test]
    fn healthz_turns_503_after_a_failure() {
        let state = shared();
        let server = start(&state);
        let (code, _, body) = http(server.addr(), "GET", "/healthz");
        assert_eq!((code, body.as_str()), (200, "ok\n"));
        state.record_failure(FailureReason::OutOfMemory);
        let (code, _, _) = http(server.addr(), "GET", "/healthz");
        assert_eq!(code, 503);
        assert_eq!(state.snapshot().phase, TrainerPhase::Failed);
        let text = state.metrics_text();
        assert_eq!(sample(&text, r#"trainer_failures_total{reason="OutOfMemory"}"#), Some(1.0));
        assert_eq!(sample(&text, r#"trainer_phase{phase="failed"}"#), Some(1.0));
    }

    #[test]
    fn unknown_paths_are_404_and_other_methods_405() {
        let state = shared();
        let server = start(&state);
        assert_eq!(http(server.addr(), "GET", "/nope").0, 404);
        assert_eq!(http(server.addr(), "GET", "/status?pretty=1").0, 200);
        let (code, head, _) = http(server.addr(), "POST", "/status");
        assert_eq!(code, 405);
        assert!(head.to_ascii_lowercase().contains("allow: get"), "{head}");
        assert_eq!(http(server.addr(), "DELETE", "/healthz").0, 405);
    }

    #[test]
    fn the_link_probe_is_its_fixed_size_on_every_pod() {
        let state = shared();
        let server = start(&state);
        let (code, head, body) = http(server.addr(), "GET", LINK_PROBE_PATH);
        assert_eq!(code, 200);
        assert!(head.to_ascii_lowercase().contains(&format!("content-length: {LINK_PROBE_BYTES}")), "{head}");
        assert_eq!(body.len(), LINK_PROBE_BYTES);
        assert_eq!(http(server.addr(), "POST", LINK_PROBE_PATH).0, 405);
    }

    #[test]
    fn drop_joins_the_server_thread() {
        let state = shared();
        let server = start(&state);
        assert_ne!(server.addr().port(), 0);
        assert_eq!(http(server.addr(), "GET", "/healthz").0, 200);
        assert_eq!(Arc::strong_count(&state.inner), 2);
        drop(server);
        // The serving thread held the other handle; it is gone once the thread has ended.
        assert_eq!(Arc::strong_count(&state.inner), 1);
    }

    #[test]
    fn binding_a_taken_port_names_the_address() {
        let state = shared();
        let server = start(&state);
        let err = StatusServer::start(server.addr(), state).unwrap_err();
        assert!(err.to_string().contains(&server.addr().to_string()), "{err}");
    }

    #[test]
    fn run_info_comes_from_the_run_config() {
        let config = crds::resolve(
            &crds::manifest::from_yaml(include_str!("../../../../examples/tiny-local.yaml"), "tiny-local.yaml")
                .unwrap(),
        )
        .unwrap();
        let info = RunInfo::from_config(&config);
        assert_eq!(info.preset, config.model.preset);
        assert_eq!(info.device, "cpu");
        assert!(["bf16-mixed", "bf16", "f32"].contains(&info.precision.as_str()), "{info:?}");
        let state = SharedStatus::from_config(&config);
        let s = state.snapshot();
        assert_eq!(
            (s.phase, s.total_steps, s.total_tokens),
            (TrainerPhase::Starting, config.schedule.total_steps, config.schedule.total_tokens)
        );
    }
}
