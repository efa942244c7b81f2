//! The TrainingRun operator. The reconcile pipeline (validate → build → apply →
//! observe → status) lands here; see ARCHITECTURE in the README.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidSpec(#[from] crds::InvalidSpec),
}
