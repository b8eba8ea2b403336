//! The verifier's spans and metrics (see [`idemkey_core::telemetry`] for the names): the
//! decision of each request, recorded in one place, and a child span for each store
//! operation, wrapped once around the engine's store.
//!
//! The metric handles are resolved once per engine ([`ServerMetrics`]), not per
//! request: a request's hot path only increments a counter or records a sample.

// Without the `metrics` feature the handles are compiled out and the emitters take
// their values for nothing.
#![cfg_attr(not(feature = "metrics"), allow(unused_variables))]

use std::future::{Future, ready};
use std::sync::Arc;
#[cfg(feature = "metrics")]
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::Either;
use http::Method;
use tracing::field::Empty;
use tracing::{Instrument, Level, Span};

use crate::store::{
    ChargedClaim, Claim, ClaimRequest, FencingToken, QuotaCharge, RecordId, RecordInfo, Store,
    StoreError, Watch,
};
use idemkey_core::telemetry::{self, Stopwatch, any_span_observable, in_span, observable};

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
    InProgress,
    /// The key is held or completed with another fingerprint: `key-reused`.
    KeyReused,
    /// Answered before any claim: missing or invalid key or scope, body too large,
    /// unreadable or late.
    Rejected,
    /// The store failed and the engine fails open: the handler runs unguarded.
    FailOpen,
    /// The store failed and the engine fails closed: `503 store-unavailable`.
    StoreUnavailable,
    /// The store is at its bound and refused a new key: `503 store-full`.
    StoreFull,
    /// No key, and none required (or a method the layer steps aside for): passed
    /// through.
    Unkeyed,
    /// The scope is over its quota of new keys (or of claims in progress):
    /// `429 quota-exceeded`, nothing recorded.
    QuotaExceeded,
}

impl Decision {
    /// Every decision, in declaration order (its slot in [`ServerMetrics`]).
    #[cfg(feature = "metrics")]
    const ALL: [Self; 11] = [
        Self::Fresh,
        Self::Takeover,
        Self::Replay,
        Self::InProgress,
        Self::KeyReused,
        Self::Rejected,
        Self::FailOpen,
        Self::StoreUnavailable,
        Self::StoreFull,
        Self::Unkeyed,
        Self::QuotaExceeded,
    ];

    /// The decision's fixed name.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Takeover => "takeover",
            Self::Replay => "replay",
            Self::InProgress => "in_progress",
            Self::KeyReused => "key_reused",
            Self::Rejected => "rejected",
            Self::FailOpen => "fail_open",
            Self::StoreUnavailable => "store_unavailable",
            Self::StoreFull => "store_full",
            Self::Unkeyed => "unkeyed",
            Self::QuotaExceeded => "quota_exceeded",
        }
    }

    /// The decision an [`Engine`](super::Engine) claim came to.
    pub(crate) fn of(claimed: &Result<super::Claimed, super::ClaimError>) -> Self {
        use super::Claimed;
        match claimed {
            Ok(Claimed::Execute(exec)) if exec.is_takeover() => Self::Takeover,
            Ok(Claimed::Execute(_)) => Self::Fresh,
            Ok(Claimed::Replay(_)) => Self::Replay,
            Ok(Claimed::InProgress { .. }) => Self::InProgress,
            Ok(Claimed::KeyReused) => Self::KeyReused,
            Ok(Claimed::Unguarded) => Self::FailOpen,
            Ok(Claimed::QuotaExceeded { .. }) => Self::QuotaExceeded,
            Err(e) if e.is_store_full() => Self::StoreFull,
            Err(_) => Self::StoreUnavailable,
        }
    }

    /// Records the decision: on the current span (the request's, where the layer opened
    /// one, which it does only when something can see it; or the caller's, at whatever
    /// level) and in the requests counter of `metrics`.
    pub(crate) fn record(self, metrics: &ServerMetrics) {
        metrics.request(self);
        if any_span_observable() {
            Span::current().record("idemkey.decision", self.as_str());
        }
    }
}

/// How a claimed execution ended: the `outcome` label of
/// `idemkey_server_executions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    Recorded,
    Deferred,
    Released,
    Fenced,
    Failed,
    Abandoned,
}

