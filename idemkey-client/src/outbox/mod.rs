//! A durable outbox for outgoing calls: the client remembers what it sent, across a
//! crash (feature `outbox`).
//!
//! A keyed call is safe to retry only while the process that knows the key lives. If
//! the process dies after sending a charge and before recording the answer, a new
//! attempt after the restart would carry a new key and might charge twice. An
//! [`Outbox`] closes that gap:
//!
//! 1. The caller names the operation (`"charge:order-42"`). Its key is derived from that
//!    name (UUID v5), so the same operation always carries the same key.
//! 2. The operation (method, URL, the headers that are safe to keep, body, time) is
//!    written to a [`Journal`] **before** the first byte is sent. Credentials
//!    (`Authorization`, `Proxy-Authorization`, `Cookie`, and any header you add with
//!    [`OutboxBuilder::keep_out`]) are never written; a resend gets them from the
//!    client's default headers or from [`OutboxBuilder::credentials`].
//! 3. It is sent through your usual client stack (same retries, same key), and its final
//!    answer is recorded: status, replayed or not, attempts, headers and body (up to
//!    [`OutboxBuilder::body_limit`]). When no final answer came
//!    ([`OutboxError::is_outcome_unknown`]) it stays **pending**. The caller gets the
//!    answer without waiting for the outcome's commit (reads in this process see it at
//!    once; [`Outbox::flush`] waits for it, call it before exiting): a crash before that
//!    commit leaves the operation pending, and a resume gets the server's replay.
//! 4. After a restart, [`Outbox::outcome`] answers what happened, [`Outbox::pending`]
//!    lists what is unknown, and [`Outbox::resume`] (or the background
//!    [`Outbox::spawn_resumer`]) re-sends each pending operation with its original key
//!    and body: the server replays what it already executed and executes what it never
//!    saw. An operation older than the remote API's retention window
//!    ([`OutboxBuilder::retention`], 24 h by default as Stripe documents) is never
//!    re-sent automatically, since the server would no longer recognise its key: it is
//!    reported as expired for the application to decide.
//!
//! Journals: [`MemoryJournal`] (tests), `SqliteJournal` (feature `outbox-sqlite`, the
//! embedded default, with group commit), `PostgresJournal` (feature `outbox-postgres`,
//! shared). The SQL journals can also take an operation inside the application's own
//! `sqlx` transaction (`enqueue_in`): the transactional outbox, where "order written"
//! and "charge to send" commit together.
//!
//! ```
//! use idemkey::client::IdempotentClientBuilder;
//! use idemkey::client::outbox::{MemoryJournal, Outbox, OutboxExt};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let app = axum::Router::new().route("/charges", axum::routing::post(|| async { "{\"id\":\"ch_1\"}" }));
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let base = format!("http://{}", listener.local_addr()?);
//! # tokio::spawn(async move { axum::serve(listener, app).await });
//! let client = IdempotentClientBuilder::new(reqwest::Client::new()).build();
//! let outbox = Outbox::new(MemoryJournal::new());
//!
//! let outcome = client
//!     .post(format!("{base}/charges"))
//!     .bearer_auth("sk_test_123") // sent, never written to the journal
//!     .body(r#"{"amount":100}"#)
//!     .outbox(&outbox, "charge:order-42")
//!     .send()
//!     .await?;
//! assert_eq!(outcome.status, 200);
//!
//! // Later, or after a restart with a durable journal:
//! let known = outbox.outcome("charge:order-42").await?.expect("recorded");
//! assert_eq!(known.body, outcome.body);
//! assert!(outbox.pending().await?.is_empty());
//! outbox.flush().await?; // before exiting: every recorded outcome durable
//! # Ok(())
//! # }
//! ```
//!
#![doc = include_str!("guide.md")]

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod error;
mod journal;
mod memory;
#[cfg(feature = "outbox-postgres")]
mod postgres;
mod resume;
#[cfg(any(feature = "outbox-sqlite", feature = "outbox-postgres"))]
pub(crate) mod sql;
#[cfg(feature = "outbox-sqlite")]
mod sqlite;
#[cfg(any(feature = "outbox-sqlite", feature = "outbox-postgres"))]
pub(crate) mod writer;

