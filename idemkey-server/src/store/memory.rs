//! The embedded in-memory store.

use std::collections::hash_map::{Entry, OccupiedEntry};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::time::Instant;

use super::{
    Claim, ClaimRequest, FencingToken, InProcessStore, RecordId, RecordInfo, RecordState,
    Settlements, Store, StoreError, SweepOptions, SweepOutcome, SweepReport, Watch, clamp_forever,
};

mod shards;

use shards::Shards;

/// The shortest time between two automatic sweeps, in microseconds of store time.
const SWEEP_INTERVAL_US: u64 = 5_000_000;

/// The shortest time between two sweeps started because the store was full, in
/// microseconds of store time.
const FULL_SWEEP_INTERVAL_US: u64 = 1_000_000;

/// The records a step of the store's own sweeps ([`Store::sweep`] and the automatic
/// one) removes at most: about 80 µs of a worker here (`memory_sweep`), what a request
/// waits at most behind it.
const OWN_SWEEP_BATCH: u32 = 256;

/// The most records one step of a sweep looks at (whole shards, so a shard or so more)
/// before it lets other tasks run, whatever it removed: a step over live records only
/// is about as short as one that removes a batch.
const SCAN_PER_STEP: usize = 8_192;

/// An in-memory store: fast, shared by every clone, bounded, and lost when the process
/// exits.
///
/// Concurrent without a global lock: the records are spread over shards, each a hash
/// map behind a lock of its own, as many as [`max_records`](MemoryStoreBuilder::max_records)
/// calls for (about 2,000 records a shard in a full store: 512 shards at the default
/// bound, 8,192 at 10 million), so claims on different records rarely contend. Time is
/// read from [`tokio::time::Instant`], so tests can drive leases and retention with
/// `tokio::time::pause`.
///
/// # Sweeping
///
/// Expired records are swept by [`Store::sweep`] and [`Store::sweep_pass`], and
/// automatically, at most every 5 s while claims arrive, by a task the store spawns
/// (never on a request's path). An abandoned claim is kept for its retention past its
/// lease (contract rule 4) by all of them. Whatever starts it, a sweep never stalls
/// requests for longer than one small batch, at any size:
///
/// - it goes round the shards in **steps**: a step removes at most one batch
///   ([`SweepOptions::batch`]; 256 records for [`Store::sweep`] and the automatic
///   sweep) or looks at about 8,000 records, whichever comes first, then yields to the
///   runtime, so a task waiting for the sweep's worker waits one step at most;
/// - it holds **one shard's lock at a time**, for one look at that shard's records, so
///   a claim waits for one shard at most; what a step removed is freed after its locks
///   are released;
/// - the counts ([`stored_bytes`](MemoryStore::stored_bytes), the bounds) drop as each
///   shard is swept, under that shard's lock: once a step returned, what it removed is
///   off them.
///
/// A pass ends [`Complete`](super::SweepOutcome::Complete) when it has looked at every
/// shard once. With a budget ([`SweepOptions::max_duration`]) it stops at the first step
/// past it, [`BudgetSpent`](super::SweepOutcome::BudgetSpent) (at least one step runs;
/// expired records may be left in the shards it did not reach),
/// and the next pass goes on from the shard where it stopped, so that short passes still
/// reach every record in turn. [`SweepOptions::exclusive`] has nothing to lock: the
/// store lives in one process, and concurrent passes take each shard's lock in turn.
/// At 10 million records a whole sweep removes about 2 million expired records a second
/// here, one step takes well under a millisecond, and requests keep being answered
/// throughout (BENCHMARKS.md, the `memory_sweep` program).
///
/// [`Store::list_in_progress`] scans the whole map (one shard locked at a time).
///
/// Use it for a single process, and in tests; use Redis or PostgreSQL when several
/// instances must agree, SQLite when records must survive a restart.
///
/// # Bounds
///
/// The store holds at most [`max_records`](MemoryStoreBuilder::max_records) records
/// and counts at most [`max_bytes`](MemoryStoreBuilder::max_bytes) bytes; by default
/// [`MemoryStore::DEFAULT_MAX_RECORDS`] (1,000,000) and
/// [`MemoryStore::DEFAULT_MAX_BYTES`] (512 MiB), so that a flood of unique keys cannot
/// grow the process until the kernel kills it. A record counts
/// [`MemoryStore::RECORD_OVERHEAD`] bytes plus its fingerprint and its payload (the
/// stored response); expired records not swept yet count until the sweep removes them.
///
/// When a bound is reached, a claim of a **new** record fails with
/// [`StoreError::is_full`] (the verifier answers `503 store-full` with `Retry-After`)
/// and starts a sweep in the background (at most one a second), so that expired records
/// free their room for the retry; no claim scans the map on its own path. No live record
/// is ever evicted to make room. Everything about existing records keeps working: a
/// claim that finds a record (a replay, a duplicate of a running request, a reused
/// key), the takeover of an expired record (it replaces it, adding no record), and the
/// complete, renew and release of claims already made. A completion is never refused
/// for room (an executed outcome is never lost), so the counted bytes may pass
/// `max_bytes` by the responses of the claims that were running when the store filled.
///
/// ```
/// use idemkey::store::{MemoryStore, Store, ClaimRequest, Claim, FencingToken, RecordId};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let id = RecordId::new("tenant", "key-1");
/// let token = FencingToken::random();
/// let (lease, retention) = (Duration::from_secs(5), Duration::from_secs(3600));
/// let claim = store.claim(ClaimRequest { id: &id, fingerprint: b"fp", token, lease, retention }).await?;
/// assert_eq!(claim, Claim::Acquired { takeover: false });
/// store.complete(&id, token, "stored".into(), retention).await?;
/// assert_eq!(store.max_records(), MemoryStore::DEFAULT_MAX_RECORDS);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

/// The default bounds, the bytes counted per record, and the builder.
impl MemoryStore {
    /// The default bound of the number of records: 1,000,000 (about 430 MiB of a
    /// process for small responses: idemkey's `memory_per_record` program measured
    /// 340 to 450 bytes per completed record).
    pub const DEFAULT_MAX_RECORDS: u64 = 1_000_000;

    /// The default budget of bytes: 512 MiB, counted as [`MemoryStore::RECORD_OVERHEAD`]
    /// plus the fingerprint and the payload of every record.
    pub const DEFAULT_MAX_BYTES: u64 = 512 * 1024 * 1024;

    /// The bytes a record counts besides its fingerprint and payload: its map entry
    /// (112 bytes), the room the map keeps free for it (a shard doubles when 7/8 full),
    /// and the allocations behind its fingerprint and payload. An estimate on the high
    /// side of what `memory_per_record` measures, so that the byte budget bounds the
    /// memory the process really uses.
    pub const RECORD_OVERHEAD: u64 = 256;

