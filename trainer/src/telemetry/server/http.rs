//! The status port's HTTP/1 server, bounded against clients that hold connections or
//! send too much: at most [`Limits::connections`] open at once (more are closed on
//! accept), request heads of at most [`MAX_REQUEST_HEAD`] bytes (larger ones get 431),
//! a whole head within [`Limits::header_timeout`] however slowly it trickles in, and
//! no connection older than [`Limits::connection_lifetime`]. Request bodies are never
//! read. One thread runs it, whatever the clients do.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, oneshot};

/// The largest request head (request line and headers) read; hyper's smallest buffer.
pub const MAX_REQUEST_HEAD: usize = 16 << 10;

/// How many clients, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub connections: usize,
    /// Time to send a whole request head, counted from the connection's start or the
    /// previous response.
    pub header_timeout: Duration,
    /// A connection is closed this long after it was accepted, keep-alive or not.
    pub connection_lifetime: Duration,
}

impl Default for Limits {
    /// Room for the operator, a Prometheus scraper, the kubelet's probes and a few
    /// people with curl, many times over.
    fn default() -> Limits {
        Limits {
            connections: 32,
            header_timeout: Duration::from_secs(10),
            connection_lifetime: Duration::from_secs(60),
        }
    }
}

/// What a request gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    pub content_type: &'static str,
    pub body: Bytes,
}

/// Answers a request from its method and path (no query).
pub type Handler = dyn Fn(&Method, &str) -> Reply + Send + Sync;

/// Serves a [`Handler`] until dropped; dropping it stops and joins its thread.
pub struct HttpServer {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves `handler` on its own thread.
    pub fn start(addr: SocketAddr, limits: Limits, handler: Arc<Handler>) -> std::io::Result<HttpServer> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        let (shutdown, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new().name("status-server".into()).spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener, limits, handler, stopped).await,
                    Err(e) => tracing::warn!("status server: {e}"),
                }
            })
        })?;
        Ok(HttpServer { addr: bound, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// The address the server is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    limits: Limits,
    handler: Arc<Handler>,
    mut stopped: oneshot::Receiver<()>,
) {
    let open = Arc::new(Semaphore::new(limits.connections));
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: back off rather than spin.
                    tracing::warn!("status server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tracing::debug!("status server: {} connections open; closing a new one", limits.connections);
            drop(stream);
            continue;
        };
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let reply = respond(handler.as_ref(), &request);
                async move { Ok::<_, Infallible>(reply) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_REQUEST_HEAD)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_lifetime, connection).await {
                Ok(Err(e)) => tracing::debug!("status server: {e}"),
                Err(_) => {
                    tracing::debug!("status server: closed a connection open for {:?}", limits.connection_lifetime)
                }
                Ok(Ok(())) => {}
            }
            drop(permit);
        });
    }
}

fn respond(handler: &Handler, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = handler(request.method(), request.uri().path());
    let mut response = Response::builder().status(reply.code).header("Content-Type", reply.content_type);
    if reply.code == 405 {
        response = response.header("Allow", "GET");
    }
    response.body(Full::new(reply.body)).unwrap_or_else(|e| {
        tracing::warn!("status server: {e}");
        let mut fallback = Response::new(Full::new(Bytes::from_static(b"internal error\n")));
        *fallback.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    })
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{Ipv4Addr, TcpStream};
    use std::time::Instant;

    use super::*;

    fn hello() -> Arc<Handler> {
        Arc::new(|method: &Method, path: &str| Reply {
            code: if method == Method::GET { 200 } else { 405 },
            content_type: "text/plain",
            body: format!("{method} {path}\n").into(),
        })
    }

    fn tight() -> Limits {
        Limits {
            connections: 4,
            header_timeout: Duration::from_millis(400),
            connection_lifetime: Duration::from_secs(3),
        }
    }

    fn start(limits: Limits) -> HttpServer {
        HttpServer::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), limits, hello()).unwrap()
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        response
    }

    /// Whether the server has closed `s` (reads 0 bytes or a reset) within `wait`.
    fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
        s.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
                Err(_) => return true,
            }
        }
    }

    #[test]
    fn serves_the_handler_with_its_code_and_type() {
        let server = start(Limits::default());
        let response = get(server.addr(), "/status?x=1");
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(response.to_ascii_lowercase().contains("content-type: text/plain"), "{response}");
        assert!(response.ends_with("GET /status\n"), "{response}");
        let mut s = TcpStream::connect(server.addr()).unwrap();
        write!(s, "POST /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 405") && response.contains("allow: GET"), "{response}");
    }

    /// Slowloris: connections that never finish their head hold no slot past the header
    /// timeout, connections beyond the limit are closed at once, and the server answers
    /// again as soon as the slots free.
    #[test]
    fn idle_and_trickling_connections_are_cut_and_bounded() {
        let limits = tight();
        let server = start(limits);
        let mut idle: Vec<TcpStream> =
            (0..limits.connections).map(|_| TcpStream::connect(server.addr()).unwrap()).collect();
        // A trickle: one header byte every 100 ms never completes a head within 400 ms.
        write!(idle[0], "GET /status HTTP/1.1\r\n").unwrap();
        let trickle = {
            let mut s = idle[0].try_clone().unwrap();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    if s.write_all(b"X").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        let mut extra = TcpStream::connect(server.addr()).unwrap();
        assert!(closed_within(&mut extra, Duration::from_millis(300)), "a connection beyond the limit stays open");
        let started = Instant::now();
        for s in &mut idle {
            assert!(closed_within(s, Duration::from_secs(3)), "an idle connection outlived the header timeout");
        }
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        trickle.join().unwrap();
        assert!(get(server.addr(), "/status").ends_with("GET /status\n"));
    }

    #[test]
    fn oversized_heads_are_refused_and_bodies_never_read() {
        let server = start(tight());
        let mut s = TcpStream::connect(server.addr()).unwrap();
        let huge = "a".repeat(4 * MAX_REQUEST_HEAD);
        let _ = write!(s, "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n");
        let mut response = String::new();
        let _ = s.read_to_string(&mut response);
        assert!(response.starts_with("HTTP/1.1 431"), "{}", &response[..response.len().min(200)]);
        // A gigabyte announced, a little sent: the answer comes without waiting for it.
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        write!(s, "GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n{}", "b".repeat(1000)).unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
    }

    #[test]
    fn no_connection_outlives_its_lifetime() {
        let limits = Limits {
            connection_lifetime: Duration::from_millis(600),
            header_timeout: Duration::from_secs(5),
            ..tight()
        };
        let server = start(limits);
        let mut s = TcpStream::connect(server.addr()).unwrap();
        // Keep-alive requests, each well within the header timeout.
        let started = Instant::now();
        let mut closed = false;
        while started.elapsed() < Duration::from_secs(3) {
            if write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").is_err()
                || closed_within(&mut s, Duration::from_millis(150))
            {
                closed = true;
                break;
            }
        }
        assert!(closed && started.elapsed() < Duration::from_secs(2), "open after {:?}", started.elapsed());
    }
}
