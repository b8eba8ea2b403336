//! Verifier-side helpers: gated handlers, a store that fails on demand, HTTP shortcuts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemkey::store::{Claim, ClaimRequest, FencingToken, MemoryStore, RecordId, Store, StoreError};
use tokio::sync::Semaphore;

/// A plain reqwest client (no idempotency middleware) for driving the verifier by hand.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest client builds")
}

/// A POST of a JSON body with an `Idempotency-Key`.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    req.send().await.expect("the verifier answers")
}

/// The problem `type` case name of a problem+json response, with its status.
pub async fn problem(resp: reqwest::Response) -> (u16, String, serde_json::Value) {
    let status = resp.status().as_u16();
    assert_eq!(
        resp.headers()["content-type"],
        "application/problem+json",
        "a problem response"
    );
    let v = json(resp).await;
    let ty = v["type"].as_str().expect("problem has a type").to_owned();
    let case = ty
        .strip_prefix(idemkey::protocol::problem::TYPE_PREFIX)
        .expect("problem type has the idemkey prefix")
        .to_owned();
    assert_eq!(v["status"], status, "problem status matches HTTP status");
    (status, case, v)
}

/// JSON from a reqwest response without reqwest's `json` feature.
pub async fn json(resp: reqwest::Response) -> serde_json::Value {
    let bytes = resp.bytes().await.expect("body reads");
    serde_json::from_slice(&bytes).expect("body is JSON")
}

/// A gate a handler waits at, with a signal that it arrived.
#[derive(Clone)]
pub struct Gate {
    entered: Arc<Semaphore>,
    open: Arc<Semaphore>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            entered: Arc::new(Semaphore::new(0)),
            open: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Gate {
    /// Called by the handler: signals arrival, waits until opened.
    pub async fn pass(&self) {
        self.entered.add_permits(1);
        self.open.acquire().await.expect("gate open").forget();
    }

    /// Waits until `n` handlers arrived.
    pub async fn wait_entered(&self, n: u32) {
        self.entered.acquire_many(n).await.expect("gate").forget();
    }

    /// Lets `n` waiting handlers through.
    pub fn open(&self, n: usize) {
        self.open.add_permits(n);
    }
}

/// A memory store that fails every operation while `failing` is set: an outage switch.
#[derive(Clone, Default)]
pub struct FlakyStore {
    pub inner: MemoryStore,
    pub failing: Arc<AtomicBool>,
    /// How many of the next `complete` calls fail (a short store blip after the handler).
    pub failing_completes: Arc<AtomicU32>,
}

impl FlakyStore {
    fn check(&self, what: &str) -> Result<(), StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            Err(StoreError::unavailable(
                what.to_owned(),
                std::io::Error::other("injected outage"),
            ))
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl Store for FlakyStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.check("claim")?;
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.check("complete")?;
        let blip = self
            .failing_completes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if blip.is_ok() {
            return Err(StoreError::unavailable(
                "complete",
                std::io::Error::other("injected blip"),
            ));
        }
        self.inner.complete(id, token, payload, retention).await
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.check("renew")?;
        self.inner.renew(id, token, lease).await
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.check("release")?;
        self.inner.release(id, token).await
    }
}
