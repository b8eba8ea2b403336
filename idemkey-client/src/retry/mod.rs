//! The idempotency-aware retry middleware: the loop ([`RetryMiddleware`]), the
//! classification of answers ([`IdempotentRetryStrategy`]), the waits between attempts
//! ([`default_policy`], the server's hints) and the retry budget ([`RetryBudget`]).

mod budget;
mod policy;
mod resend;
mod strategy;

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use http::{Extensions, HeaderName, Method};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use reqwest_retry::{Retryable, RetryableStrategy};
use retry_policies::RetryPolicy;
use tokio::time::Instant;
use tracing::Instrument;

pub use self::budget::RetryBudget;
use self::budget::Spent;
pub use self::policy::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_DEADLINE, DEFAULT_RETRY_AFTER_CAP, default_policy,
};
use self::resend::Resend;
pub use self::strategy::IdempotentRetryStrategy;
use super::error::{Error, Kind};
use super::flight::{Flights, Identity};
use super::key::KeyResolver;
use super::outcome::{self, Last};
use super::profile::{Class, VendorProfile};
use super::request::Attempt;
use super::telemetry::{self, WaitReason};
use crate::IdempotencyKey;
use idemkey_core::protocol::{retry_after, status};

/// Retries a keyed request with the same key, honouring the server's hints.
///
/// It attaches the key first (as [`IdempotencyKeyMiddleware`](super::IdempotencyKeyMiddleware)
/// does: one key per logical request, never replacing the caller's), then, unlike
/// `reqwest_retry::RetryTransientMiddleware`, it
///
/// - reads what each answer means under its [`VendorProfile`] (key reused, already
///   executed, in progress: 409 and 423 by default), reading the (small) body of the
///   answers whose meaning depends on it;
/// - honours the server's retry hints: `x-should-retry` / `Stripe-Should-Retry`,
///   `retry-after-ms`, `Retry-After` (seconds or HTTP date), in the order
///   [`retry_after`](idemkey_core::protocol::retry_after) documents; a hint never makes a 400
///   or 422 retryable, and a wait is capped and never passes the deadline;
/// - ends an attempt whose answer has not begun within the per-attempt timeout
///   ([`DEFAULT_ATTEMPT_TIMEOUT`]) and retries it; stops at the overall deadline
///   ([`DEFAULT_DEADLINE`]), and when the client-wide [`RetryBudget`] is used up;
/// - lets concurrent calls with the same caller-chosen key and the same request share
///   one flight ([`single_flight`](Self::single_flight));
/// - records the attempt number ([`Attempt`]) for inner middlewares and the response,
///   and turns a final non-success into a typed [`Error`].
///
/// It reuses `reqwest_retry`'s [`RetryableStrategy`] and `retry-policies`'
/// [`RetryPolicy`], so your own plug in; the profile's rules and the server's hints
/// apply on top of the strategy.
///
/// What it retries: requests that carry a key, and requests whose method is idempotent
/// by definition (GET, HEAD, OPTIONS, TRACE, PUT, DELETE). A POST or PATCH without a
/// key is sent once: retrying it could execute it twice.
///
/// [`IdempotentClientBuilder`](crate::IdempotentClientBuilder) assembles it; this type is public
/// for hand-made stacks.
///
/// ```
/// use idemkey::client::{RetryMiddleware, VendorProfile};
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new()
///         .profile(VendorProfile::stripe())
///         .deadline(std::time::Duration::from_secs(30)))
///     .build();
/// # let _ = client;
/// ```
#[derive(Clone)]
pub struct RetryMiddleware {
    keys: KeyResolver,
    profile: Arc<VendorProfile>,
    policy: Arc<dyn RetryPolicy + Send + Sync>,
    strategy: Arc<dyn RetryableStrategy + Send + Sync>,
    retry_after_cap: Duration,
    attempt_timeout: Option<Duration>,
    deadline: Option<Duration>,
    budget: Option<RetryBudget>,
    flights: Option<Arc<Flights>>,
    metrics: Arc<telemetry::ClientMetrics>,
    /// The level of the `idemkey.call` span (the attempts' is one below).
    span_level: tracing::Level,
}

