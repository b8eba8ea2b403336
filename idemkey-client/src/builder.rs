//! One builder call for the whole client stack.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use reqwest_middleware::{ClientWithMiddleware, Middleware};
use reqwest_retry::RetryableStrategy;
use retry_policies::RetryPolicy;

use super::profile::VendorProfile;
use super::retry::{RetryBudget, RetryMiddleware};

/// Assembles the client stack in the right order, with good defaults:
///
/// ```text
/// with(..)  middlewares      once per logical request
/// key attachment             fixes the key (once per logical request)
/// retry loop                 attempts, backoff, Retry-After, deadline, typed errors
/// with_inner(..) middlewares once per attempt, closest to the wire
/// reqwest::Client
/// ```
///
/// Key attachment and the retry loop are one middleware,
/// [`RetryMiddleware`](super::RetryMiddleware); use it, or
/// [`IdempotencyKeyMiddleware`](super::IdempotencyKeyMiddleware) beside
/// `reqwest_retry`, in a stack of your own.
///
/// Defaults: `Idempotency-Key` on POST and PATCH; [`VendorProfile::standard`]; up to 3
/// retries with exponential backoff (100 ms to 10 s, jittered); the server's hints
/// (`x-should-retry`, `Stripe-Should-Retry`, `retry-after-ms`, `Retry-After`) honoured,
/// waits capped at 30 s; a per-attempt timeout of 80 s
/// ([`DEFAULT_ATTEMPT_TIMEOUT`](super::DEFAULT_ATTEMPT_TIMEOUT), the Stripe SDKs'
/// timeout) and an overall deadline of 5 minutes
/// ([`DEFAULT_DEADLINE`](super::DEFAULT_DEADLINE)), so a hung server never hangs a call,
/// even over `reqwest::Client::new()` (which has no timeout); a client-wide
/// [`RetryBudget::standard`]; single flight for caller-chosen keys.
///
/// ```
/// use std::time::Duration;
/// use idemkey::client::{IdempotentClientBuilder, VendorProfile};
///
/// let client = IdempotentClientBuilder::new(reqwest::Client::new())
///     .profile(VendorProfile::paypal())
///     .max_retries(5)
///     .retry_after_cap(Duration::from_secs(10))
///     .deadline(Duration::from_secs(60))
///     .build();
/// ```
pub struct IdempotentClientBuilder {
    client: reqwest::Client,
    retry: RetryMiddleware,
    outer: Vec<Arc<dyn Middleware>>,
    inner: Vec<Arc<dyn Middleware>>,
}

impl std::fmt::Debug for IdempotentClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentClientBuilder")
            .field("retry", &self.retry)
            .field("outer", &self.outer.len())
            .field("inner", &self.inner.len())
            .finish_non_exhaustive()
    }
}

impl Default for IdempotentClientBuilder {
    /// A builder over `reqwest::Client::new()`.
    fn default() -> Self {
        Self::new(reqwest::Client::new())
    }
}

impl IdempotentClientBuilder {
    /// A builder over your `reqwest::Client` (its timeouts, TLS and pool settings
    /// apply to every attempt).
    #[must_use]
    pub fn new(client: reqwest::Client) -> Self {
        Self {
            client,
            retry: RetryMiddleware::default(),
            outer: Vec::new(),
            inner: Vec::new(),
        }
    }

    /// Speaks this API's dialect ([`VendorProfile`]): where the key goes and how long it
    /// may be, which answers mean "key reused", "already executed" or "in progress", and
    /// which retry hints are honoured. Replaces a key header set before.
    #[must_use]
    pub fn profile(mut self, profile: VendorProfile) -> Self {
        self.retry = self.retry.profile(profile);
        self
    }

    /// Sends the key under this header instead of `Idempotency-Key`: a vendor's
    /// [`KeyHeader`](idemkey_core::protocol::KeyHeader) or any [`HeaderName`].
    #[must_use]
    pub fn key_header(mut self, name: impl Into<HeaderName>) -> Self {
        self.retry = self.retry.key_header(name);
        self
    }

