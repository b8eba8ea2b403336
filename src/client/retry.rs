//! The idempotency-aware retry middleware.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderName, Method, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use reqwest_retry::{
    Retryable, RetryableStrategy, default_on_request_failure, default_on_request_success,
};
use retry_policies::policies::ExponentialBackoff;
use retry_policies::{Jitter, RetryDecision, RetryPolicy};
use tokio::time::Instant;

use super::error::{Error, Kind};
use super::middleware::IdempotencyKeyMiddleware;
use super::request::{Attempt, KeyInUse};
use super::response::{annotate, is_problem};
use crate::IdempotencyKey;
use crate::headers;

/// The default cap on a server's `Retry-After`.
pub const DEFAULT_RETRY_AFTER_CAP: Duration = Duration::from_secs(30);

/// The default retry policy: up to 3 retries (4 attempts), exponential backoff from
/// 100 ms to 10 s with bounded jitter.
#[must_use]
pub fn default_policy() -> ExponentialBackoff {
    ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(100), Duration::from_secs(10))
        .jitter(Jitter::Bounded)
        .build_with_max_retries(3)
}

/// Which answers are worth another attempt with the same key.
///
/// Transient: connect errors, timeouts, dropped connections, 408, 429, 5xx and 409 (an
/// earlier request with the key is in progress). Fatal: every other 4xx, explicitly
/// 400 and 422. An error from an inner middleware counts as transient when its chain
/// holds an [`std::io::Error`] of kind `ConnectionReset`, `ConnectionAborted`,
/// `BrokenPipe`, `UnexpectedEof` or `TimedOut` (how a fault injector says "the
/// connection dropped").
///
/// Wrap it in a strategy of your own to change single cases.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdempotentRetryStrategy;

impl RetryableStrategy for IdempotentRetryStrategy {
    fn handle(&self, res: &reqwest_middleware::Result<Response>) -> Option<Retryable> {
        match res {
            Ok(response) => match response.status() {
                StatusCode::CONFLICT => Some(Retryable::Transient),
                StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => {
                    Some(Retryable::Fatal)
                }
                _ => default_on_request_success(response),
            },
            Err(err) if is_injected_transport_fault(err) => Some(Retryable::Transient),
            Err(err) => default_on_request_failure(err),
        }
    }
}

fn is_injected_transport_fault(err: &reqwest_middleware::Error) -> bool {
    let reqwest_middleware::Error::Middleware(inner) = err else {
        return false;
    };
    if Error::from_middleware(err).is_some() {
        return false;
    }
    inner.chain().any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(|io| {
            use std::io::ErrorKind::*;
            matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | TimedOut
            )
        })
    })
}

/// Retries a keyed request with the same key, honouring `Retry-After`.
///
/// Unlike `reqwest_retry::RetryTransientMiddleware` it reads `Retry-After` (seconds or
/// HTTP date, capped), stops at an optional overall deadline, records the attempt
/// number ([`Attempt`]) for inner middlewares and the response, and turns a final
/// non-success into a typed [`Error`]. It reuses that crate's [`RetryableStrategy`]
/// and `retry-policies`' [`RetryPolicy`], so your own plug in.
///
/// What it retries: requests that carry a key, and requests whose method is idempotent
/// by definition (GET, HEAD, OPTIONS, TRACE, PUT, DELETE). A POST or PATCH without a
/// key is sent once: retrying it could execute it twice.
///
/// [`ClientBuilder`](crate::client::ClientBuilder) assembles it with the key
/// middleware; this type is public for hand-made stacks.
#[derive(Clone)]
pub struct RetryMiddleware {
    policy: Arc<dyn RetryPolicy + Send + Sync>,
    strategy: Arc<dyn RetryableStrategy + Send + Sync>,
    retry_after_cap: Duration,
    deadline: Option<Duration>,
    header: HeaderName,
    /// Set by `ClientBuilder`: the key middleware's work, done here to save one
    /// middleware hop per request.
    key: Option<IdempotencyKeyMiddleware>,
}

impl std::fmt::Debug for RetryMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryMiddleware")
            .field("retry_after_cap", &self.retry_after_cap)
            .field("deadline", &self.deadline)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl Default for RetryMiddleware {
    fn default() -> Self {
        Self {
            policy: Arc::new(default_policy()),
            strategy: Arc::new(IdempotentRetryStrategy),
            retry_after_cap: DEFAULT_RETRY_AFTER_CAP,
            deadline: None,
            header: headers::IDEMPOTENCY_KEY,
            key: None,
        }
    }
}

