//! Verifier-side helpers: HTTP shortcuts, one answer as read by a test, a store that
//! fails on demand and counts what it is asked.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idemkey::store::{
    Claim, ClaimRequest, FencingToken, MemoryStore, RecordId, RecordInfo, Store, StoreError,
};

/// A plain reqwest client (no idempotency middleware) for driving the verifier by hand.
pub(crate) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest client builds")
}

/// A POST of a JSON body with an `Idempotency-Key`.
pub(crate) async fn post_json(
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
pub(crate) async fn problem(resp: reqwest::Response) -> (u16, String, serde_json::Value) {
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
pub(crate) async fn json(resp: reqwest::Response) -> serde_json::Value {
    let bytes = resp.bytes().await.expect("body reads");
    serde_json::from_slice(&bytes).expect("body is JSON")
}

/// One HTTP answer, read to the end.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// Reads `resp` to the end.
    pub(crate) async fn read(resp: reqwest::Response) -> Self {
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.expect("read the answer's body");
        Self {
            status,
            headers,
            body,
        }
    }

    /// `true` when the verifier replayed a stored response.
    pub(crate) fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The `Retry-After` header, when present.
    pub(crate) fn retry_after(&self) -> Option<&str> {
        self.headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
    }

    /// The problem `type` of a problem+json answer.
    pub(crate) fn problem_type(&self) -> String {
        let v: serde_json::Value =
            serde_json::from_slice(&self.body).expect("problem answers are JSON");
        v["type"].as_str().unwrap_or_default().to_owned()
    }

    /// The problem `detail`.
    pub(crate) fn detail(&self) -> String {
        let v: serde_json::Value =
            serde_json::from_slice(&self.body).expect("problem answers are JSON");
        v["detail"].as_str().unwrap_or_default().to_owned()
    }
}

/// A memory store that fails every operation while `failing` is set (an outage switch),
/// and counts the operations the verifier asks of it (claims, completions, renewals,
/// releases; not the tests' own look-ups): a count of 0 proves a request was refused
/// before any record was touched.
#[derive(Clone, Default)]
pub(crate) struct FlakyStore {
    pub(crate) inner: MemoryStore,
    pub(crate) failing: Arc<AtomicBool>,
    /// How many of the next `complete` calls fail (a short store blip after the handler).
    pub(crate) failing_completes: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
}

impl FlakyStore {
    /// The operations asked so far (failed ones included).
    pub(crate) fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Counts an operation the verifier asks, and fails it during an outage.
    fn check(&self, what: &str) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.fail_if_down(what)
    }

    fn fail_if_down(&self, what: &str) -> Result<(), StoreError> {
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
    /// Fails during an outage like the rest; not counted (the tests look records up).
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        self.fail_if_down("inspect")?;
        self.inner.inspect(id).await
    }
}

/// A store that forwards to another and counts the watches made on it
/// ([`Store::watch`]): how a test knows that `n` duplicates are waiting.
#[derive(Clone)]
pub(crate) struct CountedWatches {
    pub(crate) inner: Arc<dyn Store>,
    watches: Arc<tokio::sync::Semaphore>,
}

impl CountedWatches {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            watches: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }

    /// Waits until `n` more watches were made.
    pub(crate) async fn wait_watches(&self, n: u32) {
        self.watches
            .acquire_many(n)
            .await
            .expect("the semaphore stays open")
            .forget();
    }
}

#[async_trait::async_trait]
impl Store for CountedWatches {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner.complete(id, token, payload, retention).await
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.renew(id, token, lease).await
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.inner.release(id, token).await
    }
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn idemkey::store::Watch>, StoreError> {
        let watch = self.inner.watch(id).await;
        self.watches.add_permits(1);
        watch
    }
}