    /// A store with bounds other than the defaults.
    ///
    /// ```
    /// use idemkey::store::MemoryStore;
    /// let store = MemoryStore::builder().max_records(100_000).max_bytes(64 << 20).build()?;
    /// assert_eq!((store.max_records(), store.max_bytes()), (100_000, 64 << 20));
    /// let err = MemoryStore::builder().max_records(0).build().expect_err("zero records");
    /// assert!(err.is_configuration() && err.to_string().contains("max_records"));
    /// # Ok::<(), idemkey::store::StoreError>(())
    /// ```
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_records: Self::DEFAULT_MAX_RECORDS,
            max_bytes: Self::DEFAULT_MAX_BYTES,
        }
    }
}

/// Configures a [`MemoryStore`]'s bounds; start with [`MemoryStore::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryStoreBuilder {
    max_records: u64,
    max_bytes: u64,
}

impl MemoryStoreBuilder {
    /// The most records the store holds (default
    /// [`MemoryStore::DEFAULT_MAX_RECORDS`]); at least 1. Expired records count until a
    /// sweep removes them.
    pub fn max_records(mut self, n: u64) -> Self {
        self.max_records = n;
        self
    }

    /// The most bytes the store counts (default [`MemoryStore::DEFAULT_MAX_BYTES`]):
    /// [`MemoryStore::RECORD_OVERHEAD`] plus the fingerprint and the payload of each
    /// record; at least one record's overhead. Checked when a new record is claimed; a
    /// completion is never refused, so the count may pass the budget by the responses
    /// of the claims running when it filled.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The store.
    ///
    /// # Errors
    /// [`StoreError::is_configuration`] when `max_records` is 0 or `max_bytes` is less
    /// than [`MemoryStore::RECORD_OVERHEAD`] (no record would fit); the message names
    /// the setting.
    pub fn build(self) -> Result<MemoryStore, StoreError> {
        if self.max_records == 0 {
            return Err(StoreError::configuration(
                "the memory store's max_records is 0, so it could hold no record: use a positive number of records",
            ));
        }
        if self.max_bytes < MemoryStore::RECORD_OVERHEAD {
            return Err(StoreError::configuration(format!(
                "the memory store's max_bytes is {} bytes, less than one record's overhead ({} bytes), so it could hold no record: use at least a few KiB (a few hundred bytes per record plus the stored responses)",
                self.max_bytes,
                MemoryStore::RECORD_OVERHEAD
            )));
        }
        Ok(MemoryStore {
            inner: Arc::new(Inner::new(Limits {
                records: self.max_records,
                bytes: self.max_bytes,
            })),
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    records: u64,
    bytes: u64,
}

struct Inner {
    records: Shards,
    /// The shard where the last sweep pass stopped: the next one starts there, so that
    /// passes cut short by their budget still go round every shard in turn.
    sweep_cursor: AtomicUsize,
    /// Duplicates waiting for a record to settle ([`Store::watch`]).
    settlements: Settlements,
    /// Store time after which the next claim starts a sweep.
    next_sweep_us: AtomicU64,
    /// Store time after which a claim refused for room may start another sweep.
    next_full_sweep_us: AtomicU64,
    /// An automatic sweep is running ([`AutoSweep`]).
    auto_sweeping: AtomicBool,
    /// Store time zero: every time a record keeps is microseconds since this instant.
    epoch: Instant,
    /// The wall-clock time at `epoch`, for [`RecordInfo`]'s times (one fixed pair, so
    /// a record shows the same times at every look).
    epoch_wall: SystemTime,
    limits: Limits,
    /// Records in the map (expired ones not swept yet included), changed under the
    /// lock of the shard of the record that comes or goes.
    used_records: AtomicU64,
    /// Bytes counted for them ([`MemoryStore::RECORD_OVERHEAD`] + fingerprint +
    /// payload each).
    used_bytes: AtomicU64,
    #[cfg(feature = "metrics")]
    gauges: Gauges,
}

impl Default for Inner {
    fn default() -> Self {
        Self::new(Limits {
            records: MemoryStore::DEFAULT_MAX_RECORDS,
            bytes: MemoryStore::DEFAULT_MAX_BYTES,
        })
    }
}

/// Why a new record was refused: the bound reached.
enum Full {
    Records,
    Bytes,
}

impl Inner {
    fn new(limits: Limits) -> Self {
        Self {
            records: Shards::for_records(limits.records),
            sweep_cursor: AtomicUsize::new(0),
            settlements: Settlements::default(),
            next_sweep_us: AtomicU64::new(SWEEP_INTERVAL_US),
            next_full_sweep_us: AtomicU64::new(0),
            auto_sweeping: AtomicBool::new(false),
            epoch: Instant::now(),
            epoch_wall: SystemTime::now(),
            limits,
            used_records: AtomicU64::new(0),
            used_bytes: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            gauges: Gauges::new(limits),
        }
    }

    /// Makes room for a new record of `cost` bytes, or says which bound is reached.
    ///
    /// One atomic add per count (no compare-and-swap loop on the claim's path), taken
    /// back when over: at the bound, a claim may be refused by the overshoot of another
    /// refused at the same moment, never admitted past it.
    fn reserve(&self, cost: u64) -> Result<(), Full> {
        let limits = self.limits;
        if self.used_records.fetch_add(1, Ordering::Relaxed) >= limits.records {
            sub(&self.used_records, 1);
            return Err(Full::Records);
        }
        if self
            .used_bytes
            .fetch_add(cost, Ordering::Relaxed)
            .saturating_add(cost)
            > limits.bytes
        {
            sub(&self.used_bytes, cost);
            sub(&self.used_records, 1);
            return Err(Full::Bytes);
        }
        #[cfg(feature = "metrics")]
        self.gauges.add(1, cost);
        Ok(())
    }

    /// A record grew by `bytes` (completed), whatever the budget.
    fn grow(&self, bytes: u64) {
        add(&self.used_bytes, bytes);
        #[cfg(feature = "metrics")]
        self.gauges.add(0, bytes);
    }

    /// `records` records of `bytes` bytes in all left the map.
    fn shrink(&self, records: u64, bytes: u64) {
        sub(&self.used_records, records);
        sub(&self.used_bytes, bytes);
        #[cfg(feature = "metrics")]
        self.gauges.sub(records, bytes);
    }

    /// A record of `old` bytes was replaced by one of `new` bytes (a takeover).
    fn replace(&self, old: u64, new: u64) {
        if new >= old {
            self.grow(new - old);
        } else {
            self.shrink(0, old - new);
        }
    }
}

/// `a += n` (a count of bytes in memory stays far below `u64::MAX`).
fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

/// `a -= n`, never below zero.
fn sub(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

/// The fill gauges (feature `metrics`): the records and bytes of every memory store of
/// the process, and their bounds, added up (each store adds its own and takes them
/// back when dropped). Resolved in the recorder current when the store is built.
#[cfg(feature = "metrics")]
struct Gauges {
    records: metrics::Gauge,
    bytes: metrics::Gauge,
    max_records: metrics::Gauge,
    max_bytes: metrics::Gauge,
    limits: Limits,
}

#[cfg(feature = "metrics")]
#[allow(
    clippy::cast_precision_loss,
    reason = "gauges are f64; counts beyond 2^53 lose precision, not meaning"
)]
impl Gauges {
    fn new(limits: Limits) -> Self {
        use idemkey_core::telemetry as names;
        let gauges = Self {
            records: metrics::gauge!(names::STORE_MEMORY_RECORDS),
            bytes: metrics::gauge!(names::STORE_MEMORY_BYTES),
            max_records: metrics::gauge!(names::STORE_MEMORY_MAX_RECORDS),
            max_bytes: metrics::gauge!(names::STORE_MEMORY_MAX_BYTES),
            limits,
        };
        gauges.max_records.increment(limits.records as f64);
        gauges.max_bytes.increment(limits.bytes as f64);
        gauges
    }

    fn add(&self, records: u64, bytes: u64) {
        if records > 0 {
            self.records.increment(records as f64);
        }
        self.bytes.increment(bytes as f64);
    }

    fn sub(&self, records: u64, bytes: u64) {
        if records > 0 {
            self.records.decrement(records as f64);
        }
        self.bytes.decrement(bytes as f64);
    }
}

#[cfg(feature = "metrics")]
impl Drop for Inner {
    #[allow(
        clippy::cast_precision_loss,
        reason = "gauges are f64; counts beyond 2^53 lose precision, not meaning"
    )]
    fn drop(&mut self) {
        let g = &self.gauges;
        g.sub(
            self.used_records.load(Ordering::Relaxed),
            self.used_bytes.load(Ordering::Relaxed),
        );
        g.max_records.decrement(g.limits.records as f64);
        g.max_bytes.decrement(g.limits.bytes as f64);
    }
}

