//! The data mix, locations, checkpoints and initial weights.

use std::collections::BTreeSet;

use super::errors::{Errors, check_name};
use crate::config::*;
use crate::contract::{CHECKPOINT_MOUNT, EMBEDDED_SOURCES};
use crate::types::*;

pub(super) fn resolve_data(e: &mut Errors, spec: &TrainingRunSpec) -> Option<ResolvedData> {
    let Some(d) = &spec.data else {
        if spec.phase == Phase::Pretrain {
            e.add("spec.data", "is required for phase pretrain");
        }
        return None;
    };
    if d.mix.is_empty() {
        e.add("spec.data.mix", "needs at least one source");
        return None;
    }
    let mut seen = BTreeSet::new();
    let mut mix = Vec::new();
    for (i, m) in d.mix.iter().enumerate() {
        let f = format!("spec.data.mix[{i}]");
        if m.name.trim().is_empty() {
            e.add(format!("{f}.name"), "must not be empty");
        } else if !seen.insert(m.name.as_str()) {
            e.add(format!("{f}.name"), format!("{:?} appears twice; names must be unique", m.name));
        }
        if !(m.weight.is_finite() && m.weight > 0.0 && m.weight <= 1.0) {
            e.add(format!("{f}.weight"), format!("{} must be in (0, 1]", m.weight));
        }
        match (&m.uri, &m.dataset) {
            (Some(uri), None) => {
                if let Some(location) = parse_location(e, &format!("{f}.uri"), uri) {
                    mix.push(ResolvedSource { name: m.name.clone(), weight: m.weight, uri: uri.clone(), location });
                }
            }
            (None, Some(dataset)) => e.add(
                format!("{f}.dataset"),
                format!(
                    "TrainingDataset {dataset:?} is resolved by the operator once it is Ready; outside a cluster, give the prepared shards' uri"
                ),
            ),
            _ => e.add(f, "set exactly one of uri and dataset"),
        }
    }
    let sum: f64 = d.mix.iter().map(|m| m.weight).sum();
    if (sum - 1.0).abs() > 1e-6 {
        e.add("spec.data.mix", format!("weights sum to {sum}, not 1"));
    }
    let eval_tokens = e.tokens("spec.data.validation.tokens", &d.validation.tokens);
    Some(ResolvedData {
        mix,
        eval_every_steps: d.validation.every_steps,
        eval_tokens: eval_tokens?,
        packing: d.packing,
    })
}

/// An S3 key or a path inside a claim becomes a path under a cache or a mount: no `.`
/// or `..` segment may move it elsewhere.
fn no_climbing(uri: &str, key: &str) -> Result<(), String> {
    if key.contains('\0') || key.split('/').any(|s| s == "." || s == "..") {
        return Err(format!("{uri:?}: a '.' or '..' segment (or a NUL byte) may not appear after the bucket or claim"));
    }
    Ok(())
}

/// Parses `s3://bucket/prefix`, `pvc://claim/path`, `embedded:<name>` or a path.
pub fn parse_location_str(uri: &str) -> Result<Location, String> {
    if let Some(rest) = uri.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("{uri:?} has no bucket; write s3://bucket/prefix"));
        }
        no_climbing(uri, prefix)?;
        return Ok(Location::S3 { bucket: bucket.into(), prefix: prefix.trim_matches('/').into() });
    }
    if let Some(rest) = uri.strip_prefix("pvc://") {
        let (claim, path) = rest.split_once('/').unwrap_or((rest, ""));
        if claim.is_empty() {
            return Err(format!("{uri:?} has no claim; write pvc://claim/path"));
        }
        no_climbing(uri, path)?;
        return Ok(Location::Pvc { claim: claim.into(), path: path.trim_matches('/').into() });
    }
    if let Some(name) = uri.strip_prefix("embedded:") {
        if name == "bpe" || EMBEDDED_SOURCES.contains(&name) {
            return Ok(Location::Embedded { name: name.into() });
        }
        return Err(format!(
            "{uri:?}: no embedded corpus named {name:?}; embedded corpora: {}",
            EMBEDDED_SOURCES.join(", ")
        ));
    }
    if let Some((scheme, _)) = uri.split_once("://") {
        return Err(format!("{uri:?}: unsupported scheme {scheme:?}; use s3://, pvc://, embedded: or a path"));
    }
    if uri.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(Location::Path { path: uri.into() })
}

