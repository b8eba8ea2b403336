//! The floor of a verifier, for the load program (`perf/src/bin/load/`): the least work any
//! verifier must do for a keyed request, written as plainly and cheaply as it can be, so
//! that idemkey's verifier is measured against what the job itself costs and not only
//! against a handler without one.
//!
//! Per keyed request it does what issue 19 lists as the floor and nothing else: it hashes
//! the scope (the `Authorization` header) and the key into a record id (SHA-256), reads the
//! body and fingerprints method, path, `Content-Type` and body (SHA-256), claims the record
//! in a concurrent map (`DashMap`, sharded, with foldhash), runs the handler, reads its
//! answer and keeps a copy of it (status, headers, body) in the record. A retry with the
//! same request gets the copy with `Idempotent-Replayed: true`; the same key with another
//! request gets 422, a duplicate while the first runs 409.
//!
//! What it leaves out, and idemkey's verifier does not: key validation and the answers
//! of the protocol (problem details, `Retry-After`), leases, fencing tokens and takeover
//! of an abandoned claim, retention and sweeping, limits on the sizes it reads, which
//! headers may be stored, a handler's outcome recorded when its caller goes away,
//! streamed bodies, telemetry, and every store but this map. None of that is needed to
//! answer the load program's requests, so none of it is in the floor.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use tower::{Layer, Service};

pub(crate) type Id = [u8; 32];

enum Slot {
    Running {
        fingerprint: Id,
    },
    Done {
        fingerprint: Id,
        answer: Arc<Answer>,
    },
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// The floor verifier as a layer; clones share one map.
#[derive(Clone, Default)]
pub(crate) struct FloorLayer {
    records: Arc<DashMap<Id, Slot, foldhash::fast::RandomState>>,
}

impl FloorLayer {
    pub(crate) fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for FloorLayer {
    type Service = Floor<S>;

    fn layer(&self, inner: S) -> Floor<S> {
        Floor {
            inner,
            records: self.records.clone(),
        }
    }
}

/// The service [`FloorLayer`] makes.
#[derive(Clone)]
pub(crate) struct Floor<S> {
    inner: S,
    records: Arc<DashMap<Id, Slot, foldhash::fast::RandomState>>,
}

fn sized(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

/// The record id of a keyed request: SHA-256 of the scope (the `Authorization` header)
/// and the key.
pub(crate) fn record_id(headers: &HeaderMap, key: &HeaderValue) -> Id {
    let mut id = Sha256::new();
    let scope = headers.get(header::AUTHORIZATION);
    sized(&mut id, scope.map_or(&b""[..], HeaderValue::as_bytes));
    sized(&mut id, key.as_bytes());
    id.finalize().into()
}

/// The request's fingerprint: SHA-256 of method, path, `Content-Type` and body.
pub(crate) fn fingerprint(parts: &http::request::Parts, body: &[u8]) -> Id {
    let mut fingerprint = Sha256::new();
    sized(&mut fingerprint, parts.method.as_str().as_bytes());
    sized(&mut fingerprint, parts.uri.path().as_bytes());
    let content_type = parts.headers.get(header::CONTENT_TYPE);
    sized(
        &mut fingerprint,
        content_type.map_or(&b""[..], HeaderValue::as_bytes),
    );
    sized(&mut fingerprint, body);
    fingerprint.finalize().into()
}

pub(crate) fn plain(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    response
}

impl<S> Service<Request<Body>> for Floor<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let records = self.records.clone();
        Box::pin(async move {
            let Some(key) = req.headers().get("idempotency-key") else {
                return inner.call(req).await;
            };
            let id = record_id(req.headers(), key);
            let (parts, body) = req.into_parts();
            let Ok(collected) = body.collect().await else {
                return Ok(plain(StatusCode::BAD_REQUEST));
            };
            let bytes = collected.to_bytes();
            let fingerprint = fingerprint(&parts, &bytes);
            match records.entry(id) {
                Entry::Vacant(v) => {
                    v.insert(Slot::Running { fingerprint });
                }
                Entry::Occupied(o) => {
                    return Ok(match o.get() {
                        Slot::Done {
                            fingerprint: f,
                            answer,
                        } if *f == fingerprint => {
                            let answer = answer.clone();
                            drop(o);
                            let mut response = Response::new(Body::from(answer.body.clone()));
                            *response.status_mut() = answer.status;
                            *response.headers_mut() = answer.headers.clone();
                            response
                                .headers_mut()
                                .insert("idempotent-replayed", HeaderValue::from_static("true"));
                            response
                        }
                        Slot::Running { fingerprint: f } if *f == fingerprint => {
                            plain(StatusCode::CONFLICT)
                        }
                        Slot::Done { .. } | Slot::Running { .. } => {
                            plain(StatusCode::UNPROCESSABLE_ENTITY)
                        }
                    });
                }
            }
            let response = inner
                .call(Request::from_parts(parts, Body::from(bytes)))
                .await?;
            let (head, body) = response.into_parts();
            let Ok(collected) = body.collect().await else {
                // The record stays claimed, as a verifier's would for an answer it
                // could not read; the load program never gets here.
                return Ok(plain(StatusCode::INTERNAL_SERVER_ERROR));
            };
            let body = collected.to_bytes();
            let answer = Arc::new(Answer {
                status: head.status,
                headers: head.headers.clone(),
                body: body.clone(),
            });
            records.insert(
                id,
                Slot::Done {
                    fingerprint,
                    answer,
                },
            );
            Ok(Response::from_parts(head, Body::from(body)))
        })
    }
}