/// Times are microseconds of store time (since [`Inner::epoch`]): 8 bytes each where an
/// `Instant` takes 16, which pays for `created` (issue 19 counts bytes per record).
struct Record {
    fingerprint: Bytes,
    /// When the current claim was made.
    created: u64,
    /// End of the lease (in progress) or of the retention (completed).
    expires: u64,
    state: State,
}

enum State {
    /// The token as two words rather than a `u128`: 8-byte alignment lets the variant
    /// share the space of `Completed`'s `Bytes`, so `State` stays 32 bytes.
    InProgress {
        token: [u64; 2],
        /// How long the record is kept past `expires` (the claim's retention).
        retention: u64,
    },
    Completed(Bytes),
}

fn token_words(t: FencingToken) -> [u64; 2] {
    let v = t.as_u128();
    // Truncation intended: the high and the low 64 bits.
    #[allow(clippy::cast_possible_truncation)]
    [(v >> 64) as u64, v as u64]
}

/// A duration in whole microseconds, "forever" held to 100 years.
fn micros(d: Duration) -> u64 {
    // 100 years in microseconds is far below u64::MAX.
    u64::try_from(clamp_forever(d).as_micros()).unwrap_or(u64::MAX)
}

impl Record {
    /// The end of the time the record is kept: its retention once completed, its lease
    /// plus the claim's retention while in progress (an abandoned claim, rule 4).
    fn kept_until(&self) -> u64 {
        match self.state {
            State::InProgress { retention, .. } => self.expires.saturating_add(retention),
            State::Completed(_) => self.expires,
        }
    }

    /// The bytes the record counts against the budget ([`MemoryStore::RECORD_OVERHEAD`]
    /// + fingerprint + payload).
    fn cost(&self) -> u64 {
        let payload = match &self.state {
            State::InProgress { .. } => 0,
            State::Completed(p) => p.len(),
        };
        MemoryStore::RECORD_OVERHEAD
            .saturating_add(self.fingerprint.len() as u64)
            .saturating_add(payload as u64)
    }

    fn held_by(&self, token: [u64; 2], now: u64) -> bool {
        matches!(self.state, State::InProgress { token: t, .. } if t == token)
            && self.kept_until() > now
    }
}

/// The automatic sweep running: lets the next one start when dropped, whether the
/// pass ended or its task was dropped with its runtime.
struct AutoSweep(MemoryStore);

impl Drop for AutoSweep {
    fn drop(&mut self) {
        self.0.inner.auto_sweeping.store(false, Ordering::Release);
    }
}

/// Where a sweep pass stands ([`MemoryStore::round`]).
struct Round {
    /// The shard the next step starts at.
    next: usize,
    /// Shards not yet looked at whole.
    left: usize,
    removed: u64,
    steps: u32,
}

