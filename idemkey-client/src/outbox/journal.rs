//! The journal contract: where an [`Outbox`](super::Outbox) keeps its operations.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use crate::IdempotencyKey;

/// One outgoing call kept by an outbox: what to send (without credentials), and, once
/// known, what came back.
///
/// Journals store every field and give them back unchanged; the outbox decides what
/// they mean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// The caller's name for the operation (`"charge:order-42"`), unique in its journal.
    pub id: String,
    /// The idempotency key every send of the operation carries (UUID v5 of the id).
    pub key: IdempotencyKey,
    /// The request's method.
    pub method: Method,
    /// The request's URL.
    pub url: String,
    /// The request's headers that are safe to keep (credentials removed).
    pub headers: HeaderMap,
    /// The request's body.
    pub body: Bytes,
    /// When the operation was first recorded.
    pub created: SystemTime,
    /// How many times the operation was handed to the client (each time with its own
    /// retries); 0 while it was only enqueued.
    pub attempts: u32,
    /// The final answer, once recorded; `None` while the outcome is unknown (pending).
    pub outcome: Option<Outcome>,
}

impl Operation {
    /// Whether the outcome is still unknown.
    #[must_use]
    pub fn is_pending(&self) -> bool {
        self.outcome.is_none()
    }

    /// Whether `self` and `other` ask for the same request: method, URL and body. (The
    /// headers may differ: credentials are re-applied on every send.)
    #[must_use]
    pub fn same_request(&self, other: &Operation) -> bool {
        self.method == other.method && self.url == other.url && self.body == other.body
    }
}

/// The final answer to an operation, as recorded in the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The answer's status.
    pub status: StatusCode,
    /// Whether the server replayed a stored answer (the request had executed before).
    pub replayed: bool,
    /// The attempts the client made in the send that got this answer.
    pub attempts: u32,
    /// The answer's headers (minus `Set-Cookie`).
    pub headers: HeaderMap,
    /// The answer's body, up to the outbox's limit.
    pub body: Bytes,
    /// Whether the body was longer than the limit and was cut.
    pub body_truncated: bool,
    /// When the outcome was recorded.
    pub completed: SystemTime,
}

/// What [`Journal::enqueue`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// The operation was new and is now recorded as given.
    Inserted,
    /// An operation with this id was recorded before; here it is, as stored.
    Existing(Box<Operation>),
}

