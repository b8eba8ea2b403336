//! [`IdempotencyLayer`]: the verifier's configuration, applied to a service.

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, StatusCode, header};
use tower_layer::Layer;
use tracing::Level;

use super::config::{Config, KeyRequirement, default_requirement};
use super::service::Idempotency;
use crate::engine::Engine;
use crate::extract::{DialectKey, ExtractKey, ExtractScope, HeaderKey, Unscoped};
use crate::fingerprint::Fingerprinter;
use crate::policy::{InProgressPolicy, OutcomePolicy, Quota};
use idemkey_core::protocol::problem::KEY_REUSED_STRIPE_STATUS;
use idemkey_core::protocol::status::is_safe;
use idemkey_core::protocol::{Dialect, ReplayHeader};

/// Applies the verifier to a service: every keyed request runs at most once; retries get
/// the stored response.
///
/// Per request, the layer:
///
/// 1. decides whether a key is required ([`IdempotencyLayer::require`]; by default
///    required on every method but `GET`, `HEAD`, `OPTIONS` and `TRACE`, on which the
///    layer steps aside),
/// 2. judges a key that comes from the head ([`ExtractKey::needs_body`]; a header, by
///    default) before reading the body: `400 missing-key` / `400 invalid-key` at once,
///    without a `100 Continue`,
/// 3. buffers the body up to [`IdempotencyLayer::body_limit`] (`413` beyond), within
///    [`IdempotencyLayer::body_read_timeout`] when set (`408` beyond),
/// 4. extracts a key or scope that needs the body ([`ExtractKey`], [`ExtractScope`]),
///    fingerprints the request ([`Fingerprinter`]),
/// 5. claims the key: a completed key is replayed (same status, headers, body bytes
///    and trailers, plus `Idempotent-Replayed: true`), a key of another request gets
///    `422`, a running one `409` with `Retry-After` (or, with
///    [`IdempotencyLayer::in_progress`], waits for its answer first), a failing store
///    `503` with `Retry-After`, a new key from a scope over its
///    [quota](IdempotencyLayer::quota) `429` with `Retry-After`,
/// 6. runs the inner service while renewing the lease, in place; if the caller goes
///    away (hyper drops the response future), the rest moves **to a spawned task**, so
///    a client that disconnects does not cancel the handler: its response is still
///    recorded and the retry receives the replay,
/// 7. stores the response if the [`OutcomePolicy`] says so (headers minus hop-by-hop
///    ones and the deny-list, `Set-Cookie` by default; body; trailers), or releases
///    the key. A body the handler has at once is recorded before the caller is
///    answered; a body that streams goes to the caller frame by frame while a copy (up
///    to [`IdempotencyLayer::stored_response_limit`]) goes to the record, completed
///    before the caller sees the end of the stream. A stream that fails midway releases
///    the key; a caller that leaves mid-stream does not stop it (the rest is read and
///    recorded in a spawned task).
///
/// # gRPC
///
/// A request with `Content-Type: application/grpc*` is a gRPC call: its key is the
/// `idempotency-key` metadata (the header), its outcome is judged by its `grpc-status`
/// (the HTTP status `google.rpc.Code` gives as its equivalent: `UNAVAILABLE` releases
/// the key like a 503, `OK` and `ALREADY_EXISTS` are stored), and the layer's own
/// answers are gRPC statuses
/// ([`Rejection::into_grpc_response`](crate::Rejection::into_grpc_response)).
/// Serve the layer over
/// HTTP/2 (hyper's `http2` builder, or `axum::serve` with axum's `http2` feature).
/// The request is buffered like any other (up to [`IdempotencyLayer::body_limit`]), so
/// the layer fits unary and server-streaming calls; a server stream is teed like any
/// streamed body.
///
/// # When the store fails after the handler answered
///
/// The response is recorded before the caller gets it (its end, for a stream) whenever
/// the store answers. If
/// the store is unavailable then, the caller gets its response **at once** and the
/// outcome moves to a background task that keeps trying (a pause doubling up to 1 s,
/// for up to the retention; [`Execution::complete_or_defer`](crate::Execution::complete_or_defer)):
/// a store outage of minutes does not hold responses for minutes, and the outcome is
/// recorded once the store is back, even after the lease ended, as long as nobody took
/// the key over. Until then duplicates get `409 in-progress` while the lease lasts, and
/// `503` while the store is down.
///
/// What remains: a retry that arrives **after the lease ended and before the outcome is
/// recorded** (the store still down, or back for less than a pause) takes the key over
/// and runs the handler again (the late outcome is then fenced, never written over the
/// new one). To narrow that window, give the engine a longer
/// [lease](crate::EngineBuilder::lease) (a crashed process then blocks its keys
/// longer too), or let duplicates wait for the first answer. Before a process exits,
/// [`Engine::wait_for_recordings`] lets the background recordings end.
///
/// The inner service receives [`RequestBody`](crate::body::RequestBody) (the buffered
/// bytes, or the untouched body where the layer stepped aside) and the caller receives
/// [`ResponseBody`](crate::body::ResponseBody). Both implement `http_body::Body`, so
/// the layer fits axum and plain hyper/tower alike.
///
/// ```
/// use axum::{Router, routing::post};
/// use idemkey::server::{Engine, IdempotencyLayer, extract::HeaderScope};
/// use idemkey::store::MemoryStore;
///
/// let verifier = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
///     .scope(HeaderScope::new(http::header::AUTHORIZATION));
/// let app: Router = Router::new()
///     .route("/v1/charges", post(|| async { "charged" }))
///     .layer(verifier);
/// # let _ = app;
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    cfg: Arc<Config>,
}

