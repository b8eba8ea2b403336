//! Sweeping: a pass of bounded batches ([`SweepOptions`], [`SweepReport`]), and a
//! background task that runs one per period ([`spawn_sweeper`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Store, StoreError, clamp_forever};

/// The default number of records one sweep statement removes at most.
pub const DEFAULT_SWEEP_BATCH: u32 = 1_000;

/// The default pause between two sweep batches, as a multiple of the time the batch
/// before it took ([`SweepOptions::pause_ratio`]): 1, so batches take at most half of a
/// pass's time and leave the other half to requests.
pub const DEFAULT_SWEEP_PAUSE_RATIO: f64 = 1.0;

/// The largest pause ratio [`SweepOptions::pause_ratio`] accepts.
const MAX_PAUSE_RATIO: f64 = 1_000.0;

/// How a sweep pass runs ([`Store::sweep_pass`]).
///
/// A pass removes expired records in batches of at most [`batch`](Self::batch) records,
/// each batch one short statement in its own transaction, so that no statement holds
/// locks for long and claims running meanwhile stay fast. It goes on until a batch finds
/// fewer than a full batch (nothing expired is left) or its time budget
/// ([`max_duration`](Self::max_duration)) is spent; at least one batch runs. An
/// exclusive pass ([`exclusive`](Self::exclusive), the default) first takes the store's
/// sweep lock (PostgreSQL: an advisory lock, MySQL/MariaDB: `GET_LOCK`; SQLite has one
/// writer), and is skipped when another instance holds it.
///
/// Between two batches the pass pauses ([`pause_ratio`](Self::pause_ratio)): for every
/// second the batch took, it waits [`DEFAULT_SWEEP_PAUSE_RATIO`] second by default, so
/// the sweep never takes more than half of the database's time from the requests, and
/// backs off by itself when the database is busy (a slower batch, a longer pause). A
/// paced pass is still far faster than the records expire: see the benchmarks' "Growth
/// and sweeping" (the sweep removes at least 5 times the request rate that made the
/// records). `pause_ratio(0.0)` runs batches back to back. The pauses apply to the SQL
/// stores' batches; the memory store yields to the runtime between its steps instead.
///
/// ```
/// use std::time::Duration;
/// use idemkey::store::SweepOptions;
///
/// let options = SweepOptions::new()
///     .batch(500)
///     .max_duration(Duration::from_secs(30))
///     .pause_ratio(3.0);
/// assert_eq!(options.batch_size(), 500);
/// // A batch that took 20 ms is followed by a pause of 60 ms.
/// assert_eq!(options.pause_after(Duration::from_millis(20)), Duration::from_millis(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepOptions {
    batch: u32,
    max_duration: Option<Duration>,
    exclusive: bool,
    /// The pause ratio in thousandths (an integer, so the options stay `Eq`).
    pause_millis_per_second: u32,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            batch: DEFAULT_SWEEP_BATCH,
            max_duration: None,
            exclusive: true,
            pause_millis_per_second: ratio_to_thousandths(DEFAULT_SWEEP_PAUSE_RATIO),
        }
    }
}

/// A pause ratio in thousandths, held to `0..=MAX_PAUSE_RATIO` (NaN is 0).
fn ratio_to_thousandths(ratio: f64) -> u32 {
    let held = if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, MAX_PAUSE_RATIO)
    };
    // In range by the clamp: at most 1,000,000.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "held to 0..=1e6 above"
    )]
    let thousandths = (held * 1_000.0).round() as u32;
    thousandths
}

impl SweepOptions {
    /// Batches of [`DEFAULT_SWEEP_BATCH`] records, no time budget, exclusive, a pause of
    /// [`DEFAULT_SWEEP_PAUSE_RATIO`] times each batch's duration after it.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The most records one statement removes (at least 1; at most 100,000).
    #[must_use]
    pub fn batch(mut self, records: u32) -> Self {
        self.batch = records.clamp(1, 100_000);
        self
    }

    /// The pass stops starting new batches once this much time has passed (it always
    /// runs one); the rest waits for the next pass.
    #[must_use]
    pub fn max_duration(mut self, budget: Duration) -> Self {
        self.max_duration = Some(budget);
        self
    }

