//! A request as the handlers see it, and the record of a client write.

use std::collections::BTreeMap;

use http::header::{ACCEPT, USER_AGENT};
use http::{HeaderMap, Method};

use super::resource::{Key, Target};

/// A client write that changed something.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// `create`, `update`, `patch`, `apply` or `delete`.
    pub verb: String,
    /// The request path, without the query.
    pub path: String,
    pub kind: String,
    pub name: String,
    pub subresource: Option<String>,
}

pub(super) struct Req<'a> {
    pub(super) method: &'a Method,
    pub(super) path: &'a str,
    pub(super) query: BTreeMap<String, String>,
    pub(super) headers: &'a HeaderMap,
    pub(super) body: &'a [u8],
    pub(super) target: Target,
}

impl Req<'_> {
    pub(super) fn q(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    pub(super) fn flag(&self, name: &str) -> bool {
        matches!(self.q(name), Some("true" | "1"))
    }

    pub(super) fn is_watch(&self) -> bool {
        self.flag("watch")
    }

    pub(super) fn wants_metadata(&self) -> bool {
        header(self.headers, ACCEPT).is_some_and(|a| a.contains("as=PartialObjectMetadata"))
    }

    /// Field manager of a non-apply write: the query parameter, else the user
    /// agent's product name, as the real server does.
    pub(super) fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        header(self.headers, USER_AGENT)
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string()
    }

    pub(super) fn write(&self, verb: &str, key: &Key, kind: &str) -> Write {
        Write {
            verb: verb.to_string(),
            path: self.path.to_string(),
            kind: kind.to_string(),
            name: key.name.clone(),
            subresource: self.target.subresource.clone(),
        }
    }
}

pub(super) fn header(headers: &HeaderMap, name: http::header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub(super) fn parse_query(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
