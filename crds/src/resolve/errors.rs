//! A spec's problems, each named by its field path, collected so that all are reported
//! at once.

use std::fmt;

use crate::quantity::TokenQuantity;
use crate::types::bounds;

/// Longest TrainingRun name ([`bounds::TRAINING_RUN_NAME`]).
pub const MAX_NAME_LEN: usize = bounds::TRAINING_RUN_NAME;

/// One problem with a spec, named by its field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found in a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSpec(pub Vec<FieldError>);

impl fmt::Display for InvalidSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|e| e.to_string()).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for InvalidSpec {}

impl InvalidSpec {
    /// Whether some error names `field` (exactly, or a sub-field of it).
    pub fn names(&self, field: &str) -> bool {
        self.0.iter().any(|e| {
            e.field == field || e.field.starts_with(&format!("{field}.")) || e.field.starts_with(&format!("{field}["))
        })
    }
}

#[derive(Default)]
pub(super) struct Errors(pub(super) Vec<FieldError>);

impl Errors {
    pub(super) fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError { field: field.into(), message: message.into() });
    }

    pub(super) fn tokens(&mut self, field: &str, q: &TokenQuantity) -> Option<u64> {
        q.value().map_err(|e| self.add(field, e.to_string())).ok()
    }

    pub(super) fn positive(&mut self, field: &str, v: Option<u32>) -> Option<u32> {
        match v {
            Some(0) => {
                self.add(field, "must be at least 1");
                None
            }
            v => v,
        }
    }
}

/// `name` must be a DNS label short enough for the children's names.
pub(super) fn check_name(e: &mut Errors, field: &str, name: &str) {
    if name.is_empty() {
        e.add(field, "is required");
        return;
    }
    let ok = name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        e.add(
            field,
            format!(
                "{name:?} must be a DNS label of at most {MAX_NAME_LEN} characters: lowercase letters, digits and '-', starting with a letter"
            ),
        );
    }
}
