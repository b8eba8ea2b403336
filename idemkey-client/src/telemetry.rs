//! The client's spans and metrics (see [`idemkey_core::telemetry`] for the names): one span
//! per logical call, one child span per attempt.

// Without the `metrics` feature the handles are compiled out and the emitters take
// their values for nothing.
#![cfg_attr(not(feature = "metrics"), allow(unused_variables))]

#[cfg(feature = "metrics")]
use std::sync::OnceLock;
use std::time::Duration;

use reqwest::{Request, Response};
use tracing::field::Empty;
use tracing::{Level, Span};

use super::error::Error;
use super::response::ResponseExt;
use crate::IdempotencyKey;
#[cfg(feature = "metrics")]
use idemkey_core::telemetry;
pub(super) use idemkey_core::telemetry::in_span;
use idemkey_core::telemetry::observable;

/// Why the loop waits before an attempt (`idemkey.wait_reason`, the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitReason {
    /// The retry policy's backoff.
    Backoff,
    /// The server asked for the wait (`retry-after-ms`, `Retry-After`).
    RetryAfter,
    /// The server's retry hint (`x-should-retry: true`) made it a retry; the wait is the
    /// backoff.
    Hint,
}

impl WaitReason {
    /// Every reason, in declaration order (its slot in [`ClientMetrics`]).
    #[cfg(feature = "metrics")]
    const ALL: [Self; 3] = [Self::Backoff, Self::RetryAfter, Self::Hint];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Backoff => "backoff",
            Self::RetryAfter => "retry_after",
            Self::Hint => "hint",
        }
    }
}

/// A client's metric handles (one set per retry middleware, shared by its clones),
/// each resolved once, at first use, in the recorder current then, as the engine's
/// are: the calls answered (outcome `response`, replayed or not), the attempts per
/// call, each retry-wait reason and the budget's refusals. Calls that ended in an error
/// (rare; one series per error kind) are still looked up per call. Looking a metric up
/// by name and labels builds and hashes a key and searches the recorder's registry; a
/// handle is one call to the recorder's own counter or histogram. Without the `metrics`
/// feature this is empty.
#[derive(Default)]
pub(crate) struct ClientMetrics {
    /// `outcome="response"`, indexed by `replayed`.
    #[cfg(feature = "metrics")]
    answered: [OnceLock<metrics::Counter>; 2],
    #[cfg(feature = "metrics")]
    attempts: OnceLock<metrics::Histogram>,
    #[cfg(feature = "metrics")]
    retry_wait: [OnceLock<metrics::Histogram>; WaitReason::ALL.len()],
    #[cfg(feature = "metrics")]
    budget_exhausted: OnceLock<metrics::Counter>,
}

impl ClientMetrics {
    /// A logical call ended with `outcome` (`response` when it was answered) after
    /// `attempts` attempts.
    fn call(&self, outcome: &'static str, replayed: bool, attempts: u32) {
        #[cfg(feature = "metrics")]
        {
            let label = if replayed { "true" } else { "false" };
            let register = || metrics::counter!(telemetry::CLIENT_CALLS, "outcome" => outcome, "replayed" => label);
            if outcome == RESPONSE {
                self.answered[usize::from(replayed)]
                    .get_or_init(register)
                    .increment(1);
            } else {
                register().increment(1);
            }
            self.attempts
                .get_or_init(|| metrics::histogram!(telemetry::CLIENT_ATTEMPTS))
                .record(f64::from(attempts));
        }
    }
}

/// The `outcome` of a call that was answered (any status).
const RESPONSE: &str = "response";

/// The span of one logical call, at `level`. Its fields are formatted only when a
/// subscriber wants the span (the URL is copied, without its query, only then).
pub(super) fn call_span(req: &Request, key: Option<&IdempotencyKey>, level: Level) -> Span {
    if !observable(level) {
        return Span::none();
    }
    let span = idemkey_core::span_at!(
        level,
        target: "idemkey::client",
        "idemkey.call",
        http.request.method = req.method().as_str(),
        url.full = Empty,
        idemkey.key = key.map(IdempotencyKey::as_str),
        idemkey.attempts = Empty,
        idemkey.outcome = Empty,
        idemkey.replayed = Empty,
        http.response.status_code = Empty,
    );
    if !span.is_disabled() {
        let mut url = req.url().clone();
        url.set_query(None);
        url.set_fragment(None);
        // Credentials never go into telemetry.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        span.record("url.full", url.as_str());
    }
    span
}

