//! [`Idempotency`], the service: the pipeline every request goes through.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::Either;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::config::{Config, KeyRequirement};
use super::future::{DetachOnDrop, ResponseFuture};
use super::tee::{self, Prefetch, Tee};
use crate::IdempotencyKey;
use crate::body::{self, BoxError, ReadError, RequestBody, ResponseBody};
use crate::engine::Claimed;
use crate::execution::Execution;
use crate::grpc;
use crate::policy::{Disposition, InProgressPolicy};
use crate::rejection::Rejection;
use crate::stored_response;
use crate::telemetry::{self, Decision};

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// ```
/// use idemkey::server::{Engine, IdempotencyLayer};
/// use idemkey::store::MemoryStore;
/// use tower::{Layer, service_fn};
///
/// let inner = service_fn(|_: http::Request<idemkey::server::body::RequestBody<String>>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("charged")))
/// });
/// let mut verified = IdempotencyLayer::new(Engine::new(MemoryStore::new())).layer(inner);
/// let _: &_ = verified.get_ref();
/// let _: &mut _ = verified.get_mut();
/// let _unverified = verified.into_inner();
/// ```
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    cfg: Arc<Config>,
}

impl<S> Idempotency<S> {
    pub(super) fn new(inner: S, cfg: Arc<Config>) -> Self {
        Self { inner, cfg }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, without the verifier.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
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
        let span = telemetry::request_span(req.method(), self.cfg.span_level);
        let (parts, body) = req.into_parts();
        let pipeline = handle(self.cfg.clone(), inner, parts, body);
        if span.is_none() {
            ResponseFuture::new(pipeline)
        } else {
            ResponseFuture::new(telemetry::in_request_span(span, pipeline))
        }
    }
}

/// The pipeline: requirement, body, key, scope, fingerprint, claim, then the handler
/// (or the answer that stands for it).
///
/// The request comes in parts: the future keeps what it is called with for its whole
/// life, so a whole `Request` taken apart inside would be held twice.
#[allow(
    clippy::manual_async_fn,
    reason = "an `async` block holds the arguments once; an `async fn` keeps a second copy of each in its future"
)]
fn handle<S, B, ResB>(
    cfg: Arc<Config>,
    mut inner: S,
    parts: Parts,
    body: B,
) -> impl Future<Output = Result<Response<ResponseBody>, S::Error>>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    async move {
        let requirement = (cfg.requirement)(&parts);
        if requirement == KeyRequirement::Off {
            Decision::Unkeyed.record(cfg.engine.metrics());
            let req = Request::from_parts(parts, RequestBody::passthrough(body));
            return Ok(inner.call(req).await?.map(ResponseBody::wrap));
        }

        // A gRPC call gets the layer's own answers as gRPC statuses.
        let grpc = grpc::is_grpc(&parts.headers);
        // A key (and scope) judged from the head alone is answered before the body is read.
        let head = match judge_head(&cfg, &parts, requirement) {
            Ok(head) => head,
            Err(rejection) => return Ok(rejected(&cfg, rejection, grpc)),
        };
        let bytes = match read_body(&cfg, &parts, body).await {
            Ok(b) => b,
            Err(rejection) => return Ok(rejected(&cfg, rejection, grpc)),
        };
        let (key, scope) = match identify(&cfg, &parts, &bytes, requirement, head) {
            Ok(Some(found)) => found,
            Ok(None) => {
                Decision::Unkeyed.record(cfg.engine.metrics());
                let req = Request::from_parts(parts, RequestBody::buffered(bytes));
                return Ok(inner.call(req).await?.map(ResponseBody::wrap));
            }
            Err(rejection) => return Ok(rejected(&cfg, rejection, grpc)),
        };
        let fingerprint = cfg.fingerprinter.fingerprint_parts(&parts, &bytes);
        let claimed = match cfg.in_progress {
            InProgressPolicy::Reject => match cfg.engine.claim_now(&scope, &key, &fingerprint) {
                Some(claimed) => claimed,
                // Boxed: a claim over the network makes the largest future of the
                // pipeline (above the sizes glibc serves from its per-thread cache), and
                // a store that answers in process should not pay for it.
                None => Box::pin(cfg.engine.claim(&scope, &key, &fingerprint)).await,
            },
            // Boxed: waiting for a duplicate to settle makes the largest future of the
            // pipeline, and only this policy's requests should pay for it.
            InProgressPolicy::Wait(up_to) => {
                Box::pin(cfg.engine.claim_or_wait(&scope, &key, &fingerprint, up_to)).await
            }
        };
        let req = Request::from_parts(parts, RequestBody::buffered(bytes));
        match claimed {
            Ok(Claimed::Execute(exec)) => {
                // Polled in place; if the caller goes away (hyper drops this future), the
                // rest moves to a spawned task, so the handler still finishes and its
                // outcome is recorded.
                DetachOnDrop::new(execute(cfg, inner, req, exec, grpc)).await
            }
            Ok(Claimed::Replay(payload)) if cfg.dialect.refuses_replays() && !grpc => {
                Ok(stored_response::refuse_replay(payload, &cfg.dialect)
                    .unwrap_or_else(|r| cfg.answer(r, grpc)))
            }
            Ok(Claimed::Replay(payload)) => {
                Ok(
                    stored_response::replay(payload, cfg.stored_response_limit, cfg.replay_header)
                        .unwrap_or_else(|r| cfg.answer(r, grpc)),
                )
            }
            Ok(Claimed::Unguarded) => Ok(inner.call(req).await?.map(ResponseBody::wrap)),
            Ok(Claimed::InProgress { retry_after }) => {
                Ok(cfg.answer(Rejection::in_progress(retry_after), grpc))
            }
            Ok(Claimed::KeyReused) => Ok(cfg.answer(
                Rejection::key_reused(
                    cfg.key_reused_status
                        .unwrap_or(idemkey_core::protocol::Problem::KeyReused.default_status()),
                ),
                grpc,
            )),
            Ok(Claimed::QuotaExceeded { retry_after }) => {
                Ok(cfg.answer(Rejection::quota_exceeded(retry_after), grpc))
            }
            Err(e) if e.is_store_full() => {
                Ok(cfg.answer(Rejection::store_full(e.retry_after()), grpc))
            }
            Err(e) => Ok(cfg.answer(Rejection::store_unavailable(e.retry_after()), grpc)),
        }
    }
}