    /// Whether the pass takes the store's sweep lock first, and is skipped when another
    /// instance holds it (`true` by default).
    #[must_use]
    pub fn exclusive(mut self, on: bool) -> Self {
        self.exclusive = on;
        self
    }

    /// Pace the pass: after each batch (but the last), wait `ratio` times as long as
    /// that batch took before starting the next (gh-ost's "nice ratio", pt-archiver's
    /// `--sleep-coef`). Batches then take at most `1 / (1 + ratio)` of the pass's time:
    /// 1 (the default, [`DEFAULT_SWEEP_PAUSE_RATIO`]) is half, 4 a fifth; 0 runs them
    /// back to back. Held to 0 to 1,000, to a thousandth; NaN is 0. The pauses count
    /// against the time budget ([`max_duration`](Self::max_duration)), and the pass
    /// holds the sweep lock through them.
    #[must_use]
    pub fn pause_ratio(mut self, ratio: f64) -> Self {
        self.pause_millis_per_second = ratio_to_thousandths(ratio);
        self
    }

    /// The pause ratio ([`pause_ratio`](Self::pause_ratio)).
    #[must_use]
    pub fn pause_factor(&self) -> f64 {
        f64::from(self.pause_millis_per_second) / 1_000.0
    }

    /// The pause that follows a batch that took `batch_took`.
    #[must_use]
    pub fn pause_after(&self, batch_took: Duration) -> Duration {
        // At most 1,000 times a batch's duration: `saturating_mul` keeps an absurd
        // duration from panicking.
        batch_took.saturating_mul(self.pause_millis_per_second) / 1_000
    }

    /// The most records one statement removes.
    #[must_use]
    pub fn batch_size(&self) -> u32 {
        self.batch
    }

    /// The time budget, if any.
    #[must_use]
    pub fn time_budget(&self) -> Option<Duration> {
        self.max_duration
    }

    /// Whether the pass takes the store's sweep lock.
    #[must_use]
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }
}

/// How a sweep pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SweepOutcome {
    /// Nothing expired was left when the pass ended.
    Complete,
    /// The time budget was spent with expired records left; the next pass goes on.
    BudgetSpent,
    /// Another instance held the store's sweep lock: this pass removed nothing.
    Skipped,
}

impl SweepOutcome {
    /// The outcome's fixed name: `complete`, `budget_spent`, `skipped`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::BudgetSpent => "budget_spent",
            Self::Skipped => "skipped",
        }
    }
}

/// What a sweep pass did ([`Store::sweep_pass`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepReport {
    removed: u64,
    batches: u32,
    duration: Duration,
    outcome: SweepOutcome,
    lag: Option<Duration>,
    paused: Duration,
}

impl SweepReport {
    /// A report of `removed` records in `batches` statements over `duration`.
    #[must_use]
    pub fn new(removed: u64, batches: u32, duration: Duration, outcome: SweepOutcome) -> Self {
        Self {
            removed,
            batches,
            duration,
            outcome,
            lag: None,
            paused: Duration::ZERO,
        }
    }

    /// The same report, with the time the pass spent pausing between batches.
    #[must_use]
    pub fn with_paused(mut self, paused: Duration) -> Self {
        self.paused = paused;
        self
    }

    /// How much of [`duration`](Self::duration) the pass spent pausing between batches
    /// ([`SweepOptions::pause_ratio`]).
    #[must_use]
    pub fn paused(&self) -> Duration {
        self.paused
    }

    /// The same report, with the age of the oldest expired record still present.
    #[must_use]
    pub fn with_lag(mut self, lag: Option<Duration>) -> Self {
        self.lag = lag;
        self
    }

    /// Records removed.
    #[must_use]
    pub fn removed(&self) -> u64 {
        self.removed
    }

    /// Statements run (batches).
    #[must_use]
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// How long the pass took, the lock included.
    #[must_use]
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// How the pass ended.
    #[must_use]
    pub fn outcome(&self) -> SweepOutcome {
        self.outcome
    }

    /// How long the oldest expired record still present has been expired, where the
    /// store can tell cheaply (the SQL stores, after a pass that left work): the sweep
    /// lag. `Some(Duration::ZERO)` when the pass left nothing expired; `None` when not
    /// known.
    #[must_use]
    pub fn lag(&self) -> Option<Duration> {
        self.lag
    }

