//! Name resolution without a DNS server: what cluster DNS would answer for headless
//! Services (`<hostname>.<service>.<namespace>.svc.cluster.local` and its shorter
//! forms), generated from the real EndpointSlices, written into the `/etc/hosts` of
//! every process of the cluster.
//!
//! Layout under the cluster's `hosts.d/`: `cluster` (every namespace's fully qualified
//! names) and `ns/<namespace>` (the names a pod of that namespace reaches through its
//! search path: `<hostname>.<service>`), both written by [`Dns`]; and one folder per
//! consumer (a pod, the operator) with `head` (what the kubelet writes: localhost, the
//! pod's own name), `namespace`, and `hosts`, the file its process sees. `hosts` is
//! rewritten in place (it is bind-mounted: a rename would leave the mount on the old
//! file), under an exclusive lock so that the last writer always used the newest parts.

use std::collections::BTreeSet;
use std::io::{Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};

use super::error::Error;

pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// What every hosts file starts with.
pub const LOCALHOST: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// One name that DNS would resolve: an endpoint with a hostname behind a Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Record {
    pub namespace: String,
    pub service: String,
    pub hostname: String,
    pub address: String,
}

/// The records of EndpointSlices: each endpoint with a hostname and an address, once.
pub fn records(slices: &[EndpointSlice]) -> BTreeSet<Record> {
    let mut out = BTreeSet::new();
    for s in slices {
        let labels = s.metadata.labels.clone().unwrap_or_default();
        let (Some(service), Some(namespace)) =
            (labels.get("kubernetes.io/service-name"), s.metadata.namespace.as_ref())
        else {
            continue;
        };
        for e in &s.endpoints {
            let (Some(hostname), Some(address)) = (e.hostname.as_ref(), e.addresses.first()) else { continue };
            out.insert(Record {
                namespace: namespace.clone(),
                service: service.clone(),
                hostname: hostname.clone(),
                address: address.clone(),
            });
        }
    }
    out
}

/// Every namespace's fully qualified forms: `h.s.ns.svc.cluster.local h.s.ns.svc h.s.ns`.
pub fn cluster_part(records: &BTreeSet<Record>) -> String {
    records
        .iter()
        .map(|r| {
            let base = format!("{}.{}.{}", r.hostname, r.service, r.namespace);
            format!("{}\t{base}.svc.{CLUSTER_DOMAIN} {base}.svc {base}\n", r.address)
        })
        .collect()
}

/// A namespace's search-path form: `h.s`.
pub fn namespace_part(records: &BTreeSet<Record>, namespace: &str) -> String {
    records
        .iter()
        .filter(|r| r.namespace == namespace)
        .map(|r| format!("{}\t{}.{}\n", r.address, r.hostname, r.service))
        .collect()
}

/// What the kubelet writes for a pod with a hostname and a subdomain.
pub fn pod_head(ip: &str, hostname: &str, subdomain: Option<&str>, namespace: &str) -> String {
    let own = match subdomain {
        Some(sub) => format!("{ip}\t{hostname}.{sub}.{namespace}.svc.{CLUSTER_DOMAIN}\t{hostname}\n"),
        None => format!("{ip}\t{hostname}\n"),
    };
    format!("# Kubernetes-managed hosts file (e2e node agent).\n{LOCALHOST}{own}")
}

/// A consumer's name files, bind-mounted over `/etc/hosts` and `/etc/resolv.conf` in its
/// mount namespace.
#[derive(Clone, Debug)]
pub struct NameFiles {
    pub hosts: PathBuf,
    pub resolv: PathBuf,
}

/// The `resolv.conf` the kubelet writes for a `ClusterFirst` pod of `namespace`, with a
/// server that answers nothing: inside the pod network nothing listens on
/// 127.0.0.1:53, so a name missing from the hosts file fails at once, as cluster DNS's
/// NXDOMAIN would, instead of waiting out the host's resolver (5 s a try, which a
/// rendezvous retrying on a name not yet published pays in full).
pub fn resolv_conf(namespace: Option<&str>) -> String {
    let search = match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}"),
        _ => format!("svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}"),
    };
    format!(
        "# e2e node agent: names resolve through /etc/hosts\nnameserver 127.0.0.1\nsearch {search}\noptions ndots:5 timeout:1 attempts:1\n"
    )
}

/// The `hosts.d` of a cluster.
#[derive(Clone, Debug)]
pub struct HostsDir(pub PathBuf);

