//! [`Idempotency`], the service: the pipeline every request goes through.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::future::{DetachOnDrop, ResponseFuture};
use super::layer::{Config, KeyRequirement};
use crate::protocol::Problem;
use crate::server::body::{self, BoxError, Collected, ReadError, RequestBody, ResponseBody};
use crate::server::engine::Claimed;
use crate::server::execution::Execution;
use crate::server::policy::Outcome;
use crate::server::rejection::Rejection;
use crate::server::stored_response;
use crate::store::StoreError;

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// ```
/// use idemkey::server::{Engine, IdempotencyLayer};
/// use idemkey::store::MemoryStore;
/// use tower::{Layer, service_fn};
///
/// let inner = service_fn(|_: http::Request<idemkey::server::RequestBody<String>>| async {
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
        ResponseFuture::new(handle(self.cfg.clone(), inner, req))
    }
}

/// The pipeline: requirement, body, key, scope, fingerprint, claim, then the handler
/// (or the answer that stands for it).
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

    let bytes = match body::read_body(&parts, body, cfg.body_limit).await {
        Ok(b) => b,
        Err(ReadError::TooLarge) => {
            return Ok(Rejection::body_too_large(cfg.body_limit).into_response());
        }
        Err(ReadError::Failed(e)) => return Ok(Rejection::body_unreadable(e).into_response()),
    };
    let found = cfg
        .key
        .extract_key(&parts, &bytes)
        .and_then(|found| requirement.apply(found, &*cfg.key));
    let key = match found {
        Ok(Some(k)) => k,
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
    let claimed = cfg.engine.claim(&scope, &key, &fingerprint).await;
    let req = Request::from_parts(parts, RequestBody::buffered(bytes));
    match claimed {
        Ok(Claimed::Execute(mut exec)) => {
            if let Some(r) = cfg.retention {
                exec.set_retention(r);
            }
            // Polled in place; if the caller goes away (hyper drops this future), the
            // rest moves to a spawned task, so the handler still finishes and its
            // outcome is recorded.
            DetachOnDrop::new(execute(cfg, inner, req, exec)).await
        }
        Ok(Claimed::Replay(payload)) => Ok(stored_response::replay(
            payload,
            cfg.stored_response_limit,
            cfg.replay_header,
        )),
        Ok(Claimed::Unguarded) => Ok(inner.call(req).await?.map(ResponseBody::wrap)),
        Ok(Claimed::InProgress { retry_after }) => {
            Ok(Rejection::in_progress(retry_after).into_response())
        }
        Ok(Claimed::KeyReused) => Ok(Rejection::key_reused(cfg.key_reused_status).into_response()),
        Err(e) => Ok(Rejection::store_unavailable(e.retry_after()).into_response()),
    }
}

/// Runs the claimed handler, then records its response or releases the key.
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
        .run(body::read_limited(
            Box::pin(body),
            cfg.stored_response_limit,
        ))
        .await
    {
        Collected::Full(bytes) => {
            let record = stored_response::record(&parts, bytes.clone(), &cfg.deny);
            finish(exec.complete(record.encode()).await, "complete");
            Ok(Response::from_parts(parts, ResponseBody::full(bytes)))
        }
        Collected::TooLarge(prefix, rest) => {
            let record = stored_response::record_too_large(&parts, prefix.len() as u64);
            tracing::warn!(
                limit = cfg.stored_response_limit,
                retries_get = %Problem::ResponseNotStored,
                "response too large to store"
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

fn finish(result: Result<(), StoreError>, what: &str) {
    match result {
        Ok(()) => {}
        Err(e) if e.is_fenced() => tracing::warn!(
            "could not {what} the key: another request took it over after this one's lease expired; its outcome wins"
        ),
        Err(e) => tracing::warn!(error = %e, "could not {what} the key; its lease will expire"),
    }
}