impl std::fmt::Debug for RetryMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryMiddleware")
            .field("keys", &self.keys)
            .field("profile", &self.profile.name())
            .field("retry_after_cap", &self.retry_after_cap)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("deadline", &self.deadline)
            .field("budget", &self.budget)
            .field("single_flight", &self.flights.is_some())
            .field("span_level", &self.span_level)
            .finish_non_exhaustive()
    }
}

impl Default for RetryMiddleware {
    fn default() -> Self {
        Self {
            keys: KeyResolver::default(),
            profile: Arc::new(VendorProfile::standard()),
            policy: Arc::new(default_policy()),
            strategy: Arc::new(IdempotentRetryStrategy),
            retry_after_cap: DEFAULT_RETRY_AFTER_CAP,
            attempt_timeout: Some(DEFAULT_ATTEMPT_TIMEOUT),
            deadline: Some(DEFAULT_DEADLINE),
            budget: Some(RetryBudget::standard()),
            flights: Some(Arc::default()),
            metrics: Arc::default(),
            span_level: tracing::Level::DEBUG,
        }
    }
}

impl RetryMiddleware {
    /// The defaults: keys in `Idempotency-Key` on POST and PATCH,
    /// [`VendorProfile::standard`], [`default_policy`], [`IdempotentRetryStrategy`],
    /// [`DEFAULT_RETRY_AFTER_CAP`], [`DEFAULT_ATTEMPT_TIMEOUT`], [`DEFAULT_DEADLINE`],
    /// [`RetryBudget::standard`], single flight on.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Speaks this API's dialect: where the key goes and how long it may be, which
    /// answers mean "key reused", "already executed" or "in progress", and which hints
    /// are honoured. Replaces the key header set before.
    #[must_use]
    pub fn profile(mut self, profile: VendorProfile) -> Self {
        self.keys.set_profile(&profile);
        self.profile = Arc::new(profile);
        self
    }

    /// Sends the key under this header instead of `Idempotency-Key` (a
    /// [`KeyHeader`](idemkey_core::protocol::KeyHeader) or any [`HeaderName`]).
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
    ///
    /// A policy that reads the call's start time (retry-policies'
    /// `ExponentialBackoffTimed`, from `build_with_total_retry_duration`) gets it on
    /// tokio's clock, as the deadline is measured: the time the call has taken so far,
    /// back from now (under `tokio::time::pause`, the paused clock's).
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

    /// The longest wait a server's `Retry-After` (or `retry-after-ms`) can ask for.
    #[must_use]
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// An overall deadline for the logical request, all attempts and waits included
    /// ([`DEFAULT_DEADLINE`], 5 minutes, by default; `Duration::MAX` means none).
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// How long one attempt may wait for the head of its answer before it is abandoned
    /// and retried with the same key ([`DEFAULT_ATTEMPT_TIMEOUT`], 80 s, by default;
    /// `Duration::MAX` means none). The `reqwest::Client`'s own `timeout`, when shorter,
    /// still applies; reading the body of a response handed to you is bounded by that
    /// one, not by this.
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The retry budget this middleware's calls draw from (shared with every middleware
    /// given a clone of it); [`RetryBudget::standard`] by default.
    #[must_use]
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// No retry budget: every call retries as its policy allows, however many fail.
    #[must_use]
    pub fn without_retry_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// Whether concurrent calls with the same key share one flight (on by default).
    ///
    /// With it, a call whose key the caller chose (a key header, a per-call key, a
    /// derived key) joins a call of this middleware already in flight with the same key
    /// and an equal request (method, URL, headers, body): it sends nothing and gets a
    /// copy of that call's answer, response or typed error, instead of racing it into
    /// a 409. To be shared, the answer's body is read into memory (the copies carry it
    /// in full; [`IdempotencyInfo::shared`](crate::IdempotencyInfo::shared) is
    /// `true` on the followers'). A call with the same key and a different request
    /// waits for the flight to land and then sends its own request, so the server
    /// judges it (usually `key_reused`). Random keys never meet, so calls with them
    /// skip this step.
    #[must_use]
    pub fn single_flight(mut self, on: bool) -> Self {
        self.flights = on.then(Arc::default);
        self
    }

