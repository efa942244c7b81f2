//! `https://` files: a URL is one file, fetched whole (a Parquet footer is at its end),
//! streamed to disk or read into memory up to a bound. TLS is rustls with the platform's
//! roots; `SSL_CERT_FILE` or `SSL_CERT_DIR` name a private CA's bundle. Redirects are
//! followed (up to 10, as a hub's CDN needs), plain `http://` is refused, and nothing is
//! retried here: a worker that fails is retried by its Job, and the files it finished are
//! skipped. `HF_TOKEN`, when set, is sent to the Hugging Face Hub only (gated datasets);
//! a redirect to another host drops it.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use crate::{Error, io_err};

/// How long the response's head may take, and then each read of its body.
const TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `uri` is an `https://` URL.
pub fn is_url(uri: &str) -> bool {
    uri.starts_with("https://")
}

/// The URL's last path segment (`…/resolve/main/data/000.parquet?download=1` →
/// `000.parquet`), or its host when the path is empty.
pub fn file_name(url: &str) -> String {
    let rest = url.strip_prefix("https://").unwrap_or(url);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    path.trim_end_matches('/').rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or(host).to_string()
}

/// The Hub's hosts, the only ones `HF_TOKEN` is sent to.
const HUB_HOSTS: [&str; 2] = ["huggingface.co", "hf.co"];

/// The URL's host, without a port or credentials.
fn host(url: &str) -> &str {
    let rest = url.strip_prefix("https://").unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    authority.split(':').next().unwrap_or_default()
}

/// Whether `HF_TOKEN` goes with a request to `url`.
fn is_hub(url: &str) -> bool {
    let h = host(url).to_ascii_lowercase();
    HUB_HOSTS.iter().any(|hub| h == *hub || h.ends_with(&format!(".{hub}")))
}

/// A client for `https://` files.
pub struct Https {
    client: reqwest::blocking::Client,
    hub_token: Option<String>,
}

impl std::fmt::Debug for Https {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Https")
    }
}

fn failed(url: &str, e: impl std::fmt::Display, permanent: bool) -> Error {
    Error::Storage { uri: url.to_string(), message: e.to_string(), permanent }
}

/// A request's error, with its causes (the TLS verifier's reason is two levels down).
fn request_error(url: &str, e: reqwest::Error) -> Error {
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        message += &format!(": {c}");
        cause = c.source();
    }
    failed(url, message, false)
}

impl Https {
    pub fn new() -> Result<Https, Error> {
        // reqwest's rustls has no crypto of its own here: ring, the process's default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::blocking::Client::builder()
            .user_agent(concat!("puretransformer-trainer/", env!("CARGO_PKG_VERSION")))
            .https_only(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| failed("https://", e, true))?;
        let hub_token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        Ok(Https { client, hub_token })
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::blocking::RequestBuilder {
        let r = self.client.request(method, url);
        match &self.hub_token {
            Some(token) if is_hub(url) => r.bearer_auth(token),
            _ => r,
        }
    }

    /// The response to a GET of `url`, when its status is a success. A 4xx is permanent
    /// (the file is not there, or not ours to read); a 5xx may pass.
    fn get(&self, url: &str) -> Result<reqwest::blocking::Response, Error> {
        let r = self.request(reqwest::Method::GET, url).send().map_err(|e| request_error(url, e))?;
        let status = r.status();
        if !status.is_success() {
            return Err(failed(url, format!("GET answered {status}"), status.is_client_error()));
        }
        Ok(r)
    }

    /// The file's size from a HEAD's `Content-Length`, if the server gives one.
    pub fn size(&self, url: &str) -> Result<Option<u64>, Error> {
        let r = self.request(reqwest::Method::HEAD, url).send().map_err(|e| request_error(url, e))?;
        let status = r.status();
        if !status.is_success() {
            return Err(failed(url, format!("HEAD answered {status}"), status.is_client_error()));
        }
        Ok(r.headers().get(reqwest::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()))
    }

    /// Streams the file at `url` to `path`; its size. A response shorter than its
    /// `Content-Length` is an error, not a truncated file.
    pub fn get_file(&self, url: &str, path: &Path) -> Result<u64, Error> {
        let mut r = self.get(url)?;
        let expected = r.content_length();
        let mut f = std::fs::File::create(path).map_err(io_err(path))?;
        // A read error is the peer's or the network's; a write error is the disk's
        // (a full one is StorageFull), so the two are told apart here.
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let got = r.read(&mut buf).map_err(|e| failed(url, format!("reading the body: {e}"), false))?;
            if got == 0 {
                break;
            }
            f.write_all(&buf[..got]).map_err(io_err(path))?;
            n += got as u64;
        }
        f.flush().map_err(io_err(path))?;
        if let Some(len) = expected
            && n != len
        {
            return Err(failed(url, format!("the body ended after {n} of {len} bytes"), false));
        }
        Ok(n)
    }

    /// The file at `url`, refused when larger than `limit` bytes.
    pub fn get_bytes(&self, url: &str, limit: u64) -> Result<Vec<u8>, Error> {
        let r = self.get(url)?;
        if let Some(len) = r.content_length()
            && len > limit
        {
            return Err(failed(url, format!("{len} bytes, more than the {limit} allowed"), true));
        }
        let mut bytes = Vec::new();
        r.take(limit + 1).read_to_end(&mut bytes).map_err(|e| failed(url, format!("reading the body: {e}"), false))?;
        if bytes.len() as u64 > limit {
            return Err(failed(url, format!("more than the {limit} bytes allowed"), true));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_urls_file_name_is_its_last_path_segment() {
        for (url, name) in [
            ("https://huggingface.co/datasets/x/y/resolve/main/data/000.parquet", "000.parquet"),
            ("https://h.example/a/b.jsonl?download=1#frag", "b.jsonl"),
            ("https://h.example/a/dir/", "dir"),
            ("https://h.example", "h.example"),
            ("https://h.example:8443/", "h.example:8443"),
        ] {
            assert_eq!(file_name(url), name, "{url}");
        }
    }

    #[test]
    fn the_hub_token_goes_to_the_hub_only() {
        for (url, hub) in [
            ("https://huggingface.co/datasets/o/n/resolve/main/a.parquet", true),
            ("https://HF.co/x", true),
            ("https://cdn-lfs.huggingface.co/repos/x", true),
            ("https://huggingface.co:443/x", true),
            ("https://user@huggingface.co/x", true),
            ("https://huggingface.co.evil.example/x", false),
            ("https://evil.example/huggingface.co/x", false),
            ("https://evil.example/?h=huggingface.co", false),
            ("https://nothuggingface.co/x", false),
        ] {
            assert_eq!(is_hub(url), hub, "{url}");
        }
    }
}
