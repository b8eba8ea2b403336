//! Batches: deliveries that carry many events (SendGrid's event arrays, Adyen's
//! notification items).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::preset::{DEFAULT_WEBHOOK_RETENTION, Retention};
use super::signature::{SignatureError, VerifySignature};
use crate::body::ResponseBody;
use crate::engine::{ClaimError, Claimed, Engine};
use crate::extract::KeySource;
use crate::fingerprint::Fingerprint;
use crate::json_pointer::{self as pointer, Pointer};
use crate::rejection::Rejection;
use crate::store::{Store, StoreError};
use idemkey_core::key::IdempotencyKey;
use idemkey_core::protocol::Problem;

/// What the fingerprint recorded with every batch item is made of (items are
/// identified by id only, so every item has the same one).
const ITEM_FINGERPRINT: &[u8] = b"idemkey/batch-item/v1";
/// What a completed item's record holds.
const ITEM_DONE: &[u8] = b"done";
/// The default lease on an item while its handler runs (renewed every third of it).
pub const DEFAULT_ITEM_LEASE: Duration = Duration::from_secs(30);
/// The body Adyen expects from a receiver that accepted a delivery.
const ADYEN_ACCEPTED: &str = "[accepted]";

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Processes each item of a batch delivery at most once, by the items' own ids.
///
/// Some senders put many events in one delivery and retry the whole delivery when it
/// fails: SendGrid's Event Webhook posts a JSON array of events, each with its
/// `sg_event_id`; Adyen posts `notificationItems`, each signed on its own. A retried
/// batch holds events that were already processed. The deduper keeps only the items
/// not processed yet, and records each one as it completes:
///
/// - first, before the store is asked anything: every item is found, its signature
///   checked ([`BatchDeduper::item_verifier`]) and its id read; one bad item refuses the
///   whole batch (`401` or `400`), and no item is claimed or run;
/// - then per item, in order: claim its id in the store; a claim that wins runs the
///   handler, then completes the record (kept for the retention) or, when the handler
///   fails, releases it and stops;
/// - an item already completed is skipped (a duplicate);
/// - an item that a concurrent delivery of the same batch is processing right now is
///   skipped and reported in [`BatchOutcome::in_progress`]: answer that delivery with a
///   retry status (409 and `Retry-After`, see [`BatchOutcome::is_settled`]) so that
///   nothing is acknowledged before it is processed.
///
/// Claims are atomic in the store, so any number of concurrent duplicate batches, on
/// any number of instances sharing a store, run each item once. While a handler runs,
/// its lease is renewed; if the delivery is cancelled, the claim is released so the
/// redelivery processes the item. [`BatchDeduper::respond`] turns the result into the
/// answer the sender expects.
///
/// ```
/// use idemkey::server::webhook::BatchDeduper;
/// use idemkey::store::MemoryStore;
/// use bytes::Bytes;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dedup = BatchDeduper::sendgrid(MemoryStore::new());
/// let body = Bytes::from_static(br#"[
///   {"email":"a@example.com","event":"processed","sg_event_id":"sg_1","timestamp":1513299569},
///   {"email":"a@example.com","event":"delivered","sg_event_id":"sg_2","timestamp":1513299570}
/// ]"#);
///
/// let first = dedup.process(&body, |item| async move { Ok::<_, std::io::Error>(()) }).await?;
/// assert_eq!(first.processed(), 2);
///
/// // SendGrid retries the same batch: nothing runs twice.
/// let retry = dedup.process(&body, |item| async move { Ok::<_, std::io::Error>(()) }).await?;
/// assert_eq!((retry.processed(), retry.duplicates()), (0, 2));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BatchDeduper {
    /// Claims, lease renewal, fenced completion and release on drop: the same engine
    /// as the verifier's, with the items' lease and retention.
    engine: Engine,
    id: KeySource,
    scope: Arc<str>,
    /// Where the array of items is in the body (`None`: the body is the array).
    items: Option<Pointer>,
    /// Where the item is in each element of the array (`None`: the element is it).
    item: Option<Pointer>,
    verifier: Option<Arc<dyn VerifySignature>>,
    retention: Retention,
    accepted: Bytes,
}