pub use error::OutboxError;
pub use journal::{Enqueued, Journal, JournalError, Operation, Outcome};
pub use memory::MemoryJournal;
#[cfg(feature = "outbox-postgres")]
pub use postgres::{PostgresJournal, PostgresJournalBuilder};
pub use resume::{ResumeReport, Resumed, Resumer};
#[cfg(feature = "outbox-sqlite")]
pub use sqlite::{SqliteJournal, SqliteJournalBuilder};

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, header};
use reqwest_middleware::ClientWithMiddleware;
use uuid::Uuid;

use super::error::Error;
use super::request::KeyChoice;
use super::response::ResponseExt;
use crate::IdempotencyKey;
use idemkey_core::protocol::headers;

/// The UUID namespace of outbox keys: key = UUID v5 of (this namespace, operation id),
/// unless [`OutboxBuilder::namespace`] names another.
///
/// Fixed forever: changing it would change every operation's key, so that a resend
/// after an upgrade would execute again.
pub const OUTBOX_KEY_NAMESPACE: Uuid = Uuid::from_u128(0x3c1e_9d42_7b05_5f6a_8e21_4d0b_c9a7_1f58);

/// The longest operation id accepted, in bytes.
pub const MAX_OPERATION_ID_LEN: usize = 1024;

/// The headers never written to a journal, whatever the configuration.
const CREDENTIALS: [HeaderName; 3] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
];

type CredentialsHook = dyn Fn(&Operation, &mut HeaderMap) + Send + Sync;
type SentHook = dyn Fn(&Operation) + Send + Sync;

/// Outgoing calls persisted before they are sent and finished after a crash with the
/// same key. See the [module docs](self).
///
/// Cheap to clone; clones share the journal and the configuration.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    journal: Arc<dyn Journal>,
    namespace: Uuid,
    retention: Duration,
    keep_out: Vec<HeaderName>,
    body_limit: usize,
    concurrency: usize,
    credentials: Option<Arc<CredentialsHook>>,
    before_record: Option<Arc<SentHook>>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("retention", &self.inner.retention)
            .field("keep_out", &self.inner.keep_out)
            .field("body_limit", &self.inner.body_limit)
            .field("concurrency", &self.inner.concurrency)
            .finish_non_exhaustive()
    }
}

/// Configures an [`Outbox`]; made by [`Outbox::builder`].
///
/// ```
/// use std::time::Duration;
/// use idemkey::client::outbox::{MemoryJournal, Outbox};
///
/// let outbox = Outbox::builder(MemoryJournal::new())
///     .retention(Duration::from_secs(7 * 24 * 3600)) // the remote API keeps keys 7 days
///     .keep_out(["x-api-key"])
///     .credentials(|_op, headers| {
///         headers.insert("x-api-key", "secret".parse().expect("a valid header value"));
///     })
///     .body_limit(16 * 1024)
///     .build();
/// # let _ = outbox;
/// ```
pub struct OutboxBuilder {
    inner: Inner,
}

