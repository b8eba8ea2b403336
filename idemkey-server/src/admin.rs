//! An admin service for operators: list the keys in progress, look one record up, and
//! force-release a stuck key, over HTTP with JSON answers (feature `admin`).
//!
//! [`AdminService`] is a plain tower [`Service`]: mount it under a path of your choosing
//! (axum's `Router::nest_service`) **behind your own authentication and authorization**.
//! It has none of its own: whoever reaches it can make any key run again. Put it on an
//! internal listener, or behind the middleware that guards your other admin routes.
//!
//! Under its mount point it answers (the last path segment decides, so it works nested
//! or not):
//!
//! | request | answer |
//! |---|---|
//! | `GET …/in-progress?limit=N` | `200 {"records": [record, …]}`: records in progress, oldest claim first (`limit` 1 to 1000, default 100) |
//! | `GET …/records?scope=S&key=K` | `200 record`, or `404 record-not-found` |
//! | `DELETE …/records?scope=S&key=K` | `200 {"released": true, "record": record}`: removed whatever its state (a running owner is fenced), or `404 record-not-found` |
//!
//! `scope` is what the layer's scope extractor produced for the request (omit it, or
//! leave it empty, for unscoped records); `key` is the idempotency key. They are hashed
//! into the [`RecordId`](crate::store::RecordId) the way requests are, and never stored.
//! A record is
//!
//! ```json
//! {"record_id": "64 hex digits", "state": "in_progress", "fingerprint": "hex",
//!  "created_unix_ms": 1764590000000, "expires_unix_ms": 1764590005000,
//!  "expired": false, "payload_len": null}
//! ```
//!
//! where `expires_unix_ms` is the end of the lease (in progress) or of the retention
//! (completed), and `expired: true` on an in-progress record marks a stuck key: its
//! owner's lease ended and nobody took it over.
//!
//! Errors are `application/problem+json`: `400 admin-request-invalid` (a missing or
//! invalid parameter), `405 admin-request-invalid` (with `Allow`), `404
//! record-not-found` (also for an unknown resource), `503 store-unavailable`,
//! `501 operation-unsupported` (a store of your own without
//! [`Store::inspect`](crate::store::Store::inspect) and the like), `500
//! record-unreadable`.
//!
//! ```
//! use axum::Router;
//! use idemkey::server::Engine;
//! use idemkey::server::admin::AdminService;
//! use idemkey::store::MemoryStore;
//!
//! let engine = Engine::new(MemoryStore::new());
//! let admin = Router::new()
//!     .nest_service("/admin/idempotency", AdminService::new(engine.clone()));
//! // Guard it: e.g. `.layer(your_auth_layer)`, or serve `admin` on an internal port only.
//! # let _: Router = admin;
//! ```

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde::Serialize;
use tower_service::Service;

use super::Engine;
use super::body::ResponseBody;
use super::rejection::Rejection;
use crate::store::{RecordInfo, RecordState, StoreError};
use idemkey_core::protocol::Problem;

/// The default number of records `GET …/in-progress` lists.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// The most records `GET …/in-progress` lists, whatever `limit` asks.
pub const MAX_LIST_LIMIT: usize = 1000;

/// The admin tower service over an [`Engine`]'s store; see the [module docs](self)
/// for its resources, and guard it with your own authentication.
///
/// ```
/// use idemkey::server::{Engine, admin::AdminService};
/// use idemkey::store::MemoryStore;
/// use tower::ServiceExt;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let admin = AdminService::new(Engine::new(MemoryStore::new()));
/// let req = http::Request::get("/records?scope=t&key=order-1").body(()).unwrap();
/// let resp = admin.oneshot(req).await.unwrap();
/// assert_eq!(resp.status(), http::StatusCode::NOT_FOUND);
/// # }
/// ```
#[derive(Clone)]
pub struct AdminService {
    engine: Engine,
}

impl fmt::Debug for AdminService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminService")
            .field("engine", &self.engine)
            .finish()
    }
}

impl AdminService {
    /// The service over `engine`'s store (the engine your layer or receiver uses).
    #[must_use]
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

impl<B> Service<Request<B>> for AdminService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let engine = self.engine.clone();
        let method = req.method().clone();
        let path = req.uri().path().trim_end_matches('/');
        let resource = path.rsplit('/').next().unwrap_or_default().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        Box::pin(async move {
            Ok(answer(&engine, &method, &resource, &query)
                .await
                .unwrap_or_else(|refused| refused.into_response()))
        })
    }
}