    /// Records removed per second of the pass (0 for an empty or skipped pass).
    #[must_use]
    pub fn rows_per_second(&self) -> f64 {
        let secs = self.duration.as_secs_f64();
        if self.removed == 0 || secs <= 0.0 {
            0.0
        } else {
            self.removed as f64 / secs
        }
    }
}

/// What one sweep batch did: the records it removed, and whether it found a full batch
/// of work (then the pass goes on).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batch {
    pub(crate) removed: u64,
    pub(crate) more: bool,
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
impl Batch {
    /// A batch of at most `limit` records that removed `removed`: more may be left when
    /// it removed a full batch. (PostgreSQL's batches say themselves whether more is
    /// left: they also date rows of the layout before `sweep_at`.)
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    pub(crate) fn removed(removed: u64, limit: u32) -> Self {
        Self {
            removed,
            more: removed >= u64::from(limit),
        }
    }
}

/// Runs `batch(limit)` until a batch finds less than a full batch of work or the budget
/// is spent (at least one batch runs), pausing between batches as the options say: the
/// loop of every store that sweeps in batches.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
async fn run_batches<F, Fut>(
    options: &SweepOptions,
    started: Instant,
    mut batch: F,
) -> Result<SweepReport, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<Batch, StoreError>>,
{
    let limit = options.batch_size();
    let (mut removed, mut batches, mut paused) = (0u64, 0u32, Duration::ZERO);
    loop {
        let began = Instant::now();
        let done = batch(limit).await?;
        let took = began.elapsed();
        removed += done.removed;
        batches += 1;
        if !done.more {
            return Ok(SweepReport::new(
                removed,
                batches,
                started.elapsed(),
                SweepOutcome::Complete,
            )
            .with_lag(Some(Duration::ZERO))
            .with_paused(paused));
        }
        let pause = options.pause_after(took);
        // A budget that would run out during the pause ends the pass now.
        if options
            .time_budget()
            .is_some_and(|budget| started.elapsed().saturating_add(pause) >= budget)
        {
            return Ok(SweepReport::new(
                removed,
                batches,
                started.elapsed(),
                SweepOutcome::BudgetSpent,
            )
            .with_paused(paused));
        }
        if !pause.is_zero() {
            let before = Instant::now();
            tokio::time::sleep(pause).await;
            paused += before.elapsed();
        }
    }
}

/// One pass of a store that sweeps in batches: takes the sweep lock when the pass is
/// exclusive (`lock` gives `None` when another instance holds it: the pass is skipped;
/// what it gives is held until the pass ends), runs the batches, and asks for the lag
/// when the budget ran out with work left.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) async fn batched_pass<L, LockFut, B, BatchFut, LagFut>(
    options: &SweepOptions,
    lock: impl FnOnce() -> LockFut,
    batch: B,
    lag: impl FnOnce() -> LagFut,
) -> Result<SweepReport, StoreError>
where
    LockFut: std::future::Future<Output = Result<Option<L>, StoreError>>,
    B: FnMut(u32) -> BatchFut,
    BatchFut: std::future::Future<Output = Result<Batch, StoreError>>,
    LagFut: std::future::Future<Output = Option<Duration>>,
{
    let started = Instant::now();
    let _held = if options.is_exclusive() {
        let Some(held) = lock().await? else {
            return Ok(SweepReport::new(
                0,
                0,
                started.elapsed(),
                SweepOutcome::Skipped,
            ));
        };
        Some(held)
    } else {
        None
    };
    let report = run_batches(options, started, batch).await?;
    Ok(if report.outcome() == SweepOutcome::BudgetSpent {
        report.with_lag(lag().await)
    } else {
        report
    })
}