pub(super) fn parse_location(e: &mut Errors, field: &str, uri: &str) -> Option<Location> {
    parse_location_str(uri).map_err(|m| e.add(field, m)).ok()
}

pub(super) fn resolve_checkpoint(e: &mut Errors, c: &CheckpointSpec, nodes: u32) -> Option<ResolvedCheckpoint> {
    let before = e.0.len();
    if c.every_steps == 0 {
        e.add("spec.checkpoint.everySteps", "must be at least 1");
    }
    if c.keep_last == 0 {
        e.add("spec.checkpoint.keepLast", "must be at least 1");
    }
    if nodes > 1 && matches!(c.access_mode, Some(AccessMode::ReadWriteOnce | AccessMode::ReadWriteOncePod)) {
        e.add(
            "spec.checkpoint.accessMode",
            format!("{:?} cannot be mounted by pods on {nodes} nodes; use ReadWriteMany", c.access_mode.unwrap()),
        );
    }
    let s3 = c.s3.as_ref().and_then(|s| match parse_location_str(&s.uri) {
        _ if !s.uri.starts_with("s3://") => {
            e.add("spec.checkpoint.s3.uri", format!("{:?} must start with s3://", s.uri));
            None
        }
        Ok(Location::S3 { bucket, prefix }) => {
            if s.secret_ref.name.trim().is_empty() {
                e.add(
                    "spec.checkpoint.s3.secretRef.name",
                    "must name a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                );
            }
            Some(ResolvedS3 {
                bucket,
                prefix,
                endpoint: s.endpoint.clone(),
                region: s.region.clone(),
                secret_name: s.secret_ref.name.clone(),
            })
        }
        Ok(_) => unreachable!("an s3:// uri parses as S3"),
        Err(m) => {
            e.add("spec.checkpoint.s3.uri", m);
            None
        }
    });
    (e.0.len() == before).then(|| ResolvedCheckpoint {
        dir: CHECKPOINT_MOUNT.into(),
        every_steps: c.every_steps,
        keep_last: c.keep_last,
        keep_best: c.keep_best,
        s3,
    })
}

/// `checkpoint.keepBest` ranks checkpoints by the validation loss measured at their
/// step: validation must run at every checkpoint.
pub(super) fn check_keep_best(e: &mut Errors, spec: &TrainingRunSpec, data: Option<&ResolvedData>) {
    let c = &spec.checkpoint;
    if c.keep_best == 0 {
        return;
    }
    let field = "spec.checkpoint.keepBest";
    if spec.phase == Phase::Grpo {
        e.add(field, "ranks checkpoints by validation loss, which a grpo run does not measure; set it to 0");
        return;
    }
    match data.map(|d| d.eval_every_steps).filter(|&n| n > 0) {
        None => e.add(field, "ranks checkpoints by validation loss, which this run does not measure: set spec.data.validation.everySteps above 0"),
        Some(n) if !c.every_steps.is_multiple_of(n) => e.add(
            field,
            format!(
                "ranks checkpoints by the validation loss at their step, but validation runs every {n} steps and \
                 checkpoints every {}: make spec.data.validation.everySteps divide spec.checkpoint.everySteps",
                c.every_steps
            ),
        ),
        Some(_) => {}
    }
}

pub(super) fn resolve_init(e: &mut Errors, spec: &TrainingRunSpec, own_name: &str) -> Option<ResolvedInit> {
    let Some(init) = &spec.init_from else {
        if spec.phase == Phase::Grpo {
            e.add("spec.initFrom", "is required for phase grpo: GRPO fine-tunes pretrained weights");
        }
        return None;
    };
    match (&init.training_run, &init.uri) {
        (Some(run), None) => {
            check_name(e, "spec.initFrom.trainingRun", run);
            if run == own_name {
                e.add("spec.initFrom.trainingRun", "a run cannot start from itself");
            }
            Some(ResolvedInit::TrainingRun { name: run.clone() })
        }
        (None, Some(uri)) => match parse_location(e, "spec.initFrom.uri", uri)? {
            Location::Embedded { .. } => {
                e.add("spec.initFrom.uri", "embedded corpora hold no checkpoints");
                None
            }
            location => Some(ResolvedInit::Checkpoint { uri: uri.clone(), location }),
        },
        _ => {
            e.add("spec.initFrom", "set exactly one of trainingRun and uri");
            None
        }
    }
}
