//! §3.1: the CRD, judged by the API server itself.

use std::time::Instant;

use crate::harness::*;

#[tokio::test]
async fn the_control_plane_starts_and_serves_the_crd() {
    let _one = serial().lock().await;
    let started = Instant::now();
    let c = cluster(2).await;
    eprintln!("cluster up in {:?}", started.elapsed());
    install_crd(&c);
    let out = kubectl(&c, &["get", "nodes"]);
    eprintln!("{out}");
}
