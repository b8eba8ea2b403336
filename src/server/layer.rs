//! The tower layer: [`IdempotencyLayer`], [`Idempotency`] (the service) and
//! [`ResponseFuture`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_layer::Layer;
use tower_service::Service;

use super::body::{BoxError, RequestBody, ResponseBody};
use super::engine::{Begin, Engine, Execution};
use super::extract::{ExtractKey, ExtractScope, HeaderKey, Unscoped};
use super::policy::{Outcome, OutcomePolicy};
use super::record::Record;
use super::rejection::Rejection;
use crate::fingerprint::Fingerprinter;
use crate::protocol::headers::IDEMPOTENT_REPLAYED;
use crate::protocol::status::is_safe;

/// Default limit of a buffered request body: 2 MiB, like axum's.
pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;
/// Default limit of a stored response body: 1 MiB.
pub const DEFAULT_STORED_RESPONSE_LIMIT: usize = 1024 * 1024;

/// Whether a request must carry a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRequirement {
    /// No key: `400 missing-key`.
    Required,
    /// No key: the handler runs unguarded, like a request without the layer.
    Optional,
    /// The layer steps aside: the body is not buffered, no key is looked for.
    Off,
}

type RequirementFn = dyn Fn(&Parts) -> KeyRequirement + Send + Sync;

#[derive(Clone)]
struct Config {
    engine: Engine,
    key: Arc<dyn ExtractKey>,
    scope: Arc<dyn ExtractScope>,
    requirement: Arc<RequirementFn>,
    fingerprinter: Fingerprinter,
    policy: OutcomePolicy,
    body_limit: usize,
    stored_response_limit: usize,
    deny: Vec<HeaderName>,
    retention: Option<Duration>,
}

/// Applies the verifier to a service: every keyed request runs at most once; retries get
/// the stored response.
///
/// Per request, the layer:
///
/// 1. decides whether a key is required ([`IdempotencyLayer::require`]; by default
///    required on every method but `GET`, `HEAD`, `OPTIONS` and `TRACE`, on which the
///    layer steps aside),
/// 2. buffers the body up to [`IdempotencyLayer::body_limit`] (`413` beyond),
/// 3. extracts the key ([`ExtractKey`]; `400 missing-key` / `400 invalid-key`) and the
///    scope ([`ExtractScope`]), fingerprints the request ([`Fingerprinter`]),
/// 4. claims the key: a completed key is replayed (same status, headers and body bytes,
///    plus `Idempotent-Replayed: true`), a key of another request gets `422`, a running
///    one `409` with `Retry-After`, a failing store `503` with `Retry-After`,
/// 5. runs the inner service while renewing the lease, in place; if the caller goes
///    away (hyper drops the response future), the rest moves **to a spawned task**, so
///    a client that disconnects does not cancel the handler: its response is still
///    recorded and the retry receives the replay,
/// 6. stores the response if the [`OutcomePolicy`] says so (headers minus hop-by-hop
///    ones and the deny-list, `Set-Cookie` by default), or releases the key.
///
/// The inner service receives [`RequestBody`] (the buffered bytes, or the untouched body
/// where the layer stepped aside) and the caller receives [`ResponseBody`]. Both
/// implement `http_body::Body`, so the layer fits axum and plain hyper/tower alike.
///
/// ```
/// use axum::{Router, routing::post};
/// use idemkey::server::{Engine, IdempotencyLayer, HeaderScope};
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

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("engine", &self.cfg.engine)
            .field("fingerprinter", &self.cfg.fingerprinter)
            .field("body_limit", &self.cfg.body_limit)
            .field("stored_response_limit", &self.cfg.stored_response_limit)
            .field("deny", &self.cfg.deny)
            .field("retention", &self.cfg.retention)
            .finish_non_exhaustive()
    }
}

fn default_requirement(parts: &Parts) -> KeyRequirement {
    if is_safe(&parts.method) {
        KeyRequirement::Off
    } else {
        KeyRequirement::Required
    }
}

impl IdempotencyLayer {
    /// A layer over `engine`, with the `Idempotency-Key` header, no scope, the default
    /// fingerprint and outcome policy, keys required on unsafe methods.
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
                body_limit: DEFAULT_BODY_LIMIT,
                stored_response_limit: DEFAULT_STORED_RESPONSE_LIMIT,
                deny: vec![header::SET_COOKIE],
                retention: None,
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

