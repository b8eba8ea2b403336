//! One schedule's server: a fault stage in front of the verifier in front of the app,
//! on its own port of 127.0.0.1, recording what each attempt met and what it was
//! answered.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tower_service::Service;

use super::schedule::{AttemptFault, Schedule};
use crate::protocol::Problem;
use crate::protocol::headers::IDEMPOTENCY_KEY;
use crate::protocol::problem::{PROBLEM_JSON, is_problem_json};
use crate::protocol::status::is_safe;
use crate::server::{Engine, IdempotencyLayer, Rejection};
use crate::store::MemoryStore;
use crate::testing::Executions;

/// Builds the app a schedule's server runs behind the verifier, given the counter its
/// handlers record executions in.
pub(super) type AppFactory = Arc<dyn Fn(Executions) -> axum::Router + Send + Sync>;

/// What one attempt (a request with an unsafe method) met and got.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    /// Its idempotency key (`None`: it had none).
    pub(super) key: Option<Vec<u8>>,
    /// What reached the code.
    pub(super) fate: Fate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Nothing yet: the attempt is being processed, or was abandoned before.
    Pending,
    /// The connection was closed without an answer (`lose`, `reset`), or the answer was
    /// held until the code hung up (`late`).
    Dropped,
    /// An answer was sent.
    Answered(Answer),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Answer {
    pub(super) status: StatusCode,
    /// A `key-reused` problem.
    pub(super) key_reused: bool,
    /// Made by the stage (a fault's answer), not by the verifier or the app.
    pub(super) injected: bool,
    /// A `late` answer sent after the hold ran out: the code was still waiting.
    pub(super) late: bool,
}

impl Answer {
    pub(super) fn is_success(self) -> bool {
        self.status.is_success() && !self.injected
    }
}

/// Everything the stage saw during one run.
#[derive(Debug, Default, Clone)]
pub(super) struct Trace {
    pub(super) attempts: Vec<Attempt>,
}

