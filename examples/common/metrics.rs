//! How the example servers show their metrics: a Prometheus recorder
//! (`metrics-exporter-prometheus`, no HTTP listener of its own) installed for the
//! process, rendered as Prometheus text at `GET /metrics` of the app's own router.
//! Included by path (`#[path = "common/metrics.rs"] mod metrics;`).
//!
//! idemkey emits its metrics (`idemkey::telemetry`) when built with its `metrics`
//! feature: `cargo run --features metrics --example charge_server -- ...`. Without it
//! the page says so, and holds nothing of idemkey's.

use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// How often histograms are drained in the background (the exporter leaves it to us).
const UPKEEP: Duration = Duration::from_secs(5);

/// The line the page starts with when idemkey emits nothing.
const WITHOUT_FEATURE: &str =
    "# idemkey was built without its `metrics` feature: run with `--features metrics`\n";

/// Installs the Prometheus recorder for the process and returns the route that renders
/// it: `GET /metrics`. Call it once, inside the tokio runtime.
pub(crate) fn install() -> Result<Router, String> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the Prometheus recorder: {e}"))?;
    #[cfg(feature = "metrics")]
    idemkey::telemetry::describe_metrics();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP).await;
            upkeep.run_upkeep();
        }
    });
    Ok(Router::new().route("/metrics", get(move || render(handle.clone()))))
}

async fn render(handle: PrometheusHandle) -> ([(header::HeaderName, &'static str); 1], String) {
    let mut page = String::new();
    if !cfg!(feature = "metrics") {
        page.push_str(WITHOUT_FEATURE);
    }
    page.push_str(&handle.render());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        page,
    )
}