/// A journal: the durable home of an outbox's operations.
///
/// Every journal honours this contract, checked by the conformance suite
/// (`idemkey::testing::journal_conformance`, feature `test-util`):
///
/// 1. [`enqueue`](Journal::enqueue) is atomic per id: of any number of concurrent
///    enqueues of one id, exactly one returns [`Enqueued::Inserted`]; the others return
///    the stored operation. When it returns, the operation is durable (for the durable
///    journals: on disk, or committed).
/// 2. [`begin_attempt`](Journal::begin_attempt) adds one to the attempts of a pending
///    operation and returns the new count; it changes nothing on a completed one.
/// 3. [`complete`](Journal::complete) records the outcome of a pending operation; the
///    first outcome recorded wins, a later one changes nothing (`false`).
/// 4. [`get`](Journal::get) returns the operation as stored; [`pending`](Journal::pending)
///    lists the pending ones, oldest first.
/// 5. Every field comes back unchanged: headers (names and byte values, repeated
///    names in order), body bytes, times to the millisecond.
/// 6. [`complete_deferred`](Journal::complete_deferred) records an outcome as
///    [`complete`](Journal::complete) does, without waiting for it to be durable. From
///    the moment it returns, this journal (and its clones) reads it back:
///    [`get`](Journal::get) returns it, [`pending`](Journal::pending) leaves the
///    operation out, [`begin_attempt`](Journal::begin_attempt) takes no attempt, a
///    second enqueue returns it. It is durable once [`flush`](Journal::flush) returns.
///    Writes that wait ([`enqueue`](Journal::enqueue),
///    [`begin_attempt`](Journal::begin_attempt)) commit after every outcome queued
///    before them, so a crash loses only outcomes queued after the last write that
///    returned.
///
/// **Why losing a deferred outcome is safe.** A crash before the outcome's commit leaves
/// the operation pending on disk, exactly as a crash just before the outcome was known
/// does. The next [`Outbox::resume`](super::Outbox::resume) re-sends it with the same key
/// and body, and the server answers with its stored replay: nothing executes twice (as
/// long as the resume comes within the remote API's retention window, which the outbox
/// enforces).
///
/// Which journal defers: [`MemoryJournal`](super::MemoryJournal) records at once (the
/// default methods). `SqliteJournal` and `PostgresJournal` queue the outcome to their
/// one ordered writer, committed with the next group commit, which keeps the ordering
/// above.
#[async_trait]
pub trait Journal: Send + Sync + 'static {
    /// Records `op` (pending, or with its outcome) unless an operation with its id
    /// exists.
    ///
    /// # Errors
    /// The journal could not record it: nothing of `op` was kept, so retrying is safe.
    /// The SQL journals commit concurrent writes together, and one failing statement
    /// fails every write of its batch (see `SqliteJournal`, `PostgresJournal`).
    async fn enqueue(&self, op: &Operation) -> Result<Enqueued, JournalError>;

    /// Adds one to the attempts of the pending operation `id`: the new count, or `None`
    /// when it is absent or completed.
    async fn begin_attempt(&self, id: &str) -> Result<Option<u32>, JournalError>;

    /// Records the outcome of the pending operation `id`: `true` if this call recorded
    /// it, `false` when it was absent or already completed.
    async fn complete(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError>;

    /// Records the outcome of the pending operation `id` without waiting for it to be
    /// durable (contract point 6): read back at once by this journal, durable after
    /// [`flush`](Journal::flush). `false` when this journal knows at once that it changes
    /// nothing (absent, completed, or an outcome is queued already: the first stays);
    /// `true` otherwise.
    ///
    /// The default records it at once, with [`complete`](Journal::complete).
    async fn complete_deferred(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError> {
        self.complete(id, outcome).await
    }

    /// Waits until every outcome queued by
    /// [`complete_deferred`](Journal::complete_deferred) before this call is durable.
    /// Call it before the process exits (the [`Outbox::flush`](super::Outbox::flush) of
    /// the outbox over this journal does).
    ///
    /// The default does nothing: a journal that records at once has nothing to wait for.
    ///
    /// # Errors
    /// A queued outcome could not be written since the last flush: its operation is
    /// pending in the journal, and a resume finishes it (with the server's replay).
    async fn flush(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// The operation `id`, if recorded.
    async fn get(&self, id: &str) -> Result<Option<Operation>, JournalError>;

    /// Up to `limit` pending operations, oldest first.
    async fn pending(&self, limit: usize) -> Result<Vec<Operation>, JournalError>;
}

/// A journal could not be read or written.
///
/// Made by journals with [`JournalError::unavailable`] (the database cannot be reached
/// or refused the statement: try again later) or [`JournalError::corrupt`] (a stored
/// row cannot be read back).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct JournalError {
    message: String,
    corrupt: bool,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl JournalError {
    /// The journal cannot be reached or refused the request; `message` says what was
    /// being done.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            message: message.into(),
            corrupt: false,
            source: Some(source.into()),
        }
    }

    /// A stored operation cannot be read back.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            corrupt: true,
            source: None,
        }
    }

    /// Whether a stored operation could not be read back.
    #[must_use]
    pub fn is_corrupt(&self) -> bool {
        self.corrupt
    }
}

/// Milliseconds since the Unix epoch (0 before it; saturating far after).
pub(crate) fn to_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The inverse of [`to_millis`].
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
        .unwrap_or(UNIX_EPOCH)
}

/// This machine's clock, to the millisecond (what every journal keeps).
pub(crate) fn now() -> SystemTime {
    from_millis(to_millis(SystemTime::now()))
}