impl OutboxBuilder {
    /// How long the remote API keeps a key (default 24 h, Stripe's documented window).
    /// A pending operation older than that is never re-sent automatically: the server
    /// would no longer recognise its key and would execute it again.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.inner.retention = retention;
        self
    }

    /// More headers never written to the journal (besides `Authorization`,
    /// `Proxy-Authorization` and `Cookie`), such as an API-key header. Names that are
    /// not valid header names are ignored.
    #[must_use]
    pub fn keep_out<I, N>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = N>,
        N: AsRef<str>,
    {
        self.inner.keep_out.extend(
            names
                .into_iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_ref().as_bytes()).ok()),
        );
        self
    }

    /// Re-applies credentials to an operation re-sent from the journal (by
    /// [`Outbox::resume`], [`Outbox::deliver`] or a second send of the same id): `hook`
    /// gets the operation and its headers, and adds what the journal did not keep. The
    /// client's default headers apply as well, without a hook.
    #[must_use]
    pub fn credentials(
        mut self,
        hook: impl Fn(&Operation, &mut HeaderMap) + Send + Sync + 'static,
    ) -> Self {
        self.inner.credentials = Some(Arc::new(hook));
        self
    }

    /// The most bytes of an answer's body kept in the outcome (default 64 KiB); a
    /// longer body is cut and marked [`Outcome::body_truncated`].
    #[must_use]
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.inner.body_limit = bytes;
        self
    }

    /// How many operations [`Outbox::resume`] sends at once (default 8).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.inner.concurrency = n.max(1);
        self
    }

    /// The UUID namespace the keys are derived in (default [`OUTBOX_KEY_NAMESPACE`]),
    /// so that two applications with the same operation ids never share keys.
    #[must_use]
    pub fn namespace(mut self, namespace: Uuid) -> Self {
        self.inner.namespace = namespace;
        self
    }

    /// Calls `hook` after the client stack answered an operation and before its outcome
    /// is recorded: the moment a crash is most expensive. For crash tests (a process
    /// that kills itself there) and tracing; the hook must not block.
    #[must_use]
    pub fn before_record(mut self, hook: impl Fn(&Operation) + Send + Sync + 'static) -> Self {
        self.inner.before_record = Some(Arc::new(hook));
        self
    }

    /// The outbox.
    #[must_use]
    pub fn build(self) -> Outbox {
        Outbox {
            inner: Arc::new(self.inner),
        }
    }
}

impl Outbox {
    /// An outbox over `journal` with the default settings.
    #[must_use]
    pub fn new(journal: impl Journal) -> Self {
        Self::builder(journal).build()
    }

    /// A builder for an outbox over `journal`.
    #[must_use]
    pub fn builder(journal: impl Journal) -> OutboxBuilder {
        OutboxBuilder {
            inner: Inner {
                journal: Arc::new(journal),
                namespace: OUTBOX_KEY_NAMESPACE,
                retention: Duration::from_secs(24 * 3600),
                keep_out: CREDENTIALS.to_vec(),
                body_limit: 64 * 1024,
                concurrency: 8,
                credentials: None,
                before_record: None,
            },
        }
    }

    /// The journal.
    #[must_use]
    pub fn journal(&self) -> &dyn Journal {
        &*self.inner.journal
    }

    /// The key of operation `id`: UUID v5 of the outbox's namespace and the id. The same
    /// id gives the same key in every process.
    ///
    /// ```
    /// use idemkey::client::outbox::{MemoryJournal, Outbox};
    /// let (a, b) = (Outbox::new(MemoryJournal::new()), Outbox::new(MemoryJournal::new()));
    /// assert_eq!(a.key_for("charge:1"), b.key_for("charge:1"));
    /// assert_ne!(a.key_for("charge:1"), a.key_for("charge:2"));
    /// ```
    #[must_use]
    pub fn key_for(&self, id: &str) -> IdempotencyKey {
        IdempotencyKey::v5(&self.inner.namespace, id.as_bytes())
    }

    /// The operation `id` would be recorded as, pending and never sent, from `request`
    /// (built with `RequestBuilder::build`): for [`Outbox::enqueue`] or a journal's
    /// `enqueue_in`. Credentials are left out.
    ///
    /// # Errors
    /// [`OutboxError::is_invalid_request`]: the id is empty or longer than
    /// [`MAX_OPERATION_ID_LEN`], or the body is a stream (it could not be sent again).
    pub fn prepare(&self, id: &str, request: reqwest::Request) -> Result<Operation, OutboxError> {
        if id.is_empty() || id.len() > MAX_OPERATION_ID_LEN {
            return Err(OutboxError::invalid_request(
                id,
                format!("an operation id must be 1 to {MAX_OPERATION_ID_LEN} bytes"),
            ));
        }
        let body = match request.body() {
            None => Bytes::new(),
            Some(body) => match body.as_bytes() {
                Some(bytes) => Bytes::copy_from_slice(bytes),
                None => {
                    return Err(OutboxError::invalid_request(
                        id,
                        "the body is a stream, which cannot be kept and sent again: buffer it \
                         (Bytes, String, Vec<u8>, json)",
                    ));
                }
            },
        };
        let mut headers = request.headers().clone();
        for name in &self.inner.keep_out {
            headers.remove(name);
        }
        Ok(Operation {
            id: id.to_owned(),
            key: self.key_for(id),
            method: request.method().clone(),
            url: request.url().to_string(),
            headers,
            body,
            created: journal::now(),
            attempts: 0,
            outcome: None,
        })
    }

