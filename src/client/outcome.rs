//! The final answer of a logical request, turned into the caller's result: a response,
//! or a typed [`Error`] for the cases the caller must handle.

use std::error::Error as StdError;
use std::time::Duration;

use reqwest::{Response, StatusCode};
use tokio::time::Instant;

use super::error::{Error, Kind};
use super::response::annotate;
use crate::IdempotencyKey;
use crate::protocol::problem::{Problem, is_problem_json};
use crate::protocol::status;

/// The last answer of the retry loop.
pub(crate) enum Last {
    Answer(reqwest_middleware::Result<Response>),
    /// A 400 problem `key-reused` (a Stripe-compatible server's answer).
    KeyReused(Response),
    DeadlinePassed,
}

/// Reads the problem of a keyed 400 to tell a reused key from other bad requests.
/// Reading the body is part of the request: the deadline covers it.
pub(crate) async fn classify(last: Last, keyed: bool, deadline: Option<Instant>) -> Last {
    let response = match last {
        Last::Answer(Ok(response)) if keyed && response.status() == StatusCode::BAD_REQUEST => {
            response
        }
        other => return other,
    };
    let read = read_problem(response);
    let read = match deadline {
        Some(at) => Box::pin(tokio::time::timeout_at(at, read)).await,
        None => Ok(Box::pin(read).await),
    };
    match read {
        Ok(Ok((response, Some(Problem::KeyReused)))) => Last::KeyReused(response),
        Ok(Ok((response, _))) => Last::Answer(Ok(response)),
        Ok(Err(e)) => Last::Answer(Err(e.into())),
        Err(_) => Last::DeadlinePassed,
    }
}

/// Turns the loop's last answer into the caller's result.
pub(crate) fn finish(
    key: Option<IdempotencyKey>,
    attempts: u32,
    last: Last,
    deadline: Option<Duration>,
) -> reqwest_middleware::Result<Response> {
    let deadline_cause = || {
        format!(
            "the overall deadline of {:?} passed during attempt {attempts}",
            deadline.unwrap_or_default()
        )
    };
    let Some(key) = key else {
        return match last {
            Last::Answer(result) => result,
            Last::KeyReused(response) => Ok(response),
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
        Last::KeyReused(mut response) => {
            annotate(&mut response, &key, attempts);
            let status = response.status();
            return Err(
                Error::new(Kind::KeyReused { key, status }, attempts, Some(response)).into(),
            );
        }
        Last::Answer(Ok(mut response)) => {
            annotate(&mut response, &key, attempts);
            let status = response.status();
            let kind = match status {
                StatusCode::CONFLICT => Kind::Conflict { key },
                StatusCode::UNPROCESSABLE_ENTITY => Kind::KeyReused { key, status },
                s if status::is_transient(s) => Kind::OutcomeUnknown {
                    key,
                    cause: format!("the last of {attempts} attempt(s) was answered {s}"),
                    source: None,
                },
                _ => return Ok(response),
            };
            return Err(Error::new(kind, attempts, Some(response)).into());
        }
        Last::Answer(Err(err)) => {
            if Error::from_middleware(&err).is_some() {
                return Err(err);
            }
            Kind::OutcomeUnknown {
                key,
                cause: format!("attempt {attempts} failed: {}", error_chain(&err)),
                source: Some(err),
            }
        }
    };
    Err(Error::new(kind, attempts, None).into())
}

fn error_chain(err: &(dyn StdError + 'static)) -> String {
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

/// The largest problem document read to classify an answer.
const MAX_PROBLEM_BYTES: u64 = 64 * 1024;

/// The [`Problem`] an RFC 9457 answer names, if it is a small problem document of ours.
/// Reads the body and gives back an equivalent response (status, version, headers, URL,
/// extensions, body bytes).
///
/// # Errors
/// The body could not be read (the connection dropped inside it): the caller gets that
/// error rather than the answer with its body silently emptied.
async fn read_problem(
    mut response: Response,
) -> Result<(Response, Option<Problem>), reqwest::Error> {
    let is_problem = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(is_problem_json);
    let small = response
        .content_length()
        .is_some_and(|n| n <= MAX_PROBLEM_BYTES);
    if !is_problem || !small {
        return Ok((response, None));
    }
    let url = response.url().clone();
    let status = response.status();
    let version = response.version();
    let headers = std::mem::take(response.headers_mut());
    let extensions = std::mem::take(response.extensions_mut());
    let body = response.bytes().await?;
    let problem = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .as_ref()
        .and_then(|doc| doc.get("type")?.as_str().and_then(Problem::from_type));
    // reqwest keeps the URL in a private extension that only its builder sets.
    let rebuilt = reqwest::ResponseBuilderExt::url(http::Response::builder(), url).body(body);
    #[allow(clippy::expect_used)]
    let mut rebuilt = rebuilt.expect("a builder given only an extension and a body cannot fail");
    *rebuilt.status_mut() = status;
    *rebuilt.version_mut() = version;
    *rebuilt.headers_mut() = headers;
    rebuilt.extensions_mut().extend(extensions);
    Ok((Response::from(rebuilt), problem))
}
