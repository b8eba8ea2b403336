//! The outbox's error type.

use std::error::Error as StdError;
use std::fmt;
use std::time::SystemTime;

use super::journal::{JournalError, Operation};
use crate::IdempotencyKey;

/// What went wrong with an operation of an [`Outbox`](super::Outbox).
///
/// Opaque like the client's [`Error`](crate::Error): ask it with the `is_*()`
/// methods, or read [`OutboxError::kind_str`].
///
/// ```
/// use idemkey::client::outbox::OutboxError;
///
/// fn what_now(err: &OutboxError) -> &'static str {
///     if err.is_outcome_unknown() {
///         "pending: the resumer will send it again with the same key"
///     } else if err.is_expired() {
///         "too old to resend safely: check with the API, then decide"
///     } else if err.is_operation_reused() {
///         "a bug: two different requests named with one operation id"
///     } else {
///         "see the message"
///     }
/// }
/// ```
pub struct OutboxError(Box<Inner>);

struct Inner {
    kind: Kind,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

#[derive(Debug)]
enum Kind {
    OperationReused { id: String, what: String },
    OutcomeUnknown { id: String, key: IdempotencyKey },
    Expired { id: String, age_secs: u64 },
    NotFound { id: String },
    InvalidRequest { id: String, why: String },
    Journal,
}

impl OutboxError {
    fn new(kind: Kind, source: Option<Box<dyn StdError + Send + Sync>>) -> Self {
        Self(Box::new(Inner { kind, source }))
    }

    pub(crate) fn operation_reused(existing: &Operation, new: &Operation) -> Self {
        let what = if existing.method != new.method {
            format!("method {} (recorded: {})", new.method, existing.method)
        } else if existing.url != new.url {
            format!("URL {} (recorded: {})", new.url, existing.url)
        } else {
            format!(
                "a body of {} bytes that differs from the recorded one of {} bytes",
                new.body.len(),
                existing.body.len()
            )
        };
        Self::new(
            Kind::OperationReused {
                id: existing.id.clone(),
                what,
            },
            None,
        )
    }

    pub(crate) fn outcome_unknown(op: &Operation, source: Box<dyn StdError + Send + Sync>) -> Self {
        Self::new(
            Kind::OutcomeUnknown {
                id: op.id.clone(),
                key: op.key.clone(),
            },
            Some(source),
        )
    }

    pub(crate) fn expired(id: &str, created: SystemTime) -> Self {
        let age_secs = SystemTime::now()
            .duration_since(created)
            .map_or(0, |d| d.as_secs());
        Self::new(
            Kind::Expired {
                id: id.to_owned(),
                age_secs,
            },
            None,
        )
    }

    pub(crate) fn not_found(id: &str) -> Self {
        Self::new(Kind::NotFound { id: id.to_owned() }, None)
    }

    pub(crate) fn invalid_request(id: &str, why: impl Into<String>) -> Self {
        Self::new(
            Kind::InvalidRequest {
                id: id.to_owned(),
                why: why.into(),
            },
            None,
        )
    }

    /// The operation id was recorded before for a different request (method, URL or
    /// body): the client-side twin of the server's `key-reused`. Nothing was sent.
    #[must_use]
    pub fn is_operation_reused(&self) -> bool {
        matches!(self.0.kind, Kind::OperationReused { .. })
    }

    /// No final answer came (transport errors, timeouts, 5xx, 408, 429 or "in
    /// progress" outlasted the client's retries). The operation stays pending: resume
    /// it later, with its key, to learn the outcome without executing it twice.
    #[must_use]
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self.0.kind, Kind::OutcomeUnknown { .. })
    }

    /// The operation is pending and older than the outbox's retention window, so it was
    /// not sent: the remote API may have forgotten its key and would execute it again.
    /// The application decides (check with the API, then send a new operation).
    #[must_use]
    pub fn is_expired(&self) -> bool {
        matches!(self.0.kind, Kind::Expired { .. })
    }

    /// No operation with this id is recorded.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self.0.kind, Kind::NotFound { .. })
    }

    /// The request cannot go through the outbox (a streaming body, an invalid id or
    /// URL). Nothing was recorded or sent.
    #[must_use]
    pub fn is_invalid_request(&self) -> bool {
        matches!(self.0.kind, Kind::InvalidRequest { .. })
    }

    /// The journal could not be read or written ([`OutboxError::journal_error`]).
    /// When enqueueing failed, nothing was sent.
    #[must_use]
    pub fn is_journal(&self) -> bool {
        matches!(self.0.kind, Kind::Journal)
    }

    /// The journal's error, when [`OutboxError::is_journal`].
    #[must_use]
    pub fn journal_error(&self) -> Option<&JournalError> {
        self.0.source.as_ref()?.downcast_ref()
    }

    /// The operation's id, when the error is about one operation.
    #[must_use]
    pub fn operation_id(&self) -> Option<&str> {
        match &self.0.kind {
            Kind::OperationReused { id, .. }
            | Kind::OutcomeUnknown { id, .. }
            | Kind::Expired { id, .. }
            | Kind::NotFound { id }
            | Kind::InvalidRequest { id, .. } => Some(id),
            Kind::Journal => None,
        }
    }

    /// The key of the operation whose outcome is unknown.
    #[must_use]
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match &self.0.kind {
            Kind::OutcomeUnknown { key, .. } => Some(key),
            _ => None,
        }
    }

    /// A stable snake_case name of the kind: `operation_reused`, `outcome_unknown`,
    /// `expired`, `not_found`, `invalid_request` or `journal`.
    #[must_use]
    pub fn kind_str(&self) -> &'static str {
        match self.0.kind {
            Kind::OperationReused { .. } => "operation_reused",
            Kind::OutcomeUnknown { .. } => "outcome_unknown",
            Kind::Expired { .. } => "expired",
            Kind::NotFound { .. } => "not_found",
            Kind::InvalidRequest { .. } => "invalid_request",
            Kind::Journal => "journal",
        }
    }
}

impl From<JournalError> for OutboxError {
    fn from(e: JournalError) -> Self {
        Self::new(Kind::Journal, Some(Box::new(e)))
    }
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            Kind::OperationReused { id, what } => write!(
                f,
                "operation {id:?} was recorded before for a different request: this one has \
                 {what}; nothing was sent: name a different operation with a new id"
            ),
            Kind::OutcomeUnknown { id, key } => {
                write!(f, "no final answer for operation {id:?} (key {key})")?;
                if let Some(source) = &self.0.source {
                    write!(f, ": {}", crate::outcome::error_chain(&**source))?;
                }
                f.write_str(
                    "; it stays pending: resume the outbox later to finish it with the same key",
                )
            }
            Kind::Expired { id, age_secs } => write!(
                f,
                "operation {id:?} is pending and {age_secs} s old, past the outbox's retention \
                 window: it was not sent, because the remote API may have forgotten its key \
                 and would execute it again; check with the API, then decide"
            ),
            Kind::NotFound { id } => write!(f, "no operation {id:?} is recorded in the outbox"),
            Kind::InvalidRequest { id, why } => {
                write!(
                    f,
                    "operation {id:?} cannot go through the outbox: {why}; nothing was recorded"
                )
            }
            Kind::Journal => match &self.0.source {
                Some(source) => write!(f, "{source}"),
                None => f.write_str("the outbox journal failed"),
            },
        }
    }
}

impl fmt::Debug for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxError")
            .field("kind", &self.0.kind)
            .field("source", &self.0.source)
            .finish()
    }
}

impl StdError for OutboxError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