    /// The key from header `name` (a vendor variant such as `X-Idempotency-Key`).
    #[must_use]
    pub fn header(self, name: HeaderName) -> Self {
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
    /// use idemkey::server::{Engine, IdempotencyLayer, KeyRequirement};
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

    /// Which responses are stored (default: 2xx, 3xx and 4xx but 408 and 429).
    #[must_use]
    pub fn policy(self, policy: OutcomePolicy) -> Self {
        self.with(|c| c.policy = policy)
    }

    /// The largest request body buffered (default 2 MiB); larger ones get `413`.
    #[must_use]
    pub fn body_limit(self, bytes: usize) -> Self {
        self.with(|c| c.body_limit = bytes)
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
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        self.with(|c| c.retention = Some(retention))
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
        Idempotency {
            inner,
            cfg: self.cfg.clone(),
        }
    }
}

/// The service made by [`IdempotencyLayer`].
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    cfg: Arc<Config>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, E>> + Send>>;

/// The response future of [`Idempotency`].
pub struct ResponseFuture<E> {
    inner: BoxFuture<E>,
}

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<ResponseBody>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<S, B, ResB> Service<Request<B>> for Idempotency<S>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The ready service goes with this request; a clone stays for the next one.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            inner: Box::pin(handle(self.cfg.clone(), inner, req)),
        }
    }
}

async fn handle<S, B, ResB>(
    cfg: Arc<Config>,
    mut inner: S,
    req: Request<B>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let requirement = (cfg.requirement)(&parts);
    if requirement == KeyRequirement::Off {
        let req = Request::from_parts(parts, RequestBody::passthrough(body));
        return Ok(inner.call(req).await?.map(ResponseBody::wrap));
    }

    let bytes = match read_body(&parts, body, cfg.body_limit).await {
        Ok(b) => b,
        Err(rejection) => return Ok(rejection.into_response()),
    };
    let key = match cfg.key.extract_key(&parts, &bytes) {
        Ok(Some(k)) => k,
        Ok(None) if requirement == KeyRequirement::Required => {
            return Ok(Rejection::missing_key(&cfg.key.describe()).into_response());
        }
        Ok(None) => {
            let req = Request::from_parts(parts, RequestBody::buffered(bytes));
            return Ok(inner.call(req).await?.map(ResponseBody::wrap));
        }
        Err(rejection) => return Ok(rejection.into_response()),
    };
    let scope = match cfg.scope.extract_scope(&parts, &bytes) {
        Ok(s) => s,
        Err(rejection) => return Ok(rejection.into_response()),
    };
    let fingerprint = cfg.fingerprinter.fingerprint_parts(&parts, &bytes);
    let begin = match cfg.engine.begin(&scope, &key, &fingerprint).await {
        Ok(b) => b,
        Err(rejection) => return Ok(rejection.into_response()),
    };
    let req = Request::from_parts(parts, RequestBody::buffered(bytes));
    match begin {
        Begin::Replay(payload) => Ok(replay(payload, cfg.stored_response_limit)),
        Begin::Unguarded => Ok(inner.call(req).await?.map(ResponseBody::wrap)),
        Begin::Execute(mut exec) => {
            if let Some(r) = cfg.retention {
                exec.set_retention(r);
            }
            // Polled in place; if the caller goes away (hyper drops this future), the
            // rest moves to a spawned task, so the handler still finishes and its
            // outcome is recorded.
            DetachOnDrop(Some(Box::pin(execute(cfg, inner, req, exec)))).await
        }
    }
}

/// Polls a future in place, and hands it to a spawned task if dropped before it ends.
///
/// Spawning every execution would cost a task and a cross-thread wake-up per request;
/// this costs one only for the requests whose caller went away.
struct DetachOnDrop<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F> Future for DetachOnDrop<F>
where
    F: Future + Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Held outside `self` while polled: if the handler panics, the unwinding drops
        // it here (its execution releases the key) instead of leaving a poisoned future
        // for `drop` to spawn, which would panic again ("`async fn` resumed after
        // panicking") on a runtime thread.
        let Some(mut fut) = self.0.take() else {
            return Poll::Pending; // never polled again after Ready
        };
        let out = fut.as_mut().poll(cx);
        if out.is_pending() {
            self.0 = Some(fut);
        }
        out
    }
}

impl<F> Drop for DetachOnDrop<F>
where
    F: Future + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(fut) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        let _ = fut.await;
                    });
                }
                // No runtime: the execution's drop releases the key instead.
                Err(_) => drop(fut),
            }
        }
    }
}

async fn read_body<B>(parts: &Parts, body: B, limit: usize) -> Result<Bytes, Rejection>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Rejection::body_too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Rejection::body_too_large(limit)),
        Err(e) => Err(Rejection::body_unreadable(e)),
    }
}

fn replay(payload: Bytes, limit: usize) -> Response<ResponseBody> {
    match Record::decode(payload) {
        Ok(Record::Response {
            status,
            headers,
            body,
        }) => {
            let mut resp = Response::new(ResponseBody::full(body));
            *resp.status_mut() = status;
            *resp.headers_mut() = headers;
            resp.headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            resp
        }
        Ok(Record::TooLarge { size_at_least, .. }) => {
            Rejection::response_not_stored(size_at_least, limit).into_response()
        }
        Ok(Record::Value(_)) => {
            Rejection::record_unreadable("the record holds a function result, not a response")
                .into_response()
        }
        Err(why) => Rejection::record_unreadable(why).into_response(),
    }
}