impl fmt::Debug for BatchDeduper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchDeduper")
            .field("id", &self.id)
            .field("scope", &self.scope)
            .field("items", &self.items)
            .field("item", &self.item)
            .field("signed", &self.verifier.is_some())
            .field("lease", &self.engine.lease())
            .field("retention", &self.engine.retention())
            .finish_non_exhaustive()
    }
}

impl BatchDeduper {
    /// A deduper of JSON-array batches whose items carry their id where `id` says
    /// (read from each item; a header source finds nothing). Scope `webhook:batch`,
    /// lease [`DEFAULT_ITEM_LEASE`], retention [`DEFAULT_WEBHOOK_RETENTION`], no
    /// signature check, an empty `200` for a settled batch.
    #[must_use]
    pub fn new(store: impl Store, id: KeySource) -> Self {
        Self {
            engine: Engine::builder(store)
                .lease(DEFAULT_ITEM_LEASE)
                .retention(DEFAULT_WEBHOOK_RETENTION)
                .build(),
            id,
            scope: Arc::from("webhook:batch"),
            items: None,
            item: None,
            verifier: None,
            retention: Retention::DEFAULT,
            accepted: Bytes::new(),
        }
    }

    /// SendGrid's Event Webhook: items identified by `sg_event_id`, scope
    /// `webhook:sendgrid`.
    ///
    /// Source: Twilio SendGrid docs, "Event Webhook Reference" (events are posted as a
    /// JSON array; `sg_event_id` is a unique id for each event; duplicate events are
    /// possible, and deliveries that do not get a 2xx are retried for up to 24 hours).
    /// The default retention of 7 days covers that window.
    #[must_use]
    pub fn sendgrid(store: impl Store) -> Self {
        Self::new(store, KeySource::json_pointer("/sg_event_id")).scope("webhook:sendgrid")
    }

    /// Adyen standard webhooks: each `notificationItems[].NotificationRequestItem` is
    /// one fact, keyed by `merchantAccountCode`, `pspReference`, `eventCode` and
    /// `success` (so a `success` of `"false"` and a later `"true"` for the same event are
    /// two facts), scope `webhook:adyen`, retention floor 31 days, answered
    /// `200 [accepted]` once settled. Add the HMAC check of every item with
    /// [`BatchDeduper::item_verifier`] and an [`AdyenHmacVerifier`](super::AdyenHmacVerifier).
    ///
    /// ```
    /// use axum::{Router, body::Bytes, extract::State, response::IntoResponse, routing::post};
    /// use idemkey::server::webhook::{AdyenHmacVerifier, BatchDeduper};
    /// use idemkey::store::MemoryStore;
    ///
    /// async fn adyen(State(dedup): State<BatchDeduper>, body: Bytes) -> impl IntoResponse {
    ///     let result = dedup
    ///         .process(&body, |item| async move {
    ///             // A real receiver updates its payment here, from `item.json()`.
    ///             let _ = item;
    ///             Ok::<_, std::io::Error>(())
    ///         })
    ///         .await;
    ///     dedup.respond(result) // `[accepted]`, 409 + Retry-After, 401, 400, 500 or 503
    /// }
    ///
    /// # fn main() -> Result<(), idemkey::server::webhook::SignatureError> {
    /// let key = AdyenHmacVerifier::new("DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00")?;
    /// let dedup = BatchDeduper::adyen(MemoryStore::new()).item_verifier(key);
    /// let app: Router = Router::new().route("/webhooks/adyen", post(adyen)).with_state(dedup);
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    ///
    /// Sources: Adyen docs, "Webhook types" (`notificationItems`: "An array of
    /// NotificationRequestItem objects"), the API explorer's `NotificationRequestItem`
    /// (no event id; `pspReference` "globally unique"; `success`: "If true: the event was
    /// executed successfully. If false: the event was not executed successfully", a
    /// string), "Troubleshoot webhooks" ("We retry sending the earliest webhook in the
    /// queue for 30 days": floor 31 days), and the help centre's "How do I set up
    /// webhooks" (respond "with `[accepted]`" and "200 as a status code"; the developer
    /// docs now accept any 2xx: `200 [accepted]` satisfies both). That composite is this
    /// crate's choice: Adyen's docs name no deduplication key.
    #[must_use]
    pub fn adyen(store: impl Store) -> Self {
        let id = KeySource::composite(
            [
                "/merchantAccountCode",
                "/pspReference",
                "/eventCode",
                "/success",
            ]
            .map(KeySource::json_pointer),
        );
        Self::new(store, id)
            .scope("webhook:adyen")
            .items_at("/notificationItems")
            .item_at("/NotificationRequestItem")
            .retention_floor(31 * DAY)
            .acknowledge_with(Bytes::from_static(ADYEN_ACCEPTED.as_bytes()))
    }