struct Shared {
    schedule: Schedule,
    app: axum::Router,
    trace: Mutex<Trace>,
    late_hold: Duration,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Trace> {
        self.trace.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Numbers an arriving attempt and decides its fault: `(index, fault)`.
    fn begin(&self, key: Option<Vec<u8>>) -> (usize, Option<AttemptFault>) {
        let mut trace = self.lock();
        let index = trace.attempts.len();
        let fault = u32::try_from(index + 1)
            .ok()
            .and_then(|n| self.schedule.fault_at(n));
        trace.attempts.push(Attempt {
            key,
            fate: Fate::Pending,
        });
        (index, fault)
    }

    fn settle(&self, index: usize, fate: Fate) {
        if let Some(a) = self.lock().attempts.get_mut(index) {
            a.fate = fate;
        }
    }
}

/// The connection is closed without an answer.
#[derive(Debug, thiserror::Error)]
#[error("fault explorer: connection closed on purpose")]
struct Dropped;

/// A schedule's server, serving until [`Stage::finish`] (or drop).
pub(super) struct Stage {
    addr: SocketAddr,
    shared: Arc<Shared>,
    executions: Executions,
    accept: JoinHandle<()>,
}

impl Stage {
    /// Serves `app(executions)` (the built-in object app when `None`) behind the
    /// standard verifier and the stage that applies `schedule`, on a free port.
    pub(super) async fn start(
        schedule: Schedule,
        app: Option<&AppFactory>,
        late_hold: Duration,
    ) -> std::io::Result<Self> {
        let executions = Executions::default();
        let app = match app {
            Some(f) => f(executions.clone()),
            None => objects_app(executions.clone()),
        };
        let verifier = IdempotencyLayer::new(Engine::new(MemoryStore::new()));
        let shared = Arc::new(Shared {
            schedule,
            app: app.layer(verifier),
            trace: Mutex::default(),
            late_hold,
        });
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let serving = shared.clone();
        let accept = tokio::spawn(async move {
            // Connections live in this set: aborting the accept task ends them all,
            // held `late` answers included.
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                while connections.try_join_next().is_some() {}
                let shared = serving.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| attempt(shared.clone(), req));
                    // An error is a connection closed: on purpose, or by the code.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            shared,
            executions,
            accept,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub(super) fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving; what the stage saw and how often the app executed.
    pub(super) fn finish(self) -> (Trace, u64) {
        self.accept.abort();
        (self.shared.lock().clone(), self.executions.count())
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One request through the stage.
async fn attempt(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Dropped> {
    // Reads (and lookups a wrapper makes to reconcile) are not attempts: they pass.
    if is_safe(req.method()) {
        return Ok(call(&shared.app, req).await);
    }
    let key = req
        .headers()
        .get(IDEMPOTENCY_KEY)
        .map(|v| v.as_bytes().to_vec());
    let (index, fault) = shared.begin(key);
    match fault {
        None => {
            let (response, answer) = inspect(call(&shared.app, req).await).await;
            shared.settle(index, Fate::Answered(answer));
            Ok(response)
        }
        Some(AttemptFault::Reset) => {
            shared.settle(index, Fate::Dropped);
            Err(Dropped)
        }
        Some(AttemptFault::LoseResponse) => {
            // Read it all: the server has finished with the request.
            let _ = call(&shared.app, req).await.into_body().collect().await;
            shared.settle(index, Fate::Dropped);
            Err(Dropped)
        }
        Some(AttemptFault::Late) => {
            let (response, mut answer) = inspect(call(&shared.app, req).await).await;
            // Hyper drops this future when the code hangs up, which leaves the fate
            // `Dropped`; an answer still wanted after the hold is sent, late.
            shared.settle(index, Fate::Dropped);
            tokio::time::sleep(shared.late_hold).await;
            answer.late = true;
            shared.settle(index, Fate::Answered(answer));
            Ok(response)
        }
        Some(answering) => {
            let response = fault_answer(answering);
            let answer = Answer {
                status: response.status(),
                key_reused: answering == AttemptFault::KeyReused,
                injected: true,
                late: false,
            };
            shared.settle(index, Fate::Answered(answer));
            Ok(response)
        }
    }
}

async fn call(app: &axum::Router, req: Request<Incoming>) -> Response<Body> {
    let result: Result<_, Infallible> = app.clone().call(req).await;
    match result {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The response, with its body in memory, and what it says.
async fn inspect(response: Response<Body>) -> (Response<Body>, Answer) {
    let (parts, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let key_reused = parts.status.is_client_error()
        && parts.headers.get(CONTENT_TYPE).is_some_and(is_problem_json)
        && serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|doc| doc["type"].as_str().and_then(Problem::from_type))
            == Some(Problem::KeyReused);
    let answer = Answer {
        status: parts.status,
        key_reused,
        injected: false,
        late: false,
    };
    (Response::from_parts(parts, Body::from(bytes)), answer)
}

/// The answer of a fault that answers, in the standard dialect: every answer the
/// explorer makes is made here, from the verifier's [`Rejection`] where it has one, with
/// a retry hint of zero seconds (`Retry-After: 0`, and `retry_after: 0` in the problem)
/// so a retry is due at once. `None` for the faults that do not answer.
pub(super) fn fault_answer(fault: AttemptFault) -> Response<Body> {
    match fault {
        AttemptFault::InProgress => rejection(Rejection::in_progress(Duration::ZERO), None),
        AttemptFault::Locked => rejection(
            Rejection::in_progress(Duration::ZERO),
            Some(StatusCode::LOCKED),
        ),
        AttemptFault::StoreUnavailable => {
            rejection(Rejection::store_unavailable(Duration::ZERO), None)
        }
        AttemptFault::KeyReused => rejection(
            Rejection::key_reused(StatusCode::UNPROCESSABLE_ENTITY),
            None,
        ),
        AttemptFault::TooManyRequests => problem(
            StatusCode::TOO_MANY_REQUESTS,
            serde_json::json!({
                "type": "about:blank",
                "title": "Too Many Requests",
                "status": 429,
                "detail": "rate limited (the fault explorer's 429); nothing was executed: retry after the time given in Retry-After",
                "retry_after": 0,
            }),
            true,
        ),
        // `500`, and (never asked) the faults that do not answer.
        AttemptFault::ServerError
        | AttemptFault::LoseResponse
        | AttemptFault::Reset
        | AttemptFault::Late => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({
                "type": "about:blank",
                "title": "Internal Server Error",
                "status": 500,
                "detail": "the server failed before executing the request (the fault explorer's 500)",
            }),
            false,
        ),
    }
}

/// `r` as the verifier sends it, with `status` instead of its own if given, and a retry
/// hint of zero where it has one.
fn rejection(r: Rejection, status: Option<StatusCode>) -> Response<Body> {
    let hinted = r.retry_after().is_some();
    let status = status.unwrap_or(r.status());
    let mut doc = r.to_json();
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("status".into(), status.as_u16().into());
        if hinted {
            obj.insert("retry_after".into(), 0.into());
        }
    }
    problem(status, doc, hinted)
}

fn problem(status: StatusCode, doc: serde_json::Value, hint: bool) -> Response<Body> {
    let mut response = Response::new(Body::from(doc.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if hint {
        headers.insert(RETRY_AFTER, HeaderValue::from_static("0"));
    }
    response
}

/// The built-in app: every request with an unsafe method creates an object (its JSON
/// body, or `{}`, with an `id` `obj_N` added) and counts one execution; `200` with the
/// object. `GET` of a path ending in an object's id answers that object; any other
/// `GET`, `404`.
pub(super) fn objects_app(executions: Executions) -> axum::Router {
    let objects: Arc<Mutex<HashMap<String, serde_json::Value>>> = Arc::default();
    let handler = move |method: Method, uri: http::Uri, body: Bytes| {
        let objects = objects.clone();
        let executions = executions.clone();
        async move {
            let mut objects = objects.lock().unwrap_or_else(PoisonError::into_inner);
            let json = |status: StatusCode, v: &serde_json::Value| {
                let mut r = Response::new(Body::from(v.to_string()));
                *r.status_mut() = status;
                r.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r
            };
            let last = uri.path().rsplit('/').next().unwrap_or_default().to_owned();
            if is_safe(&method) {
                return match objects.get(&last) {
                    Some(object) => json(StatusCode::OK, object),
                    None => json(
                        StatusCode::NOT_FOUND,
                        &serde_json::json!({"error": format!("no object `{last}`")}),
                    ),
                };
            }
            let n = executions.record();
            let mut object = match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(serde_json::Value::Object(o)) => o,
                _ => serde_json::Map::new(),
            };
            let id = format!("obj_{n}");
            object.insert("id".into(), id.clone().into());
            let object = serde_json::Value::Object(object);
            objects.insert(id, object.clone());
            json(StatusCode::OK, &object)
        }
    };
    axum::Router::new().fallback(handler)
}
