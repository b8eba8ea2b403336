#![doc = include_str!("spans.md")]
#![doc = include_str!("metrics.md")]
// Each emitter takes its labels and values as arguments; without the `metrics` feature
// its body is compiled out and they go unused (and a half may use none of them).
#![cfg_attr(not(feature = "metrics"), allow(unused_variables))]
// The items below are the halves' (idemkey-client's and idemkey-server's), public only
// so that they can reach them: hidden from the docs, not part of the API.

use std::time::Duration;

use futures_util::future::Either;
use tracing::instrument::{Instrument, Instrumented};
use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
use tracing::{Level, Span};

/// `true` when the `metrics` feature is on: durations are measured for histograms only
/// then (or when a span wants them).
#[doc(hidden)]
pub const METRICS: bool = cfg!(feature = "metrics");

/// A reading of the clock the verifier's durations are measured with (the histograms'
/// and the store spans' `idemkey.store.duration_ms`): [`Stopwatch::start`], then
/// [`Stopwatch::elapsed`].
///
/// With the `metrics` feature it is quanta's clock read raw: the CPU's time-stamp
/// counter where it is invariant (else the monotonic clock), scaled to nanoseconds only
/// for the elapsed time, by a calibration against the monotonic clock made once per
/// process and shared (`metrics-exporter-prometheus` makes it when it is built). A
/// request takes six readings (a start and an end for its claim, its handler and its
/// complete), so a reading costs a few instructions instead of a `clock_gettime` call.
/// Without the feature, std's `Instant` (only an enabled span wants a duration then).
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct Stopwatch(
    #[cfg(feature = "metrics")] u64,
    #[cfg(not(feature = "metrics"))] std::time::Instant,
);

/// The process's clock of [`Stopwatch`], built (and calibrated, where no one did yet) at
/// its first use.
#[cfg(feature = "metrics")]
fn clock() -> &'static quanta::Clock {
    static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

impl Stopwatch {
    /// Reads the clock now.
    pub fn start() -> Self {
        #[cfg(feature = "metrics")]
        return Self(clock().raw());
        #[cfg(not(feature = "metrics"))]
        return Self(std::time::Instant::now());
    }

    /// The time since [`Stopwatch::start`] (zero if the clock went backwards).
    pub fn elapsed(self) -> Duration {
        #[cfg(feature = "metrics")]
        {
            let clock = clock();
            clock.delta(self.0, clock.raw())
        }
        #[cfg(not(feature = "metrics"))]
        self.0.elapsed()
    }

    /// Builds the clock now rather than in the first request that reads it: calibrating
    /// it, where nothing in the process did yet, takes about half a millisecond (quanta
    /// bounds it at 200 ms). Without the `metrics` feature there is nothing to build.
    pub fn ready() {
        #[cfg(feature = "metrics")]
        clock();
    }
}

/// Whether anything could see a span at `level`: a `tracing` subscriber (as its level
/// filter tells), or a `log` logger (tracing's `log` feature, which a dependency such as
/// axum's default `tower-log` or sqlx turns on, mirrors spans to the `log` crate when no
/// subscriber is set, and only at or below `log`'s max level). When neither can, the
/// client's and the verifier's spans are [`Span::none`]: nothing is built, entered or
/// recorded, and the output is the same (none).
#[doc(hidden)]
pub fn observable(level: Level) -> bool {
    let traced = level <= STATIC_MAX_LEVEL && level <= LevelFilter::current();
    let logged = match level {
        Level::ERROR => log::Level::Error,
        Level::WARN => log::Level::Warn,
        Level::INFO => log::Level::Info,
        Level::DEBUG => log::Level::Debug,
        _ => log::Level::Trace,
    } <= log::max_level();
    traced || logged
}

/// A span at `level`, a value known only at run time. A `tracing` callsite has one
/// level, fixed when it is compiled, so this expands to one callsite per level and
/// picks the one asked for (tower-http's `DefaultMakeSpan` does the same). Takes what
/// `tracing::span!` takes after the level: `span_at!(level, target: "...",
/// "name", field = value, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! span_at {
    ($level:expr, target: $target:expr, $($rest:tt)+) => {
        match $level {
            ::tracing::Level::ERROR => {
                ::tracing::span!(target: $target, ::tracing::Level::ERROR, $($rest)+)
            }
            ::tracing::Level::WARN => {
                ::tracing::span!(target: $target, ::tracing::Level::WARN, $($rest)+)
            }
            ::tracing::Level::INFO => {
                ::tracing::span!(target: $target, ::tracing::Level::INFO, $($rest)+)
            }
            ::tracing::Level::DEBUG => {
                ::tracing::span!(target: $target, ::tracing::Level::DEBUG, $($rest)+)
            }
            ::tracing::Level::TRACE => {
                ::tracing::span!(target: $target, ::tracing::Level::TRACE, $($rest)+)
            }
        }
    };
}

/// Whether anything could see a span of any level ([`observable`] at the most visible
/// level): the test before recording a field on the current span, which may be one of
/// this crate's at its configured level or one of the caller's at any level.
#[doc(hidden)]
pub fn any_span_observable() -> bool {
    observable(Level::ERROR)
}

/// `future` under `span`, or alone when the span is [`Span::none`] (entering and leaving
/// it on every poll would do nothing).
#[doc(hidden)]
pub fn in_span<F: Future>(future: F, span: &Span) -> Either<F, Instrumented<F>> {
    if span.is_none() {
        Either::Left(future)
    } else {
        Either::Right(future.instrument(span.clone()))
    }
}