    /// The level of the `idemkey.call` span of each logical call: [`Level::DEBUG`] by
    /// default, as tower-http's `TraceLayer` makes its spans, so a program logging at
    /// INFO builds no span per call. Each attempt's `idemkey.attempt` span is one level
    /// below (TRACE by default; DEBUG when the call's is INFO; TRACE under a TRACE
    /// call), so that `RUST_LOG` set one level finer than the call's shows the attempts
    /// as well. The spans and their fields are listed in [`idemkey_core::telemetry`].
    ///
    /// [`Level::DEBUG`]: tracing::Level::DEBUG
    #[must_use]
    pub fn span_level(mut self, level: tracing::Level) -> Self {
        self.span_level = level;
        self
    }

    /// Whether to retry after `result`, which the profile read as `class`.
    fn wants_retry(&self, result: &reqwest_middleware::Result<Response>, class: Class) -> bool {
        let hint = |r: &Response| {
            retry_after::should_retry(r.headers(), self.profile.should_retry_headers())
        };
        match (class, result) {
            (Class::KeyReused | Class::AlreadyExecuted, _) => false,
            (Class::InProgress | Class::StoreFull | Class::QuotaExceeded, Ok(r)) => {
                hint(r) != Some(false)
            }
            (_, Err(e)) if AttemptTimedOut::is(e) => true,
            (_, Ok(r)) if r.status().as_u16() >= 400 => match hint(r) {
                Some(false) => false,
                Some(true) if !status::is_never_retried(r.status()) => true,
                _ => self.strategy.handle(result) == Some(Retryable::Transient),
            },
            _ => self.strategy.handle(result) == Some(Retryable::Transient),
        }
    }

    /// After an answer [`wants_retry`](Self::wants_retry) would retry: the wait before
    /// the next attempt (the answer dropped), or the loop's last answer when the policy,
    /// the deadline or the budget says stop.
    ///
    /// Out of line and cold: most calls are answered at once, and this code inside the
    /// loop's future would sit among the lines every call runs through (instruction
    /// cache misses, not instructions, are most of what the stack costs in time).
    #[cold]
    #[inline(never)]
    fn plan_retry(
        &self,
        result: reqwest_middleware::Result<Response>,
        class: Class,
        attempt: u32,
        started_at: Instant,
        deadline: Option<Instant>,
        key: Option<&IdempotencyKey>,
    ) -> Plan {
        // The policy wants the wall-clock time the call started: read here, on a retry,
        // rather than once more on every call.
        let started = SystemTime::now()
            .checked_sub(started_at.elapsed())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let Some((wait, asked)) = policy::next_wait(
            &*self.policy,
            result.as_ref().ok(),
            started,
            attempt - 1,
            self.retry_after_cap,
        ) else {
            return Plan::Stop(Last::Answer(result, class));
        };
        // A wait that ends at or past the deadline (or past what an `Instant` can
        // hold) is not worth starting.
        if deadline.is_some_and(|at| Instant::now().checked_add(wait).is_none_or(|t| t >= at)) {
            return Plan::Stop(Last::Answer(result, class));
        }
        let mut spent = None;
        if let Some(budget) = &self.budget {
            let after_timeout = match &result {
                Err(reqwest_middleware::Error::Reqwest(e)) => e.is_timeout(),
                Err(e) => AttemptTimedOut::is(e),
                Ok(_) => false,
            };
            match budget.try_spend(after_timeout) {
                Some(s) => spent = Some(s),
                None => {
                    telemetry::budget_exhausted(&self.metrics);
                    return Plan::Stop(Last::BudgetExhausted(result));
                }
            }
        }
        let reason = match &result {
            _ if asked => WaitReason::RetryAfter,
            Ok(r)
                if retry_after::should_retry(r.headers(), self.profile.should_retry_headers())
                    == Some(true) =>
            {
                WaitReason::Hint
            }
            _ => WaitReason::Backoff,
        };
        telemetry::retry_wait(&self.metrics, reason, wait);
        tracing::debug!(
            attempt,
            ?wait,
            reason = reason.as_str(),
            key = key.map(IdempotencyKey::as_str),
            "retrying with the same idempotency key"
        );
        Plan::Wait(PlannedWait {
            wait,
            reason,
            spent,
        })
    }

