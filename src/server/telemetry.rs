//! The verifier's spans and metrics (see [`crate::telemetry`] for the names): the
//! decision of each request, recorded in one place, and a child span for each store
//! operation, wrapped once around the engine's store.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use crate::store::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, Store, StoreError, Watch,
};
use crate::telemetry;

/// What the verifier decided for a request: the `idemkey.decision` field of its span
/// and the `decision` label of `idemkey_server_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// First request for its key: the handler runs.
    Fresh,
    /// The key's owner had died (lease expired): this request took it over and runs.
    Takeover,
    /// Completed with the same fingerprint: the stored response is replayed.
    Replay,
    /// The first request with this key is still running: `409 in-progress`.
    Conflict,
    /// The key is held or completed with another fingerprint: `key-reused`.
    Mismatch,
    /// Answered before any claim: missing or invalid key or scope, body too large,
    /// unreadable or late.
    Rejected,
    /// The store failed and the engine fails open: the handler runs unguarded.
    FailOpen,
    /// The store failed and the engine fails closed: `503 store-unavailable`.
    StoreUnavailable,
    /// No key, and none required (or a method the layer steps aside for): passed
    /// through.
    Unkeyed,
}

impl Decision {
    /// The decision's fixed name.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Takeover => "takeover",
            Self::Replay => "replay",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Rejected => "rejected",
            Self::FailOpen => "fail_open",
            Self::StoreUnavailable => "store_unavailable",
            Self::Unkeyed => "unkeyed",
        }
    }

    /// The decision an [`Engine`](super::Engine) claim came to.
    pub(crate) fn of(claimed: &Result<super::Claimed, super::ClaimError>) -> Self {
        use super::Claimed;
        match claimed {
            Ok(Claimed::Execute(exec)) if exec.is_takeover() => Self::Takeover,
            Ok(Claimed::Execute(_)) => Self::Fresh,
            Ok(Claimed::Replay(_)) => Self::Replay,
            Ok(Claimed::InProgress { .. }) => Self::Conflict,
            Ok(Claimed::KeyReused) => Self::Mismatch,
            Ok(Claimed::Unguarded) => Self::FailOpen,
            Err(_) => Self::StoreUnavailable,
        }
    }

    /// Records the decision: on the current span (the request's, where the layer opened
    /// one) and in the requests counter.
    pub(crate) fn record(self) {
        telemetry::server_request(self.as_str());
        Span::current().record("idemkey.decision", self.as_str());
    }
}

/// Records the record id on the current span (formatted only if a subscriber wants it).
pub(crate) fn record_id(id: &RecordId) {
    Span::current().record("idemkey.record_id", tracing::field::display(id));
}

/// The span of one request through the layer.
pub(crate) fn request_span(method: &Method) -> Span {
    tracing::info_span!(
        target: "idemkey::server",
        "idemkey.request",
        http.request.method = method.as_str(),
        idemkey.record_id = Empty,
        idemkey.decision = Empty,
        http.response.status_code = Empty,
    )
}

/// Runs `fut` (the request's pipeline) in `span`, and records the answer's status on it.
pub(crate) async fn in_request_span<B, E>(
    span: Span,
    fut: impl Future<Output = Result<http::Response<B>, E>>,
) -> Result<http::Response<B>, E> {
    let result = fut.instrument(span.clone()).await;
    if let Ok(response) = &result {
        span.record("http.response.status_code", response.status().as_u16());
    }
    result
}

/// Runs the handler's future `fut`, timing it for the handler-duration histogram (the
/// clock is read only with the `metrics` feature).
pub(crate) async fn timed_handler<F: Future>(fut: F) -> F::Output {
    let started = telemetry::METRICS.then(Instant::now);
    let out = fut.await;
    if let Some(started) = started {
        telemetry::server_handler_duration(started.elapsed());
    }
    out
}

/// The engine's store, observed: every operation runs in an `idemkey.store` span and
/// feeds the store metrics. Wrapped once around the store an engine is built with, so
/// no store has to do it.
pub(crate) struct ObservedStore<S> {
    inner: S,
}

impl<S: Store> ObservedStore<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self { inner }
    }

    async fn observe<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let kind = self.inner.kind();
        let span = tracing::debug_span!(
            target: "idemkey::store",
            "idemkey.store",
            idemkey.store.kind = kind,
            idemkey.store.operation = operation,
            idemkey.store.duration_ms = Empty,
            error.type = Empty,
        );
        let clock = (telemetry::METRICS || !span.is_disabled()).then(Instant::now);
        let result = fut.instrument(span.clone()).await;
        let error = result.as_ref().err().map(StoreError::kind_name);
        if let Some(start) = clock {
            let took = start.elapsed();
            telemetry::store_operation(kind, operation, took, error);
            if !span.is_disabled() {
                span.record("idemkey.store.duration_ms", millis(took));
                if let Some(error) = error {
                    span.record("error.type", error);
                }
            }
        }
        result
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[async_trait::async_trait]
impl<S: Store> Store for ObservedStore<S> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.observe("claim", self.inner.claim(req)).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.observe(
            "complete",
            self.inner.complete(id, token, payload, retention),
        )
        .await
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.observe("renew", self.inner.renew(id, token, lease))
            .await
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.observe("release", self.inner.release(id, token)).await
    }
    async fn sweep(&self) -> Result<u64, StoreError> {
        self.observe("sweep", self.inner.sweep()).await
    }
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        self.observe("inspect", self.inner.inspect(id)).await
    }
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        self.observe("force_release", self.inner.force_release(id))
            .await
    }
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        self.observe("list_in_progress", self.inner.list_in_progress(limit))
            .await
    }
    // Forwarded unobserved: a watch is a subscription that lives as long as a waiter
    // waits, not an operation with a duration. Without this line the trait's polling
    // default would hide the store's notifications from every waiting duplicate.
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        self.inner.watch(id).await
    }
}