    /// The scope of the items' records (one per sender, or per sender and tenant).
    #[must_use]
    pub fn scope(mut self, scope: &str) -> Self {
        self.scope = Arc::from(scope);
        self
    }

    /// The array of items is at JSON pointer `pointer` of the body (Adyen:
    /// `/notificationItems`) rather than the body itself.
    #[must_use]
    pub fn items_at(mut self, pointer: &str) -> Self {
        self.items = Some(Pointer::new(pointer));
        self
    }

    /// Each element of the array holds its item at JSON pointer `pointer` (Adyen:
    /// `/NotificationRequestItem`). The item is what the id is read from, what the
    /// [item verifier](BatchDeduper::item_verifier) checks and what the handler gets.
    #[must_use]
    pub fn item_at(mut self, pointer: &str) -> Self {
        self.item = Some(Pointer::new(pointer));
        self
    }

    /// Checks the signature of every item (its raw JSON, with the delivery's headers
    /// unknown) before any item is claimed: one item that does not verify refuses the
    /// whole batch with `401 signature-rejected`, and nothing is run or recorded, so
    /// the sender's retry of the genuine batch is processed in full.
    #[must_use]
    pub fn item_verifier(mut self, verifier: impl VerifySignature) -> Self {
        self.verifier = Some(Arc::new(verifier));
        self
    }

    /// The body of the `200` answer to a settled batch (default empty; Adyen:
    /// `[accepted]`), see [`BatchDeduper::respond`].
    #[must_use]
    pub fn acknowledge_with(mut self, body: Bytes) -> Self {
        self.accepted = body;
        self
    }

