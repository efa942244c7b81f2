//! End-to-end harnesses against the real control plane (the suite CI runs): the control
//! plane built from source ([`control_plane`]), the network ([`network`]), real nodes
//! (the kubelet, containerd, runc and kube-proxy: [`node`]), a volume provisioner
//! ([`provisioner`]), all composed by [`test_cluster`]; kwok's simulated nodes
//! ([`kwok`]) and the operator's scale bench on them ([`scale`]) (see docs/testing.md).

pub mod argocd;
pub mod control_plane;
pub mod cpus;
pub mod jobset;
pub mod kueue;
pub mod kwok;
pub mod monitoring;
pub mod mounts;
pub mod network;
pub mod node;
pub mod prometheus;
pub mod provisioner;
pub mod scale;
pub mod test_cluster;