impl MemoryStore {
    /// An empty store with the default bounds ([`MemoryStore::DEFAULT_MAX_RECORDS`],
    /// [`MemoryStore::DEFAULT_MAX_BYTES`]).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The store a `memory` connection string names (see [`open`](super::open)):
    /// `memory`, `memory://`, or `memory://?max_records=N&max_bytes=SIZE` with either
    /// parameter or both. `N` is a positive integer; `SIZE` a positive integer of bytes,
    /// or one followed by a unit: `B`, `KB`, `MB`, `GB` (powers of 1000), `KiB`, `MiB`,
    /// `GiB` (powers of 1024), in any case. What is not given keeps its default.
    ///
    /// ```
    /// use idemkey::store::MemoryStore;
    /// let store = MemoryStore::from_url("memory://?max_records=100000&max_bytes=256MiB")?;
    /// assert_eq!((store.max_records(), store.max_bytes()), (100_000, 256 << 20));
    /// let err = MemoryStore::from_url("memory://?max_bytes=lots").expect_err("no size");
    /// assert!(err.is_configuration() && err.to_string().contains("max_bytes"));
    /// # Ok::<(), idemkey::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// [`StoreError::is_configuration`], naming the parameter and what is accepted, for
    /// an unknown or repeated parameter, a value that is zero, negative or not a number
    /// (or size), a host or path after `memory://`, or another scheme.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        super::open::memory_settings(url)?.build()
    }

    /// The most records the store holds ([`MemoryStoreBuilder::max_records`]).
    #[must_use]
    pub fn max_records(&self) -> u64 {
        self.inner.limits.records
    }

    /// The most bytes the store counts ([`MemoryStoreBuilder::max_bytes`]).
    #[must_use]
    pub fn max_bytes(&self) -> u64 {
        self.inner.limits.bytes
    }

    /// The bytes counted for the records held now (expired ones not yet swept
    /// included): [`MemoryStore::RECORD_OVERHEAD`] plus the fingerprint and the payload
    /// of each.
    ///
    /// ```
    /// use idemkey::store::MemoryStore;
    /// assert_eq!(MemoryStore::new().stored_bytes(), 0);
    /// ```
    #[must_use]
    pub fn stored_bytes(&self) -> u64 {
        self.inner.used_bytes.load(Ordering::Relaxed)
    }

    /// The number of records held, expired ones not yet swept included, counted one
    /// shard at a time (hundreds of shards: a figure for operators and tests, not for a
    /// request's path).
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.records.len()
    }

    /// `true` when the store holds no record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.inner.records.is_empty()
    }

    /// Store time now, in microseconds since the store was made.
    fn now(&self) -> u64 {
        let since = Instant::now().saturating_duration_since(self.inner.epoch);
        u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
    }

    /// A sweep's way round the shards: from where the last pass stopped, every shard
    /// once.
    fn round(&self) -> Round {
        let shards = self.inner.records.count();
        Round {
            next: self.inner.sweep_cursor.load(Ordering::Relaxed) % shards,
            left: shards,
            removed: 0,
            steps: 0,
        }
    }

    /// One step of a sweep: removes at most `batch` records past their keeping, shard by
    /// shard from where `round` stands, until it has removed `batch`, looked at
    /// [`SCAN_PER_STEP`] records or gone round every shard. Each shard's lock is held
    /// for one look at that shard's records (about [`shards::RECORDS_PER_SHARD`] in a
    /// full store), and what was removed is freed after the locks are released.
    fn sweep_step(&self, round: &mut Round, batch: u32) {
        let now = self.now();
        let batch = batch.max(1) as usize;
        let shards = self.inner.records.count();
        let mut gone: Vec<Record> = Vec::with_capacity(batch.min(4_096));
        let mut scanned = 0;
        while round.left > 0 && gone.len() < batch && scanned < SCAN_PER_STEP {
            let want = batch - gone.len();
            let before = gone.len();
            let mut shard = self.inner.records.lock(round.next);
            scanned += shard.len();
            gone.extend(
                shard
                    .extract_if(|_, r| r.kept_until() <= now)
                    .take(want)
                    .map(|(_, r)| r),
            );
            // Counted down under the shard's lock, as every record that comes or goes:
            // once a step returned, what it removed is off the counts.
            let bytes = gone[before..].iter().map(Record::cost).sum();
            self.inner.shrink((gone.len() - before) as u64, bytes);
            drop(shard);
            if gone.len() - before < want {
                // The whole shard was looked at (`take` stopped short otherwise: the
                // rest stays for the next step).
                round.next = (round.next + 1) % shards;
                round.left -= 1;
            }
        }
        round.removed += gone.len() as u64;
        round.steps = round.steps.saturating_add(1);
        // Freed here, outside every lock.
        drop(gone);
    }

    /// A sweep pass: steps of at most `batch` records until every shard was looked at
    /// or `budget` is spent (at least one step), yielding to the runtime between steps,
    /// so that a pass on a runtime's worker holds it no longer than one step at a time.
    async fn pass(&self, batch: u32, budget: Option<Duration>) -> SweepReport {
        let started = Instant::now();
        let mut round = self.round();
        let outcome = loop {
            self.sweep_step(&mut round, batch);
            if round.left == 0 {
                break SweepOutcome::Complete;
            }
            if budget.is_some_and(|b| started.elapsed() >= b) {
                break SweepOutcome::BudgetSpent;
            }
            tokio::task::yield_now().await;
        };
        self.end_pass(&round);
        let report = SweepReport::new(round.removed, round.steps, started.elapsed(), outcome);
        if outcome == SweepOutcome::Complete {
            report.with_lag(Some(Duration::ZERO))
        } else {
            report
        }
    }

    /// What every pass does last: the next one starts where this one stopped.
    fn end_pass(&self, round: &Round) {
        self.inner.sweep_cursor.store(round.next, Ordering::Relaxed);
        self.inner.settlements.prune();
    }

    /// The claim, or `Err` when it needs a new record and the store is full.
    fn claim_at(&self, req: &ClaimRequest<'_>, now: u64) -> Result<Claim, Full> {
        let fresh = || Record {
            fingerprint: Bytes::copy_from_slice(req.fingerprint),
            created: now,
            expires: now.saturating_add(micros(req.lease)),
            state: State::InProgress {
                token: token_words(req.token),
                retention: micros(req.retention),
            },
        };
        // Under the lock of the record's shard: the room is reserved (or the old record's
        // bytes traded) as the record comes, so no count misses a record.
        let mut shard = self.inner.records.lock_for(req.id);
        Ok(match shard.entry(*req.id) {
            Entry::Vacant(v) => {
                let record = fresh();
                self.inner.reserve(record.cost())?;
                v.insert(record);
                Claim::Acquired { takeover: false }
            }
            Entry::Occupied(mut o) => {
                let r = o.get();
                if r.expires <= now {
                    // Replaces an expired record: no record is added, so a full store
                    // allows it.
                    let takeover = matches!(r.state, State::InProgress { .. });
                    let old = r.cost();
                    let record = fresh();
                    self.inner.replace(old, record.cost());
                    o.insert(record);
                    return Ok(Claim::Acquired { takeover });
                }
                match &r.state {
                    State::InProgress { .. } => Claim::InProgress {
                        fingerprint: r.fingerprint.clone(),
                        lease_remaining: Duration::from_micros(r.expires - now),
                    },
                    State::Completed(payload) => Claim::Completed {
                        fingerprint: r.fingerprint.clone(),
                        payload: payload.clone(),
                    },
                }
            }
        })
    }

    /// A claim was refused for room: starts a sweep in the background, so that expired
    /// records free their room for the retry, at most once a second (never a scan on
    /// the request's path).
    fn sweep_when_full(&self, now: u64) {
        let due = self.inner.next_full_sweep_us.load(Ordering::Relaxed);
        if now < due
            || self
                .inner
                .next_full_sweep_us
                .compare_exchange(
                    due,
                    now.saturating_add(FULL_SWEEP_INTERVAL_US),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        self.sweep_in_background();
    }

    /// Sweeps in a task of its own (a whole pass, in steps that yield), or here without
    /// a runtime. One at a time: a sweep due while the last one still runs is skipped (two passes
    /// would follow each other round the same shards).
    fn sweep_in_background(&self) {
        if self.inner.auto_sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        let running = AutoSweep(self.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    running.0.pass(OWN_SWEEP_BATCH, None).await;
                    drop(running);
                });
            }
            Err(_) => {
                let store = &running.0;
                let mut round = store.round();
                while round.left > 0 {
                    store.sweep_step(&mut round, OWN_SWEEP_BATCH);
                }
                store.end_pass(&round);
            }
        }
    }

    /// The error of a claim refused for room.
    fn full(&self, full: &Full) -> StoreError {
        let limits = self.inner.limits;
        StoreError::full(match full {
            Full::Records => format!(
                "the memory store holds its max_records of {} records",
                limits.records
            ),
            Full::Bytes => format!(
                "the memory store's records count {} of its max_bytes of {} bytes, with no room for another",
                self.stored_bytes(),
                limits.bytes
            ),
        })
    }

    /// Starts a background sweep when the interval has passed. A scan of the whole map
    /// on a request's path made that request slow, and a count-based trigger made the
    /// amortised cost grow with the number of live records.
    fn sweep_if_due(&self, now: u64) {
        let due = self.inner.next_sweep_us.load(Ordering::Relaxed);
        if now < due
            || self
                .inner
                .next_sweep_us
                .compare_exchange(
                    due,
                    now.saturating_add(SWEEP_INTERVAL_US),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        self.sweep_in_background();
    }

    /// Applies `f` to the record held by `token` (its lease expired or not, rule 3), or
    /// fails fenced.
    fn with_owned(
        &self,
        id: &RecordId,
        token: FencingToken,
        f: impl FnOnce(OccupiedEntry<'_, RecordId, Record>, u64),
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut shard = self.inner.records.lock_for(id);
        match shard.entry(*id) {
            Entry::Occupied(e) if e.get().held_by(token_words(token), now) => {
                f(e, now);
                Ok(())
            }
            _ => Err(StoreError::fenced()),
        }
    }

    /// What [`Store::inspect`] shows of `r`, or `None` once it is past its keeping.
    fn info(&self, id: RecordId, r: &Record, now: u64) -> Option<RecordInfo> {
        if r.kept_until() <= now {
            return None;
        }
        // At most 200 years after the epoch: no `SystemTime` overflow on any platform.
        let wall = |t: u64| {
            let wall = self.inner.epoch_wall;
            wall.checked_add(Duration::from_micros(t)).unwrap_or(wall)
        };
        let (state, payload_len) = match &r.state {
            State::InProgress { .. } => (RecordState::InProgress, None),
            State::Completed(p) => (RecordState::Completed, Some(p.len() as u64)),
        };
        Some(RecordInfo {
            id,
            state,
            fingerprint: r.fingerprint.clone(),
            created: wall(r.created),
            expires: wall(r.expires),
            payload_len,
        })
    }
}

/// The operations of the request path, answered at once: what [`Store::claim`] and
/// [`Store::complete`] do, without the boxed future the trait's methods make. The engine
/// calls these ([`Store::in_process`]) as a fresh request claims and completes and a
/// replay claims.
impl InProcessStore for MemoryStore {
    fn claim_now(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let now = self.now();
        let claim = self.claim_at(req, now);
        // After the claim, so a claim never races the sweep it starts.
        self.sweep_if_due(now);
        claim.map_err(|full| {
            self.sweep_when_full(now);
            self.full(&full)
        })
    }

    fn complete_now(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.with_owned(id, token, |mut e, now| {
            let r = e.get_mut();
            // Never refused for room: the outcome of an execution is not lost.
            self.inner.grow(payload.len() as u64);
            r.state = State::Completed(payload);
            r.expires = now.saturating_add(micros(retention));
        })?;
        self.inner.settlements.notify(id);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.claim_now(&req)
    }

    fn in_process(&self) -> Option<&dyn InProcessStore> {
        Some(self)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.complete_now(id, token, payload, retention)
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.with_owned(id, token, |mut e, now| {
            e.get_mut().expires = now.saturating_add(micros(lease));
        })
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.with_owned(id, token, |e, _| {
            let (_, r) = e.remove_entry();
            self.inner.shrink(1, r.cost());
        })?;
        self.inner.settlements.notify(id);
        Ok(())
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        Ok(self.pass(OWN_SWEEP_BATCH, None).await.removed())
    }

    /// Steps of at most [`SweepOptions::batch_size`] records, yielding between steps,
    /// until every record was looked at (`Complete`) or the budget is spent
    /// (`BudgetSpent`: the next pass goes on from the shard where this one stopped).
    /// [`SweepOptions::exclusive`] changes nothing: the store lives in one process, and
    /// concurrent passes take each shard's lock in turn.
    async fn sweep_pass(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        Ok(self.pass(options.batch_size(), options.time_budget()).await)
    }

    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let now = self.now();
        Ok(self
            .inner
            .records
            .lock_for(id)
            .get(id)
            .and_then(|r| self.info(*id, r, now)))
    }

    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let now = self.now();
        let removed = {
            let mut shard = self.inner.records.lock_for(id);
            shard.remove(id).inspect(|r| self.inner.shrink(1, r.cost()))
        };
        self.inner.settlements.notify(id);
        Ok(removed.is_some_and(|r| r.kept_until() > now))
    }

    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        Ok(Box::new(self.inner.settlements.subscribe(id)))
    }

    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let now = self.now();
        let mut found: Vec<(u64, RecordInfo)> = Vec::new();
        for i in 0..self.inner.records.count() {
            let shard = self.inner.records.lock(i);
            found.extend(
                shard
                    .iter()
                    .filter(|(_, r)| matches!(r.state, State::InProgress { .. }))
                    .filter_map(|(id, r)| Some((r.created, self.info(*id, r, now)?))),
            );
        }
        found.sort_unstable_by_key(|(created, info)| (*created, info.id));
        Ok(found
            .into_iter()
            .take(limit)
            .map(|(_, info)| info)
            .collect())
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .field("stored_bytes", &self.stored_bytes())
            .field("max_records", &self.max_records())
            .field("max_bytes", &self.max_bytes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn huge_durations_do_not_panic() {
        let store = MemoryStore::new();
        let id = RecordId::new("", "k");
        let token = FencingToken::random();
        let claim = store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"fp",
                token,
                lease: Duration::MAX,
                retention: Duration::MAX,
            })
            .await
            .expect("claim");
        assert_eq!(claim, Claim::Acquired { takeover: false });
        store.renew(&id, token, Duration::MAX).await.expect("renew");
        store
            .complete(&id, token, Bytes::from_static(b"p"), Duration::MAX)
            .await
            .expect("complete");
        assert_eq!(store.sweep().await.expect("sweep"), 0);
    }
}

