//! The API server's way into the cluster network: its `cluster` egress (to the kubelets
//! for logs, exec and port-forward, and to pods and Services it proxies), configured
//! with an `EgressSelectorConfiguration` as HTTP CONNECT over a Unix socket, the
//! protocol of Konnectivity's proxy server. The API server runs on the host's loopback;
//! each tunnel is dialled from inside the cluster's namespace, except loopback targets
//! (webhooks served on the host), which are dialled where they are.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::Error;
use super::relay::connect_in;

/// The `--egress-selector-config-file` that sends the `cluster` egress to `socket`.
pub fn selector_config(socket: &Path) -> String {
    format!(
        "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
        socket.display()
    )
}

pub struct EgressProxy {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub socket: PathBuf,
}

impl EgressProxy {
    /// Serves CONNECT requests on `socket`, dialling inside the namespace at `netns`.
    pub fn start(socket: &Path, netns: &Path) -> Result<EgressProxy, Error> {
        let _ = std::fs::remove_file(socket);
        let io = |e| Error::Io { path: socket.to_path_buf(), source: e };
        let listener = UnixListener::bind(socket).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, netns) = (stop.clone(), netns.to_path_buf());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let netns = netns.clone();
                        std::thread::spawn(move || tunnel(client, &netns));
                    }
                    // Polls so that it can stop; tunnels run on their own threads.
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(EgressProxy { stop, thread: Some(thread), socket: socket.to_path_buf() })
    }
}

/// The target of `CONNECT host:port HTTP/1.1`.
pub fn connect_target(request_line: &str) -> Option<SocketAddr> {
    let mut parts = request_line.split_whitespace();
    (parts.next()? == "CONNECT").then_some(())?;
    parts.next()?.parse().ok()
}

fn tunnel(client: UnixStream, netns: &Path) {
    let _ = client.set_nonblocking(false);
    let Ok(read_half) = client.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    // The headers end at an empty line.
    let mut header = String::new();
    while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
        header.clear();
    }
    let mut client_w = client;
    let Some(target) = connect_target(&line) else {
        let _ = client_w.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        return;
    };
    let upstream = if target.ip().is_loopback() {
        TcpStream::connect_timeout(&target, Duration::from_secs(5)).map_err(|e| e.to_string())
    } else {
        connect_in(netns, target).map_err(|e| e.to_string())
    };
    let upstream = match upstream {
        Ok(s) => s,
        Err(e) => {
            let _ = write!(client_w, "HTTP/1.1 503 Service Unavailable\r\n\r\n{target}: {e}");
            return;
        }
    };
    if client_w.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err() {
        return;
    }
    let Ok(mut up_w) = upstream.try_clone() else { return };
    // The reader hands over what it buffered past the headers first.
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut reader, &mut up_w);
        let _ = up_w.shutdown(std::net::Shutdown::Write);
    });
    let mut up_r = upstream;
    let _ = std::io::copy(&mut up_r, &mut client_w);
    let _ = client_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_line_names_its_target() {
        assert_eq!(connect_target("CONNECT 172.18.0.2:10250 HTTP/1.1\r\n"), Some("172.18.0.2:10250".parse().unwrap()));
        assert_eq!(connect_target("GET / HTTP/1.1"), None);
        assert_eq!(connect_target("CONNECT node-0:10250 HTTP/1.1"), None);
    }
}
