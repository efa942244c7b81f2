//! The operator's poll of rank 0's `/status` against endpoints that answer slowly,
//! without end, too much, garbage or lies: each is cut short or refused with a message
//! naming the URL and what was wrong, and nothing reaches `obs.trainer`. The link
//! probe is timed to its last byte, and only a whole probe is a reading.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crds::RunConfig;
use crds::contract::{LINK_PROBE_BYTES, TrainerPhase, TrainerStatus};
use crds::types::{CheckpointRef, RunMetrics};
use k8s_openapi::api::core::v1::Pod;
use operator::observe::{Attempts, Poll, PollError, STATUS_BODY_LIMIT, StatusClient, poll_rank0};
use operator::resources::ATTEMPT_LABEL;
use serde_json::json;
use tokio::net::{TcpSocket, TcpStream};

const TIMEOUT: Duration = Duration::from_secs(2);
/// What an endless body sends at most, so that a client that never stops reading
/// fails the test instead of filling the machine.
const ENDLESS_CAP: u64 = 512 << 20;

fn cfg() -> RunConfig {
    let text = r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {name: llm, namespace: ml, uid: u1}
spec:
  model: {preset: tiny}
  tokens: 64M
  data: {mix: [{name: web, weight: 1, uri: embedded:textbook}]}
  topology: {nodes: 2, gpusPerNode: 4}
  batch: {globalTokens: 262144, microBatch: 8, seqLength: 1024}
"#;
    let run = crds::manifest::from_yaml(text, "test").unwrap();
    let mut cfg = crds::resolve(&run).unwrap();
    cfg.attempt = 1;
    cfg
}

/// A report rank 0 of [`cfg`] could give.
fn report(cfg: &RunConfig) -> TrainerStatus {
    TrainerStatus {
        phase: TrainerPhase::Training,
        attempt: cfg.attempt,
        step: 20,
        total_steps: cfg.schedule.total_steps,
        tokens: 20 * cfg.batch.tokens_per_step,
        total_tokens: cfg.schedule.total_tokens,
        metrics: RunMetrics { loss: Some(3.2), tokens_per_second: Some(40_000), ..Default::default() },
        last_checkpoint: Some(CheckpointRef {
            step: 20,
            tokens: 20 * cfg.batch.tokens_per_step,
            uri: "/checkpoints/step-00000020".into(),
            time: Some("2026-01-01T00:30:00Z".into()),
            val_loss: None,
        }),
        best_checkpoint: None,
        tokens_by_source: Default::default(),
        ranks: Vec::new(),
    }
}

/// Rank 0 of attempt 1, running.
fn observed() -> Attempts {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "llm-a1-0-abcde", "labels": {
            ATTEMPT_LABEL: "1", "batch.kubernetes.io/job-completion-index": "0"
        }},
        "status": {"phase": "Running"},
    }))
    .unwrap();
    Attempts { pods: vec![pod], ..Default::default() }
}