impl Ended {
    /// Every outcome, in declaration order (its slot in [`ServerMetrics`]).
    #[cfg(feature = "metrics")]
    const ALL: [Self; 6] = [
        Self::Recorded,
        Self::Deferred,
        Self::Released,
        Self::Fenced,
        Self::Failed,
        Self::Abandoned,
    ];

    /// The outcome's fixed name.
    #[cfg(feature = "metrics")]
    const fn as_str(self) -> &'static str {
        match self {
            Self::Recorded => "recorded",
            Self::Deferred => "deferred",
            Self::Released => "released",
            Self::Fenced => "fenced",
            Self::Failed => "failed",
            Self::Abandoned => "abandoned",
        }
    }
}

/// A store operation [`ObservedStore`] observes: the `operation` label of the store
/// metrics and `idemkey.store.operation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Claim,
    Complete,
    Renew,
    Release,
    Sweep,
    Inspect,
    ForceRelease,
    ListInProgress,
}

impl Operation {
    /// Every operation, in declaration order (its slot in [`ServerMetrics`]).
    #[cfg(feature = "metrics")]
    const ALL: [Self; 8] = [
        Self::Claim,
        Self::Complete,
        Self::Renew,
        Self::Release,
        Self::Sweep,
        Self::Inspect,
        Self::ForceRelease,
        Self::ListInProgress,
    ];

    /// The operation's fixed name.
    const fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Complete => "complete",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Sweep => "sweep",
            Self::Inspect => "inspect",
            Self::ForceRelease => "force_release",
            Self::ListInProgress => "list_in_progress",
        }
    }
}

/// An engine's metric handles, resolved once: one per label value of each fixed set
/// (decision, outcome, store operation; the store kind is the engine's), each
/// registered in the recorder current at its first use, then only incremented or
/// recorded. Looking a metric up by name and labels costs a key built and hashed and a
/// registry search on every call; a handle is one atomic operation. Rare series (store
/// errors, fenced writes) are still looked up per call. Without the `metrics` feature
/// this is empty.
pub(crate) struct ServerMetrics {
    #[cfg(feature = "metrics")]
    store: &'static str,
    #[cfg(feature = "metrics")]
    requests: [OnceLock<metrics::Counter>; Decision::ALL.len()],
    #[cfg(feature = "metrics")]
    executions: [OnceLock<metrics::Counter>; Ended::ALL.len()],
    #[cfg(feature = "metrics")]
    handler_duration: OnceLock<metrics::Histogram>,
    #[cfg(feature = "metrics")]
    stored_bytes: OnceLock<metrics::Histogram>,
    #[cfg(feature = "metrics")]
    store_duration: [OnceLock<metrics::Histogram>; Operation::ALL.len()],
}

impl ServerMetrics {
    /// The handles of an engine over a store of `kind`, none registered yet (the clock
    /// of their durations readied).
    pub(crate) fn new(kind: &'static str) -> Self {
        Stopwatch::ready();
        Self {
            #[cfg(feature = "metrics")]
            store: kind,
            #[cfg(feature = "metrics")]
            requests: Default::default(),
            #[cfg(feature = "metrics")]
            executions: Default::default(),
            #[cfg(feature = "metrics")]
            handler_duration: OnceLock::new(),
            #[cfg(feature = "metrics")]
            stored_bytes: OnceLock::new(),
            #[cfg(feature = "metrics")]
            store_duration: Default::default(),
        }
    }

    /// One request (or [`Engine::claim`](super::Engine::claim)) decided.
    fn request(&self, decision: Decision) {
        #[cfg(feature = "metrics")]
        self.requests[decision as usize]
            .get_or_init(
                || metrics::counter!(telemetry::SERVER_REQUESTS, "decision" => decision.as_str()),
            )
            .increment(1);
    }

    /// One execution (a claim that ran) ended.
    pub(crate) fn execution(&self, ended: Ended) {
        #[cfg(feature = "metrics")]
        self.executions[ended as usize]
            .get_or_init(
                || metrics::counter!(telemetry::SERVER_EXECUTIONS, "outcome" => ended.as_str()),
            )
            .increment(1);
    }

