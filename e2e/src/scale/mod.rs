//! The operator at scale on the real control plane (`make bench-operator`): the load
//! ([`load`]: runs of 1–8 nodes of 8 GPUs, pretraining and GRPO, each with a fate), a
//! stand-in for rank 0's `/status` behind the operator's `STATUS_URL` ([`stub`]: kwok's
//! pods serve nothing), and what is measured ([`measure`]: the operator's requests from
//! the API server's audit log, its RSS and CPU, etcd's size; [`stores`]: what its
//! stores hold, by kind), and the runs as a watch shows them ([`seen`]). The nodes are kwok's
//! ([`crate::kwok`]).

pub mod cluster;
pub mod jobset;
pub mod load;
pub mod measure;
pub mod seen;
pub mod stores;
pub mod stub;