    /// The lease held on an item while its handler runs (renewed every third of it).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        let lease = lease.max(Duration::from_millis(10));
        self.engine = self.engine.to_builder().lease(lease).build();
        self
    }

    /// How long a processed item's id is remembered; values below the floor
    /// ([`BatchDeduper::retention_floor`]) are raised to it.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention.requested = retention;
        self.rebuild_retention()
    }

    /// The shortest retention allowed: how long the sender may deliver the same item
    /// again.
    #[must_use]
    pub fn retention_floor(mut self, floor: Duration) -> Self {
        self.retention.floor = floor;
        self.rebuild_retention()
    }

    fn rebuild_retention(mut self) -> Self {
        let retention = self.retention.effective();
        self.engine = self.engine.to_builder().retention(retention).build();
        self
    }

    /// The retention in force: the one set with [`BatchDeduper::retention`] (default
    /// [`DEFAULT_WEBHOOK_RETENTION`]), raised to the floor.
    #[must_use]
    pub fn effective_retention(&self) -> Duration {
        self.retention.effective()
    }

    /// The floor ([`BatchDeduper::retention_floor`]).
    #[must_use]
    pub fn min_retention(&self) -> Duration {
        self.retention.floor
    }

    /// The items of `body`, each checked and identified; nothing is claimed.
    fn prepare<E>(&self, body: &Bytes) -> Result<Vec<BatchItem>, BatchError<E>> {
        let invalid = |kind| BatchError::new(kind, BatchOutcome::default());
        let doc = pointer::parse_document(body)
            .map_err(|e| invalid(ErrorKind::NotArray(format!("not JSON: {e}"))))?;
        let array = match &self.items {
            None => doc,
            Some(p) => p.find(doc).ok_or_else(|| {
                invalid(ErrorKind::NotArray(format!(
                    "no array of items at `{}`",
                    p.as_str()
                )))
            })?,
        };
        let elements: Vec<&RawValue> = serde_json::from_str(array.get())
            .map_err(|e| invalid(ErrorKind::NotArray(e.to_string())))?;
        let no_headers = HeaderMap::new();
        let now = SystemTime::now();
        let mut items = Vec::with_capacity(elements.len());
        for (index, element) in elements.into_iter().enumerate() {
            let raw = match &self.item {
                None => element,
                Some(p) => p.find(element).ok_or_else(|| {
                    invalid(ErrorKind::InvalidItem {
                        index,
                        source: Rejection::invalid_key(format_args!(
                            "the element has no item at `{}`",
                            p.as_str()
                        )),
                    })
                })?,
            };
            let json = body.slice_ref(raw.get().as_bytes());
            if let Some(v) = &self.verifier {
                v.verify_at(&no_headers, &json, now)
                    .map_err(|source| invalid(ErrorKind::Signature { index, source }))?;
            }
            let key = self
                .id
                .extract(&no_headers, &json)
                .map_err(|source| invalid(ErrorKind::InvalidItem { index, source }))?;
            items.push(BatchItem { index, key, json });
        }
        Ok(items)
    }

    /// Runs `handler` on each item of `body` not processed yet.
    ///
    /// Every item is found, verified and identified first; then items are handled one
    /// after another, in order. Items without an id are handled every time (they cannot
    /// be deduplicated) and counted in [`BatchOutcome::without_id`].
    ///
    /// # Errors
    /// [`BatchError`]: the body is not a batch, or an item is not where the deduper
    /// looks or its id is unusable (400), or an item's signature does not verify (401):
    /// in these cases no item was claimed or run. The store failed (503); the handler
    /// failed on an item (its claim was released and the items after it were not looked
    /// at; answer 5xx so the sender retries). Items completed before the error stay
    /// completed and are skipped on the retry.
    pub async fn process<F, Fut, E>(
        &self,
        body: &Bytes,
        mut handler: F,
    ) -> Result<BatchOutcome, BatchError<E>>
    where
        F: FnMut(BatchItem) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let items = self.prepare(body)?;
        let mut outcome = BatchOutcome::default();
        let item_fingerprint = Fingerprint::of_bytes(ITEM_FINGERPRINT);
        for item in items {
            let index = item.index;
            let Some(key) = item.key.clone() else {
                handler(item).await.map_err(|e| BatchError {
                    kind: ErrorKind::Handler { index, source: e },
                    outcome,
                })?;
                outcome.without_id += 1;
                continue;
            };
            let claim = self
                .engine
                .claim(&self.scope, &key, &item_fingerprint)
                .await
                .map_err(|e| BatchError::new(ErrorKind::Claim(e), outcome))?;
            match claim {
                Claimed::Replay(_) => outcome.duplicates += 1,
                // Over the quota, the item waits like one in progress elsewhere: nothing
                // was recorded, the redelivery runs it.
                Claimed::InProgress { retry_after } | Claimed::QuotaExceeded { retry_after } => {
                    outcome.in_progress += 1;
                    outcome.retry_after = outcome.retry_after.max(retry_after);
                }
                Claimed::KeyReused => {
                    // Only another kind of operation in this scope records another
                    // fingerprint: it holds the id, so this deduper must not run it.
                    tracing::warn!(scope = %self.scope, item = index, "a batch item's id is recorded by another operation in this scope; skipped as processed (give each deduper a scope of its own)");
                    outcome.duplicates += 1;
                }
                Claimed::Unguarded => {
                    // The deduper's engine fails closed; were it to fail open, the item
                    // would run unrecorded, as fail-open means.
                    handler(item).await.map_err(|e| BatchError {
                        kind: ErrorKind::Handler { index, source: e },
                        outcome,
                    })?;
                    outcome.processed += 1;
                }
                Claimed::Execute(mut execution) => {
                    // Renews the lease while the handler runs; a cancelled delivery drops
                    // the execution, which releases the claim.
                    match execution.run(handler(item)).await {
                        Ok(()) => {
                            // The handler ran: through a store outage its record goes on
                            // in the background, so the delivery is answered meanwhile.
                            let _ = execution
                                .complete_or_defer(Bytes::from_static(ITEM_DONE))
                                .await
                                .map_err(|e| BatchError::new(ErrorKind::Store(e), outcome))?;
                            outcome.processed += 1;
                        }
                        Err(e) => {
                            // A failed release leaves the claim to expire with its lease;
                            // the handler's error is the one to report.
                            if let Err(release) = execution.release().await {
                                tracing::warn!(%release, "could not release a failed batch item; it becomes claimable when its lease ends");
                            }
                            return Err(BatchError {
                                kind: ErrorKind::Handler { index, source: e },
                                outcome,
                            });
                        }
                    }
                }
            }
        }
        Ok(outcome)
    }

    /// The answer to a delivery, from what [`BatchDeduper::process`] did with it:
    ///
    /// | result | answer |
    /// |---|---|
    /// | settled: every item processed, here or before | `200` with [`BatchDeduper::acknowledge_with`]'s body (Adyen: `[accepted]`) |
    /// | items still being processed by a concurrent delivery | `409 in-progress` with `Retry-After`: the sender retries |
    /// | an error | [`BatchError::into_response`] |
    #[must_use]
    pub fn respond<E: fmt::Display>(
        &self,
        result: Result<BatchOutcome, BatchError<E>>,
    ) -> http::Response<ResponseBody> {
        match result {
            Ok(o) if o.is_settled() => {
                let mut resp = http::Response::new(ResponseBody::full(self.accepted.clone()));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                resp
            }
            Ok(o) => Rejection::in_progress(o.retry_after).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

/// One item of a batch, handed to the handler.
#[derive(Debug, Clone)]
pub struct BatchItem {
    index: usize,
    key: Option<IdempotencyKey>,
    json: Bytes,
}

impl BatchItem {
    /// The item's position in the batch.
    #[must_use]
    pub fn index(&self) -> usize {
        self.index
    }

    /// The item's id, if it has one.
    #[must_use]
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// The item's JSON text (a slice of the delivery's body, not a copy).
    #[must_use]
    pub fn json(&self) -> &Bytes {
        &self.json
    }

    /// The item deserialised as `T`.
    ///
    /// # Errors
    /// When the item does not have `T`'s shape.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.json)
    }
}

/// What [`BatchDeduper::process`] did with a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    processed: usize,
    duplicates: usize,
    in_progress: usize,
    without_id: usize,
    /// The longest wait a concurrent delivery's item asked for.
    retry_after: Duration,
}