    /// A handler that [`handler_started`] ended (gave its response head or failed),
    /// timed with the `metrics` feature. Timed around the call that runs the handler,
    /// not by a future wrapped around the handler's (which would be moved once more).
    pub(crate) fn handler_ended(&self, started: Option<Stopwatch>) {
        #[cfg(feature = "metrics")]
        if let Some(started) = started {
            self.handler_duration
                .get_or_init(|| metrics::histogram!(telemetry::SERVER_HANDLER_DURATION))
                .record(started.elapsed().as_secs_f64());
        }
    }

    /// A response of `len` bytes (the encoded record) was stored.
    pub(crate) fn stored_bytes(&self, len: usize) {
        #[cfg(feature = "metrics")]
        self.stored_bytes
            .get_or_init(|| metrics::histogram!(telemetry::SERVER_STORED_BYTES))
            .record(len as f64);
    }

    /// A store operation ended after `took`, failing with `error` (a
    /// `StoreError::kind_name`) or not.
    fn store_operation(&self, operation: Operation, took: Duration, error: Option<&'static str>) {
        #[cfg(feature = "metrics")]
        {
            let store = self.store;
            self.store_duration[operation as usize]
                .get_or_init(|| metrics::histogram!(telemetry::STORE_DURATION, "store" => store, "operation" => operation.as_str()))
                .record(took.as_secs_f64());
            let operation = operation.as_str();
            match error {
                None => {}
                Some("fenced") => {
                    metrics::counter!(telemetry::SERVER_FENCED_WRITES, "operation" => operation)
                        .increment(1);
                }
                Some(error) => {
                    metrics::counter!(telemetry::STORE_ERRORS, "store" => store, "operation" => operation, "error" => error)
                        .increment(1);
                }
            }
        }
    }
}

/// Records the record id on the current span (formatted only if a subscriber wants it;
/// the current span is not even looked up when nothing can see a span).
pub(crate) fn record_id(id: &RecordId) {
    if any_span_observable() {
        Span::current().record("idemkey.record_id", tracing::field::display(id));
    }
}

/// The span of one request through the layer, at `level`
/// ([`IdempotencyLayer::span_level`](crate::IdempotencyLayer::span_level)): [`Span::none`]
/// when nothing can see it (no subscriber whose level filter admits it, no logger).
pub(crate) fn request_span(method: &Method, level: Level) -> Span {
    if !observable(level) {
        return Span::none();
    }
    idemkey_core::span_at!(
        level,
        target: "idemkey::server",
        "idemkey.request",
        http.request.method = method.as_str(),
        idemkey.record_id = Empty,
        idemkey.decision = Empty,
        http.response.status_code = Empty,
    )
}

/// Runs `fut` (the request's pipeline) in `span`, and records the answer's status on it.
/// For a span that something can see: the caller boxes `fut` itself when the span is
/// [`Span::none`].
///
/// A combinator rather than an `async` block: an `async` block would hold `fut` twice
/// (as its capture and as the future it awaits), and the pipeline is the largest future
/// of a request (its box is served from the allocator's per-thread cache only when small).
pub(crate) fn in_request_span<B, E, F>(
    span: Span,
    fut: F,
) -> impl Future<Output = Result<http::Response<B>, E>>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    fut.instrument(span.clone()).inspect(move |result| {
        if let Ok(response) = result {
            span.record("http.response.status_code", response.status().as_u16());
        }
    })
}

/// The start of a handler's run, for [`ServerMetrics::handler_ended`]: a clock reading
/// with the `metrics` feature, none without (then nothing is timed).
pub(crate) fn handler_started() -> Option<Stopwatch> {
    telemetry::METRICS.then(Stopwatch::start)
}

/// The level of the `idemkey.store` spans: below the request span's default (DEBUG), as
/// a request's detail (two store operations per fresh request).
const STORE_SPAN_LEVEL: Level = Level::TRACE;