    /// Records `op` in the journal without sending it; [`Outbox::deliver`] or the
    /// resumer sends it. Returns the operation as stored (the earlier one, when the id
    /// was recorded before with the same request).
    ///
    /// # Errors
    /// [`OutboxError::is_operation_reused`] when the id was recorded before for a
    /// different request; [`OutboxError::is_journal`] when the journal failed.
    pub async fn enqueue(&self, op: Operation) -> Result<Operation, OutboxError> {
        match self.inner.journal.enqueue(&op).await? {
            Enqueued::Inserted => Ok(op),
            Enqueued::Existing(existing) => check_same(*existing, &op),
        }
    }

    /// What happened to operation `id`: its recorded outcome, or `None` while it is
    /// pending or unknown to the journal.
    ///
    /// # Errors
    /// The journal failed.
    pub async fn outcome(&self, id: &str) -> Result<Option<Outcome>, OutboxError> {
        Ok(self.inner.journal.get(id).await?.and_then(|op| op.outcome))
    }

    /// Waits until every outcome this process recorded so far is durable in the journal.
    ///
    /// Sends return as soon as their answer is known and its outcome queued, without
    /// waiting for the outcome's commit (the operation itself was durable before its
    /// first byte went out). Reads in this process ([`Outbox::outcome`],
    /// [`Outbox::pending`], [`Outbox::resume`]) see queued outcomes at once; a crash
    /// before their commit leaves those operations pending, and the next resume gets the
    /// server's replay. Call `flush` before the process exits, so that a clean exit
    /// leaves nothing to resume:
    ///
    /// ```
    /// use idemkey::client::outbox::{MemoryJournal, Outbox};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let outbox = Outbox::new(MemoryJournal::new());
    /// // ... sends ...
    /// outbox.flush().await?; // every recorded outcome is durable now
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`OutboxError::is_journal`]: a queued outcome could not be written; its operation
    /// is pending in the journal, and [`Outbox::resume`] finishes it.
    pub async fn flush(&self) -> Result<(), OutboxError> {
        Ok(self.inner.journal.flush().await?)
    }

    /// The operation `id` as recorded, if it is.
    ///
    /// # Errors
    /// The journal failed.
    pub async fn operation(&self, id: &str) -> Result<Option<Operation>, OutboxError> {
        Ok(self.inner.journal.get(id).await?)
    }

    /// Whether `op` is older than the retention window: it is not re-sent automatically.
    #[must_use]
    pub fn is_expired(&self, op: &Operation) -> bool {
        SystemTime::now()
            .duration_since(op.created)
            .is_ok_and(|age| age > self.inner.retention)
    }

    /// Sends the recorded operation `id` (enqueued before, or pending after a crash)
    /// with its key and body, and records its outcome. A completed operation is not
    /// sent again: its recorded outcome is returned.
    ///
    /// # Errors
    /// [`OutboxError::is_not_found`] (no such operation), [`OutboxError::is_expired`]
    /// (older than the retention window: not sent), [`OutboxError::is_outcome_unknown`]
    /// (no final answer: still pending), [`OutboxError::is_journal`].
    pub async fn deliver(
        &self,
        client: &ClientWithMiddleware,
        id: &str,
    ) -> Result<Outcome, OutboxError> {
        let Some(op) = self.inner.journal.get(id).await? else {
            return Err(OutboxError::not_found(id));
        };
        self.finish(client, op, None).await
    }

    /// Finishes `op` as found in the journal: its outcome if recorded; otherwise sends
    /// it (counting an attempt first) with `request` or the journal's copy.
    async fn finish(
        &self,
        client: &ClientWithMiddleware,
        op: Operation,
        request: Option<reqwest::Request>,
    ) -> Result<Outcome, OutboxError> {
        if let Some(outcome) = op.outcome {
            return Ok(outcome);
        }
        if self.is_expired(&op) {
            return Err(OutboxError::expired(&op.id, op.created));
        }
        let Some(attempts) = self.inner.journal.begin_attempt(&op.id).await? else {
            // Completed meanwhile (by a concurrent send).
            return self
                .outcome(&op.id)
                .await?
                .ok_or_else(|| OutboxError::not_found(&op.id));
        };
        let op = Operation { attempts, ..op };
        self.send(client, &op, request).await
    }

    /// Sends `op` through `client` with its key, and records the final answer.
    async fn send(
        &self,
        client: &ClientWithMiddleware,
        op: &Operation,
        request: Option<reqwest::Request>,
    ) -> Result<Outcome, OutboxError> {
        let request = match request {
            Some(r) => r,
            None => self.rebuild(op)?,
        };
        let mut ext = http::Extensions::new();
        ext.insert(KeyChoice::Use(op.key.clone()));
        let result = client.execute_with_extensions(request, &mut ext).await;
        let response = match result {
            Ok(response) => response,
            Err(err) => match Error::try_from_middleware(err) {
                // A final answer that the client turned into an error: it is the outcome.
                Ok(e) if e.is_key_reused() || e.is_already_executed() => match e.into_response() {
                    Some(response) => response,
                    None => return Err(OutboxError::outcome_unknown(op, "no answer kept".into())),
                },
                Ok(e) => return Err(OutboxError::outcome_unknown(op, e.into())),
                Err(e) => return Err(OutboxError::outcome_unknown(op, e.into())),
            },
        };
        let outcome = self.read_outcome(op, response).await?;
        if let Some(hook) = &self.inner.before_record {
            hook(op);
        }
        // Queued, not awaited: the answer goes back one synced commit sooner. A crash
        // before its commit leaves the operation pending, and a resume gets the replay
        // (journal contract, point 6).
        if !self
            .inner
            .journal
            .complete_deferred(&op.id, &outcome)
            .await?
        {
            // Another send recorded an outcome first: that one is the record.
            if let Some(first) = self.outcome(&op.id).await? {
                return Ok(first);
            }
        }
        Ok(outcome)
    }

    /// The request of a recorded operation, with credentials re-applied by the hook.
    fn rebuild(&self, op: &Operation) -> Result<reqwest::Request, OutboxError> {
        let url = reqwest::Url::parse(&op.url).map_err(|e| {
            OutboxError::invalid_request(&op.id, format!("the recorded URL {:?}: {e}", op.url))
        })?;
        let mut request = reqwest::Request::new(op.method.clone(), url);
        let mut headers = op.headers.clone();
        if let Some(hook) = &self.inner.credentials {
            hook(op, &mut headers);
        }
        *request.headers_mut() = headers;
        *request.body_mut() = Some(reqwest::Body::from(op.body.clone()));
        Ok(request)
    }

    /// Reads the answer into an outcome, its body up to the limit.
    async fn read_outcome(
        &self,
        op: &Operation,
        mut response: reqwest::Response,
    ) -> Result<Outcome, OutboxError> {
        let (replayed, attempts) = match response.idempotency() {
            Some(info) => (info.replayed(), info.attempts()),
            None => (headers::is_replayed(response.headers()), 1),
        };
        let status = response.status();
        let mut kept = response.headers().clone();
        kept.remove(header::SET_COOKIE);
        let limit = self.inner.body_limit;
        let mut body = Vec::new();
        let mut truncated = false;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = limit.saturating_sub(body.len());
                    if chunk.len() > room {
                        body.extend_from_slice(&chunk[..room]);
                        truncated = true;
                        break;
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                // The answer was cut inside its body: the server answered, but what it
                // said is not known in full. Keep it pending; a resend gets the replay.
                Err(e) => return Err(OutboxError::outcome_unknown(op, e.into())),
            }
        }
        Ok(Outcome {
            status,
            replayed,
            attempts,
            headers: kept,
            body: body.into(),
            body_truncated: truncated,
            completed: journal::now(),
        })
    }
}