/// The answer to a request refused before any claim.
fn rejected(cfg: &Config, rejection: Rejection, grpc: bool) -> Response<ResponseBody> {
    Decision::Rejected.record(cfg.engine.metrics());
    cfg.answer(rejection, grpc)
}

/// What the head alone told of a request's key and scope: filled in when their
/// extractors need no body.
#[derive(Default)]
struct Head {
    key: Option<Option<IdempotencyKey>>,
    scope: Option<String>,
}

/// Judges the key, and the scope of a keyed request, from the head when their
/// extractors read no body, so that a missing or malformed one is answered before the
/// body is read (and before `100 Continue` is sent).
fn judge_head(cfg: &Config, parts: &Parts, requirement: KeyRequirement) -> Result<Head, Rejection> {
    let mut head = Head::default();
    if cfg.key.needs_body() {
        return Ok(head);
    }
    let none = Bytes::new();
    let key = find_key(cfg, parts, &none, requirement)?;
    if key.is_some() && !cfg.scope.needs_body() {
        head.scope = Some(cfg.scope.extract_scope(parts, &none)?);
    }
    head.key = Some(key);
    Ok(head)
}

/// The key and scope of a request (`None`: no key, and none required), from what the
/// head told and the buffered body.
fn identify(
    cfg: &Config,
    parts: &Parts,
    bytes: &Bytes,
    requirement: KeyRequirement,
    head: Head,
) -> Result<Option<(IdempotencyKey, String)>, Rejection> {
    let key = match head.key {
        Some(key) => key,
        None => find_key(cfg, parts, bytes, requirement)?,
    };
    let Some(key) = key else {
        return Ok(None);
    };
    let scope = match head.scope {
        Some(scope) => scope,
        None => cfg.scope.extract_scope(parts, bytes)?,
    };
    Ok(Some((key, scope)))
}

fn find_key(
    cfg: &Config,
    parts: &Parts,
    bytes: &Bytes,
    requirement: KeyRequirement,
) -> Result<Option<IdempotencyKey>, Rejection> {
    let found = cfg.key.extract_key(parts, bytes)?;
    requirement.apply(found, &*cfg.key)
}