/// The store an engine is built with, and the same store observed ([`ObservedStore`]),
/// chosen per operation ([`EngineStore::get`]): observed with the `metrics` feature or
/// when something can see a store span, else the store itself, so an operation nobody
/// observes costs no span, no wrapper future and no second boxed future.
#[derive(Clone)]
pub(crate) struct EngineStore(Arc<ObservedStore>);

impl EngineStore {
    /// `store`, observed when observable, feeding `metrics` (the engine's).
    pub(crate) fn new(store: impl Store, metrics: Arc<ServerMetrics>) -> Self {
        Self(Arc::new(ObservedStore {
            inner: Box::new(store),
            metrics,
        }))
    }

    /// Whether store operations are observed now.
    fn observed() -> bool {
        telemetry::METRICS || observable(STORE_SPAN_LEVEL)
    }

    /// The store to run one operation on.
    pub(crate) fn get(&self) -> &dyn Store {
        if Self::observed() {
            &*self.0
        } else {
            self.0.inner()
        }
    }

    /// [`Store::claim`], observed as [`EngineStore::get`] would, without the observed
    /// store's own boxed future (the claim and the complete are on every fresh
    /// request's path), and without the store's either when it answers in process
    /// ([`Store::in_process`]: then [`EngineStore::claim_now`], made at once).
    pub(crate) fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send + 'a {
        match self.claim_now(&req) {
            Some(claimed) => Either::Left(ready(claimed)),
            None => Either::Right(self.maybe_observed(Operation::Claim, self.0.inner().claim(req))),
        }
    }

    /// [`InProcessStore::claim_now`](crate::store::InProcessStore::claim_now), observed as
    /// [`EngineStore::claim`] would observe the claim: `None` for a store that does not
    /// answer in process ([`Store::in_process`]).
    pub(crate) fn claim_now(&self, req: &ClaimRequest<'_>) -> Option<Result<Claim, StoreError>> {
        let now = self.0.inner().in_process()?;
        Some(self.maybe_observed_now(Operation::Claim, || now.claim_now(req)))
    }

    /// [`InProcessStore::complete_now`](crate::store::InProcessStore::complete_now),
    /// observed as [`EngineStore::complete`] would observe it: `None` for a store that
    /// does not answer in process.
    pub(crate) fn complete_now(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: &Bytes,
        retention: Duration,
    ) -> Option<Result<(), StoreError>> {
        let now = self.0.inner().in_process()?;
        Some(self.maybe_observed_now(Operation::Complete, || {
            now.complete_now(id, token, payload.clone(), retention)
        }))
    }

    /// Whether the store answers in process ([`Store::in_process`]).
    pub(crate) fn answers_in_process(&self) -> bool {
        self.0.inner().in_process().is_some()
    }

    /// [`Store::claim_charged`], observed as a claim, as [`EngineStore::claim`].
    pub(crate) fn claim_charged<'a>(
        &'a self,
        req: ClaimRequest<'a>,
        charge: QuotaCharge<'a>,
    ) -> impl Future<Output = Result<ChargedClaim, StoreError>> + Send + 'a {
        self.maybe_observed(Operation::Claim, self.0.inner().claim_charged(req, charge))
    }

    /// [`Store::complete`], as [`EngineStore::claim`] (in process:
    /// [`EngineStore::complete_now`], made at once).
    pub(crate) fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        match self.complete_now(id, token, &payload, retention) {
            Some(completed) => Either::Left(ready(completed)),
            None => Either::Right(self.maybe_observed(
                Operation::Complete,
                self.0.inner().complete(id, token, payload, retention),
            )),
        }
    }

    /// [`EngineStore::maybe_observed`] for an operation answered at once.
    fn maybe_observed_now<T>(
        &self,
        operation: Operation,
        op: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if Self::observed() {
            self.0.observe_now(operation, op)
        } else {
            op()
        }
    }

    /// The inner store's future `fut` for `operation`, observed when [`EngineStore::get`]
    /// would pick the observed store.
    fn maybe_observed<'a, T, F>(
        &'a self,
        operation: Operation,
        fut: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'a
    where
        T: Send + 'a,
        F: Future<Output = Result<T, StoreError>> + Send + 'a,
    {
        if Self::observed() {
            Either::Right(self.0.observe(operation, fut))
        } else {
            Either::Left(fut)
        }
    }
}