/// The defaults of the layer's limits.
impl IdempotencyLayer {
    /// Default limit of a buffered request body: 2 MiB, like axum's.
    pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;
    /// Default limit of a stored response body: 1 MiB.
    pub const DEFAULT_STORED_RESPONSE_LIMIT: usize = 1024 * 1024;
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("engine", &self.cfg.engine)
            .field("fingerprinter", &self.cfg.fingerprinter)
            .field("body_limit", &self.cfg.body_limit)
            .field("body_read_timeout", &self.cfg.body_read_timeout)
            .field("stored_response_limit", &self.cfg.stored_response_limit)
            .field("in_progress", &self.cfg.in_progress)
            .field("deny", &self.cfg.deny)
            .field("key_reused_status", &self.cfg.key_reused_status)
            .field("replay_header", &self.cfg.replay_header)
            .field("dialect", &self.cfg.dialect.id())
            .field("span_level", &self.cfg.span_level)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer over `engine`, with the `Idempotency-Key` header, no scope, the default
    /// fingerprint and outcome policy, keys required on unsafe methods, `422` on a
    /// reused key.
    #[must_use]
    pub fn new(engine: Engine) -> Self {
        Self {
            cfg: Arc::new(Config {
                engine,
                key: Arc::new(HeaderKey::default()),
                scope: Arc::new(Unscoped),
                requirement: Arc::new(default_requirement),
                fingerprinter: Fingerprinter::new(),
                policy: OutcomePolicy::default(),
                in_progress: InProgressPolicy::default(),
                body_limit: IdempotencyLayer::DEFAULT_BODY_LIMIT,
                body_read_timeout: None,
                stored_response_limit: IdempotencyLayer::DEFAULT_STORED_RESPONSE_LIMIT,
                deny: vec![header::SET_COOKIE],
                key_reused_status: None,
                replay_header: Some(ReplayHeader::default()),
                dialect: Dialect::standard(),
                span_level: Level::DEBUG,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.cfg));
        self
    }

    /// Where the key comes from (default: the `Idempotency-Key` header).
    #[must_use]
    pub fn key(self, extractor: impl ExtractKey) -> Self {
        self.with(|c| c.key = Arc::new(extractor))
    }

    /// The key from header `name`: a [`KeyHeader`](idemkey_core::protocol::KeyHeader) (the
    /// vendor variants, as the client's `IdempotentClientBuilder::key_header` takes them) or any
    /// [`HeaderName`]. Short for `.key(HeaderKey::new(name))`.
    ///
    /// ```
    /// use idemkey::protocol::KeyHeader;
    /// use idemkey::server::{Engine, IdempotencyLayer};
    /// use idemkey::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
    ///     .key_header(KeyHeader::XIdempotencyKey);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn key_header(self, name: impl Into<HeaderName>) -> Self {
        self.key(HeaderKey::new(name))
    }

