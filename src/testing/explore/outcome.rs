//! What the code under test says happened, in the terms the explorer judges.

use std::fmt;

use crate::client::Error;

/// What the code under test reports about its operation: the claim the explorer checks
/// against what the server saw.
///
/// | claim | true when |
/// |---|---|
/// | `Success` | the operation executed exactly once and a success answer reached the code |
/// | `KeyReused` | the server answered `key-reused` |
/// | `OutcomeUnknown` | always acceptable, unless the last answer the code received said what happened (a success, or key reused) |
/// | `NeverSent` | the operation did not execute |
/// | `Failed` | the operation did not execute: a caller told "failed" may try again with a new key |
///
/// ```
/// use idemkey::testing::Outcome;
/// assert_eq!(Outcome::Failed("HTTP 400".into()).to_string(), "failed: HTTP 400");
/// assert_eq!(Outcome::OutcomeUnknown.to_string(), "outcome unknown");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The operation happened; the code has its result.
    Success,
    /// The server refused the key, used before for another request.
    KeyReused,
    /// The code cannot tell whether the operation happened (and says to retry it later
    /// with the same key).
    OutcomeUnknown,
    /// Nothing was sent, so nothing happened.
    NeverSent,
    /// The operation failed and did not happen, for the reason given.
    Failed(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Success => f.write_str("success"),
            Self::KeyReused => f.write_str("key reused"),
            Self::OutcomeUnknown => f.write_str("outcome unknown"),
            Self::NeverSent => f.write_str("never sent"),
            Self::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// Turns what the code under test returns into the [`Outcome`] it claims. Implement it
/// for your SDK's error type (mapping its variants, and delegating to the impls here
/// for the errors it wraps); `Result<T, E>` is then `Success` when `Ok`.
///
/// ```
/// use idemkey::testing::{Outcome, ToOutcome};
///
/// enum SdkError {
///     Conflict,
///     Unknown,
///     Http(reqwest_middleware::Error),
/// }
///
/// impl ToOutcome for SdkError {
///     fn to_outcome(&self) -> Outcome {
///         match self {
///             SdkError::Conflict => Outcome::KeyReused,
///             SdkError::Unknown => Outcome::OutcomeUnknown,
///             SdkError::Http(e) => e.to_outcome(),
///         }
///     }
/// }
///
/// let charged: Result<u64, SdkError> = Ok(42);
/// assert_eq!(charged.to_outcome(), Outcome::Success);
/// assert_eq!(Err::<u64, _>(SdkError::Conflict).to_outcome(), Outcome::KeyReused);
/// ```
pub trait ToOutcome {
    /// The outcome this value claims.
    fn to_outcome(&self) -> Outcome;
}

impl ToOutcome for Outcome {
    fn to_outcome(&self) -> Outcome {
        self.clone()
    }
}

/// `Ok` is `Success`; `Err(e)` is what `e` says.
///
/// A bare `send()` result is `Ok` for any status the client hands back (idemkey's
/// client turns the transient ones into errors, but a `400` is `Ok`): map it through
/// `error_for_status` first.
impl<T, E: ToOutcome> ToOutcome for Result<T, E> {
    fn to_outcome(&self) -> Outcome {
        match self {
            Ok(_) => Outcome::Success,
            Err(e) => e.to_outcome(),
        }
    }
}

/// By kind: `key_reused` is `KeyReused`; `outcome_unknown`, `in_progress` and
/// `retry_budget_exhausted` are `OutcomeUnknown`; `never_sent`, `invalid_key` and
/// `body_not_replayable` are `NeverSent` (nothing was sent); `already_executed` is
/// `Success` (the server says it happened); the rest (`store_full`, `quota_exceeded`:
/// the server refused before executing) are `Failed` with the kind's name.
impl ToOutcome for Error {
    fn to_outcome(&self) -> Outcome {
        if self.is_key_reused() {
            Outcome::KeyReused
        } else if self.is_outcome_unknown()
            || self.is_in_progress()
            || self.is_retry_budget_exhausted()
        {
            Outcome::OutcomeUnknown
        } else if self.is_never_sent() || self.is_invalid_key() || self.is_body_not_replayable() {
            Outcome::NeverSent
        } else if self.is_already_executed() {
            Outcome::Success
        } else {
            Outcome::Failed(self.kind_str().to_owned())
        }
    }
}

/// idemkey's [`Error`] inside it says; otherwise a `reqwest::Error` as below, and any
/// other middleware's error is `OutcomeUnknown` (the explorer cannot tell what it
/// claims).
impl ToOutcome for reqwest_middleware::Error {
    fn to_outcome(&self) -> Outcome {
        if let Some(e) = Error::from_middleware(self) {
            return e.to_outcome();
        }
        match self {
            reqwest_middleware::Error::Reqwest(e) => e.to_outcome(),
            reqwest_middleware::Error::Middleware(_) => Outcome::OutcomeUnknown,
        }
    }
}

/// A status error (`error_for_status`) is `Failed` with its status; an error before
/// anything was sent (connecting, building the request) is `NeverSent`; an answer that
/// does not decode is `Failed`; any other (a timeout, a dropped connection) is
/// `OutcomeUnknown`.
impl ToOutcome for reqwest::Error {
    fn to_outcome(&self) -> Outcome {
        if let Some(status) = self.status() {
            Outcome::Failed(format!("HTTP {}", status.as_u16()))
        } else if self.is_connect() || self.is_builder() {
            Outcome::NeverSent
        } else if self.is_decode() {
            Outcome::Failed(format!("undecodable answer: {self}"))
        } else {
            Outcome::OutcomeUnknown
        }
    }
}
