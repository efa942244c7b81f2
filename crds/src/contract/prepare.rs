//! The contract between the operator and `trainer prepare`'s pods: what a pod reports
//! on `/status` while it works and in its termination message when it is done, and
//! the reasons a TrainingDataset's status gives.

use serde::{Deserialize, Serialize};

use super::clip;

/// Which part of a preparation a pod runs (`trainer prepare --step`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PrepareStep {
    /// Trains the tokenizer on a sample of the source and publishes it.
    Tokenizer,
    /// Prepares a worker's share of the files.
    #[default]
    Work,
    /// Writes the dataset's manifest from every file's part.
    Merge,
}

impl PrepareStep {
    pub const fn as_str(self) -> &'static str {
        match self {
            PrepareStep::Tokenizer => "tokenizer",
            PrepareStep::Work => "work",
            PrepareStep::Merge => "merge",
        }
    }
}

/// An input file that failed, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FailedInput {
    /// The file's key: its path below its input.
    pub file: String,
    pub error: String,
}

/// The manifest a merge wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MergedManifest {
    /// SHA-256 of manifest.json, hex.
    pub sha256: String,
    pub train_tokens: u64,
    pub validation_tokens: u64,
    pub shards: u64,
    pub tokenizer_hash: String,
}

/// A prepare pod's report: its `/status` document while it works, and its
/// termination message when it exits 0. The counts cover the files of its step (a
/// worker's share; every file for the merge), prepared now or found prepared.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrepareReport {
    pub step: PrepareStep,
    pub files_total: u64,
    /// Files prepared, skipped as already prepared, or failed.
    pub files_done: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// Tokens written, train and validation.
    pub tokens: u64,
    /// Seconds since the pod started its step.
    pub seconds: f64,
    /// Tokens this pod encoded itself (not found prepared), for its rate.
    #[serde(default)]
    pub tokens_encoded: u64,
    /// Files that failed; [`PrepareReport::failed_count`] counts them all when the
    /// list is cut to fit a termination message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedInput>,
    #[serde(default)]
    pub failed_count: u64,
    /// The merge's manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<MergedManifest>,
    /// The step is finished.
    #[serde(default)]
    pub done: bool,
}

impl PrepareReport {
    /// The JSON, with failed files dropped from the end and errors shortened until it
    /// fits in a termination message ([`super::TerminationMessage::MAX_BYTES`]).
    pub fn to_json(&self) -> String {
        let mut r = self.clone();
        r.failed_count = r.failed_count.max(r.failed.len() as u64);
        loop {
            let json = serde_json::to_string(&r).expect("PrepareReport serializes");
            if json.len() <= super::TerminationMessage::MAX_BYTES {
                return json;
            }
            if r.failed.len() > 1 {
                r.failed.pop();
            } else if let Some(f) = r.failed.first_mut() {
                f.error = clip(&f.error, 200);
                f.file = clip(&f.file, 200);
                if json.len() > super::TerminationMessage::MAX_BYTES + 1000 {
                    r.failed.clear();
                }
            } else {
                return json;
            }
        }
    }

    pub fn parse(text: &str) -> Option<PrepareReport> {
        serde_json::from_str(text.trim()).ok()
    }
}

/// Why a TrainingDataset is where it is: `status.reason` and its conditions' reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DatasetReason {
    /// The spec resolves (Accepted=True).
    Accepted,
    /// The spec does not resolve: Failed until it is fixed.
    InvalidSpec,
    /// The tokenizer is being trained, before the workers start.
    TrainingTokenizer,
    /// The workers prepare the files.
    Preparing,
    /// The merge writes the manifest.
    Merging,
    /// The manifest is written: runs may train on it.
    Ready,
    /// More input files failed than `spec.maxFailedFiles` allows.
    FilesFailed,
    /// A pod failed more often than `spec.maxRetries` allows.
    RetriesExhausted,
    /// A pod found its output's file system full.
    StorageFull,
    /// A pod failed for a reason no retry helps (an invalid option, unreadable input).
    PrepareFailed,
    /// A pod was retried: the event of each retry.
    Retried,
    /// Deletion waits for the runs that use the dataset to end.
    InUse,
}

impl DatasetReason {
    pub const ALL: [DatasetReason; 12] = [
        DatasetReason::Accepted,
        DatasetReason::InvalidSpec,
        DatasetReason::TrainingTokenizer,
        DatasetReason::Preparing,
        DatasetReason::Merging,
        DatasetReason::Ready,
        DatasetReason::FilesFailed,
        DatasetReason::RetriesExhausted,
        DatasetReason::StorageFull,
        DatasetReason::PrepareFailed,
        DatasetReason::Retried,
        DatasetReason::InUse,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DatasetReason::Accepted => "Accepted",
            DatasetReason::InvalidSpec => "InvalidSpec",
            DatasetReason::TrainingTokenizer => "TrainingTokenizer",
            DatasetReason::Preparing => "Preparing",
            DatasetReason::Merging => "Merging",
            DatasetReason::Ready => "Ready",
            DatasetReason::FilesFailed => "FilesFailed",
            DatasetReason::RetriesExhausted => "RetriesExhausted",
            DatasetReason::StorageFull => "StorageFull",
            DatasetReason::PrepareFailed => "PrepareFailed",
            DatasetReason::Retried => "Retried",
            DatasetReason::InUse => "InUse",
        }
    }
}

impl From<DatasetReason> for String {
    fn from(r: DatasetReason) -> String {
        r.as_str().into()
    }
}

impl std::fmt::Display for DatasetReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_with_many_failures_fits_a_termination_message_and_counts_them_all() {
        let failed: Vec<FailedInput> = (0..500)
            .map(|i| FailedInput { file: format!("raw/part-{i:05}.parquet"), error: "x".repeat(300) })
            .collect();
        let r = PrepareReport { files_total: 600, files_done: 600, failed, done: true, ..Default::default() };
        let json = r.to_json();
        assert!(json.len() <= super::super::TerminationMessage::MAX_BYTES, "{}", json.len());
        let back = PrepareReport::parse(&json).unwrap();
        assert_eq!(back.failed_count, 500);
        assert!(!back.failed.is_empty() && back.failed.len() < 500);
        assert_eq!(back.failed[0].file, "raw/part-00000.parquet");
    }

    #[test]
    fn a_report_is_not_a_trainer_failure_message() {
        let json = PrepareReport { done: true, ..Default::default() }.to_json();
        assert_eq!(super::super::TerminationMessage::parse(&json), None);
    }
}