/// Runs one pass on `store` and reports it: a span (`idemkey.sweep`), metrics (feature
/// `metrics`: records removed, pass duration, passes skipped, the time of the last
/// complete pass, the sweep lag), and a WARN line when the pass fails or runs out of
/// budget with work left. What [`spawn_sweeper`] and the `idemkey sweep` command run.
///
/// # Errors
/// The store failed (the pass stopped; what it removed before stays removed).
pub async fn sweep_and_report(
    store: &dyn Store,
    options: &SweepOptions,
) -> Result<SweepReport, StoreError> {
    let kind = store.kind();
    let span = tracing::info_span!(
        "idemkey.sweep",
        idemkey.store.kind = kind,
        idemkey.sweep.removed = tracing::field::Empty,
        idemkey.sweep.batches = tracing::field::Empty,
        idemkey.sweep.outcome = tracing::field::Empty,
    );
    let result = tracing::Instrument::instrument(store.sweep_pass(options), span.clone()).await;
    match &result {
        Ok(report) => {
            span.record("idemkey.sweep.removed", report.removed());
            span.record("idemkey.sweep.batches", report.batches());
            span.record("idemkey.sweep.outcome", report.outcome().as_str());
            if report.outcome() == SweepOutcome::BudgetSpent {
                tracing::warn!(
                    store = kind,
                    removed = report.removed(),
                    lag_seconds = report.lag().map(|l| l.as_secs_f64()),
                    "idempotency store sweep ran out of its time budget with expired records left"
                );
            } else {
                tracing::debug!(
                    store = kind,
                    removed = report.removed(),
                    outcome = report.outcome().as_str(),
                    "idempotency store swept"
                );
            }
        }
        Err(e) => tracing::warn!(store = kind, error = %e, "idempotency store sweep failed"),
    }
    #[cfg(feature = "metrics")]
    if let Ok(report) = &result {
        record_metrics(kind, report);
    }
    result
}

#[cfg(feature = "metrics")]
fn record_metrics(kind: &'static str, report: &SweepReport) {
    use idemkey_core::telemetry::{
        SWEEP_DURATION, SWEEP_LAG, SWEEP_LAST_COMPLETE, SWEEP_REMOVED, SWEEP_SKIPPED,
    };
    if report.outcome() == SweepOutcome::Skipped {
        metrics::counter!(SWEEP_SKIPPED, "store" => kind).increment(1);
        return;
    }
    metrics::counter!(SWEEP_REMOVED, "store" => kind).increment(report.removed());
    metrics::histogram!(SWEEP_DURATION, "store" => kind, "outcome" => report.outcome().as_str())
        .record(report.duration().as_secs_f64());
    if report.outcome() == SweepOutcome::Complete {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        metrics::gauge!(SWEEP_LAST_COMPLETE, "store" => kind).set(now.as_secs_f64());
    }
    if let Some(lag) = report.lag() {
        metrics::gauge!(SWEEP_LAG, "store" => kind).set(lag.as_secs_f64());
    }
}

/// Spawns a task that runs a sweep pass ([`Store::sweep_pass`] with
/// [`SweepOptions::default`]: batches of 1,000, exclusive, paced with a pause as long as
/// each batch; [`spawn_sweeper_with`] sets them) every `every` (first after one period), for stores that keep expired records until swept (PostgreSQL, MySQL/MariaDB,
/// SQLite). However many instances run it on one database, one sweeps at a time: the
/// others skip that period. A failed pass is logged (`tracing`, warn) and tried again
/// next period. The task ends when the returned handle is aborted or the runtime shuts
/// down.
///
/// ```
/// use idemkey::store::{MemoryStore, Store, spawn_sweeper};
/// use std::{sync::Arc, time::Duration};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let sweeper = spawn_sweeper(Arc::clone(&store), Duration::from_secs(300));
/// sweeper.abort();
/// # }
/// ```
pub fn spawn_sweeper(store: Arc<dyn Store>, every: Duration) -> tokio::task::JoinHandle<()> {
    spawn_sweeper_with(store, every, SweepOptions::default())
}

