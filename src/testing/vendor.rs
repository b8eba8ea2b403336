//! Fakes of a vendor's endpoint: the verifier in that vendor's dialect on 127.0.0.1, in
//! front of a built-in handler that creates objects, or an app of the test's own.

use std::net::SocketAddr;

use axum::Json;
use axum::body::Bytes;
use axum::extract::OriginalUri;
use http::StatusCode;

use super::{Executions, TestServer};
use crate::protocol::Dialect;
use crate::server::{Engine, IdempotencyLayer};
use crate::store::MemoryStore;

/// A fake of a vendor's API on `127.0.0.1`: idemkey's verifier speaking the vendor's
/// [`Dialect`] (where the key travels, its length limit, the replay marker, the status
/// and body of a reused key, a duplicate in progress, a missing or invalid key) in
/// front of a handler, with an in-memory store.
///
/// [`VendorFake::start`] brings a built-in handler: every `POST` (any path) creates an
/// object and answers `201` with `{"id": "obj_N", "object": "<last path segment>",
/// "request": <the JSON body>}`, counting each execution ([`VendorFake::executions`]);
/// other methods get `405`. [`VendorFake::with_app`] puts the dialect in front of an
/// app of the test's own. For faults, put a [`FaultProxy`](super::FaultProxy) in
/// front ([`VendorFake::addr`] is its upstream). An SDK in another language gets the
/// same from `idemkey proxy --dialect stripe --upstream ...`.
///
/// ```
/// use idemkey::client::{IdempotentClientBuilder, ResponseExt, VendorProfile};
/// use idemkey::protocol::Dialect;
/// use idemkey::testing::{Fault, FaultProxy, VendorFake};
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stripe = VendorFake::start(Dialect::stripe()).await?;
/// // Lose the first answer: the charge ran, the client never heard.
/// let proxy = FaultProxy::start(stripe.addr(), Fault::cycle(vec![Fault::LoseResponse, Fault::None])).await?;
/// let client = IdempotentClientBuilder::new(reqwest::Client::new())
///     .profile(VendorProfile::stripe())
///     .build();
/// let resp = client.post(proxy.url("/v1/charges")).json(&serde_json::json!({"amount": 100})).send().await?;
/// let info = resp.idempotency().expect("keyed");
/// assert_eq!((info.attempts(), info.replayed()), (2, true));
/// assert_eq!(stripe.executions().count(), 1);
///
/// // A reused key with another body: Stripe's 400 idempotency_error.
/// let raw = reqwest::Client::new();
/// let send = |amount: u32| raw.post(stripe.url("/v1/charges")).header("idempotency-key", "k-1")
///     .json(&serde_json::json!({"amount": amount})).send();
/// assert_eq!(send(1).await?.status(), 201);
/// let reused = send(2).await?;
/// assert_eq!(reused.status(), 400);
/// let body: serde_json::Value = reused.json().await?;
/// assert_eq!(body["error"]["type"], "idempotency_error");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct VendorFake {
    server: TestServer,
    executions: Executions,
    dialect: Dialect,
}

impl VendorFake {
    /// The fake of `dialect`'s vendor with the built-in handler.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(dialect: Dialect) -> std::io::Result<Self> {
        let executions = Executions::default();
        let handler = {
            let executions = executions.clone();
            move |OriginalUri(uri): OriginalUri, body: Bytes| {
                let executions = executions.clone();
                async move { create(&executions, uri.path(), &body) }
            }
        };
        let app = axum::Router::new().fallback(axum::routing::post(handler));
        Self::serve(dialect, app, executions).await
    }

    /// The fake of `dialect`'s vendor in front of `app` (the test counts executions
    /// itself; [`VendorFake::executions`] stays at 0).
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn with_app(dialect: Dialect, app: axum::Router) -> std::io::Result<Self> {
        Self::serve(dialect, app, Executions::default()).await
    }

    async fn serve(
        dialect: Dialect,
        app: axum::Router,
        executions: Executions,
    ) -> std::io::Result<Self> {
        let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new())).dialect(dialect.clone());
        Ok(Self {
            server: TestServer::start_verified(app, layer).await?,
            executions,
            dialect,
        })
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// The built-in handler's executions.
    #[must_use]
    pub fn executions(&self) -> &Executions {
        &self.executions
    }

    /// The dialect the fake speaks.
    #[must_use]
    pub fn dialect(&self) -> &Dialect {
        &self.dialect
    }
}

/// The built-in handler: one more object.
fn create(
    executions: &Executions,
    path: &str,
    body: &[u8],
) -> (StatusCode, Json<serde_json::Value>) {
    let n = executions.record();
    let object = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("object");
    let request = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
    (
        StatusCode::CREATED,
        Json(serde_json::json!({"id": format!("obj_{n}"), "object": object, "request": request})),
    )
}
