//! The idempotency-aware retry middleware: the loop ([`RetryMiddleware`]), the
//! classification of answers ([`IdempotentRetryStrategy`]) and the waits between
//! attempts ([`default_policy`], `Retry-After`).

mod policy;
mod strategy;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderName, Method};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use reqwest_retry::{Retryable, RetryableStrategy};
use retry_policies::RetryPolicy;
use tokio::time::Instant;

pub use self::policy::{DEFAULT_RETRY_AFTER_CAP, default_policy};
pub use self::strategy::IdempotentRetryStrategy;
use super::error::{Error, Kind};
use super::key::KeyResolver;
use super::outcome::{self, Last};
use super::request::Attempt;
use crate::IdempotencyKey;
use crate::protocol::status;

/// Retries a keyed request with the same key, honouring `Retry-After`.
///
/// It attaches the key first (as [`IdempotencyKeyMiddleware`](super::IdempotencyKeyMiddleware)
/// does: one key per logical request, never replacing the caller's), then, unlike
/// `reqwest_retry::RetryTransientMiddleware`, it reads `Retry-After` (seconds or HTTP
/// date, capped), stops at an optional overall deadline, records the attempt number
/// ([`Attempt`]) for inner middlewares and the response, and turns a final non-success
/// into a typed [`Error`]. It reuses that crate's [`RetryableStrategy`] and
/// `retry-policies`' [`RetryPolicy`], so your own plug in.
///
/// What it retries: requests that carry a key, and requests whose method is idempotent
/// by definition (GET, HEAD, OPTIONS, TRACE, PUT, DELETE). A POST or PATCH without a
/// key is sent once: retrying it could execute it twice.
///
/// [`ClientBuilder`](crate::client::ClientBuilder) assembles it; this type is public
/// for hand-made stacks.
///
/// ```
/// use idemkey::client::RetryMiddleware;
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new().deadline(std::time::Duration::from_secs(30)))
///     .build();
/// # let _ = client;
/// ```
#[derive(Clone)]
pub struct RetryMiddleware {
    keys: KeyResolver,
    policy: Arc<dyn RetryPolicy + Send + Sync>,
    strategy: Arc<dyn RetryableStrategy + Send + Sync>,
    retry_after_cap: Duration,
    deadline: Option<Duration>,
}

impl std::fmt::Debug for RetryMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryMiddleware")
            .field("keys", &self.keys)
            .field("retry_after_cap", &self.retry_after_cap)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Default for RetryMiddleware {
    fn default() -> Self {
        Self {
            keys: KeyResolver::default(),
            policy: Arc::new(default_policy()),
            strategy: Arc::new(IdempotentRetryStrategy),
            retry_after_cap: DEFAULT_RETRY_AFTER_CAP,
            deadline: None,
        }
    }
}

impl RetryMiddleware {
    /// The defaults: keys in `Idempotency-Key` on POST and PATCH, [`default_policy`],
    /// [`IdempotentRetryStrategy`], [`DEFAULT_RETRY_AFTER_CAP`], no deadline.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends the key under this header instead of `Idempotency-Key` (a
    /// [`KeyHeader`](crate::protocol::KeyHeader) or any [`HeaderName`]).
    #[must_use]
    pub fn key_header(mut self, name: impl Into<HeaderName>) -> Self {
        self.keys.set_header(name.into());
        self
    }

    /// The methods that get a generated key (POST and PATCH by default; an empty list
    /// generates none, and only keys set by the caller are sent).
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.keys.set_methods(methods);
        self
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
        policy::next_wait(
            &*self.policy,
            result.as_ref().ok(),
            started,
            retries_so_far,
            self.retry_after_cap,
        )
    }
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        mut req: Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = self.keys.attach(&mut req, ext)?;
        let replayable = req.body().is_none_or(|b| b.as_bytes().is_some());
        if let (Some(key), false) = (&key, replayable) {
            let key = key.clone();
            return Err(Error::new(Kind::BodyNotReplayable { key }, 0, None).into());
        }
        // A POST or PATCH without a key, or a stream without a key, is sent once; the
        // deadline still bounds it.
        let single_shot = !replayable || (key.is_none() && !status::is_idempotent(req.method()));
        let started = SystemTime::now();
        // A deadline too far away to represent (`Duration::MAX`) is no deadline.
        let deadline = self.deadline.and_then(|d| Instant::now().checked_add(d));
        let mut original = Some(req);
        let mut attempt = 0u32;
        let last = loop {
            attempt += 1;
            ext.insert(Attempt(attempt));
            #[allow(clippy::expect_used)]
            let this = if single_shot {
                original
                    .take()
                    .expect("a single shot is sent once: the loop ends after its answer")
            } else {
                original
                    .as_ref()
                    .and_then(Request::try_clone)
                    .expect("only a streaming body fails to clone, and those are single shots")
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
        let last = outcome::classify(last, key.is_some(), deadline).await;
        outcome::finish(key, attempt, last, self.deadline)
    }
}
