//! The images a node runs, imported into its containerd from the archives
//! `scripts/setup-images.sh` builds (no registry is reachable here), and pinned, so that
//! the kubelet's image garbage collection never removes them. A node slot's containerd
//! keeps its content store between clusters: an image already there is not imported
//! again. Once unpacked, an image's layer blobs go (`--discard-unpacked-layers`): its
//! containers run from the snapshots, and the trainer's layers would double the ~1.7 GB
//! a slot holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::control_plane::Error;

/// One image: its reference (`repository:tag`) and the archive it comes from.
#[derive(Clone, Debug, Deserialize)]
pub struct Image {
    #[serde(rename = "ref")]
    pub reference: String,
    pub archive: PathBuf,
}

/// The images of `<dir>/images.json`, by name (`pause`, `trainer`, `operator`, `coredns`).
pub fn catalogue(dir: &Path) -> Result<BTreeMap<String, Image>, Error> {
    let file = dir.join("images.json");
    let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Setup(format!("{}: {e}", file.display())))
}

/// `ctr` against the containerd at `socket`, in the CRI's namespace.
fn ctr(bin: &Path, socket: &Path) -> Command {
    let mut cmd = Command::new(bin.join("ctr"));
    cmd.arg("--address").arg(socket).args(["--namespace", "k8s.io"]);
    cmd
}

fn run(mut cmd: Command, what: &str) -> Result<String, Error> {
    let out = cmd.output().map_err(|e| Error::Spawn { program: what.to_string(), source: e })?;
    if !out.status.success() {
        return Err(Error::Setup(format!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// Imports every image the node's store lacks and pins them all; the names imported.
pub fn import(bin: &Path, socket: &Path, images: &BTreeMap<String, Image>) -> Result<Vec<String>, Error> {
    let mut list = ctr(bin, socket);
    list.args(["images", "ls", "--quiet"]);
    let present: Vec<String> = run(list, "ctr images ls")?.lines().map(String::from).collect();
    let mut imported = Vec::new();
    for (name, image) in images {
        if !present.contains(&image.reference) {
            let mut cmd = ctr(bin, socket);
            cmd.args(["images", "import", "--local", "--discard-unpacked-layers"]).arg(&image.archive);
            run(cmd, &format!("ctr images import {}", image.archive.display()))?;
            imported.push(name.clone());
        }
        let mut pin = ctr(bin, socket);
        pin.args(["images", "label", &image.reference, "io.cri-containerd.pinned=pinned"]);
        run(pin, &format!("ctr images label {}", image.reference))?;
    }
    // Earlier builds of these images go, through the CRI (which drops every name of an
    // image, its ID too, so that containerd collects the content): a slot's store holds
    // one trainer image, not one per build.
    let wanted: Vec<&str> = images.values().map(|i| i.reference.as_str()).collect();
    for stale in present.iter().filter(|r| is_stale(r, &wanted)) {
        let mut rmi = Command::new(bin.join("crictl"));
        rmi.arg("--runtime-endpoint").arg(format!("unix://{}", socket.display())).args(["rmi", stale]);
        run(rmi, &format!("crictl rmi {stale}"))?;
    }
    Ok(imported)
}

/// A synchronous garbage collection (through a lease deleted with `--sync`): the layer
/// blobs an import let go (`--discard-unpacked-layers`) are deleted now, not at the
/// store's next start.
pub fn collect_garbage(bin: &Path, socket: &Path) -> Result<(), Error> {
    let mut create = ctr(bin, socket);
    create.args(["leases", "create"]);
    let lease = run(create, "ctr leases create")?;
    let mut delete = ctr(bin, socket);
    delete.args(["leases", "delete", "--sync", lease.trim()]);
    run(delete, "ctr leases delete --sync").map(|_| ())
}

/// The repository of `repo:tag` (a registry's port is not a tag).
fn repository(reference: &str) -> &str {
    match reference.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => reference,
    }
}

/// Whether `reference` is another tag of a repository `wanted` names.
fn is_stale(reference: &str, wanted: &[&str]) -> bool {
    !reference.contains('@')
        && !wanted.contains(&reference)
        && wanted.iter().any(|w| repository(w) == repository(reference))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_other_tags_of_our_repositories_are_stale() {
        let wanted = ["ghcr.io/puretransformer/trainer:e2e-2", "localhost:5000/pause:e2e-1"];
        assert!(is_stale("ghcr.io/puretransformer/trainer:e2e-1", &wanted));
        assert!(!is_stale("ghcr.io/puretransformer/trainer:e2e-2", &wanted));
        assert!(!is_stale("ghcr.io/puretransformer/trainer@sha256:ab", &wanted));
        assert!(!is_stale("sha256:0123", &wanted));
        assert!(!is_stale("docker.io/library/busybox:1", &wanted));
        assert!(is_stale("localhost:5000/pause:e2e-0", &wanted));
    }
}