impl BatchOutcome {
    /// Items handled and recorded by this call.
    #[must_use]
    pub fn processed(&self) -> usize {
        self.processed
    }

    /// Items skipped because they were processed before.
    #[must_use]
    pub fn duplicates(&self) -> usize {
        self.duplicates
    }

    /// Items skipped because a concurrent delivery is processing them right now.
    #[must_use]
    pub fn in_progress(&self) -> usize {
        self.in_progress
    }

    /// Items without an id, handled without deduplication.
    #[must_use]
    pub fn without_id(&self) -> usize {
        self.without_id
    }

    /// `true` when every item is processed, here or before: acknowledge with 2xx.
    /// Otherwise some items are still being processed by a concurrent delivery, which
    /// may yet fail: answer 409 with `Retry-After` so the sender retries the batch
    /// ([`BatchDeduper::respond`] does both).
    #[must_use]
    pub fn is_settled(&self) -> bool {
        self.in_progress == 0
    }
}

/// A batch that could not be processed to the end.
///
/// Items completed before the error stay completed ([`BatchError::outcome`]); the retry
/// skips them.
pub struct BatchError<E> {
    kind: ErrorKind<E>,
    outcome: BatchOutcome,
}

enum ErrorKind<E> {
    NotArray(String),
    InvalidItem {
        index: usize,
        source: Rejection,
    },
    Signature {
        index: usize,
        source: SignatureError,
    },
    Claim(ClaimError),
    Store(StoreError),
    Handler {
        index: usize,
        source: E,
    },
}

