//! Rank 0's `/status` for runs whose pods are kwok's and serve nothing: one server on
//! loopback, at the path the operator's `STATUS_URL` template gives
//! ([`Stub::status_url`]), answering for each run's current attempt as its trainer
//! would: steps at a steady rate from the first question, within the run's own totals,
//! until [`Stub::freeze`] stops every clock (a settled cluster).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::RunConfig;
use crds::contract::{TrainerPhase, TrainerStatus};
use crds::types::RunMetrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Steps a stub trainer makes a second.
const STEPS_PER_SECOND: f64 = 0.5;

#[derive(Default)]
struct State {
    /// Each run's resolved config, by `namespace/name`.
    runs: HashMap<String, RunConfig>,
    /// When each `namespace/job` was first asked about.
    started: HashMap<String, Instant>,
    frozen: Option<Instant>,
    answered: u64,
}

#[derive(Clone)]
pub struct Stub {
    pub port: u16,
    state: Arc<Mutex<State>>,
}

impl Stub {
    /// Serves on a free loopback port until the runtime stops.
    pub async fn start() -> std::io::Result<Stub> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let stub = Stub { port, state: Arc::default() };
        let serving = stub.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let stub = serving.clone();
                tokio::spawn(async move { stub.answer(conn).await });
            }
        });
        Ok(stub)
    }

    /// The operator's `STATUS_URL` for this stub.
    pub fn status_url(&self) -> String {
        format!("http://127.0.0.1:{}/{{namespace}}/{{job}}/status", self.port)
    }

    /// Runs it answers for (its resolved config: attempt 1's; an attempt's differ only
    /// in the attempt).
    pub fn add(&self, namespace: &str, name: &str, cfg: RunConfig) {
        self.state.lock().expect("the stub's lock").runs.insert(format!("{namespace}/{name}"), cfg);
    }

    /// Stops every run's steps where they are.
    pub fn freeze(&self) {
        self.state.lock().expect("the stub's lock").frozen.get_or_insert_with(Instant::now);
    }

    /// How many questions it has answered.
    pub fn answered(&self) -> u64 {
        self.state.lock().expect("the stub's lock").answered
    }

    async fn answer(&self, mut conn: tokio::net::TcpStream) {
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let head = String::from_utf8_lossy(&buf);
        let path = head.split_whitespace().nth(1).unwrap_or_default();
        let reply = match self.report(path) {
            Some(doc) => {
                let body = serde_json::to_string(&doc).expect("a status document");
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            }
            None => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
        };
        let _ = conn.write_all(reply.as_bytes()).await;
    }

    /// The document for `/{namespace}/{job}/status`, `{job}` being `<run>-a<attempt>`.
    fn report(&self, path: &str) -> Option<TrainerStatus> {
        let mut parts = path.trim_start_matches('/').split('/');
        let (namespace, job) = (parts.next()?, parts.next()?);
        let (run, attempt) = job.rsplit_once("-a")?;
        let attempt: u32 = attempt.parse().ok()?;
        let mut state = self.state.lock().expect("the stub's lock");
        let cfg = state.runs.get(&format!("{namespace}/{run}"))?.clone();
        let frozen = state.frozen;
        let started = *state.started.entry(format!("{namespace}/{job}")).or_insert_with(Instant::now);
        state.answered += 1;
        let until = frozen.unwrap_or_else(Instant::now).max(started);
        Some(trainer_status(&cfg, attempt, until - started))
    }
}

/// What a trainer of `cfg` reports `ran` into `attempt`.
fn trainer_status(cfg: &RunConfig, attempt: u32, ran: Duration) -> TrainerStatus {
    let s = &cfg.schedule;
    let step = ((ran.as_secs_f64() * STEPS_PER_SECOND) as u64).min(s.total_steps);
    let per_step = cfg.batch.tokens_per_step;
    TrainerStatus {
        phase: TrainerPhase::Training,
        attempt,
        step,
        total_steps: s.total_steps,
        tokens: (step * per_step).min(s.total_tokens),
        total_tokens: s.total_tokens,
        metrics: RunMetrics {
            loss: Some(9.0 / (1.0 + step as f64 / 100.0)),
            tokens_per_second: Some((per_step as f64 * STEPS_PER_SECOND) as u64),
            ..Default::default()
        },
        last_checkpoint: None,
        best_checkpoint: None,
        tokens_by_source: Default::default(),
        ranks: Vec::new(),
    }
}
