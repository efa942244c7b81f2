//! A static HTTPS file server for the tests of `https://` inputs: a fresh CA (written to
//! `ca.pem` for `SSL_CERT_FILE`) signs a certificate for 127.0.0.1 and `localhost`; every
//! request is served `Connection: close` from one directory, GET and HEAD, with
//! `Content-Length`, and counted by path.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub struct Server {
    /// `https://127.0.0.1:PORT`
    pub base: String,
    /// The CA that signed the server's certificate, as PEM.
    pub ca_pem: PathBuf,
    /// Requests per `METHOD /path`.
    pub requests: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Server {
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.base)
    }
}

/// Serves the files of `root`; the CA's PEM is written into `pki`.
pub fn serve(root: &Path, pki: &Path) -> Server {
    std::fs::create_dir_all(pki).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, "trainer-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let ca_pem = pki.join("ca.pem");
    std::fs::write(&ca_pem, ca.pem()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert =
        CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap().signed_by(&key, &ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let requests = Arc::new(Mutex::new(BTreeMap::new()));
    let (root, counted) = (root.to_path_buf(), requests.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (config, root, counted) = (config.clone(), root.clone(), counted.clone());
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                // A client that refuses the certificate ends the handshake: not the server's error.
                let _ = respond(rustls::StreamOwned::new(conn, stream), &root, &counted);
            });
        }
    });
    Server { base, ca_pem, requests }
}

fn respond(
    mut tls: rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>,
    root: &Path,
    counted: &Mutex<BTreeMap<String, usize>>,
) -> std::io::Result<()> {
    // GET and HEAD carry no body: what the reader buffered past the head is nothing.
    let mut reader = BufReader::new(&mut tls);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default().to_string());
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    let path = target.split('?').next().unwrap_or_default().trim_start_matches('/').to_string();
    *counted.lock().unwrap().entry(format!("{method} /{path}")).or_default() += 1;
    let file = root.join(&path);
    let (status, body) = match std::fs::read(&file) {
        Ok(b) if !path.is_empty() && !path.contains("..") => ("200 OK", b),
        _ => ("404 Not Found", b"not found\n".to_vec()),
    };
    drop(reader);
    write!(tls, "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())?;
    if method != "HEAD" {
        tls.write_all(&body)?;
    }
    tls.conn.send_close_notify();
    tls.flush()
}
