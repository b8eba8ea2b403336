//! The client half's error type.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use reqwest::{Response, StatusCode};

use crate::{IdempotencyKey, InvalidKey};

/// What went wrong with a keyed request, with the key and, where the server answered,
/// its last response.
///
/// Opaque like [`reqwest::Error`]: ask it with the `is_*()` methods, or read
/// [`Error::kind_str`] for a stable snake_case name (for logs and JSON). It travels
/// through [`reqwest_middleware::Error::Middleware`]; get it back with
/// [`Error::from_middleware`] (borrowed) or [`Error::try_from_middleware`] (owned, to
/// take the response out).
///
/// ```
/// use idemkey::client::Error;
///
/// fn describe(err: &reqwest_middleware::Error) -> String {
///     match Error::from_middleware(err) {
///         Some(e) if e.is_outcome_unknown() => {
///             format!("retry later with key {}", e.key().map(|k| k.as_str()).unwrap_or("?"))
///         }
///         Some(e) => format!("{}: {e}", e.kind_str()),
///         None => format!("transport: {err}"),
///     }
/// }
/// ```
pub struct Error(Box<Inner>);

struct Inner {
    kind: Kind,
    attempts: u32,
    response: Option<Response>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Kind {
    #[error(
        "the server already used idempotency key {key} for a different request (HTTP {status}); \
         send a new key for a new operation, or resend the original payload to get its outcome"
    )]
    KeyReused {
        key: IdempotencyKey,
        status: StatusCode,
    },
    #[error(
        "the request with idempotency key {key} was still in progress on the server after the \
         last attempt (HTTP {status}); retry later with the same key to get its outcome"
    )]
    InProgress {
        key: IdempotencyKey,
        status: StatusCode,
    },
    #[error(
        "the server's idempotency store was full after the last attempt with idempotency key \
         {key} (HTTP {status}, problem store-full): nothing executed; retry later with the same \
         key, once its operator has made room or records have expired"
    )]
    StoreFull {
        key: IdempotencyKey,
        status: StatusCode,
    },
    #[error(
        "the server refused a new idempotency key over this client's quota after the last \
         attempt with key {key} (HTTP {status}, problem quota-exceeded): nothing executed; send \
         fewer new keys per second, and retry later with the same key"
    )]
    QuotaExceeded {
        key: IdempotencyKey,
        status: StatusCode,
    },
    #[error(
        "the server says a request with idempotency key {key} was executed before (HTTP \
         {status}) and does not replay its answer; the response body names what it did"
    )]
    AlreadyExecuted {
        key: IdempotencyKey,
        status: StatusCode,
    },
    #[error(
        "no final answer for idempotency key {key} ({cause}); the server may or may not have \
         executed the request: retry later with the same key to find out without executing it twice"
    )]
    OutcomeUnknown {
        key: IdempotencyKey,
        cause: String,
        #[source]
        source: Option<Arc<reqwest_middleware::Error>>,
    },
    #[error(
        "the request with idempotency key {key} was never sent ({cause}): no attempt got as far \
         as sending a byte of it, so nothing executed; check the URL and that the server is up, \
         then send it again (with this key or any other)"
    )]
    NeverSent {
        key: IdempotencyKey,
        cause: String,
        #[source]
        source: Option<Arc<reqwest_middleware::Error>>,
    },
    #[error(
        "the client's retry budget is used up, so the request with idempotency key {key} was \
         not retried ({cause}); the server may or may not have executed it: retry later with \
         the same key, once the upstream recovers"
    )]
    RetryBudgetExhausted {
        key: IdempotencyKey,
        cause: String,
        #[source]
        source: Option<Arc<reqwest_middleware::Error>>,
    },
    #[error("{source}; nothing was sent")]
    InvalidKey {
        #[source]
        source: InvalidKey,
    },
    #[error(
        "the body of the request with idempotency key {key} is a stream and cannot be sent \
         again, so the request cannot be retried safely; nothing was sent: buffer the body \
         (Bytes, String, Vec<u8>, json) or opt out of the key for this call"
    )]
    BodyNotReplayable { key: IdempotencyKey },
}