impl<E> BatchError<E> {
    fn new(kind: ErrorKind<E>, outcome: BatchOutcome) -> Self {
        Self { kind, outcome }
    }

    /// `true` when the body is not a batch, or an item is not where the deduper looks
    /// or its id is unusable.
    #[must_use]
    pub fn is_invalid_batch(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::NotArray(_) | ErrorKind::InvalidItem { .. }
        )
    }

    /// `true` when an item's signature does not verify ([`BatchError::signature_error`]
    /// says how); no item was claimed.
    #[must_use]
    pub fn is_signature_rejected(&self) -> bool {
        matches!(self.kind, ErrorKind::Signature { .. })
    }

    /// The signature error of the item that did not verify.
    #[must_use]
    pub fn signature_error(&self) -> Option<&SignatureError> {
        match &self.kind {
            ErrorKind::Signature { source, .. } => Some(source),
            _ => None,
        }
    }

    /// `true` when the store failed or could not be reached: nothing of the batch was
    /// recorded past what the error's items say; the delivery gets
    /// `503 store-unavailable` and the sender's redelivery runs what is left. The same
    /// fact is [`OnceError::is_store_unavailable`](crate::OnceError::is_store_unavailable)
    /// on the function API and [`StoreError::is_unavailable`](crate::store::StoreError::is_unavailable)
    /// on a store's own error.
    #[must_use]
    pub fn is_store_unavailable(&self) -> bool {
        match &self.kind {
            ErrorKind::Claim(e) => !e.is_store_full(),
            ErrorKind::Store(_) => true,
            _ => false,
        }
    }

    /// `true` when the store is at its bound and refused an item's new id: the items
    /// before it stay recorded ([`BatchError::outcome`]), the rest did not run; the
    /// delivery gets `503 store-full` with `Retry-After`, and the sender's redelivery
    /// runs what is left once expired records were swept. The same fact is
    /// [`OnceError::is_store_full`](crate::OnceError::is_store_full) on the function API
    /// and [`StoreError::is_full`](crate::store::StoreError::is_full) on a store's own
    /// error.
    #[must_use]
    pub fn is_store_full(&self) -> bool {
        matches!(&self.kind, ErrorKind::Claim(e) if e.is_store_full())
    }

    /// The handler's error, when the handler failed.
    #[must_use]
    pub fn handler_error(&self) -> Option<&E> {
        match &self.kind {
            ErrorKind::Handler { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The index of the item that failed, when one did.
    #[must_use]
    pub fn item_index(&self) -> Option<usize> {
        match &self.kind {
            ErrorKind::Handler { index, .. }
            | ErrorKind::InvalidItem { index, .. }
            | ErrorKind::Signature { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// What was done before the error.
    #[must_use]
    pub fn outcome(&self) -> BatchOutcome {
        self.outcome
    }

    /// The status to answer the delivery with: 400 for an invalid batch (a retry of the
    /// same bytes cannot succeed), 401 for an item whose signature does not verify, 503
    /// for a store failure or a full store, 500 for a handler failure (the sender retries; completed
    /// items are skipped then).
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match &self.kind {
            ErrorKind::NotArray(_) => Problem::InvalidKey.default_status(),
            ErrorKind::InvalidItem { source, .. } => source.status(),
            ErrorKind::Signature { source, .. } => source.status(),
            ErrorKind::Claim(e) if e.is_store_full() => Problem::StoreFull.default_status(),
            ErrorKind::Claim(_) | ErrorKind::Store(_) => Problem::StoreUnavailable.default_status(),
            ErrorKind::Handler { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl<E: fmt::Display> BatchError<E> {
    /// The answer to the delivery, with [`BatchError::status`]: a problem response
    /// (`invalid-key`, `signature-rejected`, `store-unavailable` or `store-full` with
    /// `Retry-After`)
    /// where the crate has one, a plain `500` with this error's text when the handler
    /// failed.
    #[must_use]
    pub fn into_response(self) -> http::Response<ResponseBody> {
        let detail = self.to_string();
        let rejection = match self.kind {
            ErrorKind::NotArray(_) => Rejection::invalid_key(detail),
            ErrorKind::InvalidItem { source, .. } => source,
            ErrorKind::Signature { .. } => Rejection::signature_rejected(detail),
            ErrorKind::Claim(e) if e.is_store_full() => Rejection::store_full(e.retry_after()),
            ErrorKind::Claim(e) => Rejection::store_unavailable(e.retry_after()),
            ErrorKind::Store(_) => {
                Rejection::store_unavailable(Engine::DEFAULT_UNAVAILABLE_RETRY_AFTER)
            }
            ErrorKind::Handler { .. } => {
                let mut resp = http::Response::new(ResponseBody::full(Bytes::from(detail)));
                *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return resp;
            }
        };
        rejection.into_response()
    }
}

impl<E: fmt::Display> fmt::Display for BatchError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::NotArray(e) => write!(f, "the body is not a batch of items: {e}"),
            ErrorKind::InvalidItem { index, source } => write!(f, "batch item {index}: {source}"),
            ErrorKind::Signature { index, source } => write!(
                f,
                "batch item {index}: {source}; no item of the batch was processed"
            ),
            ErrorKind::Claim(e) => write!(f, "batch deduplication failed: {e}"),
            ErrorKind::Store(e) => write!(f, "batch deduplication failed: {e}"),
            ErrorKind::Handler { index, source } => write!(
                f,
                "the handler failed on batch item {index}: {source}; it was released so that the retry processes it"
            ),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for BatchError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            ErrorKind::NotArray(e) => format!("NotArray({e})"),
            ErrorKind::InvalidItem { index, source } => format!("InvalidItem({index}, {source})"),
            ErrorKind::Signature { index, source } => format!("Signature({index}, {source})"),
            ErrorKind::Claim(e) => format!("Claim({e})"),
            ErrorKind::Store(e) => format!("Store({e})"),
            ErrorKind::Handler { index, source } => format!("Handler({index}, {source:?})"),
        };
        f.debug_struct("BatchError")
            .field("kind", &kind)
            .field("outcome", &self.outcome)
            .finish()
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for BatchError<E> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::once::OnceError;
    use crate::store::MemoryStore;

    /// An item id that another kind of operation holds in the deduper's scope (another
    /// fingerprint) is not the deduper's to run, whether that operation is done or still
    /// running: it is skipped as processed, never run, never left pending.
    #[tokio::test]
    async fn an_id_held_by_another_operation_in_the_scope_is_skipped() {
        let store = Arc::new(MemoryStore::new());
        let other = Engine::new(store.clone());
        let fp = Fingerprint::of_bytes(b"another operation");
        let key = |k: &str| IdempotencyKey::new(k).expect("valid key");
        let done: Result<_, OnceError<std::io::Error>> = other
            .once("webhook:sendgrid", &key("sg_done"), &fp, || async {
                Ok(1u8)
            })
            .await;
        assert!(done.is_ok());
        let Ok(Claimed::Execute(running)) = other
            .claim("webhook:sendgrid", &key("sg_running"), &fp)
            .await
        else {
            panic!("the other operation claims its key");
        };

        let dedup = BatchDeduper::sendgrid(store);
        let body = Bytes::from_static(
            br#"[{"sg_event_id":"sg_done"},{"sg_event_id":"sg_running"},{"sg_event_id":"sg_new"}]"#,
        );
        let mut ran = Vec::new();
        let outcome = dedup
            .process(&body, |item| {
                ran.push(item.index());
                async { Ok::<_, std::io::Error>(()) }
            })
            .await
            .expect("processed");
        assert_eq!(ran, [2]);
        assert_eq!(
            (
                outcome.processed(),
                outcome.duplicates(),
                outcome.in_progress()
            ),
            (1, 2, 0)
        );
        assert!(outcome.is_settled());
        drop(running);
    }
}
