//! The operator against the real control plane: kube-apiserver, etcd, the controller
//! manager (job, garbage collector, endpointslice, PV binder, node lifecycle, ...) and the
//! scheduler, built from source (scripts/setup-control-plane.sh), and real nodes (the
//! kubelet, containerd, runc, kube-proxy, kube-router and CoreDNS:
//! scripts/setup-node.sh) running our images (scripts/setup-images.sh). Needs root
//! (namespaces, cgroups, the kubelet); fails loudly without it.
//!
//! Each test starts its own cluster; three run at a time (`PT_REAL_CLUSTERS`), the
//! longest first when libtest starts every test at once (`make test` gives it a thread
//! for each: `slots`): most of a test is waiting for controllers, leases and grace
//! periods, which the others overlap.

mod harness;
mod in_process;
mod probe;
mod scenario;
mod slots;

mod alerts;
mod containers;
mod crd;
mod datasets;
mod datasets_storage;
mod failures;
mod kueue;
mod kwok;
mod network_faults;
mod nodes;
mod operator;
mod pushback;
mod run;
mod scenarios;