// The metric names, once; `metrics.md` documents each.
#[doc(hidden)]
pub const SERVER_REQUESTS: &str = "idemkey_server_requests_total";
#[doc(hidden)]
pub const SERVER_EXECUTIONS: &str = "idemkey_server_executions_total";
#[doc(hidden)]
pub const SERVER_FENCED_WRITES: &str = "idemkey_server_fenced_writes_total";
#[doc(hidden)]
pub const SERVER_HANDLER_DURATION: &str = "idemkey_server_handler_duration_seconds";
#[doc(hidden)]
pub const SERVER_STORED_BYTES: &str = "idemkey_server_stored_response_bytes";
#[doc(hidden)]
pub const STORE_DURATION: &str = "idemkey_store_operation_duration_seconds";
#[doc(hidden)]
pub const STORE_ERRORS: &str = "idemkey_store_errors_total";
#[doc(hidden)]
pub const STORE_REDIS_EVICTED_KEYS: &str = "idemkey_store_redis_evicted_keys_total";
#[doc(hidden)]
pub const STORE_MEMORY_RECORDS: &str = "idemkey_store_memory_records";
#[doc(hidden)]
pub const STORE_MEMORY_BYTES: &str = "idemkey_store_memory_bytes";
#[doc(hidden)]
pub const STORE_MEMORY_MAX_RECORDS: &str = "idemkey_store_memory_max_records";
#[doc(hidden)]
pub const STORE_MEMORY_MAX_BYTES: &str = "idemkey_store_memory_max_bytes";
#[doc(hidden)]
pub const SWEEP_REMOVED: &str = "idemkey_store_sweep_removed_total";
#[doc(hidden)]
pub const SWEEP_DURATION: &str = "idemkey_store_sweep_duration_seconds";
#[doc(hidden)]
pub const SWEEP_SKIPPED: &str = "idemkey_store_sweep_skipped_total";
#[doc(hidden)]
pub const SWEEP_LAST_COMPLETE: &str = "idemkey_store_sweep_last_complete_timestamp_seconds";
#[doc(hidden)]
pub const SWEEP_LAG: &str = "idemkey_store_sweep_lag_seconds";
#[doc(hidden)]
pub const CLIENT_CALLS: &str = "idemkey_client_calls_total";
#[doc(hidden)]
pub const CLIENT_ATTEMPTS: &str = "idemkey_client_attempts";
#[doc(hidden)]
pub const CLIENT_RETRY_WAIT: &str = "idemkey_client_retry_wait_seconds";
#[doc(hidden)]
pub const CLIENT_BUDGET_EXHAUSTED: &str = "idemkey_client_retry_budget_exhausted_total";

/// Gives every metric of this crate its description and unit, in the recorder
/// installed now (an exporter shows them, as Prometheus' `# HELP` and `# TYPE` lines).
/// Optional: the metrics are emitted either way. Call it once, after installing the
/// recorder.
///
/// ```
/// # #[cfg(feature = "metrics")] {
/// let recorder = metrics_util::debugging::DebuggingRecorder::new();
/// metrics::with_local_recorder(&recorder, idemkey::telemetry::describe_metrics);
/// # }
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        SERVER_REQUESTS,
        Unit::Count,
        "Keyed requests by the verifier's decision"
    );
    describe_counter!(
        SERVER_EXECUTIONS,
        Unit::Count,
        "Claimed executions by how they ended"
    );
    describe_counter!(
        SERVER_FENCED_WRITES,
        Unit::Count,
        "Writes of an owner that lost its key, refused by the store"
    );
    describe_histogram!(
        SERVER_HANDLER_DURATION,
        Unit::Seconds,
        "Time a claimed handler took to its response head"
    );
    describe_histogram!(
        SERVER_STORED_BYTES,
        Unit::Bytes,
        "Size of each outcome recorded"
    );
    describe_histogram!(STORE_DURATION, Unit::Seconds, "Latency of store operations");
    describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Store operations that failed (fenced writes excluded)"
    );
    describe_counter!(
        STORE_REDIS_EVICTED_KEYS,
        Unit::Count,
        "Keys a Redis holding idempotency records evicted since it started (INFO stats)"
    );
    describe_gauge!(
        STORE_MEMORY_RECORDS,
        Unit::Count,
        "Records held by the memory stores (expired ones not swept yet included)"
    );
    describe_gauge!(
        STORE_MEMORY_BYTES,
        Unit::Bytes,
        "Bytes counted for the records of the memory stores"
    );
    describe_gauge!(
        STORE_MEMORY_MAX_RECORDS,
        Unit::Count,
        "The memory stores' bound of records"
    );
    describe_gauge!(
        STORE_MEMORY_MAX_BYTES,
        Unit::Bytes,
        "The memory stores' budget of bytes"
    );
    describe_counter!(
        SWEEP_REMOVED,
        Unit::Count,
        "Expired records removed by sweeps"
    );
    describe_histogram!(SWEEP_DURATION, Unit::Seconds, "Duration of each sweep pass");
    describe_counter!(
        SWEEP_SKIPPED,
        Unit::Count,
        "Sweep passes skipped because another instance held the sweep lock"
    );
    describe_gauge!(
        SWEEP_LAST_COMPLETE,
        Unit::Seconds,
        "Unix time of the last sweep pass that left nothing expired"
    );
    describe_gauge!(
        SWEEP_LAG,
        Unit::Seconds,
        "Age of the oldest expired record still present after the last pass"
    );
    describe_counter!(CLIENT_CALLS, Unit::Count, "Logical client calls by outcome");
    describe_histogram!(
        CLIENT_ATTEMPTS,
        Unit::Count,
        "Attempts sent per logical client call"
    );
    describe_histogram!(
        CLIENT_RETRY_WAIT,
        Unit::Seconds,
        "Waits before a retry, by reason"
    );
    describe_counter!(
        CLIENT_BUDGET_EXHAUSTED,
        Unit::Count,
        "Retries refused by the retry budget"
    );
}
