//! `GET /metrics` of `idemkey proxy` (features `cli` and `metrics`): a Prometheus
//! recorder installed for the process, rendered as Prometheus text on request (no HTTP
//! listener of the exporter's own). The example servers do the same on axum
//! (examples/common/metrics.rs); the few lines are not worth a shared module that would
//! put the exporter into the library.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use idemkey::server::body::ResponseBody;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// How often histograms are drained in the background (the exporter leaves it to us).
const UPKEEP: Duration = Duration::from_secs(5);

/// The path the proxy answers itself; every other path goes to the upstream.
pub(super) const PATH: &str = "/metrics";

/// Installs the Prometheus recorder for the process, with idemkey's descriptions.
/// Call it once, inside the tokio runtime, before the verifier is built, so that
/// whatever it resolves at build time lands in this recorder.
pub(super) fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the Prometheus recorder for GET /metrics: {e}"))?;
    idemkey::telemetry::describe_metrics();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The page: Prometheus text exposition format 0.0.4.
pub(super) fn render(handle: &PrometheusHandle) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(Bytes::from(handle.render())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