    /// Sends the logical request: the attempts, the waits, the typed result.
    ///
    /// An `async` block rather than an `async fn`: the future holds the arguments once
    /// (an `async fn` keeps a second copy of each, and this future is boxed per request).
    #[allow(clippy::manual_async_fn)]
    fn send<'a>(
        &'a self,
        mut request: Outgoing,
        ext: &'a mut Extensions,
        next: Next<'a>,
        key: Option<IdempotencyKey>,
        started_at: Instant,
        deadline: Option<Instant>,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let single_shot = matches!(request, Outgoing::Once(_));
            let mut attempt = 0u32;
            let mut spent: Option<Spent> = None;
            let mut waited: Option<(Duration, WaitReason)> = None;
            // Whether any attempt may have sent a byte of the request.
            let mut sent = false;
            let last = loop {
                attempt += 1;
                Attempt::set(ext, attempt);
                #[allow(clippy::expect_used)]
                let this = match &mut request {
                    Outgoing::Once(req) => req
                        .take()
                        .expect("a single shot is sent once: the loop ends after its answer"),
                    Outgoing::Copies(resend) => {
                        resend.next(self.keys.header_name().zip(key.as_ref()))
                    }
                };
                let span = telemetry::attempt_span(attempt, waited, self.span_level);
                let run = telemetry::in_span(next.clone().run(this, ext), &span);
                // The attempt ends at its own timeout or at the deadline, whichever is first.
                // The first attempt starts when the call did (no second clock read).
                let now = if attempt == 1 {
                    started_at
                } else {
                    Instant::now()
                };
                let attempt_ends = self
                    .attempt_timeout
                    .and_then(|t| now.checked_add(t))
                    .filter(|at| deadline.is_none_or(|d| *at < d));
                // One timer, and one place that awaits it: the attempt's own end, else the
                // deadline.
                let timer = match (attempt_ends, deadline) {
                    (Some(at), _) => Some((at, true)),
                    (None, at) => at.map(|at| (at, false)),
                };
                // Boxed: inline, the timer saves an allocation but showed no gain
                // (measured: -126 instructions per request, +49 instruction-cache misses;
                // BENCHMARKS.md, "Client").
                let result = match timer {
                    Some((at, own)) => match Box::pin(tokio::time::timeout_at(at, run)).await {
                        Ok(result) => result,
                        Err(_) if own => Err(AttemptTimedOut::error(self.attempt_timeout, attempt)),
                        Err(_) => break Last::DeadlinePassed,
                    },
                    None => run.await,
                };
                telemetry::attempt_answered(&span, &result);
                sent |= !outcome::never_left(&result);
                let (result, class) = if key.is_none() {
                    (result, Class::Other)
                } else if let Some(class) = outcome::classify(&result, &self.profile) {
                    (result, class)
                } else {
                    #[allow(clippy::expect_used)]
                    let response = result.expect("classify() asks for the body of responses only");
                    match read_and_classify(response, &self.profile, deadline).await {
                        Some(judged) => judged,
                        None => break Last::DeadlinePassed,
                    }
                };
                if single_shot || !self.wants_retry(&result, class) {
                    break Last::Answer(result, class);
                }
                let wait = match self.plan_retry(
                    result,
                    class,
                    attempt,
                    started_at,
                    deadline,
                    key.as_ref(),
                ) {
                    Plan::Wait(planned) => planned,
                    Plan::Stop(last) => break last,
                };
                if let Some(s) = wait.spent {
                    spent = Some(s);
                }
                waited = Some((wait.wait, wait.reason));
                sleep(wait.wait).await;
            };
            if let (Some(budget), Last::Answer(Ok(r), _)) = (&self.budget, &last)
                && r.status().as_u16() < 400
            {
                budget.succeeded(spent);
            }
            let result = outcome::finish(key, attempt, last, self.deadline, sent);
            telemetry::call_ended(&self.metrics, &result, attempt, self.span_level);
            result
        }
    }
}

