//! Argo CD's own judgement of our health check: `e2e/argocd-health` (built from the Go
//! module proxy by `scripts/setup-argocd-health.sh`) runs `deploy/argocd/health.lua` in
//! Argo CD's Lua VM (`github.com/argoproj/argo-cd/v3/util/lua`), registered as the
//! TrainingRun customization the way `argocd-cm` registers it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::control_plane::{Error, tool_dir};

pub fn binaries() -> Result<PathBuf, Error> {
    tool_dir("PT_ARGOCD_HEALTH_DIR", "setup-argocd-health.sh")
}

/// The health check the chart's users install.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/argocd/health.lua")
}

/// Argo CD's (status, message) of each object, by name.
pub fn health(objects: &[Value]) -> Result<BTreeMap<String, (String, String)>, Error> {
    let bin = binaries()?.join("argocd-health");
    let mut child = Command::new(&bin)
        .arg(script())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Spawn { program: bin.display().to_string(), source: e })?;
    let input = serde_json::to_vec(objects).expect("JSON");
    child.stdin.take().expect("piped").write_all(&input).map_err(|e| Error::io(&bin, e))?;
    let out = child.wait_with_output().map_err(|e| Error::io(&bin, e))?;
    if !out.status.success() {
        return Err(Error::Setup(format!("argocd-health: {}", String::from_utf8_lossy(&out.stderr))));
    }
    let mut by_name = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line).map_err(|e| Error::Setup(format!("argocd-health: {e}: {line}")))?;
        if let Some(e) = v["error"].as_str() {
            return Err(Error::Setup(format!("argocd-health: {}: {e}", v["name"])));
        }
        let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        by_name.insert(field("name"), (field("status"), field("message")));
    }
    Ok(by_name)
}
