//! Sockets inside the cluster's network namespaces: the router's forwarder of the API
//! server's port to the API server on the host's loopback (the address the nodes, and
//! through the `kubernetes` Service the pods, reach it at), and connections and HTTP
//! requests made from there.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::Error;

pub struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    listen: SocketAddr,
}

/// Runs `f` on a short-lived thread that has entered the network namespace at `netns`:
/// a socket it makes stays in that namespace.
pub fn in_netns<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    let netns = netns.to_path_buf();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&netns).map_err(|e| Error::Io { path: netns.clone(), source: e })?;
        // SAFETY: setns(2) on this short-lived thread only.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(Error::Io { path: netns, source: std::io::Error::last_os_error() });
        }
        f().map_err(|e| Error::Io { path: netns, source: e })
    })
    .join()
    .expect("the namespace thread does not panic")
}

/// A listener created inside the network namespace at `netns`.
pub fn listen_in(netns: &Path, addr: SocketAddr) -> Result<TcpListener, Error> {
    in_netns(netns, move || TcpListener::bind(addr))
}

/// A connection made from inside the network namespace at `netns`.
pub fn connect_in(netns: &Path, addr: SocketAddr) -> Result<TcpStream, Error> {
    in_netns(netns, move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
}

/// `GET http://<addr><path>` from inside the network namespace at `netns`: the body of
/// a 200; an error names the request and says what came back.
pub fn http_get(netns: &Path, addr: SocketAddr, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let failed = |e: &dyn std::fmt::Display| format!("GET http://{addr}{path}: {e}");
    let mut stream = connect_in(netns, addr).map_err(|e| failed(&e))?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| failed(&e))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| failed(&e))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| failed(&e))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or("no response");
        return Err(failed(&format!("{status}: {body}")));
    }
    Ok(body.to_string())
}

impl Relay {
    /// Relays `listen` (in the namespace at `netns`) to `target` (in this process's).
    pub fn start(netns: &Path, listen: SocketAddr, target: SocketAddr) -> Result<Relay, Error> {
        let listener = listen_in(netns, listen)?;
        listener.set_nonblocking(true).map_err(|e| Error::Io { path: "relay".into(), source: e })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        std::thread::spawn(move || pipe(inbound, target));
                    }
                    // The accept loop polls so that it can stop; connections are served
                    // on their own threads.
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Relay { stop, thread: Some(thread), listen })
    }

    pub fn addr(&self) -> SocketAddr {
        self.listen
    }
}

fn pipe(inbound: TcpStream, target: SocketAddr) {
    let _ = inbound.set_nonblocking(false);
    let Ok(outbound) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else { return };
    let (Ok(mut in_r), Ok(mut out_w)) = (inbound.try_clone(), outbound.try_clone()) else { return };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut in_r, &mut out_w);
        let _ = out_w.shutdown(std::net::Shutdown::Write);
    });
    let (mut out_r, mut in_w) = (outbound, inbound);
    let _ = std::io::copy(&mut out_r, &mut in_w);
    let _ = in_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
