//! What an answer means (the profile's rules over its status and body), and the final
//! answer of a logical request turned into the caller's result: a response, or a typed
//! [`Error`] for the cases the caller must handle.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Response;
use tokio::time::Instant;

use super::buffered::Buffered;
use super::error::{Error, Kind};
use super::profile::{Class, VendorProfile};
use super::response::annotate;
use crate::IdempotencyKey;
use idemkey_core::protocol::status;

/// The last answer of the retry loop.
pub(crate) enum Last {
    /// The final answer, and what the profile made of it.
    Answer(reqwest_middleware::Result<Response>, Class),
    /// A retry was due, and the retry budget refused it.
    BudgetExhausted(reqwest_middleware::Result<Response>),
    DeadlinePassed,
}

/// The largest body read to classify an answer whose length is announced; longer ones
/// are classified by their status alone. (An answer of unannounced length is read
/// whole: only the statuses a profile's body rules name are read, error answers.)
const MAX_RULE_BODY_BYTES: u64 = 64 * 1024;

/// What `result` means to a keyed request under `profile`, from its status alone.
/// `None` when the profile must see the body ([`classify_with_body`]).
pub(crate) fn classify(
    result: &reqwest_middleware::Result<Response>,
    profile: &VendorProfile,
) -> Option<Class> {
    let Ok(response) = result else {
        return Some(Class::Other);
    };
    let status = response.status();
    if profile.needs_body(status)
        && response
            .content_length()
            .is_none_or(|n| n <= MAX_RULE_BODY_BYTES)
    {
        return None;
    }
    Some(profile.classify(status, None))
}

/// Reads the body of `response` and classifies it; the response comes back equal, its
/// body in memory. Reading is part of the request: the deadline covers it (`None` when
/// it passed).
///
/// # Errors
/// The body could not be read (the connection dropped inside it): the caller gets that
/// error rather than the answer with its body silently emptied.
pub(crate) async fn classify_with_body(
    response: Response,
    profile: &VendorProfile,
    deadline: Option<Instant>,
) -> Option<(reqwest_middleware::Result<Response>, Class)> {
    let status = response.status();
    let read = Buffered::read(response);
    let read = match deadline {
        Some(at) => tokio::time::timeout_at(at, read).await.ok()?,
        None => read.await,
    };
    Some(match read {
        Ok(buffered) => {
            let doc = serde_json::from_slice::<serde_json::Value>(buffered.body()).ok();
            let class = profile.classify(status, doc.as_ref());
            (Ok(buffered.into_response()), class)
        }
        Err(e) => (Err(e.into()), Class::Other),
    })
}

/// Turns the loop's last answer into the caller's result. `sent` is whether any
/// attempt may have sent a byte of the request ([`never_left`] says no for each).
pub(crate) fn finish(
    key: Option<IdempotencyKey>,
    attempts: u32,
    last: Last,
    deadline: Option<Duration>,
    sent: bool,
) -> reqwest_middleware::Result<Response> {
    let deadline_cause = || {
        format!(
            "the overall deadline of {:?} passed during attempt {attempts}",
            deadline.unwrap_or_default()
        )
    };
    let Some(key) = key else {
        return match last {
            Last::Answer(result, _) | Last::BudgetExhausted(result) => result,
            Last::DeadlinePassed => Err(reqwest_middleware::Error::middleware(
                std::io::Error::new(std::io::ErrorKind::TimedOut, deadline_cause()),
            )),
        };
    };
    let kind = match last {
        Last::DeadlinePassed => Kind::OutcomeUnknown {
            key,
            cause: deadline_cause(),
            source: None,
        },
        Last::Answer(Ok(mut response), class) => {
            annotate(&mut response, &key, attempts);
            let status = response.status();
            let kind = match class {
                Class::KeyReused => Kind::KeyReused { key, status },
                Class::AlreadyExecuted => Kind::AlreadyExecuted { key, status },
                Class::InProgress => Kind::InProgress { key, status },
                Class::StoreFull => Kind::StoreFull { key, status },
                Class::QuotaExceeded => Kind::QuotaExceeded { key, status },
                Class::Other if status::is_transient(status) => Kind::OutcomeUnknown {
                    key,
                    cause: format!("the last of {attempts} attempt(s) was answered {status}"),
                    source: None,
                },
                Class::Other => return Ok(response),
            };
            return Err(Error::new(kind, attempts, Some(response)).into());
        }
        Last::Answer(Err(err), _) => {
            if Error::from_middleware(&err).is_some() {
                return Err(err);
            }
            if !sent {
                let cause = if attempts > 1 {
                    format!(
                        "each of {attempts} attempts failed to connect; the last: {}",
                        error_chain(&err)
                    )
                } else {
                    format!("the attempt failed to connect: {}", error_chain(&err))
                };
                return Err(Error::new(
                    Kind::NeverSent {
                        key,
                        cause,
                        source: Some(Arc::new(err)),
                    },
                    attempts,
                    None,
                )
                .into());
            }
            Kind::OutcomeUnknown {
                key,
                cause: format!("attempt {attempts} failed: {}", error_chain(&err)),
                source: Some(Arc::new(err)),
            }
        }
        Last::BudgetExhausted(Ok(mut response)) => {
            annotate(&mut response, &key, attempts);
            let cause = format!(
                "the last of {attempts} attempt(s) was answered {}",
                response.status()
            );
            let kind = Kind::RetryBudgetExhausted {
                key,
                cause,
                source: None,
            };
            return Err(Error::new(kind, attempts, Some(response)).into());
        }
        Last::BudgetExhausted(Err(err)) => Kind::RetryBudgetExhausted {
            key,
            cause: format!("attempt {attempts} failed: {}", error_chain(&err)),
            source: Some(Arc::new(err)),
        },
    };
    Err(Error::new(kind, attempts, None).into())
}

/// An error and its sources, in one line, each message once.
pub(crate) fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        source = e.source();
    }
    text
}

/// Whether `result` is an attempt that failed before any byte of its request went out:
/// reqwest could not connect (refused, unresolvable host, a connect or TLS handshake
/// that failed or timed out). A connection taken from the pool that breaks is not one:
/// the request may have been written to it.
pub(crate) fn never_left(result: &reqwest_middleware::Result<Response>) -> bool {
    let err: &(dyn StdError + 'static) = match result {
        Ok(_) => return false,
        Err(reqwest_middleware::Error::Reqwest(e)) => return e.is_connect(),
        Err(reqwest_middleware::Error::Middleware(e)) => e.as_ref(),
    };
    // An inner middleware's error that wraps reqwest's connect error.
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<reqwest::Error>() {
            return e.is_connect();
        }
        source = e.source();
    }
    false
}