    /// Where the scope comes from (default: one unscoped space).
    #[must_use]
    pub fn scope(self, extractor: impl ExtractScope) -> Self {
        self.with(|c| c.scope = Arc::new(extractor))
    }

    /// Whether requests with unsafe methods must carry a key (default
    /// [`KeyRequirement::Required`]); safe methods stay [`KeyRequirement::Off`].
    #[must_use]
    pub fn require(self, requirement: KeyRequirement) -> Self {
        self.requirement_by(move |parts| {
            if is_safe(&parts.method) {
                KeyRequirement::Off
            } else {
                requirement
            }
        })
    }

    /// Decide the requirement per request (by path, method, header).
    ///
    /// ```
    /// use idemkey::server::{Engine, IdempotencyLayer, policy::KeyRequirement};
    /// use idemkey::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
    ///     .requirement_by(|parts| match parts.uri.path() {
    ///         p if p.starts_with("/v1/charges") => KeyRequirement::Required,
    ///         "/v1/search" => KeyRequirement::Off,
    ///         _ => KeyRequirement::Optional,
    ///     });
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn requirement_by(
        self,
        f: impl Fn(&Parts) -> KeyRequirement + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| c.requirement = Arc::new(f))
    }

    /// What makes two requests the same (default: method, path and query,
    /// `Content-Type`, raw body).
    ///
    /// The path is the one this layer sees. Inside an axum `Router::nest`, axum strips
    /// the prefix first, so a layer (and store) shared by two mounts of one router
    /// (`/v1` and `/v2`) sees `POST /charges` for both: apply the layer outside the
    /// `nest`, or give each mount its own scope, or the same key on the other mount
    /// gets the first mount's response replayed.
    #[must_use]
    pub fn fingerprinter(self, fingerprinter: Fingerprinter) -> Self {
        self.with(|c| c.fingerprinter = fingerprinter)
    }

    /// Which responses are stored (default: 2xx, 3xx and the 4xx a handler gives after
    /// judging the request; 5xx, 408, 429 and the answers that refuse a request as sent,
    /// such as 404 and 405, release the key: see [`OutcomePolicy`]).
    #[must_use]
    pub fn policy(self, policy: OutcomePolicy) -> Self {
        self.with(|c| c.policy = policy)
    }

    /// What a duplicate of a running request gets (default
    /// [`InProgressPolicy::Reject`]: `409 in-progress` at once); with
    /// [`InProgressPolicy::Wait`] it waits for the running request's answer.
    #[must_use]
    pub fn in_progress(self, policy: InProgressPolicy) -> Self {
        self.with(|c| c.in_progress = policy)
    }

    /// The largest request body buffered (default 2 MiB); larger ones get `413`.
    #[must_use]
    pub fn body_limit(self, bytes: usize) -> Self {
        self.with(|c| c.body_limit = bytes)
    }

    /// How long the whole request body may take to arrive (default: no limit of the
    /// layer's own). A body that has not arrived by then (shorter than its
    /// `Content-Length`, or a sender that stalled) gets
    /// `408 body-timeout` with `Connection: close`; the key is not claimed, so the
    /// request can be sent again with it.
    ///
    /// The timer runs from the moment the layer starts reading the body, after the head
    /// was read; the server in front should bound the head too (hyper's
    /// `http1::Builder::header_read_timeout`, which `axum::serve` leaves unset).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemkey::server::{Engine, IdempotencyLayer};
    /// use idemkey::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
    ///     .body_read_timeout(Duration::from_secs(30));
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn body_read_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.body_read_timeout = Some(timeout))
    }

    /// The largest response body stored (default 1 MiB). A larger response is still
    /// sent to its caller; the key stays completed, and retries get
    /// `410 response-not-stored` instead of a second execution.
    #[must_use]
    pub fn stored_response_limit(self, bytes: usize) -> Self {
        self.with(|c| c.stored_response_limit = bytes)
    }

    /// Also leave header `name` out of stored responses (`Set-Cookie` is left out by
    /// default; hop-by-hop headers always are).
    #[must_use]
    pub fn deny_header(self, name: HeaderName) -> Self {
        self.with(|c| {
            if !c.deny.contains(&name) {
                c.deny.push(name);
            }
        })
    }

    /// Replace the deny-list (an empty list stores `Set-Cookie` too).
    #[must_use]
    pub fn deny_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.with(|c| c.deny = names.into_iter().collect())
    }

    /// Keep records of this layer for `retention` instead of the engine's default
    /// (7 days for webhooks, say).
    ///
    /// The layer then runs on an engine derived from the one it was given (same store,
    /// lease and settings) with this retention, so that every claim asks the store for
    /// the retention its record will really get: an abandoned claim is kept as long
    /// (see [`ClaimRequest::retention`](crate::store::ClaimRequest::retention)), and so
    /// is the time the engine goes on trying to record an outcome through a store
    /// outage. [`IdempotencyLayer::engine`] returns the derived engine.
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        self.with(|c| c.engine = c.engine.to_builder().retention(retention).build())
    }

    /// A quota of new keys per scope (the layer's [scope](IdempotencyLayer::scope):
    /// tenant, API key, webhook sender) for this layer: a scope over it gets
    /// `429 quota-exceeded` with `Retry-After` for a key that has no record, and nothing
    /// is recorded, so the same key after the wait runs normally; replays and
    /// in-progress answers spend nothing and are served as usual.
    ///
    /// The layer then runs on an engine derived from the one it was given (same store
    /// and settings, as with [`IdempotencyLayer::retention`]) with buckets of its own.
    /// To share one quota between the layer, [`Engine::once`] and webhooks, give it to
    /// the engine instead ([`EngineBuilder::quota`](crate::EngineBuilder::quota)). See
    /// [Quotas](crate#quotas) in the guide.
    ///
    /// ```
    /// use idemkey::server::{Engine, IdempotencyLayer, extract::HeaderScope, policy::Quota};
    /// use idemkey::store::MemoryStore;
    /// # fn main() -> Result<(), idemkey::server::policy::QuotaError> {
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
    ///     .scope(HeaderScope::new(http::header::AUTHORIZATION))
    ///     .quota(Quota::per_second(60)?.burst(300)?.max_in_progress(100)?);
    /// assert_eq!(layer.engine().quota().and_then(|q| q.burst_size()), Some(300));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn quota(self, quota: Quota) -> Self {
        self.with(|c| c.engine = c.engine.to_builder().quota(quota).build())
    }

    /// The status of `key-reused` answers (default: the [dialect](Self::dialect)'s,
    /// `422` in the standard one).
    #[must_use]
    pub fn key_reused_status(self, status: StatusCode) -> Self {
        self.with(|c| c.key_reused_status = Some(status))
    }

    /// A key reused with a different request gets `400` instead of `422`, as Stripe
    /// answers it, still as this crate's `key-reused` problem document (which any
    /// client profile reads). Short for `.key_reused_status(400)`; to answer in all of
    /// Stripe's dialect (its error envelope, `Stripe-Should-Retry`), use
    /// `.dialect(Dialect::stripe())` instead.
    ///
    /// ```
    /// use idemkey::server::{Engine, IdempotencyLayer};
    /// use idemkey::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new())).stripe_compatible();
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn stripe_compatible(self) -> Self {
        self.key_reused_status(KEY_REUSED_STRIPE_STATUS)
    }

    /// Speak a vendor's dialect (default [`Dialect::standard`]): the key is read where
    /// the vendor puts it (a header, or a field of the JSON body, which the layer
    /// buffers anyway) and refused (`invalid-key`) beyond the vendor's length limit;
    /// replays carry the vendor's marker, or none where it marks none; and a reused
    /// key, a duplicate in progress, a missing or invalid key and an unavailable store
    /// are answered with the vendor's status, error body and retry hints
    /// ([`Dialect::reply`]). A dialect that refuses repeats of a completed request
    /// (GoCardless) answers them with its conflict instead of the stored response.
    /// Every other answer of the verifier stays a problem document, as the client's
    /// profiles expect. gRPC calls are answered with gRPC statuses whatever the
    /// dialect.
    ///
    /// The client's [`VendorProfile`](https://docs.rs/idemkey-client) of the same
    /// vendor is built from the same [`Dialect`], so the two halves agree. Setters
    /// called after this one ([`key`](Self::key), [`key_header`](Self::key_header),
    /// [`replay_header`](Self::replay_header),
    /// [`key_reused_status`](Self::key_reused_status)) override what it set.
    ///
    /// ```
    /// use idemkey::protocol::Dialect;
    /// use idemkey::server::{Engine, IdempotencyLayer};
    /// use idemkey::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
    ///     .dialect(Dialect::square());
    /// assert_eq!(layer.dialect_in_use().id(), "square");
    /// ```
    #[must_use]
    pub fn dialect(self, dialect: Dialect) -> Self {
        self.key(DialectKey::new(&dialect)).with(|c| {
            c.replay_header = dialect.replay_header();
            c.dialect = dialect;
        })
    }

    /// The dialect this layer answers in.
    #[must_use]
    pub fn dialect_in_use(&self) -> &Dialect {
        &self.cfg.dialect
    }

    /// The header replayed responses are marked with: `Idempotent-Replayed: true` (the
    /// default, Stripe's spelling) or `Idempotency-Replayed: true`
    /// ([`ReplayHeader::IdempotencyReplayed`], the spelling clients written for idemkit
    /// or fastapi-idempotency-key expect). This crate's client reads both.
    ///
    /// ```
    /// use idemkey::protocol::ReplayHeader;
    /// use idemkey::server::{Engine, IdempotencyLayer};
    /// use idemkey::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
    ///     .replay_header(ReplayHeader::IdempotencyReplayed);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn replay_header(self, header: ReplayHeader) -> Self {
        self.with(|c| c.replay_header = Some(header))
    }

    /// The level of the `idemkey.request` span each request runs in: [`Level::DEBUG`]
    /// by default, as tower-http's `TraceLayer` makes its request spans, so a service
    /// logging at INFO (`RUST_LOG=info`, the common default) builds no span per request
    /// and pays nothing for it. Set [`Level::INFO`] to see every request's decision at
    /// INFO; its cost is in `BENCHMARKS.md`, "Cost of telemetry". The store spans
    /// (`idemkey.store`) stay at DEBUG. The spans and their fields are listed in
    /// [`idemkey_core::telemetry`].
    ///
    /// ```
    /// use idemkey::server::{Engine, IdempotencyLayer};
    /// use idemkey::store::MemoryStore;
    /// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
    ///     .span_level(tracing::Level::INFO);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn span_level(self, level: Level) -> Self {
        self.with(|c| c.span_level = level)
    }

    /// The engine this layer runs on.
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.cfg.engine
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, self.cfg.clone())
    }
}