// Written out instead of `#[async_trait]`: the checks before the first attempt run
// here, synchronously, and only the loop's own future is boxed.
impl Middleware for RetryMiddleware {
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        mut req: Request,
        ext: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> Pin<Box<dyn Future<Output = reqwest_middleware::Result<Response>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        let resolved = match self.keys.attach(&mut req, ext) {
            Ok(resolved) => resolved,
            Err(e) => return refused(e.into()),
        };
        // The key moves out of `resolved` (no second handle on it to count up and down).
        let (key, random, placed_header) = match resolved {
            Some(r) => (Some(r.key), r.random, r.placed_header),
            None => (None, false, false),
        };
        let replayable = req.body().is_none_or(|b| b.as_bytes().is_some());
        if let (Some(key), false) = (&key, replayable) {
            let err = Error::new(Kind::BodyNotReplayable { key: key.clone() }, 0, None);
            return refused(err.into());
        }
        // A POST or PATCH without a key, or a stream without a key, is sent once; the
        // deadline still bounds it.
        let single_shot = !replayable || (key.is_none() && !status::is_idempotent(req.method()));
        let request = if single_shot {
            Outgoing::Once(Some(req))
        } else {
            let own_key = self.keys.header_name().filter(|_| placed_header);
            match Resend::new(req, own_key) {
                Some(resend) => Outgoing::Copies(resend),
                None => return refused(body_lost(key)),
            }
        };
        // A deadline too far away to represent (`Duration::MAX`) is no deadline.
        let now = Instant::now();
        let deadline = self.deadline.and_then(|d| now.checked_add(d));
        let span = telemetry::call_span(request.request(), key.as_ref(), self.span_level);
        match (&self.flights, key) {
            (Some(flights), Some(key)) if !random => {
                self.shared(flights, request, ext, next, key, deadline, span)
            }
            (_, key) => boxed_in(span, self.send(request, ext, next, key, now, deadline)),
        }
    }
}

impl RetryMiddleware {
    /// The call of a key the caller chose, in a flight that concurrent calls with the
    /// same key and request share ([`single_flight`](Self::single_flight)). Out of
    /// line: the default stack's random keys never take this path.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn shared<'a>(
        &'a self,
        flights: &'a Flights,
        request: Outgoing,
        ext: &'a mut Extensions,
        next: Next<'a>,
        key: IdempotencyKey,
        deadline: Option<Instant>,
        span: tracing::Span,
    ) -> BoxFuture<'a, reqwest_middleware::Result<Response>> {
        let identity = Identity::of(request.request());
        let flight_key = key.clone();
        boxed_in(
            span,
            flights.run(flight_key, identity, deadline, move || {
                // A follower may wait for another flight first: its first attempt
                // starts when it is let go.
                self.send(request, ext, next, Some(key), Instant::now(), deadline)
            }),
        )
    }
}