    /// The methods that get a generated key (POST and PATCH by default).
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.retry = self.retry.methods(methods);
        self
    }

    /// When and how often to retry: any `retry_policies::RetryPolicy`. The call's start
    /// time a policy may read follows tokio's clock ([`RetryMiddleware::policy`]).
    #[must_use]
    pub fn retry_policy(mut self, policy: impl RetryPolicy + Send + Sync + 'static) -> Self {
        self.retry = self.retry.policy(policy);
        self
    }

    /// The default backoff (100 ms to 10 s, jittered) with this many retries; 0 sends
    /// every request once.
    #[must_use]
    pub fn max_retries(self, retries: u32) -> Self {
        let mut policy = super::retry::default_policy();
        policy.max_n_retries = Some(retries);
        self.retry_policy(policy)
    }

    /// Which answers are retried (default [`IdempotentRetryStrategy`](super::IdempotentRetryStrategy)).
    #[must_use]
    pub fn retryable_strategy(
        mut self,
        strategy: impl RetryableStrategy + Send + Sync + 'static,
    ) -> Self {
        self.retry = self.retry.strategy(strategy);
        self
    }

    /// The longest wait a server's `Retry-After` can ask for (default 30 s).
    #[must_use]
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry = self.retry.retry_after_cap(cap);
        self
    }

    /// An overall deadline per logical request, all attempts and waits included (5
    /// minutes by default, [`DEFAULT_DEADLINE`](super::DEFAULT_DEADLINE)). When it
    /// passes, a keyed request fails with
    /// [`Error::is_outcome_unknown`](super::Error::is_outcome_unknown), a request without
    /// a key with a timed-out I/O error. `Duration::MAX` means no deadline.
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.retry = self.retry.deadline(deadline);
        self
    }

    /// How long one attempt may wait for the head of its answer (80 s by default,
    /// [`DEFAULT_ATTEMPT_TIMEOUT`](super::DEFAULT_ATTEMPT_TIMEOUT)). An attempt that
    /// passes it is abandoned and retried with the same key, within the deadline.
    /// `Duration::MAX` means none. A shorter `timeout` of your `reqwest::Client` still
    /// applies, and is what bounds reading a response's body once you have it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemkey::client::IdempotentClientBuilder;
    ///
    /// // A fast internal API: give up on an attempt after 5 s, on the call after 20 s.
    /// let client = IdempotentClientBuilder::new(reqwest::Client::new())
    ///     .attempt_timeout(Duration::from_secs(5))
    ///     .deadline(Duration::from_secs(20))
    ///     .build();
    /// # let _ = client;
    /// ```
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.retry = self.retry.attempt_timeout(timeout);
        self
    }

    /// The retry budget the client's calls draw from ([`RetryBudget::standard`] by
    /// default); give clones of one budget to several clients to share it.
    #[must_use]
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.retry = self.retry.retry_budget(budget);
        self
    }

    /// No retry budget: every call retries as its policy allows, however many fail.
    #[must_use]
    pub fn without_retry_budget(mut self) -> Self {
        self.retry = self.retry.without_retry_budget();
        self
    }

    /// Whether concurrent calls with the same caller-chosen key and the same request
    /// share one flight and its answer (on by default; see
    /// [`RetryMiddleware::single_flight`](super::RetryMiddleware::single_flight)).
    #[must_use]
    pub fn single_flight(mut self, on: bool) -> Self {
        self.retry = self.retry.single_flight(on);
        self
    }

    /// The level of the client's spans: `idemkey.call` at `level` (DEBUG by default),
    /// each `idemkey.attempt` one level below (see
    /// [`RetryMiddleware::span_level`](super::RetryMiddleware::span_level)).
    ///
    /// ```
    /// use idemkey::client::IdempotentClientBuilder;
    ///
    /// let client = IdempotentClientBuilder::new(reqwest::Client::new())
    ///     .span_level(tracing::Level::INFO)
    ///     .build();
    /// # let _ = client;
    /// ```
    #[must_use]
    pub fn span_level(mut self, level: tracing::Level) -> Self {
        self.retry = self.retry.span_level(level);
        self
    }

    /// Adds a middleware that runs once per logical request, outside the key and retry
    /// middlewares (logging, tracing spans, auth that must not change between attempts).
    #[must_use]
    pub fn with(mut self, middleware: impl Middleware) -> Self {
        self.outer.push(Arc::new(middleware));
        self
    }

    /// Adds a middleware that runs once per attempt, closest to the wire, inside the
    /// retry loop (fault injectors, per-attempt metrics). It sees the key header and
    /// can read [`Attempt`](super::Attempt) from the extensions.
    #[must_use]
    pub fn with_inner(mut self, middleware: impl Middleware) -> Self {
        self.inner.push(Arc::new(middleware));
        self
    }

    /// Assembles the stack.
    #[must_use]
    pub fn build(self) -> ClientWithMiddleware {
        let mut builder = reqwest_middleware::ClientBuilder::new(self.client);
        for m in self.outer {
            builder = builder.with_arc(m);
        }
        builder = builder.with(self.retry);
        for m in self.inner {
            builder = builder.with_arc(m);
        }
        builder.build()
    }
}