/// The request body, buffered up to the limit and within the body-read timeout.
async fn read_body<B>(cfg: &Config, parts: &Parts, body: B) -> Result<Bytes, Rejection>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    body::read_body(parts, body, cfg.body_limit, cfg.body_read_timeout)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge => Rejection::body_too_large(cfg.body_limit),
            ReadError::Failed(e) => Rejection::body_unreadable(e),
            ReadError::TimedOut => {
                Rejection::body_timeout(cfg.body_read_timeout.unwrap_or_default())
            }
        })
}

/// Runs the claimed handler, then records its response or releases the key: at once
/// for a body that is all there, while it streams to the caller for one that is not
/// (see `tee.rs`).
///
/// Two futures one after the other (the handler's run, then the recording) rather than
/// one `async` block: a block keeps room for what it was called with (the request, the
/// execution) beside everything it later holds, and this future is boxed per request.
fn execute<S, B, ResB>(
    cfg: Arc<Config>,
    mut inner: S,
    req: Request<RequestBody<B>>,
    exec: Execution,
    grpc_call: bool,
) -> impl Future<Output = Result<Response<ResponseBody>, S::Error>>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let started = telemetry::handler_started();
    exec.run_owned(inner.call(req)).then(move |(exec, resp)| {
        cfg.engine.metrics().handler_ended(started);
        match resp {
            Ok(resp) => {
                let (parts, body) = resp.into_parts();
                Either::Left(record(cfg, exec, parts, body, grpc_call))
            }
            Err(e) => Either::Right(tee::release(exec).map(|()| Err(e))),
        }
    })
}

/// What follows the handler's answer (see [`execute`]).
///
/// What is held across more than one wait takes room in every state of the future, so
/// the tee is dropped before the wait that follows it.
#[allow(
    clippy::manual_async_fn,
    reason = "an `async` block holds the arguments once; an `async fn` keeps a second copy of each in its future"
)]
fn record<ResB, E>(
    cfg: Arc<Config>,
    exec: Execution,
    parts: http::response::Parts,
    body: ResB,
    grpc_call: bool,
) -> impl Future<Output = Result<Response<ResponseBody>, E>>
where
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    async move {
        // A gRPC answer is judged by its `grpc-status` once its body ended; its HTTP status
        // is always 200.
        let grpc = grpc_call && grpc::is_grpc(&parts.headers);
        if !grpc && cfg.policy.decide(parts.status) == Disposition::Release {
            tee::release(exec).await;
            return Ok(Response::from_parts(parts, ResponseBody::wrap(body)));
        }
        // One wait after the read-ahead for either outcome, and the tee (borrowed while
        // it reads ahead) out of scope by then: a future keeps room for what is in
        // scope at each wait, and what is in scope at two waits takes room in all.
        let (settling, answer) = {
            // Inline while it reads ahead (the execution's future, boxed per request,
            // stays within the sizes glibc serves from its per-thread cache); boxed
            // only for a body that streams on.
            // The tee takes the configuration (a shared count not touched again).
            let mut tee = tee::Inner::new(cfg, exec, &parts, body, grpc);
            match std::future::poll_fn(|cx| Poll::Ready(tee.prefetch(cx))).await {
                // Read whole: the record is made from the read-ahead, then the body is
                // taken out of it for the caller, who is answered once it is recorded.
                Prefetch::Ended => {
                    let settle = tee.settlement(Some(&parts.headers));
                    let (bytes, trailers) = tee.into_full();
                    (
                        tee::settle_at_once(settle),
                        Response::from_parts(
                            parts,
                            ResponseBody::full_with_trailers(bytes, trailers),
                        ),
                    )
                }
                Prefetch::Failed(e) => (
                    Some(tee.fail()),
                    tee.config()
                        .answer(Rejection::response_failed(e), grpc_call),
                ),
                Prefetch::Stream => {
                    tee.stream(&parts);
                    return Ok(Response::from_parts(
                        parts,
                        ResponseBody::wrap(Tee::new(Box::new(tee))),
                    ));
                }
            }
        };
        if let Some(settling) = settling {
            settling.await;
        }
        Ok(answer)
    }
}