/// The span of attempt number `attempt` (1 for the first), with the wait before it: one
/// level below its call's span at `call_level` ([`attempt_level`]).
pub(super) fn attempt_span(
    attempt: u32,
    waited: Option<(Duration, WaitReason)>,
    call_level: Level,
) -> Span {
    let level = attempt_level(call_level);
    if !observable(level) {
        return Span::none();
    }
    idemkey_core::span_at!(
        level,
        target: "idemkey::client",
        "idemkey.attempt",
        http.request.resend_count = attempt.saturating_sub(1),
        idemkey.wait_ms = waited.map(|(d, _)| d.as_millis() as u64),
        idemkey.wait_reason = waited.map(|(_, r)| r.as_str()),
        http.response.status_code = Empty,
        error.type = Empty,
    )
}

/// The level of an attempt's span under a call's span at `call_level`: one level more
/// verbose, TRACE at the most.
pub(crate) fn attempt_level(call_level: Level) -> Level {
    match call_level {
        Level::ERROR => Level::WARN,
        Level::WARN => Level::INFO,
        Level::INFO => Level::DEBUG,
        Level::DEBUG | Level::TRACE => Level::TRACE,
    }
}

/// Records how an attempt was answered on its span.
pub(super) fn attempt_answered(span: &Span, result: &reqwest_middleware::Result<Response>) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(r) => span.record("http.response.status_code", r.status().as_u16()),
        Err(e) => span.record("error.type", error_type(e)),
    };
}

/// A retry was due and the retry budget refused it.
pub(super) fn budget_exhausted(metrics: &ClientMetrics) {
    #[cfg(feature = "metrics")]
    metrics
        .budget_exhausted
        .get_or_init(|| metrics::counter!(telemetry::CLIENT_BUDGET_EXHAUSTED))
        .increment(1);
}

/// The loop waits `wait` before its next attempt.
pub(super) fn retry_wait(metrics: &ClientMetrics, reason: WaitReason, wait: Duration) {
    #[cfg(feature = "metrics")]
    metrics.retry_wait[reason as usize]
        .get_or_init(
            || metrics::histogram!(telemetry::CLIENT_RETRY_WAIT, "reason" => reason.as_str()),
        )
        .record(wait.as_secs_f64());
}

/// Records how the call ended, on the current span (the call's, at `level`) and in
/// `metrics`.
pub(super) fn call_ended(
    metrics: &ClientMetrics,
    result: &reqwest_middleware::Result<Response>,
    attempts: u32,
    level: Level,
) {
    // Nothing to record into: no metric handles (without the feature) and no span.
    if !cfg!(feature = "metrics") && !observable(level) {
        return;
    }
    let (outcome, replayed) = match result {
        Ok(r) => (RESPONSE, r.idempotency().is_some_and(|i| i.replayed())),
        Err(e) => (error_type(e), false),
    };
    metrics.call(outcome, replayed, attempts);
    // The current span is the call's (`call_span`), which nothing sees when this is false.
    if !observable(level) {
        return;
    }
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("idemkey.attempts", attempts);
    span.record("idemkey.outcome", outcome);
    span.record("idemkey.replayed", replayed);
    let response = match result {
        Ok(r) => Some(r),
        Err(e) => Error::from_middleware(e).and_then(Error::response),
    };
    if let Some(r) = response {
        span.record("http.response.status_code", r.status().as_u16());
    }
}

/// A bounded name for an error: the typed error's kind, else the transport's.
fn error_type(e: &reqwest_middleware::Error) -> &'static str {
    if let Some(e) = Error::from_middleware(e) {
        return e.kind_str();
    }
    match e {
        reqwest_middleware::Error::Reqwest(e) if e.is_timeout() => "timeout",
        reqwest_middleware::Error::Reqwest(e) if e.is_connect() => "connect",
        reqwest_middleware::Error::Reqwest(_) => "transport",
        reqwest_middleware::Error::Middleware(_) => "middleware",
    }
}
