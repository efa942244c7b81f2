//! Pure builders: one function per Kubernetes kind, the run in, the object out.
//! Names, labels and owner references are defined once, in `meta`.

pub mod configmap;
pub mod job;
mod meta;
pub mod networkpolicy;
pub mod pvc;
pub mod service;
mod suspension;
#[cfg(test)]
pub(crate) mod testing;
pub mod workload;

pub use configmap::configmap;
pub use job::job;
pub use meta::{
    APPLIED_HASH, ATTEMPT_LABEL, COMPLETION_INDEX, CONTAINER, Inputs, JOB_NAME_LABEL, KEY_PREFIX, MANAGED_BY,
    QUEUE_LABEL, RUN_LABEL, SUSPENDED_BY_OPERATOR, applied_hash, configmap_name, hash_of, job_name, labels, owned_by,
    owned_selector, pvc_name, run_selector, service_name,
};
pub use networkpolicy::network_policy;
pub use pvc::{access_mode, pvc};
pub use service::service;
pub use suspension::{Suspension, suspension};
pub use workload::QueuedWorkload;