async fn write_all(s: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        s.writable().await?;
        match s.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn read_request(s: &TcpStream) -> io::Result<()> {
    let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        s.readable().await?;
        match s.try_read(&mut buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Serves every connection with `answer` after reading its request; returns the URL.
async fn serve<F, Fut>(answer: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let socket = TcpSocket::new_v4().unwrap();
    // A small send buffer keeps what the kernel takes off the server's hands close to
    // what the client read.
    socket.set_send_buffer_size(64 << 10).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(16).unwrap();
    let url = format!("http://{}/status", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(answer(conn));
        }
    });
    url
}

/// A 200 with `body`, its length announced.
async fn answering(body: String) -> String {
    serve(move |conn| {
        let body = body.clone();
        async move {
            if read_request(&conn).await.is_ok() {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                let _ = write_all(&conn, format!("{head}{body}").as_bytes()).await;
                // Held open: the client, not the server, ends the exchange.
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        }
    })
    .await
}

/// Each connection: `head`, then 64 KiB blocks of JSON whitespace until the client
/// hangs up or [`ENDLESS_CAP`]. Each connection's bytes of body written, and whether the
/// client hung up, go to `written`.
async fn endless(head: &'static str, written: tokio::sync::mpsc::UnboundedSender<(u64, bool)>) -> String {
    serve(move |conn| {
        let written = written.clone();
        async move {
            if read_request(&conn).await.is_err() || write_all(&conn, head.as_bytes()).await.is_err() {
                return;
            }
            let block = vec![b' '; 64 << 10];
            let mut sent = 0;
            while sent < ENDLESS_CAP {
                if write_all(&conn, &block).await.is_err() {
                    let _ = written.send((sent, true));
                    return;
                }
                sent += block.len() as u64;
            }
            let _ = written.send((sent, false));
        }
    })
    .await
}

fn refused(e: PollError) -> String {
    match e {
        PollError::Refused(m) => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn unanswered(e: PollError) -> String {
    match e {
        PollError::Unanswered(m) => m,
        other => panic!("expected no answer, got {other:?}"),
    }
}

/// Resident set size of this process, bytes (`VmRSS`, whatever the page size).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test]
async fn a_well_formed_report_is_read_into_the_observation() {
    let cfg = cfg();
    let url = answering(serde_json::to_string(&report(&cfg)).unwrap()).await;
    let client = StatusClient::new(TIMEOUT);
    let mut obs = observed();
    assert_eq!(poll_rank0(&client, &mut obs, &cfg, &url, "llm").await, Poll::Answered);
    assert_eq!(obs.trainer, Some(report(&cfg)));
    // Rank 0 of another attempt is not asked.
    let next = RunConfig { attempt: 2, ..cfg };
    let mut obs = observed();
    assert_eq!(poll_rank0(&client, &mut obs, &next, &url, "llm").await, Poll::NotAsked);
}

#[tokio::test]
async fn a_body_that_trickles_forever_times_out_and_the_poll_returns() {
    let url = serve(|conn| async move {
        if read_request(&conn).await.is_err() {
            return;
        }
        let _ = write_all(&conn, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{").await;
        while write_all(&conn, b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let client = StatusClient::new(TIMEOUT);
    let mut obs = observed();
    let started = Instant::now();
    let poll = tokio::time::timeout(4 * TIMEOUT, poll_rank0(&client, &mut obs, &cfg(), &url, "llm"))
        .await
        .expect("the poll hangs past its timeout");
    let took = started.elapsed();
    assert!(took >= TIMEOUT && took < TIMEOUT + Duration::from_secs(2), "{took:?}");
    let Poll::Failed(e) = poll else { panic!("{poll:?}") };
    let message = unanswered(e);
    assert_eq!(message, format!("GET {url}: no answer within {TIMEOUT:?}"));
    assert_eq!(obs.trainer, None);
}

#[tokio::test]
async fn an_endless_body_is_cut_at_the_limit() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Read to the end of the connection, no length announced.
    let url = endless("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n", tx).await;
    let client = StatusClient::new(TIMEOUT);
    let message = refused(client.get(&url).await.unwrap_err());
    assert_eq!(message, format!("GET {url}: refused: the body is over the {STATUS_BODY_LIMIT}-byte limit"));
    let (sent, hung_up) =
        tokio::time::timeout(TIMEOUT, rx.recv()).await.expect("the client holds the connection").unwrap();
    assert!(hung_up, "the client read all {sent} bytes");
    // What the client read, plus what the kernel buffers on both sides held.
    assert!(sent < 4 * STATUS_BODY_LIMIT as u64, "{sent} bytes sent before the client hung up");
    eprintln!("endless body: {sent} bytes sent before the client hung up");
}

#[tokio::test]
async fn a_chunked_endless_body_is_cut_at_the_limit() {
    // One chunk announced at 256 GiB, then whitespace without end.
    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n4000000000\r\n";
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let url = endless(head, tx).await;
    let message = refused(StatusClient::new(TIMEOUT).get(&url).await.unwrap_err());
    assert_eq!(message, format!("GET {url}: refused: the body is over the {STATUS_BODY_LIMIT}-byte limit"));
    let (sent, hung_up) =
        tokio::time::timeout(TIMEOUT, rx.recv()).await.expect("the client holds the connection").unwrap();
    assert!(hung_up && sent < 4 * STATUS_BODY_LIMIT as u64, "{sent} bytes sent, hung up: {hung_up}");
}

#[tokio::test]
async fn polling_endless_bodies_keeps_memory_bounded() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let url = endless("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n", tx).await;
    let client = StatusClient::new(TIMEOUT);
    let cfg = cfg();
    // The first poll pays for the client's and the runtime's own allocations.
    refused(client.poll(&url, &cfg).await.unwrap_err());
    let before = rss();
    for _ in 0..50 {
        refused(client.poll(&url, &cfg).await.unwrap_err());
    }
    let grown = rss().saturating_sub(before);
    let mut sent = 0;
    for _ in 0..51 {
        let (bytes, hung_up) = tokio::time::timeout(TIMEOUT, rx.recv()).await.expect("a connection held").unwrap();
        assert!(hung_up);
        sent += bytes;
    }
    eprintln!("50 polls of an endless body: {sent} bytes sent, resident memory grew by {grown} bytes");
    assert!(sent >= 50 * STATUS_BODY_LIMIT as u64, "{sent}");
    assert!(grown < 16 * STATUS_BODY_LIMIT as u64 && grown * 10 < sent, "grew by {grown} bytes for {sent} sent");
}

#[tokio::test]
async fn a_huge_content_length_is_refused_before_reading() {
    let url = serve(|conn| async move {
        if read_request(&conn).await.is_ok() {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1099511627776\r\n\r\n{";
            let _ = write_all(&conn, head.as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    })
    .await;
    let started = Instant::now();
    let message = refused(StatusClient::new(TIMEOUT).get(&url).await.unwrap_err());
    assert_eq!(
        message,
        format!("GET {url}: refused: Content-Length 1099511627776 is over the {STATUS_BODY_LIMIT}-byte limit")
    );
    assert!(started.elapsed() < TIMEOUT, "it waited for the body");
}

#[tokio::test]
async fn an_error_status_is_no_answer_and_its_body_is_not_read() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let url = endless("HTTP/1.1 503 Service Unavailable\r\n\r\n", tx).await;
    let message = unanswered(StatusClient::new(TIMEOUT).get(&url).await.unwrap_err());
    assert_eq!(message, format!("GET {url}: HTTP 503 Service Unavailable"));
    let (sent, hung_up) =
        tokio::time::timeout(TIMEOUT, rx.recv()).await.expect("the client holds the connection").unwrap();
    assert!(hung_up && sent < 4 * STATUS_BODY_LIMIT as u64, "{sent} bytes sent, hung up: {hung_up}");
}

#[tokio::test]
async fn garbage_and_the_wrong_shape_are_refused() {
    let cases = [
        (
            "not JSON",
            "<html>pwned</html>".to_string(),
            "not a trainer status document: expected value at line 1 column 1",
        ),
        ("truncated", r#"{"phase": "training", "attempt": 1, "st"#.to_string(), "EOF while parsing"),
        ("another shape", r#"{"status": "ok", "ready": true}"#.to_string(), "missing field `phase`"),
        ("a list", "[1, 2, 3]".to_string(), "invalid type: sequence"),
        (
            "a long unknown phase, quoted only in part",
            format!(r#"{{"phase": "{}", "attempt": 1}}"#, "a".repeat(10_000)),
            "unknown variant `aaaa",
        ),
    ];
    let client = StatusClient::new(TIMEOUT);
    for (case, body, reason) in cases {
        let url = answering(body).await;
        let message = refused(client.get(&url).await.unwrap_err());
        assert!(message.starts_with(&format!("GET {url}: refused: ")), "{case}: {message}");
        assert!(message.contains(reason), "{case}: {message}");
        assert!(message.len() < 400, "{case}: {} bytes of message", message.len());
    }
}

#[tokio::test]
async fn absurd_numbers_are_refused_and_leave_no_report() {
    let cfg = cfg();
    let doc = serde_json::to_value(report(&cfg)).unwrap();
    let with = |key: &str, v: serde_json::Value| {
        let mut d = doc.clone();
        d[key] = v;
        d.to_string()
    };
    let total = cfg.schedule.total_steps;
    let beyond = format!("implausible status: step {} is past the run's {total} steps", total * 1000);
    let past = format!("step {} is past its own totalSteps {total}", total + 1);
    let cases = [
        ("negative tokens", with("tokens", json!(-5)), "not a trainer status document: invalid value: integer `-5`"),
        ("a loss past f64", doc.to_string().replace(r#""loss":3.2"#, r#""loss":1e400"#), "number out of range"),
        ("a loss of 1e308", with("loss", json!(1e308)), "implausible status: loss 1e308 is over 1e6"),
        ("a negative loss", with("loss", json!(-3.2)), "implausible status: loss -3.2 is below 0"),
        (
            "a step beyond the run",
            with("step", json!(total * 1000))
                .replace(&format!(r#""totalSteps":{total}"#), r#""totalSteps":1000000000"#),
            beyond.as_str(),
        ),
        ("a step past its own total", with("step", json!(total + 1)), past.as_str()),
        ("another attempt", with("attempt", json!(7)), "it is attempt 7's report, and attempt 1 runs"),
        (
            "a rank outside the world",
            with("ranks", json!([{"rank": 4000000000u32, "computeSeconds": 0.4, "dataWaitSeconds": 0.0}])),
            "ranks names rank 4000000000, and the run has 8 processes",
        ),
    ];
    let client = StatusClient::new(TIMEOUT);
    for (case, body, reason) in cases {
        let url = answering(body).await;
        let mut obs = observed();
        let poll = poll_rank0(&client, &mut obs, &cfg, &url, "llm").await;
        let Poll::Failed(e) = poll else { panic!("{case}: {poll:?}") };
        let message = refused(e);
        assert!(message.starts_with(&format!("GET {url}: refused: ")), "{case}: {message}");
        assert!(message.contains(reason), "{case}: {message}");
        assert_eq!(obs.trainer, None, "{case}");
    }
}

#[tokio::test]
async fn an_endpoint_that_never_answers_times_out() {
    // Neither a status line nor a close.
    let url = serve(|conn| async move {
        let _ = read_request(&conn).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let started = Instant::now();
    let message = unanswered(StatusClient::new(TIMEOUT).get(&url).await.unwrap_err());
    assert_eq!(message, format!("GET {url}: no answer within {TIMEOUT:?}"));
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(2));
}

/// Serves [`LINK_PROBE_BYTES`] in 16 KiB blocks, `pause` before each; the address.
async fn probe_server(pause: Duration, body_len: usize) -> SocketAddr {
    let url = serve(move |conn| async move {
        if read_request(&conn).await.is_err() {
            return;
        }
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {LINK_PROBE_BYTES}\r\n\r\n");
        if write_all(&conn, head.as_bytes()).await.is_err() {
            return;
        }
        for block in vec![b'0'; body_len].chunks(16 << 10) {
            tokio::time::sleep(pause).await;
            if write_all(&conn, block).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    url.trim_start_matches("http://").trim_end_matches("/status").parse().unwrap()
}

#[tokio::test]
async fn a_link_probe_is_timed_to_its_last_byte() {
    let client = StatusClient::new(TIMEOUT);
    let fast = client.time_link(probe_server(Duration::ZERO, LINK_PROBE_BYTES).await).await.expect("a reading");
    // 16 blocks, each 30 ms late: a link that carries 256 KiB in about half a second.
    let slow = client.time_link(probe_server(Duration::from_millis(30), LINK_PROBE_BYTES).await).await;
    let slow = slow.expect("a reading");
    eprintln!("link probe: {fast:.4} s whole at once, {slow:.4} s throttled");
    assert!((0.48..TIMEOUT.as_secs_f64()).contains(&slow), "{slow}");
    assert!(fast < 0.1 && fast * 4.0 < slow, "{fast} against {slow}");
}

#[tokio::test]
async fn a_link_probe_with_no_whole_answer_is_no_reading_and_a_silent_one_the_timeout() {
    let client = StatusClient::new(TIMEOUT);
    // A body cut short: the server closes before its announced length.
    let short = serve(|conn| async move {
        if read_request(&conn).await.is_ok() {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {LINK_PROBE_BYTES}\r\n\r\n000");
            let _ = write_all(&conn, head.as_bytes()).await;
        }
    })
    .await;
    let short: SocketAddr = short.trim_start_matches("http://").trim_end_matches("/status").parse().unwrap();
    assert_eq!(client.time_link(short).await, None, "cut short");
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert_eq!(client.time_link(closed).await, None, "refused");
    // A body past the probe's size.
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let endless = endless("HTTP/1.1 200 OK\r\n\r\n", tx).await;
    let endless: SocketAddr = endless.trim_start_matches("http://").trim_end_matches("/status").parse().unwrap();
    assert_eq!(client.time_link(endless).await, None, "more than a probe");
    // Accepted and never answered: at least as slow as the timeout.
    let silent = probe_server(Duration::from_secs(60), LINK_PROBE_BYTES).await;
    let started = Instant::now();
    assert_eq!(client.time_link(silent).await, Some(TIMEOUT.as_secs_f64()));
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(1));
}
