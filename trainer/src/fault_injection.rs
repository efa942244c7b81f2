//! The gate of the test-only fault injection (`TRAINER_INJECT_*`, in `train::faults` and
//! `data::prepare`): only a trainer built with the `fault-injection` feature (the test
//! builds and the test images) honours those variables; a release build ignores them
//! with a warning, so no TrainingRun's `spec.env` can switch test code on.

/// Whether this build honours the `TRAINER_INJECT_*` variables.
pub const ENABLED: bool = cfg!(feature = "fault-injection");

/// The value of fault variable `name` from the environment, if this build honours it.
pub fn knob(name: &str) -> Option<String> {
    knob_in(ENABLED, name, &|n| std::env::var(n).ok())
}

/// The value of fault variable `name` from `lookup`, if `enabled`; when not, a variable
/// that is set is warned about (once a process for each name) and ignored.
pub(crate) fn knob_in(enabled: bool, name: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let value = lookup(name)?;
    if enabled {
        return Some(value);
    }
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    if WARNED.lock().map(|mut w| w.insert(name.to_string())).unwrap_or(false) {
        tracing::warn!("{name} is set, but this trainer is built without fault injection: ignored");
    }
    None
}
