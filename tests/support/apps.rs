//! Verifier apps on 127.0.0.1 over a given store, with a charge handler that counts its
//! executions and can be held at a gate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::Store;
use tokio::sync::Semaphore;

/// What the charge handler of every app made by [`spawn_app`] shares.
#[derive(Clone, Default)]
pub struct Handler {
    executions: Arc<AtomicUsize>,
    /// `None`: the handler answers at once; `Some`: it waits for a permit.
    gate: Option<Arc<Semaphore>>,
}

impl Handler {
    /// A handler that answers at once.
    pub fn open() -> Self {
        Self::default()
    }

    /// A handler that waits for [`Handler::release`] before answering.
    pub fn gated() -> Self {
        Self {
            executions: Arc::default(),
            gate: Some(Arc::new(Semaphore::new(0))),
        }
    }

    /// Lets `n` waiting (or future) executions answer.
    pub fn release(&self, n: usize) {
        if let Some(gate) = &self.gate {
            gate.add_permits(n);
        }
    }

    /// How many times the handler ran.
    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    async fn charge(self, body: bytes::Bytes) -> (http::StatusCode, String) {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("gate open").forget();
        }
        let charge = uuid::Uuid::new_v4();
        (
            http::StatusCode::CREATED,
            format!(
                "{{\"charge\":\"{charge}\",\"execution\":{n},\"request_bytes\":{}}}",
                body.len()
            ),
        )
    }
}

/// Serves a verifier app (`POST /v1/charges` behind the idempotency layer over `store`)
/// on a free port of 127.0.0.1; returns its address.
pub async fn spawn_app(store: Arc<dyn Store>, handler: Handler) -> SocketAddr {
    let verifier = IdempotencyLayer::new(Engine::new(store));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move |body: bytes::Bytes| handler.clone().charge(body)),
        )
        .layer(verifier);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// One answer of a verifier.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub replayed: bool,
    pub retry_after: Option<String>,
    pub body: bytes::Bytes,
}

/// `POST /v1/charges` with `key` and a fixed JSON body.
pub async fn charge(client: &reqwest::Client, addr: SocketAddr, key: &str) -> Reply {
    let resp = client
        .post(format!("http://{addr}/v1/charges"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":1000,"currency":"eur"}"#)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST to the verifier at {addr}: {e}"));
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Reply {
        status: resp.status().as_u16(),
        replayed: header("idempotent-replayed").as_deref() == Some("true"),
        retry_after: header("retry-after"),
        body: resp.bytes().await.expect("read the reply body"),
    }
}