/// [`spawn_sweeper`] with the passes' options: their batch, pacing
/// ([`SweepOptions::pause_ratio`]) and lock. A pass never takes longer than its period:
/// without a [`max_duration`](SweepOptions::max_duration), or with a longer one, the
/// period is the budget.
///
/// ```
/// use idemkey::store::{MemoryStore, Store, SweepOptions, spawn_sweeper_with};
/// use std::{sync::Arc, time::Duration};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// // Batches take at most a fifth of each pass's time.
/// let options = SweepOptions::new().pause_ratio(4.0);
/// let sweeper = spawn_sweeper_with(Arc::clone(&store), Duration::from_secs(300), options);
/// sweeper.abort();
/// # }
/// ```
pub fn spawn_sweeper_with(
    store: Arc<dyn Store>,
    every: Duration,
    options: SweepOptions,
) -> tokio::task::JoinHandle<()> {
    // `Instant + Duration` panics on overflow: a period of `Duration::MAX` ("never")
    // is held to 100 years, like every other "forever" in the stores.
    let every = clamp_forever(every).max(Duration::from_millis(1));
    let budget = options.time_budget().map_or(every, |b| b.min(every));
    let options = options.max_duration(budget);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let _ = sweep_and_report(store.as_ref(), &options).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::spawn_sweeper;
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    use super::{Batch, SweepOptions, SweepOutcome, SweepReport, run_batches};
    use crate::store::{ClaimRequest, FencingToken, MemoryStore, RecordId, Store};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn sweeps_every_period() {
        let store = MemoryStore::new();
        let id = RecordId::new("", "k");
        store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"",
                token: FencingToken::random(),
                lease: Duration::from_secs(1),
                retention: Duration::ZERO,
            })
            .await
            .expect("claim");
        let sweeper = spawn_sweeper(Arc::new(store.clone()), Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(store.len(), 1, "not swept before the first period");
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(store.len(), 0, "swept after the first period");
        sweeper.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_period_of_duration_max_never_sweeps_and_does_not_panic() {
        let sweeper = spawn_sweeper(Arc::new(MemoryStore::new()), Duration::MAX);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            !sweeper.is_finished(),
            "the sweeper task must still be alive"
        );
        sweeper.abort();
    }

    /// Runs a pass of `full` full batches and a last short one, each taking 10 ms of the
    /// paused clock, as `run_batches` paces it.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    async fn paced_pass(options: SweepOptions, full: u32) -> SweepReport {
        let mut left = full + 1;
        run_batches(&options, tokio::time::Instant::now(), |limit| {
            left -= 1;
            let more = left > 0;
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(Batch {
                    removed: if more { u64::from(limit) } else { 1 },
                    more,
                })
            }
        })
        .await
        .expect("the batches do not fail")
    }

    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[tokio::test(start_paused = true)]
    async fn a_pass_pauses_its_ratio_of_each_batch_before_the_next() {
        let report = paced_pass(SweepOptions::new().batch(10).pause_ratio(3.0), 4).await;
        assert_eq!((report.removed(), report.batches()), (41, 5));
        assert_eq!(report.outcome(), SweepOutcome::Complete);
        // Five batches of 10 ms; a pause of 30 ms after each of the first four.
        assert_eq!(report.paused(), Duration::from_millis(120), "{report:?}");
        assert_eq!(report.duration(), Duration::from_millis(170), "{report:?}");

        let unpaced = paced_pass(SweepOptions::new().batch(10).pause_ratio(0.0), 4).await;
        assert_eq!(unpaced.paused(), Duration::ZERO);
        assert_eq!(unpaced.duration(), Duration::from_millis(50), "{unpaced:?}");

        let default = paced_pass(SweepOptions::new().batch(10), 4).await;
        assert_eq!(default.paused(), Duration::from_millis(40), "{default:?}");
    }

    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[tokio::test(start_paused = true)]
    async fn a_pause_that_would_outlast_the_budget_ends_the_pass() {
        // 10 ms batches and 30 ms pauses: the third batch ends at 90 ms, and its pause
        // would end past the 100 ms budget.
        let options = SweepOptions::new()
            .batch(10)
            .pause_ratio(3.0)
            .max_duration(Duration::from_millis(100));
        let report = paced_pass(options, 10).await;
        assert_eq!(report.outcome(), SweepOutcome::BudgetSpent);
        assert_eq!(report.batches(), 3, "{report:?}");
        assert_eq!(report.duration(), Duration::from_millis(90), "{report:?}");
    }

    #[test]
    fn pause_ratios_are_held_to_their_range() {
        let took = Duration::from_millis(10);
        assert_eq!(
            SweepOptions::new().pause_ratio(f64::NAN).pause_after(took),
            Duration::ZERO
        );
        assert_eq!(
            SweepOptions::new().pause_ratio(-1.0).pause_after(took),
            Duration::ZERO
        );
        assert_eq!(
            SweepOptions::new()
                .pause_ratio(f64::INFINITY)
                .pause_after(took),
            Duration::from_secs(10)
        );
        assert_eq!(
            SweepOptions::new()
                .pause_ratio(f64::INFINITY)
                .pause_after(Duration::MAX),
            Duration::MAX / 1_000
        );
    }
}