/// The stored operation, if it asks for the same request as `new`.
fn check_same(existing: Operation, new: &Operation) -> Result<Operation, OutboxError> {
    if existing.same_request(new) {
        Ok(existing)
    } else {
        Err(OutboxError::operation_reused(&existing, new))
    }
}

/// Sends a request through an [`Outbox`]: `.outbox(&outbox, "charge:order-42")` on a
/// [`reqwest_middleware::RequestBuilder`].
///
/// The key is the operation's (set as with
/// [`RequestBuilderExt::idempotency_key`](crate::RequestBuilderExt::idempotency_key));
/// do not set a key header yourself.
pub trait OutboxExt {
    /// This request as operation `id` of `outbox`: see [`OutboxCall::send`].
    fn outbox(self, outbox: &Outbox, id: impl Into<String>) -> OutboxCall;
}

impl OutboxExt for reqwest_middleware::RequestBuilder {
    fn outbox(self, outbox: &Outbox, id: impl Into<String>) -> OutboxCall {
        OutboxCall {
            builder: self,
            outbox: outbox.clone(),
            id: id.into(),
        }
    }
}

/// A request on its way through an [`Outbox`]; made by [`OutboxExt::outbox`].
#[derive(Debug)]
pub struct OutboxCall {
    builder: reqwest_middleware::RequestBuilder,
    outbox: Outbox,
    id: String,
}