impl Error {
    pub(crate) fn new(kind: Kind, attempts: u32, response: Option<Response>) -> Self {
        Self(Box::new(Inner {
            kind,
            attempts,
            response,
        }))
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn invalid_key(source: InvalidKey) -> Self {
        Self::new(Kind::InvalidKey { source }, 0, None)
    }

    pub(crate) fn into_parts(self) -> (Kind, u32, Option<Response>) {
        let inner = *self.0;
        (inner.kind, inner.attempts, inner.response)
    }

    /// The server rejected the key because it was used before for a request with a
    /// different payload: a problem `key-reused` (422, or 400 from a Stripe-compatible
    /// server), or the vendor's documented equivalent
    /// ([`VendorProfile`](super::VendorProfile)). Not retried: the same request can never
    /// succeed with this key.
    #[must_use]
    pub fn is_key_reused(&self) -> bool {
        matches!(self.0.kind, Kind::KeyReused { .. })
    }

    /// The server still answered "in progress" (409, 423, or the vendor's equivalent: an
    /// earlier request with this key is running) when the retries ran out. Retry later
    /// with the same key.
    #[must_use]
    pub fn is_in_progress(&self) -> bool {
        matches!(self.0.kind, Kind::InProgress { .. })
    }

    /// The server's idempotency store was full (a problem `store-full`, 503) when the
    /// retries ran out: the server refused to record a new key and nothing executed.
    /// Retry later with [`Error::key`].
    #[must_use]
    pub fn is_store_full(&self) -> bool {
        matches!(self.0.kind, Kind::StoreFull { .. })
    }

    /// The server refused the new key over this client's quota of new keys (a problem
    /// `quota-exceeded`, 429) when the retries ran out: nothing was recorded or
    /// executed. Send fewer new keys per second, and retry later with [`Error::key`].
    #[must_use]
    pub fn is_quota_exceeded(&self) -> bool {
        matches!(self.0.kind, Kind::QuotaExceeded { .. })
    }

    /// The server says a request with this key was executed before and answers with
    /// that fact instead of a replay (GoCardless's 409 `idempotent_creation_conflict`,
    /// see [`VendorProfile::gocardless`](super::VendorProfile::gocardless)). Not
    /// retried; [`Error::response`] holds the answer, whose body names the result.
    #[must_use]
    pub fn is_already_executed(&self) -> bool {
        matches!(self.0.kind, Kind::AlreadyExecuted { .. })
    }

    /// A retry was due but the client's retry budget
    /// ([`RetryBudget`](super::RetryBudget)) was used up, as it is when the upstream
    /// fails for many calls at once. As with [`Error::is_outcome_unknown`], the server
    /// may have executed the request: retry later with [`Error::key`].
    #[must_use]
    pub fn is_retry_budget_exhausted(&self) -> bool {
        matches!(self.0.kind, Kind::RetryBudgetExhausted { .. })
    }

    /// No final answer came: transport errors, timeouts, 5xx, 408 or 429 (other than the
    /// verifier's `store-full` and `quota-exceeded`, which say nothing ran) outlasted the
    /// retries or the deadline, and at least one attempt may have reached the server.
    /// The server may have executed the request; retry later with [`Error::key`] to learn
    /// the outcome without executing it twice. (When no attempt sent anything, the error
    /// is [`Error::is_never_sent`] instead.)
    #[must_use]
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self.0.kind, Kind::OutcomeUnknown { .. })
    }

    /// Every attempt failed before any byte of the request was sent: the connection was
    /// refused, the host name did not resolve, the connection (or its TLS handshake)
    /// could not be set up in time. The request executed nowhere, so sending it again is
    /// safe with [`Error::key`] or any other key. Unlike [`Error::is_outcome_unknown`],
    /// which is kept for calls of which at least one attempt may have reached the server.
    ///
    /// ```no_run
    /// # async fn run(client: reqwest_middleware::ClientWithMiddleware) {
    /// use idemkey::client::Error;
    ///
    /// let err = client.post("http://127.0.0.1:1/charges").send().await.unwrap_err();
    /// let err = Error::from_middleware(&err).expect("idemkey's error");
    /// assert!(err.is_never_sent(), "{err}");
    /// assert_eq!(err.kind_str(), "never_sent");
    /// # }
    /// ```
    #[must_use]
    pub fn is_never_sent(&self) -> bool {
        matches!(self.0.kind, Kind::NeverSent { .. })
    }

    /// The key (from a header or a per-request option) is not 1 to 255 visible ASCII
    /// characters, or a key could not be derived from the payload. Nothing was sent.
    #[must_use]
    pub fn is_invalid_key(&self) -> bool {
        matches!(self.0.kind, Kind::InvalidKey { .. })
    }

    /// The request body is a stream, which cannot be sent twice, so a keyed request
    /// with it cannot be retried. Nothing was sent.
    #[must_use]
    pub fn is_body_not_replayable(&self) -> bool {
        matches!(self.0.kind, Kind::BodyNotReplayable { .. })
    }

    /// The idempotency key of the request, if it had a valid one: use it to retry the
    /// same operation later.
    #[must_use]
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match &self.0.kind {
            Kind::KeyReused { key, .. }
            | Kind::InProgress { key, .. }
            | Kind::StoreFull { key, .. }
            | Kind::QuotaExceeded { key, .. }
            | Kind::AlreadyExecuted { key, .. }
            | Kind::OutcomeUnknown { key, .. }
            | Kind::NeverSent { key, .. }
            | Kind::RetryBudgetExhausted { key, .. }
            | Kind::BodyNotReplayable { key } => Some(key),
            Kind::InvalidKey { .. } => None,
        }
    }

    /// How many attempts were sent (0 when the request was refused before sending).
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.0.attempts
    }

    /// A stable snake_case name of the kind: `key_reused`, `in_progress`, `store_full`,
    /// `quota_exceeded`, `already_executed`, `outcome_unknown`, `never_sent`,
    /// `retry_budget_exhausted`, `invalid_key` or `body_not_replayable`.
    #[must_use]
    pub fn kind_str(&self) -> &'static str {
        match self.0.kind {
            Kind::KeyReused { .. } => "key_reused",
            Kind::InProgress { .. } => "in_progress",
            Kind::StoreFull { .. } => "store_full",
            Kind::QuotaExceeded { .. } => "quota_exceeded",
            Kind::AlreadyExecuted { .. } => "already_executed",
            Kind::OutcomeUnknown { .. } => "outcome_unknown",
            Kind::NeverSent { .. } => "never_sent",
            Kind::RetryBudgetExhausted { .. } => "retry_budget_exhausted",
            Kind::InvalidKey { .. } => "invalid_key",
            Kind::BodyNotReplayable { .. } => "body_not_replayable",
        }
    }

    /// The status of the server's last answer, if one came.
    #[must_use]
    pub fn status(&self) -> Option<StatusCode> {
        self.0.response.as_ref().map(Response::status)
    }

    /// The server's last answer, if one came (its body has not been read).
    #[must_use]
    pub fn response(&self) -> Option<&Response> {
        self.0.response.as_ref()
    }

    /// Takes the server's last answer out, to read its body (a problem document).
    #[must_use]
    pub fn into_response(self) -> Option<Response> {
        self.0.response
    }

    /// Finds this crate's error inside a [`reqwest_middleware::Error`], also when
    /// another middleware (such as `reqwest_retry::RetryTransientMiddleware`) wrapped it.
    #[must_use]
    pub fn from_middleware(err: &reqwest_middleware::Error) -> Option<&Error> {
        match err {
            reqwest_middleware::Error::Middleware(inner) => {
                let inner: &(dyn StdError + 'static) = inner.as_ref();
                find(inner)
            }
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// Takes this crate's error out of a [`reqwest_middleware::Error`] that holds it
    /// directly, or gives the error back unchanged.
    ///
    /// # Errors
    /// The original error when it does not hold an [`Error`] at its top level.
    pub fn try_from_middleware(
        err: reqwest_middleware::Error,
    ) -> Result<Error, reqwest_middleware::Error> {
        match err {
            reqwest_middleware::Error::Middleware(inner) => inner
                .downcast::<Error>()
                .map_err(reqwest_middleware::Error::Middleware),
            other => Err(other),
        }
    }
}

fn find<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a Error> {
    if let Some(ours) = err.downcast_ref::<Error>() {
        return Some(ours);
    }
    // `reqwest_middleware::Error` is transparent: its `source()` skips the wrapped error.
    if let Some(reqwest_middleware::Error::Middleware(inner)) =
        err.downcast_ref::<reqwest_middleware::Error>()
    {
        let inner: &(dyn StdError + 'static) = inner.as_ref();
        return find(inner);
    }
    // So is `reqwest_retry::RetryError::Error`: look inside it by hand.
    if let Some(retry) = err.downcast_ref::<reqwest_retry::RetryError>() {
        let (reqwest_retry::RetryError::WithRetries { err, .. }
        | reqwest_retry::RetryError::Error(err)) = retry;
        return find(err);
    }
    err.source().and_then(find)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.kind, f)?;
        if self.0.attempts > 1 {
            write!(f, " [{} attempts]", self.0.attempts)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("attempts", &self.0.attempts)
            .field("status", &self.status())
            .finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.kind.source()
    }
}

impl From<Error> for reqwest_middleware::Error {
    fn from(err: Error) -> Self {
        reqwest_middleware::Error::middleware(err)
    }
}