impl RetryMiddleware {
    /// The defaults: [`default_policy`], [`IdempotentRetryStrategy`],
    /// [`DEFAULT_RETRY_AFTER_CAP`], no deadline, keys in `Idempotency-Key`.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// When and how often to retry (for example an `ExponentialBackoff` of your own).
    #[must_use]
    pub fn policy(mut self, policy: impl RetryPolicy + Send + Sync + 'static) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// Which answers are retried.
    #[must_use]
    pub fn strategy(mut self, strategy: impl RetryableStrategy + Send + Sync + 'static) -> Self {
        self.strategy = Arc::new(strategy);
        self
    }

    /// The longest wait a server's `Retry-After` can ask for.
    #[must_use]
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// An overall deadline for the logical request, all attempts and waits included.
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The header a key set by hand is found in (when no key middleware ran first).
    #[must_use]
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// Does the key middleware's work first, in the same middleware.
    pub(crate) fn with_key_middleware(mut self, key: IdempotencyKeyMiddleware) -> Self {
        self.key = Some(key);
        self
    }

    fn key_of(&self, req: &Request, ext: &Extensions) -> Option<IdempotencyKey> {
        if let Some(in_use) = ext.get::<KeyInUse>() {
            return Some(in_use.key.clone());
        }
        let value = req.headers().get(&self.header)?;
        IdempotencyKey::from_header_value(value).ok()
    }

    /// How long to wait before the next attempt, or `None` to stop.
    fn wait_before_retry(
        &self,
        result: &reqwest_middleware::Result<Response>,
        started: SystemTime,
        retries_so_far: u32,
    ) -> Option<Duration> {
        if self.strategy.handle(result) != Some(Retryable::Transient) {
            return None;
        }
        let RetryDecision::Retry { execute_after } =
            self.policy.should_retry(started, retries_so_far)
        else {
            return None;
        };
        let backoff = execute_after
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let asked = result.as_ref().ok().and_then(retry_after);
        Some(asked.map_or(backoff, |asked| asked.min(self.retry_after_cap)))
    }
}

/// The server's `Retry-After`, in delta-seconds or HTTP-date form.
pub(crate) fn retry_after(response: &Response) -> Option<Duration> {
    let value = response
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    // delta-seconds is digits only (RFC 9110 §10.2.3): no sign, no fraction. More
    // seconds than a u64 holds still mean "wait long", so they saturate (then the cap
    // applies) instead of falling back to the short backoff.
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(value.parse().map_or(Duration::MAX, Duration::from_secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The final answer of the loop, before it is turned into the caller's result.
enum Last {
    Answer(reqwest_middleware::Result<Response>),
    /// A 400 problem `key-reused`.
    KeyReused(Response),
    DeadlinePassed,
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        mut req: Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = match &self.key {
            Some(key_middleware) => key_middleware.attach(&mut req, ext)?,
            None => self.key_of(&req, ext),
        };
        let replayable = req.body().is_none_or(|b| b.as_bytes().is_some());
        if let (Some(key), false) = (&key, replayable) {
            let key = key.clone();
            return Err(Error::new(Kind::BodyNotReplayable { key }, 0, None).into());
        }
        // A POST or PATCH without a key, or a stream without a key, is sent once; the
        // deadline still bounds it.
        let single_shot = !replayable || (key.is_none() && !is_idempotent(req.method()));
        let started = SystemTime::now();
        // A deadline too far away to represent (`Duration::MAX`) is no deadline.
        let deadline = self.deadline.and_then(|d| Instant::now().checked_add(d));
        let mut original = Some(req);
        let mut attempt = 0u32;
        let last = loop {
            attempt += 1;
            ext.insert(Attempt(attempt));
            let this = if single_shot {
                original.take()
            } else {
                original.as_ref().and_then(Request::try_clone)
            };
            let Some(this) = this else {
                // Unreachable: a single shot is sent once, other bodies are replayable.
                break Last::Answer(Err(reqwest_middleware::Error::middleware(
                    std::io::Error::other("the request could not be cloned for another attempt"),
                )));
            };
            let run = next.clone().run(this, ext);
            let result = match deadline {
                // Rare paths are boxed: they would otherwise grow every request's future.
                Some(at) => match Box::pin(tokio::time::timeout_at(at, run)).await {
                    Ok(result) => result,
                    Err(_) => break Last::DeadlinePassed,
                },
                None => run.await,
            };
            let wait = if single_shot {
                None
            } else {
                self.wait_before_retry(&result, started, attempt - 1)
            };
            let Some(wait) = wait else {
                break Last::Answer(result);
            };
            // A wait that ends at or past the deadline (or past what an `Instant` can
            // hold) is not worth starting.
            if deadline.is_some_and(|at| Instant::now().checked_add(wait).is_none_or(|t| t >= at)) {
                break Last::Answer(result);
            }
            tracing::debug!(
                attempt,
                ?wait,
                key = key.as_ref().map(IdempotencyKey::as_str),
                "retrying with the same idempotency key"
            );
            drop(result);
            Box::pin(tokio::time::sleep(wait)).await;
        };
        // A Stripe-compatible server answers a reused key with 400 `key-reused`.
        let last = match last {
            Last::Answer(Ok(response))
                if key.is_some() && response.status() == StatusCode::BAD_REQUEST =>
            {
                // Reading the problem body is part of the request: the deadline covers it.
                let read = is_problem(response, "key-reused");
                let read = match deadline {
                    Some(at) => Box::pin(tokio::time::timeout_at(at, read)).await,
                    None => Ok(Box::pin(read).await),
                };
                match read {
                    Ok(Ok((response, true))) => Last::KeyReused(response),
                    Ok(Ok((response, false))) => Last::Answer(Ok(response)),
                    Ok(Err(e)) => Last::Answer(Err(e.into())),
                    Err(_) => Last::DeadlinePassed,
                }
            }
            other => other,
        };
        finish(key, attempt, last, self.deadline)
    }
}

/// Turns the loop's last answer into the caller's result.
fn finish(
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
                s if s.is_server_error()
                    || s == StatusCode::REQUEST_TIMEOUT
                    || s == StatusCode::TOO_MANY_REQUESTS =>
                {
                    Kind::OutcomeUnknown {
                        key,
                        cause: format!("the last of {attempts} attempt(s) was answered {s}"),
                        source: None,
                    }
                }
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