async fn execute<S, B, ResB>(
    cfg: Arc<Config>,
    mut inner: S,
    req: Request<RequestBody<B>>,
    mut exec: Execution,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let resp = match exec.run(inner.call(req)).await {
        Ok(r) => r,
        Err(e) => {
            finish(exec.release().await, "release");
            return Err(e);
        }
    };
    let (parts, body) = resp.into_parts();
    if cfg.policy.decide(parts.status) == Outcome::Release {
        finish(exec.release().await, "release");
        return Ok(Response::from_parts(parts, ResponseBody::wrap(body)));
    }
    match exec
        .run(read_limited(Box::pin(body), cfg.stored_response_limit))
        .await
    {
        Collected::Full(bytes) => {
            let record = Record::Response {
                status: parts.status,
                headers: storable_headers(&parts.headers, &cfg.deny),
                body: bytes.clone(),
            };
            finish(exec.complete(record.encode()).await, "complete");
            Ok(Response::from_parts(parts, ResponseBody::full(bytes)))
        }
        Collected::TooLarge(prefix, rest) => {
            let record = Record::TooLarge {
                status: parts.status,
                size_at_least: prefix.len() as u64,
            };
            tracing::warn!(
                limit = cfg.stored_response_limit,
                "response too large to store; retries will get 410 response-not-stored"
            );
            finish(exec.complete(record.encode()).await, "complete");
            Ok(Response::from_parts(
                parts,
                ResponseBody::chain(prefix, rest),
            ))
        }
        Collected::Failed(e) => {
            finish(exec.release().await, "release");
            Ok(Rejection::response_failed(e).into_response())
        }
    }
}

fn finish(result: Result<(), crate::store::StoreError>, what: &str) {
    match result {
        Ok(()) => {}
        Err(e) if e.is_fenced() => tracing::warn!(
            "could not {what} the key: another request took it over after this one's lease expired; its outcome wins"
        ),
        Err(e) => tracing::warn!(error = %e, "could not {what} the key; its lease will expire"),
    }
}

enum Collected<B> {
    Full(Bytes),
    TooLarge(Bytes, B),
    Failed(BoxError),
}

/// Reads `body` up to `limit` bytes; beyond, hands back what was read and the rest.
async fn read_limited<B>(mut body: B, limit: usize) -> Collected<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut buf = BytesMut::new();
    let mut single: Option<Bytes> = None;
    loop {
        match body.frame().await {
            None => {
                return Collected::Full(match single {
                    Some(b) if buf.is_empty() => b,
                    _ => buf.freeze(),
                });
            }
            Some(Err(e)) => return Collected::Failed(e.into()),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers are not stored
                };
                let held = single.as_ref().map_or(0, Bytes::len) + buf.len();
                if held + data.len() > limit {
                    if let Some(s) = single.take() {
                        buf.extend_from_slice(&s);
                    }
                    buf.extend_from_slice(&data);
                    return Collected::TooLarge(buf.freeze(), body);
                }
                // The common case, one data frame, is kept without copying.
                match single.take() {
                    None if buf.is_empty() => single = Some(data),
                    prev => {
                        if let Some(p) = prev {
                            buf.extend_from_slice(&p);
                        }
                        buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// Hop-by-hop headers (RFC 9110 7.6.1) and the length/encoding framing that the server
/// recomputes; never stored.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn storable_headers(headers: &HeaderMap, deny: &[HeaderName]) -> HeaderMap {
    let named_by_connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let drop = HOP_BY_HOP.contains(name)
            || name == header::CONTENT_LENGTH
            || deny.contains(name)
            || named_by_connection.iter().any(|n| n == name.as_str());
        if !drop {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    #[test]
    fn hop_by_hop_framing_and_denied_headers_are_not_stored() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "close, x-private"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-length", "12"),
            ("x-private", "named by Connection"),
            ("set-cookie", "s=1"),
            ("x-request-id", "r-1"),
            ("content-type", "application/json"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let kept = storable_headers(&h, &[header::SET_COOKIE]);
        let names: Vec<_> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-request-id", "content-type"]);
    }

    fn frames(parts: &[&'static [u8]]) -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        let v: Vec<_> = parts
            .iter()
            .map(|p| Ok(http_body::Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(v))
    }

    #[tokio::test]
    async fn bodies_within_the_limit_are_buffered_whole() {
        match read_limited(frames(&[b"ab", b"cd", b"e"]), 5).await {
            Collected::Full(b) => assert_eq!(b, "abcde"),
            _ => panic!("fits"),
        }
    }

    #[tokio::test]
    async fn larger_bodies_hand_back_what_was_read_and_the_rest() {
        match read_limited(frames(&[b"ab", b"cd", b"ef", b"gh"]), 5).await {
            Collected::TooLarge(prefix, rest) => {
                assert_eq!(prefix, "abcdef");
                let tail = rest.collect().await.map(|c| c.to_bytes());
                assert_eq!(tail.ok(), Some(Bytes::from_static(b"gh")));
            }
            _ => panic!("too large"),
        }
    }
}