#[cfg(test)]
mod sweep_tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn expired_records_are_swept_in_the_background_while_claims_arrive() {
        let store = MemoryStore::new();
        for i in 0..100 {
            let id = RecordId::new("", &format!("k{i}"));
            let claim = ClaimRequest {
                id: &id,
                fingerprint: b"fp",
                token: FencingToken::random(),
                lease: Duration::from_secs(1),
                retention: Duration::ZERO,
            };
            store.claim(claim).await.expect("claim");
        }
        assert_eq!(store.len(), 100);
        tokio::time::advance(Duration::from_micros(SWEEP_INTERVAL_US)).await;
        let id = RecordId::new("", "trigger");
        let claim = ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: Duration::from_secs(60),
            retention: Duration::ZERO,
        };
        store.claim(claim).await.expect("claim");
        // Bounded: the sweep runs on the blocking pool.
        for _ in 0..1000 {
            if store.len() == 1 {
                break;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(store.len(), 1, "only the live record is left");
    }

    #[tokio::test(start_paused = true)]
    async fn the_automatic_sweep_keeps_an_abandoned_claim_for_its_retention() {
        let store = MemoryStore::new();
        let id = RecordId::new("", "abandoned");
        let owner = FencingToken::random();
        let claim = ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: owner,
            lease: Duration::from_secs(1),
            retention: Duration::from_secs(60),
        };
        store.claim(claim).await.expect("claim");
        let trigger = |key: &'static str| {
            let store = store.clone();
            async move {
                let id = RecordId::new("", key);
                let claim = ClaimRequest {
                    id: &id,
                    fingerprint: b"fp",
                    token: FencingToken::random(),
                    lease: Duration::from_secs(3600),
                    retention: Duration::from_secs(3600),
                };
                store.claim(claim).await.expect("claim");
                // Bounded: the sweep runs on the blocking pool; let it finish.
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        };
        tokio::time::advance(Duration::from_micros(SWEEP_INTERVAL_US)).await;
        trigger("t1").await;
        assert!(
            store.inspect(&id).await.expect("inspect").is_some(),
            "an abandoned claim is kept past its lease"
        );
        assert_eq!(
            store.sweep().await.expect("sweep"),
            0,
            "nothing is past its keeping"
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            store.sweep().await.expect("sweep"),
            1,
            "lease + retention have passed"
        );
        let err = store
            .complete(
                &id,
                owner,
                Bytes::from_static(b"late"),
                Duration::from_secs(60),
            )
            .await
            .expect_err("a swept claim is fenced");
        assert!(err.is_fenced(), "{err}");
    }

    #[test]
    fn a_record_is_no_larger_than_before_contract_v2() {
        // Issue 19 counts bytes per record: `created` and the abandoned-claim retention
        // were paid for by 8-byte store times instead of 16-byte `Instant`s.
        assert!(std::mem::size_of::<State>() <= 32, "State grew");
        assert!(
            std::mem::size_of::<(RecordId, Record)>() <= 112,
            "a map entry grew"
        );
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    pub(super) const FP: &[u8] = b"fingerprint";

    pub(super) fn bounded(records: u64, bytes: u64) -> MemoryStore {
        MemoryStore::builder()
            .max_records(records)
            .max_bytes(bytes)
            .build()
            .expect("valid bounds")
    }

    pub(super) async fn claim(
        store: &MemoryStore,
        key: &str,
        lease: Duration,
    ) -> (FencingToken, Result<Claim, StoreError>) {
        let id = RecordId::new("t", key);
        let token = FencingToken::random();
        let claim = store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: FP,
                token,
                lease,
                retention: Duration::ZERO,
            })
            .await;
        (token, claim)
    }

    /// What one in-progress record counts.
    pub(super) const CLAIMED: u64 = MemoryStore::RECORD_OVERHEAD + FP.len() as u64;

    #[tokio::test]
    async fn bytes_follow_claims_completions_and_releases() {
        let store = bounded(10, 1 << 20);
        let lease = Duration::from_secs(60);
        let (a, _) = claim(&store, "a", lease).await;
        let (b, _) = claim(&store, "b", lease).await;
        assert_eq!(store.stored_bytes(), 2 * CLAIMED);
        let id_a = RecordId::new("t", "a");
        store
            .complete(&id_a, a, Bytes::from_static(b"12345"), lease)
            .await
            .expect("complete");
        assert_eq!(store.stored_bytes(), 2 * CLAIMED + 5);
        store
            .renew(&RecordId::new("t", "b"), b, lease)
            .await
            .expect("renew");
        assert_eq!(
            store.stored_bytes(),
            2 * CLAIMED + 5,
            "a renew changes nothing"
        );
        store
            .release(&RecordId::new("t", "b"), b)
            .await
            .expect("release");
        assert_eq!(store.stored_bytes(), CLAIMED + 5);
        // A fenced release changes nothing.
        assert!(store.release(&RecordId::new("t", "b"), b).await.is_err());
        assert_eq!(store.stored_bytes(), CLAIMED + 5);
        assert!(store.force_release(&id_a).await.expect("force release"));
        assert!(!store.force_release(&id_a).await.expect("gone"));
        assert_eq!(store.stored_bytes(), 0);
        assert_eq!(store.inner.used_records.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_store_refuses_new_keys_only_and_sweeps_free_room() {
        let store = bounded(2, 1 << 20);
        let (a, _) = claim(&store, "a", Duration::from_secs(60)).await;
        let (_, short) = claim(&store, "short", Duration::from_secs(1)).await;
        assert_eq!(short.expect("room"), Claim::Acquired { takeover: false });
        // The expired claim is taken over though the store is full: it adds no record.
        // (Before any refusal: a refused claim starts a sweep that could remove it.)
        tokio::time::advance(Duration::from_secs(2)).await;
        let (_, takeover) = claim(&store, "short", Duration::from_secs(1)).await;
        assert_eq!(
            takeover.expect("takeover"),
            Claim::Acquired { takeover: true }
        );
        assert_eq!(store.stored_bytes(), 2 * CLAIMED);
        let (_, refused) = claim(&store, "c", Duration::from_secs(60)).await;
        let err = refused.expect_err("full");
        assert!(err.is_full() && !err.is_unavailable(), "{err}");
        assert!(err.to_string().contains("max_records of 2"), "{err}");
        // An existing record is still answered, and its owner still completes it,
        // payload and all, past the room the claim left.
        let (_, dup) = claim(&store, "a", Duration::from_secs(60)).await;
        assert!(matches!(dup, Ok(Claim::InProgress { .. })), "{dup:?}");
        let big = Bytes::from(vec![7_u8; 4096]);
        store
            .complete(&RecordId::new("t", "a"), a, big, Duration::from_secs(60))
            .await
            .expect("a completion is never refused for room");
        let (_, replay) = claim(&store, "a", Duration::from_secs(60)).await;
        assert!(matches!(replay, Ok(Claim::Completed { .. })), "{replay:?}");
        // Once the short claim expires again and is swept (by this sweep or the one
        // the refusal started), a new key fits.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(store.sweep().await.expect("sweep") <= 1);
        assert_eq!(store.len(), 1);
        assert_eq!(store.stored_bytes(), CLAIMED + 4096);
        let (_, fits) = claim(&store, "c", Duration::from_secs(60)).await;
        assert_eq!(
            fits.expect("room again"),
            Claim::Acquired { takeover: false }
        );
    }

    #[tokio::test]
    async fn the_byte_budget_refuses_a_record_that_would_not_fit() {
        let store = bounded(100, 2 * CLAIMED + 10);
        let lease = Duration::from_secs(60);
        let (a, _) = claim(&store, "a", lease).await;
        let (_, b) = claim(&store, "b", lease).await;
        assert!(b.is_ok());
        let (_, c) = claim(&store, "c", lease).await;
        let err = c.expect_err("over the byte budget");
        assert!(
            err.is_full() && err.to_string().contains("max_bytes"),
            "{err}"
        );
        // The refused claim took nothing: the counts are those of two records.
        assert_eq!(store.stored_bytes(), 2 * CLAIMED);
        assert_eq!(store.inner.used_records.load(Ordering::Relaxed), 2);
        store
            .release(&RecordId::new("t", "a"), a)
            .await
            .expect("release");
        let (_, c) = claim(&store, "c", lease).await;
        assert!(c.is_ok(), "a release frees its room");
    }

    #[tokio::test]
    async fn counts_never_underflow() {
        let store = bounded(1, 1 << 20);
        store.inner.shrink(5, 1_000_000);
        assert_eq!(store.stored_bytes(), 0);
        assert_eq!(store.inner.used_records.load(Ordering::Relaxed), 0);
        store.inner.replace(10, 0);
        assert_eq!(store.stored_bytes(), 0);
        let (_, a) = claim(&store, "a", Duration::from_secs(1)).await;
        assert!(a.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_claims_never_pass_the_bound() {
        let store = bounded(50, 1 << 20);
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut won = 0_u64;
                    for i in 0..100 {
                        let (_, c) =
                            claim(&store, &format!("{t}-{i}"), Duration::from_secs(60)).await;
                        match c {
                            Ok(Claim::Acquired { .. }) => won += 1,
                            Err(e) if e.is_full() => {}
                            other => panic!("{other:?}"),
                        }
                    }
                    won
                })
            })
            .collect();
        let mut won = 0;
        for t in tasks {
            won += t.await.expect("task");
        }
        assert_eq!(won, 50);
        assert_eq!(store.len(), 50);
        assert_eq!(store.inner.used_records.load(Ordering::Relaxed), 50);
        assert_eq!(store.stored_bytes(), 50 * CLAIMED);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_refused_for_room_sweeps_expired_records_in_the_background() {
        let store = bounded(3, 1 << 20);
        for k in ["a", "b", "c"] {
            let (_, c) = claim(&store, k, Duration::from_secs(1)).await;
            assert!(c.is_ok());
        }
        // Past their lease (and their retention of zero), not swept yet.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(store.len(), 3);
        let (_, refused) = claim(&store, "d", Duration::from_secs(60)).await;
        assert!(refused.expect_err("full").is_full());
        // Bounded: the sweep runs on the blocking pool.
        for _ in 0..1000 {
            if store.is_empty() {
                break;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(store.is_empty(), "the refused claim started a sweep");
        assert_eq!(store.stored_bytes(), 0);
        let (_, retry) = claim(&store, "d", Duration::from_secs(60)).await;
        assert!(retry.is_ok(), "the retry finds the room");
    }

    #[test]
    fn bounds_that_hold_no_record_are_refused() {
        let err = MemoryStore::builder()
            .max_records(0)
            .build()
            .expect_err("0 records");
        assert!(
            err.is_configuration() && err.to_string().contains("max_records"),
            "{err}"
        );
        let err = MemoryStore::builder()
            .max_bytes(10)
            .build()
            .expect_err("10 bytes");
        assert!(
            err.is_configuration() && err.to_string().contains("max_bytes"),
            "{err}"
        );
        let store = MemoryStore::new();
        assert_eq!(
            (store.max_records(), store.max_bytes()),
            (
                MemoryStore::DEFAULT_MAX_RECORDS,
                MemoryStore::DEFAULT_MAX_BYTES
            )
        );
    }

    #[tokio::test]
    async fn memory_urls_set_the_bounds_or_say_what_is_wrong() {
        for (url, records, bytes) in [
            (
                "memory",
                MemoryStore::DEFAULT_MAX_RECORDS,
                MemoryStore::DEFAULT_MAX_BYTES,
            ),
            (
                "memory://",
                MemoryStore::DEFAULT_MAX_RECORDS,
                MemoryStore::DEFAULT_MAX_BYTES,
            ),
            (
                "memory://?max_records=100000&max_bytes=256MiB",
                100_000,
                256 << 20,
            ),
            (
                "memory://?max_bytes=1GB",
                MemoryStore::DEFAULT_MAX_RECORDS,
                1_000_000_000,
            ),
            ("memory://?max_records=5", 5, MemoryStore::DEFAULT_MAX_BYTES),
            (
                "memory://?max_bytes=65536",
                MemoryStore::DEFAULT_MAX_RECORDS,
                65_536,
            ),
        ] {
            let store = MemoryStore::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                (store.max_records(), store.max_bytes()),
                (records, bytes),
                "{url}"
            );
        }
        for (url, names) in [
            ("memory://?max_records=0", "max_records"),
            ("memory://?max_records=-1", "max_records"),
            ("memory://?max_records=many", "max_records"),
            ("memory://?max_records=", "max_records"),
            ("memory://?max_bytes=0", "max_bytes"),
            ("memory://?max_bytes=-5MiB", "max_bytes"),
            ("memory://?max_bytes=12XB", "KiB"),
            ("memory://?max_bytes=100", "max_bytes"),
            ("memory://?max_records=1&max_records=2", "twice"),
            ("memory://?max_entries=5", "max_entries"),
            ("memory://host", "no host"),
            ("memory:x", "no host"),
        ] {
            let err = MemoryStore::from_url(url).expect_err(url);
            assert!(err.is_configuration(), "{url}: {err}");
            assert!(err.to_string().contains(names), "{url}: {err}");
            let err = crate::store::open(url).await.err().expect(url);
            assert!(err.is_configuration(), "{url}: {err}");
        }
    }
}

#[cfg(test)]
mod pass_tests {
    use super::bound_tests::{CLAIMED, bounded, claim};
    use super::*;

    /// `n` claims of keys `prefix-0..n` with `lease` (and no retention).
    async fn claims(store: &MemoryStore, prefix: &str, n: usize, lease: Duration) {
        for i in 0..n {
            let (_, c) = claim(store, &format!("{prefix}-{i}"), lease).await;
            assert_eq!(c.expect("room"), Claim::Acquired { takeover: false });
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_with_its_budget_spent_stops_after_one_batch_and_the_next_goes_on() {
        let store = MemoryStore::new();
        claims(&store, "expired", 500, Duration::from_secs(1)).await;
        claims(&store, "live", 50, Duration::from_secs(3600)).await;
        // Past the short leases; no claim comes, so the store starts no sweep itself.
        tokio::time::advance(Duration::from_secs(2)).await;
        let options = SweepOptions::new().batch(100).max_duration(Duration::ZERO);
        for pass in 1..=5_u64 {
            let report = store.sweep_pass(&options).await.expect("pass");
            assert_eq!(report.removed(), 100, "pass {pass}: one batch");
            assert_eq!(report.batches(), 1, "pass {pass}");
            if pass < 5 {
                assert_eq!(report.outcome(), SweepOutcome::BudgetSpent, "pass {pass}");
                assert_eq!(report.lag(), None);
            }
            let left = 550 - 100 * pass;
            assert_eq!(store.len() as u64, left);
            assert_eq!(store.inner.used_records.load(Ordering::Relaxed), left);
            assert_eq!(store.stored_bytes(), left * CLAIMED);
        }
        let last = store.sweep_pass(&options).await.expect("pass");
        assert_eq!(
            (last.removed(), last.outcome(), last.lag()),
            (0, SweepOutcome::Complete, Some(Duration::ZERO)),
            "nothing expired is left"
        );
        assert_eq!(store.len(), 50, "live records are kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_over_live_records_only_ends_after_a_bounded_look() {
        let store = MemoryStore::new();
        let records = 3 * SCAN_PER_STEP;
        claims(&store, "live", records, Duration::from_secs(3600)).await;
        let options = SweepOptions::new().max_duration(Duration::ZERO);
        let cut = store.sweep_pass(&options).await.expect("pass");
        assert_eq!(
            (cut.removed(), cut.batches(), cut.outcome()),
            (0, 1, SweepOutcome::BudgetSpent),
            "one step looks at about {SCAN_PER_STEP} records, not all {records}"
        );
        let whole = store.sweep_pass(&SweepOptions::new()).await.expect("pass");
        assert_eq!(whole.outcome(), SweepOutcome::Complete);
        assert!(whole.batches() >= 3, "{} steps", whole.batches());
        assert_eq!(store.len(), records);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_runs_between_two_batches_of_a_sweep() {
        // One thread: the claim's task can only run where the pass yields.
        let store = MemoryStore::new();
        claims(&store, "expired", 2_000, Duration::from_secs(1)).await;
        tokio::time::advance(Duration::from_secs(2)).await;
        let claimer = tokio::spawn({
            let store = store.clone();
            async move {
                let (_, c) = claim(&store, "fresh", Duration::from_secs(60)).await;
                assert_eq!(c.expect("room"), Claim::Acquired { takeover: false });
                store.len()
            }
        });
        let report = store
            .sweep_pass(&SweepOptions::new().batch(100))
            .await
            .expect("pass");
        let seen = claimer.await.expect("claimer");
        assert_eq!(
            seen,
            2_000 - 100 + 1,
            "the claim ran right after the first batch, not after the whole pass"
        );
        assert_eq!(report.removed(), 2_000);
        assert_eq!(report.outcome(), SweepOutcome::Complete);
        assert!(report.batches() >= 20, "{} batches", report.batches());
        assert_eq!(store.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counts_stay_exact_while_passes_race_claims_from_many_tasks() {
        const TASKS: usize = 8;
        const KEYS: usize = 400;
        let store = bounded(100_000, 1 << 30);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sweeper = tokio::spawn({
            let (store, stop) = (store.clone(), Arc::clone(&stop));
            async move {
                let options = SweepOptions::new().batch(7);
                let mut removed = 0;
                while !stop.load(Ordering::Relaxed) {
                    removed += store.sweep_pass(&options).await.expect("pass").removed();
                }
                removed
            }
        });
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut takeovers = 0_u64;
                    for i in 0..KEYS {
                        let key = format!("{t}-{i}");
                        // Expired as soon as it is made: a pass may remove it, or the
                        // next claim take it over, never both.
                        let (_, c) = claim(&store, &key, Duration::ZERO).await;
                        assert_eq!(c.expect("room"), Claim::Acquired { takeover: false });
                        let (token, c) = claim(&store, &key, Duration::from_secs(60)).await;
                        match c.expect("room") {
                            Claim::Acquired { takeover: true } => takeovers += 1,
                            Claim::Acquired { takeover: false } => {}
                            other => panic!("{other:?}"),
                        }
                        if i % 2 == 0 {
                            let id = RecordId::new("t", &key);
                            let payload = Bytes::from_static(b"0123456789");
                            store
                                .complete(&id, token, payload, Duration::from_secs(60))
                                .await
                                .expect("complete");
                        }
                        tokio::task::yield_now().await;
                    }
                    takeovers
                })
            })
            .collect();
        let mut takeovers = 0;
        for t in tasks {
            takeovers += t.await.expect("task");
        }
        stop.store(true, Ordering::Relaxed);
        let swept = sweeper.await.expect("sweeper") + store.sweep().await.expect("sweep");
        let keys = (TASKS * KEYS) as u64;
        assert_eq!(
            swept + takeovers,
            keys,
            "every expired record left once: swept or taken over"
        );
        assert_eq!(store.len() as u64, keys);
        assert_eq!(store.inner.used_records.load(Ordering::Relaxed), keys);
        assert_eq!(store.stored_bytes(), keys * CLAIMED + keys / 2 * 10);
    }
}