impl OutboxCall {
    /// Records the operation (durably, before anything is sent), sends it through the
    /// client it was built on, and records its final answer.
    ///
    /// The answer is returned once its outcome is queued to the journal, without waiting
    /// for the outcome to be durable: [`Outbox::outcome`] and [`Outbox::pending`] in this
    /// process see it at once, and [`Outbox::flush`] waits for it. Losing it in a crash
    /// is safe: the operation stays pending, and a resume re-sends it with the same key
    /// and gets the server's replay.
    ///
    /// The same id sent again: with the same request, a recorded outcome is returned
    /// without sending, and a pending operation is sent again with its key (the server
    /// replays it if it executed); with a different request, it is refused.
    ///
    /// # Errors
    /// - [`OutboxError::is_operation_reused`]: the id was recorded for a different
    ///   request (method, URL or body); nothing was sent.
    /// - [`OutboxError::is_outcome_unknown`]: no final answer came (transport errors,
    ///   5xx, in progress, past the client's retries); the operation stays pending.
    /// - [`OutboxError::is_expired`]: a pending operation of this id is older than the
    ///   retention window; not sent.
    /// - [`OutboxError::is_invalid_request`], [`OutboxError::is_journal`].
    pub async fn send(self) -> Result<Outcome, OutboxError> {
        let OutboxCall {
            builder,
            outbox,
            id,
        } = self;
        let (client, request) = builder.build_split();
        let request =
            request.map_err(|e| OutboxError::invalid_request(&id, format!("building it: {e}")))?;
        let sendable = request.try_clone();
        let mut op = outbox.prepare(&id, request)?;
        op.attempts = 1;
        match outbox.inner.journal.enqueue(&op).await? {
            Enqueued::Inserted => outbox.send(&client, &op, sendable).await,
            Enqueued::Existing(existing) => {
                let existing = check_same(*existing, &op)?;
                outbox.finish(&client, existing, sendable).await
            }
        }
    }
}