async fn answer(
    engine: &Engine,
    method: &Method,
    resource: &str,
    query: &str,
) -> Result<Response<ResponseBody>, Refused> {
    let params = Params::parse(query);
    match (resource, method) {
        ("in-progress", &Method::GET) => {
            let limit = params.limit().map_err(Refused::from)?;
            let records = engine.list_in_progress(limit).await.map_err(store_failed)?;
            let records: Vec<_> = records.iter().map(RecordJson::of).collect();
            Ok(json(&serde_json::json!({ "records": records })))
        }
        ("records", &Method::GET) => {
            let (scope, key) = params.scope_and_key().map_err(Refused::from)?;
            match engine.inspect(scope, key).await.map_err(store_failed)? {
                Some(info) => Ok(json(&RecordJson::of(&info))),
                None => Err(not_found().into()),
            }
        }
        ("records", &Method::DELETE) => {
            let (scope, key) = params.scope_and_key().map_err(Refused::from)?;
            // Shown as it was, so the operator sees what was removed.
            let before = engine.inspect(scope, key).await.ok().flatten();
            if !engine
                .force_release(scope, key)
                .await
                .map_err(store_failed)?
            {
                return Err(not_found().into());
            }
            tracing::warn!(
                record = %crate::store::RecordId::new(scope, key),
                "record force-released by an admin request"
            );
            let record = before.as_ref().map(RecordJson::of);
            Ok(json(
                &serde_json::json!({ "released": true, "record": record }),
            ))
        }
        ("in-progress", _) => Err(not_allowed("GET")),
        ("records", _) => Err(not_allowed("GET, DELETE")),
        _ => Err(Rejection::of(
            Problem::RecordNotFound,
            format!("no admin resource `{resource}`: use `in-progress` or `records`"),
        )
        .into()),
    }
}

/// Why an admin request was refused: a problem, and for `405` the methods allowed.
struct Refused {
    rejection: Rejection,
    allow: Option<&'static str>,
}

impl From<Rejection> for Refused {
    fn from(rejection: Rejection) -> Self {
        Self {
            rejection,
            allow: None,
        }
    }
}

impl Refused {
    fn into_response(self) -> Response<ResponseBody> {
        let mut resp = self.rejection.into_response();
        if let Some(allow) = self.allow {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }
}

/// The query parameters an admin request may carry.
#[derive(Default)]
struct Params {
    scope: Option<String>,
    key: Option<String>,
    limit: Option<String>,
}

impl Params {
    fn parse(query: &str) -> Self {
        let mut params = Self::default();
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match &*name {
                "scope" => &mut params.scope,
                "key" => &mut params.key,
                "limit" => &mut params.limit,
                _ => continue,
            };
            *slot = Some(value.into_owned());
        }
        params
    }

    fn scope_and_key(&self) -> Result<(&str, &str), Rejection> {
        let key = self.key.as_deref().filter(|k| !k.is_empty()).ok_or_else(|| {
            invalid("the query parameter `key` (the idempotency key) is missing; add `?key=...` (and `&scope=...` for a scoped record)")
        })?;
        Ok((self.scope.as_deref().unwrap_or_default(), key))
    }

    fn limit(&self) -> Result<usize, Rejection> {
        let Some(raw) = &self.limit else {
            return Ok(DEFAULT_LIST_LIMIT);
        };
        match raw.parse::<usize>() {
            Ok(n) if (1..=MAX_LIST_LIMIT).contains(&n) => Ok(n),
            _ => Err(invalid(format!(
                "`limit={raw}` is not a whole number from 1 to {MAX_LIST_LIMIT}"
            ))),
        }
    }
}

/// A record as the admin service shows it.
#[derive(Serialize)]
struct RecordJson {
    record_id: String,
    state: &'static str,
    fingerprint: String,
    created_unix_ms: u128,
    expires_unix_ms: u128,
    expired: bool,
    payload_len: Option<u64>,
}

impl RecordJson {
    fn of(info: &RecordInfo) -> Self {
        let unix_ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        Self {
            record_id: info.id.to_hex(),
            state: match info.state {
                RecordState::Completed => "completed",
                _ => "in_progress",
            },
            fingerprint: hex::encode(&info.fingerprint),
            created_unix_ms: unix_ms(info.created),
            expires_unix_ms: unix_ms(info.expires),
            expired: info.expires <= SystemTime::now(),
            payload_len: info.payload_len,
        }
    }
}

fn json(value: &impl Serialize) -> Response<ResponseBody> {
    // Serializing these plain structs cannot fail; an empty object is the fallback.
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = Response::new(ResponseBody::full(Bytes::from(body)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn invalid(detail: impl Into<String>) -> Rejection {
    Rejection::of(Problem::AdminRequestInvalid, detail)
}

fn not_found() -> Rejection {
    Rejection::of(
        Problem::RecordNotFound,
        "the store holds no record for this scope and key (never used, expired, or released)",
    )
}

fn not_allowed(allow: &'static str) -> Refused {
    Refused {
        rejection: Rejection::new(
            Problem::AdminRequestInvalid,
            StatusCode::METHOD_NOT_ALLOWED,
            format!("this resource answers {allow} only"),
        ),
        allow: Some(allow),
    }
}

fn store_failed(e: StoreError) -> Refused {
    store_rejection(e).into()
}

fn store_rejection(e: StoreError) -> Rejection {
    if e.is_unsupported() {
        Rejection::of(Problem::OperationUnsupported, e.to_string())
    } else if e.is_corrupt() {
        Rejection::record_unreadable(e)
    } else {
        Rejection::of(Problem::StoreUnavailable, e.to_string())
            .with_retry_after(crate::Engine::DEFAULT_UNAVAILABLE_RETRY_AFTER)
    }
}
