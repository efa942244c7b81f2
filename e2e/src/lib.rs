//! End-to-end harnesses. Against the real control plane (the suite CI runs): the control
//! plane built from source ([`control_plane`]), the network ([`network`]), real nodes
//! (the kubelet, containerd, runc and kube-proxy: [`node`]), a volume provisioner
//! ([`provisioner`]), all composed by [`test_cluster`]. Against a stand-in, where the real
//! control plane cannot do the job (an injected clock, a reconcile driven by hand): a
//! stateful fake API server ([`fake_api`]) (see docs/testing.md).

pub mod argocd;
pub mod control_plane;
pub mod cpus;
pub mod fake_api;
pub mod jobset;
pub mod kueue;
pub mod monitoring;
pub mod mounts;
pub mod network;
pub mod node;
pub mod prometheus;
pub mod provisioner;
pub mod test_cluster;