/// A call refused before its first attempt, as the boxed future `handle` returns: out
/// of line and cold.
#[cold]
#[inline(never)]
fn refused<'a>(
    err: reqwest_middleware::Error,
) -> BoxFuture<'a, reqwest_middleware::Result<Response>> {
    Box::pin(std::future::ready(Err(err)))
}

/// `call` boxed as it is, or instrumented when its span is wanted: not wrapped in an
/// `Either` of both, which would be a larger box, built by one more move of the (about
/// 1 KB) loop future.
fn boxed_in<'a, F: Future + Send + 'a>(span: tracing::Span, call: F) -> BoxFuture<'a, F::Output> {
    if span.is_none() {
        Box::pin(call)
    } else {
        Box::pin(call.instrument(span))
    }
}

/// [`outcome::classify_with_body`], boxed, out of line and cold: the answers whose
/// meaning depends on their body are usually error answers, and the code that builds
/// this future would otherwise sit in the loop's, among the lines every call runs
/// through.
#[cold]
#[inline(never)]
fn read_and_classify<'a>(
    response: Response,
    profile: &'a VendorProfile,
    deadline: Option<Instant>,
) -> BoxFuture<'a, Option<(reqwest_middleware::Result<Response>, Class)>> {
    Box::pin(outcome::classify_with_body(response, profile, deadline))
}

/// The wait before a retry, boxed, out of line and cold (as [`read_and_classify`]).
#[cold]
#[inline(never)]
fn sleep(wait: Duration) -> Pin<Box<tokio::time::Sleep>> {
    Box::pin(tokio::time::sleep(wait))
}

/// What [`RetryMiddleware::plan_retry`] decided: wait and retry, or stop with this last
/// answer.
enum Plan {
    Wait(PlannedWait),
    Stop(Last),
}

/// The wait before a retry ([`RetryMiddleware::plan_retry`]): how long, why, and what
/// it took from the retry budget.
struct PlannedWait {
    wait: Duration,
    reason: WaitReason,
    spent: Option<Spent>,
}

/// What the loop sends: a single shot once, or copies of a request it keeps.
enum Outgoing {
    Once(Option<Request>),
    Copies(Resend),
}

impl Outgoing {
    #[allow(clippy::expect_used)]
    fn request(&self) -> &Request {
        match self {
            Self::Once(req) => req.as_ref().expect("taken only by the loop"),
            Self::Copies(resend) => resend.original(),
        }
    }
}

/// The error for a body that [`Resend::new`] could not keep: not expected from
/// reqwest's in-memory bodies, but a clear error rather than a request sent without it.
fn body_lost(key: Option<IdempotencyKey>) -> reqwest_middleware::Error {
    let why = "the request body could not be kept for resending; nothing was sent";
    match key {
        Some(key) => Error::new(
            Kind::OutcomeUnknown {
                key,
                cause: why.into(),
                source: None,
            },
            0,
            None,
        )
        .into(),
        None => reqwest_middleware::Error::middleware(std::io::Error::other(why)),
    }
}

/// An attempt that got no answer within the per-attempt timeout: retried like a
/// transport timeout.
#[derive(Debug, thiserror::Error)]
#[error("attempt {attempt} got no answer within the per-attempt timeout of {timeout:?}")]
struct AttemptTimedOut {
    attempt: u32,
    timeout: Duration,
}

impl AttemptTimedOut {
    #[cold]
    #[inline(never)]
    fn error(timeout: Option<Duration>, attempt: u32) -> reqwest_middleware::Error {
        reqwest_middleware::Error::middleware(Self {
            attempt,
            timeout: timeout.unwrap_or_default(),
        })
    }

    fn is(err: &reqwest_middleware::Error) -> bool {
        matches!(err, reqwest_middleware::Error::Middleware(e) if e.is::<Self>())
    }
}