impl HostsDir {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |e| Error::Io { path: path.to_path_buf(), source: e }
    }

    /// Registers a consumer `id` with its head and namespace; returns its `hosts` file,
    /// already complete, and its `resolv.conf`.
    pub fn register(&self, id: &str, head: &str, namespace: Option<&str>) -> Result<NameFiles, Error> {
        let dir = self.0.join("consumers").join(id);
        std::fs::create_dir_all(&dir).map_err(Self::io(&dir))?;
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(Self::io(&p))
        };
        write("head", head)?;
        write("namespace", namespace.unwrap_or(""))?;
        write("resolv.conf", &resolv_conf(namespace))?;
        let hosts = dir.join("hosts");
        if !hosts.exists() {
            write("hosts", head)?;
        }
        self.refresh(&dir)?;
        Ok(NameFiles { hosts, resolv: dir.join("resolv.conf") })
    }

    pub fn unregister(&self, id: &str) {
        let _ = std::fs::remove_dir_all(self.0.join("consumers").join(id));
    }

    /// Rewrites one consumer's `hosts` from its head and the newest DNS parts.
    fn refresh(&self, dir: &Path) -> Result<(), Error> {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let path = dir.join("hosts");
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(Self::io(&path))?;
        // SAFETY: flock(2) on a descriptor we own; released when `file` closes.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::Io { path, source: std::io::Error::last_os_error() });
        }
        let namespace = read(dir.join("namespace"));
        let mut text = read(dir.join("head"));
        text.push_str(&read(self.0.join("cluster")));
        if !namespace.is_empty() {
            text.push_str(&read(self.0.join("ns").join(&namespace)));
        }
        // In place, never empty: a reader sees the old or the new names, at worst with
        // a stale tail for a moment.
        let mut file = file;
        file.rewind().map_err(Self::io(&path))?;
        file.write_all(text.as_bytes()).map_err(Self::io(&path))?;
        file.set_len(text.len() as u64).map_err(Self::io(&path))?;
        Ok(())
    }

    /// Writes the DNS parts for `records`, then refreshes every consumer.
    pub fn publish(&self, records: &BTreeSet<Record>) -> Result<(), Error> {
        let ns_dir = self.0.join("ns");
        std::fs::create_dir_all(&ns_dir).map_err(Self::io(&ns_dir))?;
        let atomic = |p: PathBuf, text: String| -> Result<(), Error> {
            let tmp = p.with_extension("tmp");
            std::fs::write(&tmp, text).map_err(Self::io(&tmp))?;
            std::fs::rename(&tmp, &p).map_err(Self::io(&p))
        };
        atomic(self.0.join("cluster"), cluster_part(records))?;
        let namespaces: BTreeSet<&str> = records.iter().map(|r| r.namespace.as_str()).collect();
        if let Ok(dir) = std::fs::read_dir(&ns_dir) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if !namespaces.contains(name.as_str()) && !name.ends_with(".tmp") {
                    atomic(e.path(), String::new())?;
                }
            }
        }
        for ns in namespaces {
            atomic(ns_dir.join(ns), namespace_part(records, ns))?;
        }
        let consumers = self.0.join("consumers");
        if let Ok(dir) = std::fs::read_dir(&consumers) {
            for e in dir.flatten() {
                // A consumer that went away meanwhile is no error.
                if e.path().join("hosts").exists() {
                    let _ = self.refresh(&e.path());
                }
            }
        }
        Ok(())
    }
}

/// Cluster DNS: watches every EndpointSlice and publishes the records on each change.
pub struct Dns;

impl Dns {
    /// Runs until the watch ends (the client's API server goes away) or the task is
    /// dropped.
    pub async fn run(client: kube::Client, dir: HostsDir) {
        let api: kube::Api<EndpointSlice> = kube::Api::all(client);
        let (reader, writer) = kube::runtime::reflector::store();
        let stream = kube::runtime::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        futures::pin_mut!(stream);
        let mut last = None;
        while let Some(event) = stream.next().await {
            if event.is_err() {
                continue;
            }
            let slices: Vec<EndpointSlice> = reader.state().iter().map(|s| (**s).clone()).collect();
            let now = records(&slices);
            if last.as_ref() != Some(&now) {
                if let Err(e) = dir.publish(&now) {
                    tracing::warn!("cluster DNS: {e}");
                }
                last = Some(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::Endpoint;
    use kube::api::ObjectMeta;

    fn slice(ns: &str, svc: &str, endpoints: &[(Option<&str>, &str)]) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                labels: Some([("kubernetes.io/service-name".to_string(), svc.to_string())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: endpoints
                .iter()
                .map(|(h, a)| Endpoint {
                    hostname: h.map(String::from),
                    addresses: vec![a.to_string()],
                    ..Default::default()
                })
                .collect(),
            ports: None,
        }
    }

    #[test]
    fn names_as_cluster_dns_answers_them() {
        let slices = [
            slice(
                "ml",
                "llm",
                &[(Some("llm-a1-0"), "10.244.1.2"), (Some("llm-a1-1"), "10.244.2.2"), (None, "10.244.1.9")],
            ),
            slice("other", "llm", &[(Some("llm-a1-0"), "10.244.2.3")]),
        ];
        let r = records(&slices);
        assert_eq!(r.len(), 3, "an endpoint without a hostname has no name: {r:?}");
        let cluster = cluster_part(&r);
        assert!(
            cluster.contains("10.244.1.2\tllm-a1-0.llm.ml.svc.cluster.local llm-a1-0.llm.ml.svc llm-a1-0.llm.ml\n")
        );
        assert!(cluster.contains("10.244.2.3\tllm-a1-0.llm.other.svc.cluster.local"));
        // The short form belongs to the pod's own namespace only.
        assert_eq!(namespace_part(&r, "ml"), "10.244.1.2\tllm-a1-0.llm\n10.244.2.2\tllm-a1-1.llm\n");
        assert_eq!(namespace_part(&r, "other"), "10.244.2.3\tllm-a1-0.llm\n");
    }

    #[test]
    fn consumers_see_the_newest_records_in_the_same_file() {
        let dir = std::env::temp_dir().join(format!("hosts-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let hosts = HostsDir(dir.clone());
        let head = pod_head("10.244.1.2", "llm-0", Some("llm"), "ml");
        let file = hosts.register("pod-a", &head, Some("ml")).unwrap().hosts;
        assert_eq!(std::fs::read_to_string(&file).unwrap(), head);
        let inode = std::fs::metadata(&file).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
        let r = records(&[slice("ml", "llm", &[(Some("llm-1"), "10.244.2.2")])]);
        hosts.publish(&r).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with(&head) && text.contains("10.244.2.2\tllm-1.llm\n"), "{text}");
        // Shorter content after a pod went away: no stale tail is left.
        hosts.publish(&BTreeSet::new()).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), head);
        let after = std::fs::metadata(&file).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
        assert_eq!(inode, after, "rewritten in place, so a bind mount keeps seeing it");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
