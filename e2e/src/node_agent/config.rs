//! A node agent's configuration (one node) and its error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::network::hosts::HostsDir;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("starting {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{0}")]
    Pod(String),
    #[error("{0}")]
    Image(String),
    #[error("network: {0}")]
    Network(crate::network::Error),
    #[error("no pod address left on this node")]
    Exhausted,
}

impl Error {
    pub fn kube(what: String, source: kube::Error) -> Error {
        Error::Kube { what, source }
    }
    pub fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), source }
    }
}

/// One node.
#[derive(Clone, Debug)]
pub struct Config {
    pub node: String,
    /// The node's number: its pod range is `10.244.<index + 1>.0/24`.
    pub index: u8,
    pub root: PathBuf,
    /// Image repository suffix → the binary it runs.
    pub images: BTreeMap<String, PathBuf>,
    pub cluster_netns: String,
    /// Pod namespaces are named `<prefix>-<index>-<slot>`.
    pub netns_prefix: String,
    pub hosts: HostsDir,
    pub cpu: String,
    pub memory: String,
    pub gpus: u32,
    pub kubelet_version: String,
    /// A deleted pod's processes get at most this long after SIGTERM.
    pub max_grace: Duration,
    /// The cluster's CA, PEM: a pod's `ca.crt`.
    pub ca_pem: String,
}
