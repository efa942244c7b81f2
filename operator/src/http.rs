//! The operator's HTTP endpoints: `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::Error;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    /// Set once the CRD check passed and the process is serving (as leader or standby).
    pub ready: Arc<AtomicBool>,
}

pub fn router(h: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(h)
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.metrics.render())
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Binds `addr` and serves until the process ends. Returns the bound address.
pub async fn serve(addr: SocketAddr, h: Health) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Http { addr: addr.to_string(), source })?;
    let bound = listener.local_addr().map_err(|source| Error::Http { addr: addr.to_string(), source })?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(h)).await {
            tracing::error!("HTTP server stopped: {e}");
        }
    });
    Ok((bound, task))
}
