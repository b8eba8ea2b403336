//! Batches: deliveries that carry many events (SendGrid's event arrays).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::preset::DEFAULT_WEBHOOK_RETENTION;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::protocol::Problem;
use crate::server::engine::{ClaimError, Claimed, Engine};
use crate::server::extract::KeySource;
use crate::server::rejection::Rejection;
use crate::store::{Store, StoreError};

/// What the fingerprint recorded with every batch item is made of (items are
/// identified by id only, so every item has the same one).
const ITEM_FINGERPRINT: &[u8] = b"idemkey/batch-item/v1";
/// What a completed item's record holds.
const ITEM_DONE: &[u8] = b"done";
/// The default lease on an item while its handler runs (renewed every third of it).
pub const DEFAULT_ITEM_LEASE: Duration = Duration::from_secs(30);

/// Processes each item of a batch delivery at most once, by the items' own ids.
///
/// Some senders put many events in one delivery and retry the whole delivery when it
/// fails: SendGrid's Event Webhook posts a JSON array of events, each with its
/// `sg_event_id`. A retried batch holds events that were already processed. The deduper
/// keeps only the items not processed yet, and records each one as it completes:
///
/// - per item, in order: claim its id in the store; a claim that wins runs the handler,
///   then completes the record (kept for the retention) or, when the handler fails,
///   releases it and stops;
/// - an item already completed is skipped (a duplicate);
/// - an item that a concurrent delivery of the same batch is processing right now is
///   skipped and reported in [`BatchOutcome::in_progress`]: answer that delivery with a
///   retry status (409 and `Retry-After`, see [`BatchOutcome::is_settled`]) so that
///   nothing is acknowledged before it is processed.
///
/// Claims are atomic in the store, so any number of concurrent duplicate batches, on
/// any number of instances sharing a store, run each item once. While a handler runs,
/// its lease is renewed; if the delivery is cancelled, the claim is released so the
/// redelivery processes the item.
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
}

impl fmt::Debug for BatchDeduper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchDeduper")
            .field("id", &self.id)
            .field("scope", &self.scope)
            .field("lease", &self.engine.lease())
            .field("retention", &self.engine.retention())
            .finish_non_exhaustive()
    }
}

impl BatchDeduper {
    /// A deduper of JSON-array batches whose items carry their id where `id` says
    /// (read from each item; a header source finds nothing). Scope `webhook:batch`,
    /// lease [`DEFAULT_ITEM_LEASE`], retention [`DEFAULT_WEBHOOK_RETENTION`].
    #[must_use]
    pub fn new(store: impl Store, id: KeySource) -> Self {
        Self {
            engine: Engine::builder(store)
                .lease(DEFAULT_ITEM_LEASE)
                .retention(DEFAULT_WEBHOOK_RETENTION)
                .build(),
            id,
            scope: Arc::from("webhook:batch"),
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

    /// The scope of the items' records (one per sender, or per sender and tenant).
    #[must_use]
    pub fn scope(mut self, scope: &str) -> Self {
        self.scope = Arc::from(scope);
        self
    }

    /// The lease held on an item while its handler runs (renewed every third of it).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        let lease = lease.max(Duration::from_millis(10));
        self.engine = self.engine.to_builder().lease(lease).build();
        self
    }

    /// How long a processed item's id is remembered.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.engine = self.engine.to_builder().retention(retention).build();
        self
    }

    /// Runs `handler` on each item of `body` (a JSON array) not processed yet.
    ///
    /// Items are handled one after another, in order. Items without an id are handled
    /// every time (they cannot be deduplicated) and counted in
    /// [`BatchOutcome::without_id`].
    ///
    /// # Errors
    /// [`BatchError`]: the body is not a JSON array or an item's id is unusable (400);
    /// the store failed (503); the handler failed on an item (its claim was released and
    /// the items after it were not looked at; answer 5xx so the sender retries). Items
    /// completed before the error stay completed and are skipped on the retry.
    pub async fn process<F, Fut, E>(
        &self,
        body: &Bytes,
        mut handler: F,
    ) -> Result<BatchOutcome, BatchError<E>>
    where
        F: FnMut(BatchItem) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let mut outcome = BatchOutcome::default();
        let items: Vec<&RawValue> = serde_json::from_slice(body).map_err(|e| BatchError {
            kind: ErrorKind::NotArray(e.to_string()),
            outcome,
        })?;
        let no_headers = HeaderMap::new();
        let item_fingerprint = Fingerprint::of_bytes(ITEM_FINGERPRINT);
        for (index, raw) in items.into_iter().enumerate() {
            let json = body.slice_ref(raw.get().as_bytes());
            let key = self
                .id
                .extract(&no_headers, &json)
                .map_err(|e| BatchError {
                    kind: ErrorKind::InvalidItem { index, source: e },
                    outcome,
                })?;
            let item = BatchItem {
                index,
                key: key.clone(),
                json,
            };
            let Some(key) = key else {
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
                Claimed::InProgress { .. } => outcome.in_progress += 1,
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
    /// may yet fail: answer 409 with `Retry-After` so the sender retries the batch.
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
    InvalidItem { index: usize, source: Rejection },
    Claim(ClaimError),
    Store(StoreError),
    Handler { index: usize, source: E },
}

impl<E> BatchError<E> {
    fn new(kind: ErrorKind<E>, outcome: BatchOutcome) -> Self {
        Self { kind, outcome }
    }

    /// `true` when the body is not a JSON array, or an item's id is unusable.
    #[must_use]
    pub fn is_invalid_batch(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::NotArray(_) | ErrorKind::InvalidItem { .. }
        )
    }

    /// `true` when the store failed.
    #[must_use]
    pub fn is_store(&self) -> bool {
        matches!(self.kind, ErrorKind::Claim(_) | ErrorKind::Store(_))
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
            ErrorKind::Handler { index, .. } | ErrorKind::InvalidItem { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// What was done before the error.
    #[must_use]
    pub fn outcome(&self) -> BatchOutcome {
        self.outcome
    }

    /// The status to answer the delivery with: 400 for an invalid batch (a retry of the
    /// same bytes cannot succeed), 503 for a store failure, 500 for a handler failure
    /// (the sender retries; completed items are skipped then).
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match &self.kind {
            ErrorKind::NotArray(_) => StatusCode::BAD_REQUEST,
            ErrorKind::InvalidItem { source, .. } => source.status(),
            ErrorKind::Claim(_) | ErrorKind::Store(_) => Problem::StoreUnavailable.default_status(),
            ErrorKind::Handler { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl<E: fmt::Display> fmt::Display for BatchError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::NotArray(e) => write!(f, "the batch is not a JSON array: {e}"),
            ErrorKind::InvalidItem { index, source } => write!(f, "batch item {index}: {source}"),
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
    use crate::server::once::OnceError;
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
