//! Sweeping: a pass of bounded batches ([`SweepOptions`], [`SweepReport`]), and a
//! background task that runs one per period ([`spawn_sweeper`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Store, StoreError, clamp_forever};

/// The default number of records one sweep statement removes at most.
pub const DEFAULT_SWEEP_BATCH: u32 = 1_000;

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
/// ```
/// use std::time::Duration;
/// use idemkey::store::SweepOptions;
///
/// let options = SweepOptions::new().batch(500).max_duration(Duration::from_secs(30));
/// assert_eq!(options.batch_size(), 500);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepOptions {
    batch: u32,
    max_duration: Option<Duration>,
    exclusive: bool,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            batch: DEFAULT_SWEEP_BATCH,
            max_duration: None,
            exclusive: true,
        }
    }
}

impl SweepOptions {
    /// Batches of [`DEFAULT_SWEEP_BATCH`] records, no time budget, exclusive.
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
        }
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
/// is spent (at least one batch runs): the loop of every store that sweeps in batches.
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
    let (mut removed, mut batches) = (0u64, 0u32);
    loop {
        let done = batch(limit).await?;
        removed += done.removed;
        batches += 1;
        if !done.more {
            return Ok(SweepReport::new(
                removed,
                batches,
                started.elapsed(),
                SweepOutcome::Complete,
            )
            .with_lag(Some(Duration::ZERO)));
        }
        if options
            .time_budget()
            .is_some_and(|budget| started.elapsed() >= budget)
        {
            return Ok(SweepReport::new(
                removed,
                batches,
                started.elapsed(),
                SweepOutcome::BudgetSpent,
            ));
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
/// [`SweepOptions::default`]: batches of 1,000, exclusive) every `every` (first after one
/// period), for stores that keep expired records until swept (PostgreSQL, MySQL/MariaDB,
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
    // `Instant + Duration` panics on overflow: a period of `Duration::MAX` ("never")
    // is held to 100 years, like every other "forever" in the stores.
    let every = clamp_forever(every).max(Duration::from_millis(1));
    // A pass never takes longer than its period: the rest waits for the next one.
    let options = SweepOptions::default().max_duration(every);
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
}