/// The engine's store, observed: every operation runs in an `idemkey.store` span (when
/// something can see it) and feeds the store metrics. Wrapped once around the store an
/// engine is built with, so no store has to do it.
struct ObservedStore {
    inner: Box<dyn Store>,
    metrics: Arc<ServerMetrics>,
}

impl ObservedStore {
    /// The store observed, called as itself (not through a forwarding impl for `Box`,
    /// which would box each operation's future once more).
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn observe<T>(
        &self,
        operation: Operation,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let watch = self.watch(operation);
        let result = in_span(fut, &watch.span).await;
        self.watched(watch, &result);
        result
    }

    /// [`observe`](Self::observe) for an operation answered at once.
    fn observe_now<T>(
        &self,
        operation: Operation,
        op: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let watch = self.watch(operation);
        let result = watch.span.in_scope(op);
        self.watched(watch, &result);
        result
    }

    /// The span and the clock of one operation, before it runs.
    fn watch(&self, operation: Operation) -> Watched {
        let span = if observable(STORE_SPAN_LEVEL) {
            tracing::span!(
                target: "idemkey::store",
                STORE_SPAN_LEVEL,
                "idemkey.store",
                idemkey.store.kind = self.inner().kind(),
                idemkey.store.operation = operation.as_str(),
                idemkey.store.duration_ms = Empty,
                error.type = Empty,
            )
        } else {
            Span::none()
        };
        let clock = (telemetry::METRICS || !span.is_disabled()).then(Stopwatch::start);
        Watched {
            operation,
            span,
            clock,
        }
    }

    /// Records how an operation watched by [`watch`](Self::watch) went.
    fn watched<T>(&self, watch: Watched, result: &Result<T, StoreError>) {
        let error = result.as_ref().err().map(StoreError::kind_name);
        if let Some(start) = watch.clock {
            let took = start.elapsed();
            self.metrics.store_operation(watch.operation, took, error);
            if !watch.span.is_disabled() {
                watch.span.record("idemkey.store.duration_ms", millis(took));
                if let Some(error) = error {
                    watch.span.record("error.type", error);
                }
            }
        }
    }
}

/// One store operation under way, observed ([`ObservedStore::watch`]).
struct Watched {
    operation: Operation,
    span: Span,
    clock: Option<Stopwatch>,
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[async_trait::async_trait]
impl Store for ObservedStore {
    fn kind(&self) -> &'static str {
        self.inner().kind()
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.observe(Operation::Claim, self.inner().claim(req))
            .await
    }
    async fn claim_charged(
        &self,
        req: ClaimRequest<'_>,
        charge: QuotaCharge<'_>,
    ) -> Result<ChargedClaim, StoreError> {
        self.observe(Operation::Claim, self.inner().claim_charged(req, charge))
            .await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.observe(
            Operation::Complete,
            self.inner().complete(id, token, payload, retention),
        )
        .await
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.observe(Operation::Renew, self.inner().renew(id, token, lease))
            .await
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.observe(Operation::Release, self.inner().release(id, token))
            .await
    }
    async fn sweep(&self) -> Result<u64, StoreError> {
        self.observe(Operation::Sweep, self.inner().sweep()).await
    }
    async fn sweep_pass(
        &self,
        options: &crate::store::SweepOptions,
    ) -> Result<crate::store::SweepReport, StoreError> {
        self.observe(Operation::Sweep, self.inner().sweep_pass(options))
            .await
    }
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        self.observe(Operation::Inspect, self.inner().inspect(id))
            .await
    }
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        self.observe(Operation::ForceRelease, self.inner().force_release(id))
            .await
    }
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        self.observe(
            Operation::ListInProgress,
            self.inner().list_in_progress(limit),
        )
        .await
    }
    // Forwarded unobserved: a watch is a subscription that lives as long as a waiter
    // waits, not an operation with a duration. Without this line the trait's polling
    // default would hide the store's notifications from every waiting duplicate.
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        self.inner().watch(id).await
    }
}
