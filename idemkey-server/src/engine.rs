//! The framework-free engine: claim, run, complete or release.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::execution::{Execution, Recordings};
use super::telemetry::{Decision, EngineStore, ServerMetrics};
use crate::IdempotencyKey;
use crate::fingerprint::Fingerprint;
use crate::policy::Quota;
use crate::quota::QuotaState;
use crate::store::{
    ChargedClaim, Claim, ClaimRequest, FencingToken, QuotaCharge, RecordId, RecordInfo, Store,
    StoreError,
};

/// The verifier's core, independent of any HTTP framework: it claims a key, lets the
/// caller run the operation while it renews the lease, then completes or releases it.
///
/// Cheap to clone (shared configuration). The [tower layer](super::IdempotencyLayer)
/// and the [function-level API](Engine::once) are built on it and answer its
/// [`Claimed`] their own way (the layer with HTTP responses); use it directly for other
/// transports (gRPC, message queues, a framework without tower).
///
/// ```
/// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
/// use idemkey::server::{Claimed, Engine};
/// use idemkey::store::MemoryStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = Engine::new(MemoryStore::new());
/// let key = IdempotencyKey::new("order-42")?;
/// let fp = Fingerprint::of_bytes(b"ship order 42");
///
/// match engine.claim("tenant-a", &key, &fp).await? {
///     Claimed::Execute(mut exec) => {
///         let result = exec.run(async { "shipped" }).await; // lease renewed meanwhile
///         exec.complete(result.into()).await?;
///     }
///     Claimed::Replay(payload) => println!("already done: {payload:?}"),
///     Claimed::InProgress { retry_after } => println!("running elsewhere; ask again in {retry_after:?}"),
///     Claimed::KeyReused => println!("this key belongs to another operation"),
///     Claimed::Unguarded => unreachable!("only with fail_open"),
///     Claimed::QuotaExceeded { retry_after } => println!("too many new keys; ask again in {retry_after:?}"),
/// }
/// assert!(matches!(engine.claim("tenant-a", &key, &fp).await?, Claimed::Replay(p) if p == "shipped"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Engine {
    cfg: Arc<Config>,
}

/// The defaults of [`EngineBuilder`].
impl Engine {
    /// Default lease of a claim: how long a crashed owner blocks its key.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);
    /// Default retention of a completed record (API calls).
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
    /// Default cap of the wait advised to a duplicate of a running request
    /// ([`Claimed::InProgress`]).
    pub const DEFAULT_IN_PROGRESS_RETRY_AFTER: Duration = Duration::from_secs(1);
    /// Default wait advised when the store fails ([`ClaimError::retry_after`]).
    pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(2);
}

/// An engine's settings and shared parts, behind one `Arc`: what an [`Execution`]
/// keeps of its engine (one shared count per claimed request, not one per part).
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: EngineStore,
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    /// `renew_every` as set with [`EngineBuilder::renew_every`], kept for derived
    /// engines; `None` renews every third of the lease.
    renew_every_set: Option<Duration>,
    pub(crate) retention: Duration,
    fail_open: bool,
    unavailable_retry_after: Duration,
    in_progress_retry_after: Duration,
    /// Outcomes being recorded in the background, shared with derived engines.
    pub(crate) recordings: Arc<Recordings>,
    /// The quota of new keys per scope and its per-process buckets, shared with
    /// derived engines.
    quota: Option<Arc<QuotaState>>,
    /// The metric handles, resolved once (shared with the observed store and derived
    /// engines).
    pub(crate) metrics: Arc<ServerMetrics>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("lease", &self.cfg.lease)
            .field("renew_every", &self.cfg.renew_every)
            .field("retention", &self.cfg.retention)
            .field("fail_open", &self.cfg.fail_open)
            .field("quota", &self.quota())
            .finish_non_exhaustive()
    }
}

/// Who holds a key, as [`Engine::claim`] found it, and what the caller does next.
#[derive(Debug)]
pub enum Claimed {
    /// This caller owns the key: run the operation (through [`Execution::run`], so the
    /// lease is renewed), then [`Execution::complete`] (or
    /// [`Execution::complete_or_defer`], not to wait for a store that is down) or
    /// [`Execution::release`].
    Execute(Execution),
    /// The key is completed with this fingerprint: the payload given to
    /// [`Execution::complete`] by the request that ran.
    Replay(Bytes),
    /// A request with this fingerprint holds the key and is still running: ask again
    /// after `retry_after` (its remaining lease, capped by
    /// [`EngineBuilder::in_progress_retry_after`]) for its outcome.
    InProgress {
        /// When the outcome may be there.
        retry_after: Duration,
    },
    /// The key is held or completed by a request with another fingerprint: a different
    /// operation reused it. Nothing runs.
    KeyReused,
    /// The store failed and the engine is configured to fail open: run the operation
    /// without protection (nothing is recorded).
    Unguarded,
    /// The scope is over its [quota](EngineBuilder::quota) of new keys (or of claims in
    /// progress): nothing was recorded and nothing runs; the same key sent again after
    /// `retry_after` is processed normally. Only a key without a live record gets this:
    /// replays, in-progress answers and reused keys are answered as usual.
    QuotaExceeded {
        /// When the scope may send a new key again (a token is back in its bucket, or,
        /// for the cap on claims in progress, the engine's
        /// [`in_progress_retry_after`](EngineBuilder::in_progress_retry_after)).
        retry_after: Duration,
    },
}

/// The store failed, or is full, so the key could not be claimed and nothing ran (the
/// engine fails closed; see [`EngineBuilder::fail_open`]). Ask again after
/// [`ClaimError::retry_after`].
#[derive(Debug)]
pub struct ClaimError {
    source: StoreError,
    retry_after: Duration,
}

impl ClaimError {
    /// When to ask again ([`EngineBuilder::unavailable_retry_after`]).
    #[must_use]
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// `true` when the store is at its bound and refused a new key
    /// ([`StoreError::is_full`]): the layer answers `503 store-full`. Records that
    /// exist are still replayed; retry after [`ClaimError::retry_after`], when expired
    /// records were swept. Fail-open does not apply to it.
    #[must_use]
    pub fn is_store_full(&self) -> bool {
        self.source.is_full()
    }

    /// What the store answered.
    #[must_use]
    pub fn store_error(&self) -> &StoreError {
        &self.source
    }
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.source.is_full() {
            return write!(f, "{}", self.source);
        }
        write!(
            f,
            "the idempotency store failed, so the key was not claimed and nothing ran ({}); try again with the same key",
            self.source
        )
    }
}

impl std::error::Error for ClaimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Configures an [`Engine`]; start with [`Engine::builder`].
#[must_use]
pub struct EngineBuilder {
    cfg: Config,
}

impl fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("lease", &self.cfg.lease)
            .field("retention", &self.cfg.retention)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// How long a claim holds its key unless renewed (default 5 s). A crashed owner
    /// blocks its key for at most this long; then the next request takes it over.
    /// Values under 1 ms are raised to 1 ms.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.cfg.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// How often a running operation renews its lease (default a third of the lease).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.cfg.renew_every_set = Some(every);
        self
    }

    /// How long a completed record is kept and replayed (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.cfg.retention = retention;
        self
    }

    /// When the store fails, run the operation unprotected ([`Claimed::Unguarded`])
    /// instead of failing the claim with a [`ClaimError`] (default: fail closed). Choose
    /// it only where a duplicate execution is cheaper than an outage.
    ///
    /// It applies to a store that fails, not to one that is full
    /// ([`ClaimError::is_store_full`]): a full store answers, and running new keys
    /// unrecorded is what a flood of them would want; they are refused either way.
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.cfg.fail_open = fail_open;
        self
    }

    /// The longest wait advised to a duplicate of a running request (default 1 s): the
    /// layer sends it as the `Retry-After` of `409 in-progress`, [`Engine::once`] as
    /// [`OnceError::retry_after`](super::OnceError::retry_after).
    ///
    /// A duplicate is advised the remaining lease of the running request, capped by
    /// this: the owner renews its lease while it runs, so the remaining lease stays close
    /// to the full lease and says little about when the answer will be ready. Set
    /// `Duration::MAX` to advise the remaining lease as it is.
    pub fn in_progress_retry_after(mut self, max: Duration) -> Self {
        self.cfg.in_progress_retry_after = max;
        self
    }

    /// The wait advised when the store fails or is full (default 2 s): the layer sends
    /// it as the `Retry-After` of `503 store-unavailable` and `503 store-full`.
    pub fn unavailable_retry_after(mut self, after: Duration) -> Self {
        self.cfg.unavailable_retry_after = after;
        self
    }

    /// A quota of new keys per scope (default: none): a scope over it gets
    /// [`Claimed::QuotaExceeded`] for a key that has no live record, so the layer, the
    /// function API and the webhook receivers over this engine all enforce it.
    ///
    /// Only new records spend quota. The engine takes a token before it claims and
    /// gives it back when the claim finds a live record (a replay, an in-progress
    /// answer, a reused key) or takes an abandoned one over: charging after the claim
    /// would leave a record over the quota behind. When the bucket is empty, the engine
    /// looks the record up ([`Store::inspect`]) and answers a live one as usual; only a
    /// key with no record is refused. The buckets are per process unless the quota is
    /// [`shared`](Quota::shared) through the store. See
    /// [Quotas](crate#quotas) in the guide.
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::{Claimed, Engine, policy::Quota};
    /// use idemkey::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::builder(MemoryStore::new())
    ///     .quota(Quota::per_minute(1)?)
    ///     .build();
    /// let fp = Fingerprint::of_bytes(b"x");
    /// let (first, second) = (IdempotencyKey::new("k-1")?, IdempotencyKey::new("k-2")?);
    /// let Claimed::Execute(exec) = engine.claim("agent-7", &first, &fp).await? else { unreachable!() };
    /// exec.complete("done".into()).await?;
    /// assert!(matches!(engine.claim("agent-7", &second, &fp).await?, Claimed::QuotaExceeded { .. }));
    /// // The replay of the first key spends nothing and is answered.
    /// assert!(matches!(engine.claim("agent-7", &first, &fp).await?, Claimed::Replay(_)));
    /// // Another scope has its own bucket.
    /// assert!(matches!(engine.claim("agent-8", &second, &fp).await?, Claimed::Execute(_)));
    /// # Ok(()) }
    /// ```
    pub fn quota(mut self, quota: Quota) -> Self {
        self.cfg.quota = Some(QuotaState::new(quota));
        self
    }

    /// The engine.
    #[must_use]
    pub fn build(mut self) -> Engine {
        self.cfg.renew_every = self
            .cfg
            .renew_every_set
            .unwrap_or(self.cfg.lease / 3)
            .clamp(Duration::from_millis(1), self.cfg.lease);
        Engine {
            cfg: Arc::new(self.cfg),
        }
    }
}

impl Engine {
    /// An engine over `store` with the defaults: lease 5 s renewed every 1.7 s,
    /// retention 24 h, fail closed.
    #[must_use]
    pub fn new(store: impl Store) -> Self {
        Self::builder(store).build()
    }

    /// Configure an engine over `store`.
    ///
    /// ```
    /// use idemkey::server::Engine;
    /// use idemkey::store::MemoryStore;
    /// use std::time::Duration;
    /// let engine = Engine::builder(MemoryStore::new())
    ///     .lease(Duration::from_secs(5))
    ///     .retention(Duration::from_secs(7 * 24 * 3600))
    ///     .build();
    /// assert_eq!(engine.lease(), Duration::from_secs(5));
    /// ```
    pub fn builder(store: impl Store) -> EngineBuilder {
        let metrics = Arc::new(ServerMetrics::new(store.kind()));
        EngineBuilder {
            cfg: Config {
                store: EngineStore::new(store, Arc::clone(&metrics)),
                metrics,
                lease: Engine::DEFAULT_LEASE,
                renew_every: Engine::DEFAULT_LEASE / 3,
                renew_every_set: None,
                retention: Engine::DEFAULT_RETENTION,
                fail_open: false,
                unavailable_retry_after: Engine::DEFAULT_UNAVAILABLE_RETRY_AFTER,
                in_progress_retry_after: Engine::DEFAULT_IN_PROGRESS_RETRY_AFTER,
                recordings: Arc::default(),
                quota: None,
            },
        }
    }

    /// A builder with this engine's settings and store, to derive another engine from
    /// it (renewing as this one was set to, or every third of its lease).
    pub(crate) fn to_builder(&self) -> EngineBuilder {
        EngineBuilder {
            cfg: (*self.cfg).clone(),
        }
    }

    /// The store records are kept in: for maintenance of your own, such as
    /// [`Store::sweep`] on your scheduler.
    ///
    /// The engine calls its store through this `&dyn Store`: the store itself, or,
    /// with the `metrics` feature or when a `tracing` subscriber or a logger can see
    /// the `idemkey.store` spans, the store observed (each operation timed in its span
    /// and its metrics).
    #[must_use]
    pub fn store(&self) -> &dyn Store {
        self.cfg.store.get()
    }

    /// The engine's metric handles (for the layer's own decisions and handler timing).
    pub(crate) fn metrics(&self) -> &ServerMetrics {
        &self.cfg.metrics
    }

    /// The lease of a claim.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.cfg.lease
    }

    /// The default retention of completed records.
    #[must_use]
    pub fn retention(&self) -> Duration {
        self.cfg.retention
    }

    /// The quota of new keys per scope ([`EngineBuilder::quota`]), if any.
    #[must_use]
    pub fn quota(&self) -> Option<&Quota> {
        self.cfg.quota.as_ref().map(|q| &q.quota)
    }

    /// How many outcomes are being recorded in the background right now (by this engine
    /// and the engines derived from it, such as a layer's with its own retention):
    /// outcomes whose first attempt found the store unavailable
    /// ([`Execution::complete_or_defer`]).
    #[must_use]
    pub fn pending_recordings(&self) -> usize {
        self.cfg.recordings.pending()
    }

    /// Waits until no outcome is being recorded in the background: each is recorded,
    /// fenced, or given up after the retention. Returns at once when none is.
    ///
    /// Call it before a process exits (after the server stopped taking requests), so
    /// that an outcome held through a store outage is not lost with the process, and in
    /// tests that must know the store holds every outcome. It waits as long as the
    /// store stays away: bound it with `tokio::time::timeout` where that matters.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let engine = idemkey::server::Engine::new(idemkey::store::MemoryStore::new());
    /// // ... serve until shutdown ...
    /// engine.wait_for_recordings().await;
    /// assert_eq!(engine.pending_recordings(), 0);
    /// # }
    /// ```
    pub async fn wait_for_recordings(&self) {
        self.cfg.recordings.wait_idle().await;
    }

    /// Looks up the record of `key` within `scope`, addressed the way requests address
    /// it (scope and key hashed into a [`RecordId`]; neither is stored raw): its state,
    /// fingerprint, times and stored size. `None` when there is no live record.
    ///
    /// For operators: what a stuck or disputed key holds, without reading the store by
    /// hand.
    ///
    /// # Errors
    /// The store's, including [`StoreError::is_unsupported`] for a store of your own
    /// that does not implement [`Store::inspect`].
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::{Claimed, Engine};
    /// use idemkey::store::{MemoryStore, RecordState};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(MemoryStore::new());
    /// let key = IdempotencyKey::new("order-42")?;
    /// let Claimed::Execute(exec) = engine.claim("tenant-a", &key, &Fingerprint::of_bytes(b"x")).await? else { unreachable!() };
    /// let info = engine.inspect("tenant-a", "order-42").await?.expect("claimed");
    /// assert_eq!(info.state, RecordState::InProgress);
    /// assert!(engine.inspect("tenant-b", "order-42").await?.is_none());
    /// # drop(exec); Ok(()) }
    /// ```
    pub async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        self.store().inspect(&RecordId::new(scope, key)).await
    }

    /// Removes the record of `key` within `scope` whatever its state: a stuck claim is
    /// freed at once (its owner, if it still runs, is fenced and cannot complete
    /// afterwards) and a completed record is forgotten, so the next request with the
    /// key runs again. Returns `true` when there was a record to remove.
    ///
    /// # Errors
    /// The store's, including [`StoreError::is_unsupported`].
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::{Claimed, Engine};
    /// use idemkey::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(MemoryStore::new());
    /// let (key, fp) = (IdempotencyKey::new("order-42")?, Fingerprint::of_bytes(b"x"));
    /// let Claimed::Execute(stuck) = engine.claim("t", &key, &fp).await? else { unreachable!() };
    /// assert!(engine.force_release("t", "order-42").await?);
    /// assert!(matches!(engine.claim("t", &key, &fp).await?, Claimed::Execute(_)));
    /// assert!(stuck.complete("late".into()).await.is_err()); // fenced
    /// # Ok(()) }
    /// ```
    pub async fn force_release(&self, scope: &str, key: &str) -> Result<bool, StoreError> {
        self.store().force_release(&RecordId::new(scope, key)).await
    }

    /// Up to `limit` records in progress, oldest claim first (live ones and abandoned
    /// ones whose lease expired): where to look for stuck keys.
    ///
    /// # Errors
    /// The store's, including [`StoreError::is_unsupported`] where the store cannot
    /// list efficiently.
    pub async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        self.store().list_in_progress(limit).await
    }

    /// Claims `key` within `scope` for a request with `fingerprint`: the one way to a
    /// key, for the layer, [`Engine::once`], the webhook batch deduper and your own
    /// callers alike.
    ///
    /// # Errors
    /// [`ClaimError`] when the store failed and the engine fails closed (the default):
    /// nothing ran; ask again after [`ClaimError::retry_after`].
    pub async fn claim(
        &self,
        scope: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<Claimed, ClaimError> {
        let id = RecordId::new(scope, key.as_str());
        super::telemetry::record_id(&id);
        let claimed = self
            .claim_id(scope, id, fingerprint.as_bytes())
            .await
            .map(|c| c.0);
        Decision::of(&claimed).record(&self.cfg.metrics);
        claimed
    }

    /// Claims like [`Engine::claim`], but a duplicate of a running request (same
    /// fingerprint) waits up to `up_to` for that request's outcome instead of getting
    /// [`Claimed::InProgress`] at once: the replay when it completes, the key itself
    /// ([`Claimed::Execute`]) when it is released, and [`Claimed::InProgress`] only once
    /// `up_to` passed. A key held by a request with another fingerprint is
    /// [`Claimed::KeyReused`] at once, without waiting.
    ///
    /// The duplicate waits on the store's [`Watch`](crate::store::Watch) of the record
    /// ([`Store::watch`]): woken at once by a store that notifies (memory, Redis,
    /// PostgreSQL with `notify(true)`), polling otherwise; it looks again at the latest
    /// when the owner's lease ends, so that an owner that crashed is taken over as by
    /// any claim.
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::{Claimed, Engine};
    /// use idemkey::store::MemoryStore;
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(MemoryStore::new());
    /// let (key, fp) = (IdempotencyKey::new("order-9")?, Fingerprint::of_bytes(b"ship 9"));
    /// let Claimed::Execute(first) = engine.claim("", &key, &fp).await? else { unreachable!() };
    /// let waiter = tokio::spawn({
    ///     let (engine, key, fp) = (engine.clone(), key.clone(), fp.clone());
    ///     async move { engine.claim_or_wait("", &key, &fp, Duration::from_secs(30)).await }
    /// });
    /// tokio::task::yield_now().await; // the duplicate is waiting now
    /// first.complete("shipped".into()).await?;
    /// assert!(matches!(waiter.await??, Claimed::Replay(p) if p == "shipped"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Engine::claim`].
    pub async fn claim_or_wait(
        &self,
        scope: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        up_to: Duration,
    ) -> Result<Claimed, ClaimError> {
        let id = RecordId::new(scope, key.as_str());
        super::telemetry::record_id(&id);
        let claimed = self
            .wait_for_claim(scope, id, fingerprint.as_bytes(), up_to)
            .await;
        Decision::of(&claimed).record(&self.cfg.metrics);
        claimed
    }

    /// [`Engine::claim_or_wait`] of a record id.
    async fn wait_for_claim(
        &self,
        scope: &str,
        id: RecordId,
        fingerprint: &[u8],
        up_to: Duration,
    ) -> Result<Claimed, ClaimError> {
        let (first, _) = self.claim_id(scope, id, fingerprint).await?;
        if !matches!(first, Claimed::InProgress { .. }) || up_to.is_zero() {
            return Ok(first);
        }
        let start = tokio::time::Instant::now();
        let mut watch = match self.store().watch(&id).await {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(record = %id, error = %e, "cannot watch the record; polling");
                Box::new(crate::store::PollingWatch::default())
            }
        };
        loop {
            // Looked at after the watch was made: a settling from now on wakes it.
            let (claimed, lease_remaining) = self.claim_id(scope, id, fingerprint).await?;
            if !matches!(claimed, Claimed::InProgress { .. }) {
                return Ok(claimed);
            }
            let Some(left) = up_to.checked_sub(start.elapsed()).filter(|d| !d.is_zero()) else {
                return Ok(claimed);
            };
            // A crashed owner settles nothing: look again when its lease ends.
            let lease_end = lease_remaining.unwrap_or(left) + Duration::from_millis(1);
            watch.settled(left.min(lease_end)).await;
        }
    }

    /// [`Engine::claim`] of a record id within `scope`, with the owner's remaining lease
    /// when the key is in progress: the quota's admission around the store's claim.
    async fn claim_id(
        &self,
        scope: &str,
        id: RecordId,
        fingerprint: &[u8],
    ) -> Result<(Claimed, Option<Duration>), ClaimError> {
        let Some(state) = &self.cfg.quota else {
            return self.claim_store(id, fingerprint, None).await;
        };
        let quota = state.quota;
        // Only a shared bucket needs an address every process agrees on (a SHA-256).
        let bucket = quota.is_shared().then(|| QuotaState::bucket_of(scope));
        let charge = match (&bucket, quota.rate_per_second()) {
            (Some(bucket), Some(rate)) => Some(QuotaCharge::new(
                bucket,
                rate,
                quota.burst_size().unwrap_or(1),
            )),
            _ => None,
        };
        if charge.is_some() && quota.in_progress_limit().is_none() {
            // All in the store: nothing to admit here.
            return self.claim_store(id, fingerprint, charge).await;
        }
        // Check, then claim: the token is taken first and given back when the claim
        // finds a live record (charging after the claim would leave a record behind).
        let permit = match state.admit(scope, charge.is_none(), self.cfg.in_progress_retry_after) {
            Ok(permit) => permit,
            Err(refused) => {
                return self
                    .claim_over_quota(id, fingerprint, refused.retry_after)
                    .await;
            }
        };
        let (mut claimed, remaining) = self.claim_store(id, fingerprint, charge).await?;
        match &mut claimed {
            Claimed::Execute(exec) => {
                let held = if exec.is_takeover() {
                    permit.refund_token()
                } else {
                    permit.spend()
                };
                if let Some(slot) = held {
                    exec.hold(slot);
                }
            }
            _ => permit.refund(),
        }
        Ok((claimed, remaining))
    }

    /// A claim of a scope over its quota: answered as usual when the key has a live
    /// record (nothing new would be written), refused otherwise.
    async fn claim_over_quota(
        &self,
        id: RecordId,
        fingerprint: &[u8],
        retry_after: Duration,
    ) -> Result<(Claimed, Option<Duration>), ClaimError> {
        let refused = Ok((Claimed::QuotaExceeded { retry_after }, None));
        match self.store().inspect(&id).await {
            Ok(Some(_)) => {}
            // No record, or none this store can show: a claim would make a new one.
            Ok(None) => return refused,
            Err(e) => {
                tracing::debug!(record = %id, error = %e, "over quota and the record cannot be looked up; refused as new");
                return refused;
            }
        }
        match self.claim_store(id, fingerprint, None).await? {
            (Claimed::Execute(exec), _) => {
                // The record ended between the look-up and the claim: this claim made a
                // record over the quota, so it gives it back.
                if let Err(e) = exec.release().await {
                    tracing::warn!(record = %id, error = %e, "could not release a claim made over the quota; its lease expires it");
                }
                refused
            }
            answered => Ok(answered),
        }
    }

    /// The store's claim of a record id (charged to a bucket in the store with
    /// `charge`), with the owner's remaining lease when the key is in progress.
    async fn claim_store(
        &self,
        id: RecordId,
        fingerprint: &[u8],
        charge: Option<QuotaCharge<'_>>,
    ) -> Result<(Claimed, Option<Duration>), ClaimError> {
        let token = FencingToken::random();
        let req = self.claim_request(&id, fingerprint, token);
        let claim = match charge {
            None => self.cfg.store.claim(req).await,
            Some(charge) => match self.cfg.store.claim_charged(req, charge).await {
                Ok(ChargedClaim::Claimed(claim)) => Ok(claim),
                Ok(ChargedClaim::OverQuota { retry_after }) => {
                    return Ok((Claimed::QuotaExceeded { retry_after }, None));
                }
                Err(e) => Err(e),
            },
        };
        self.judge(id, token, fingerprint, claim)
    }

    /// [`Engine::claim`] answered at once: `Some` when the store answers in process
    /// ([`Store::in_process`], the memory store) and no quota applies, `None` otherwise
    /// (then [`Engine::claim`] it is). The layer's pipeline claims this way first, so that
    /// a request over such a store holds no future sized for a store that answers over
    /// the network.
    pub(crate) fn claim_now(
        &self,
        scope: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Option<Result<Claimed, ClaimError>> {
        if self.cfg.quota.is_some() || !self.cfg.store.answers_in_process() {
            return None;
        }
        let id = RecordId::new(scope, key.as_str());
        super::telemetry::record_id(&id);
        let fingerprint = fingerprint.as_bytes();
        let token = FencingToken::random();
        let claim = self
            .cfg
            .store
            .claim_now(&self.claim_request(&id, fingerprint, token))?;
        let claimed = self.judge(id, token, fingerprint, claim).map(|c| c.0);
        Decision::of(&claimed).record(&self.cfg.metrics);
        Some(claimed)
    }

    /// The store's claim of `id` for `token`.
    fn claim_request<'a>(
        &self,
        id: &'a RecordId,
        fingerprint: &'a [u8],
        token: FencingToken,
    ) -> ClaimRequest<'a> {
        ClaimRequest {
            id,
            fingerprint,
            token,
            lease: self.cfg.lease,
            retention: self.cfg.retention,
        }
    }

    /// What the store's answer to a claim of `id` with `fingerprint` for `token` means
    /// for the request, and how long the lease of a running duplicate has left.
    fn judge(
        &self,
        id: RecordId,
        token: FencingToken,
        fingerprint: &[u8],
        claim: Result<Claim, StoreError>,
    ) -> Result<(Claimed, Option<Duration>), ClaimError> {
        let mut remaining = None;
        let claimed = match claim {
            Ok(Claim::Acquired { takeover }) => {
                if takeover {
                    tracing::info!(record = %id, "took over a key whose owner's lease expired");
                }
                let exec = Execution::new(Arc::clone(&self.cfg), id, token, takeover);
                Claimed::Execute(exec)
            }
            Ok(Claim::InProgress {
                fingerprint: held,
                lease_remaining,
            }) if held == fingerprint => {
                remaining = Some(lease_remaining);
                Claimed::InProgress {
                    retry_after: lease_remaining.min(self.cfg.in_progress_retry_after),
                }
            }
            Ok(Claim::Completed {
                fingerprint: held,
                payload,
            }) if held == fingerprint => Claimed::Replay(payload),
            Ok(Claim::InProgress { .. } | Claim::Completed { .. }) => Claimed::KeyReused,
            Err(e) if self.cfg.fail_open && !e.is_full() => {
                tracing::warn!(error = %e, "idempotency store failed; running unguarded (fail-open)");
                Claimed::Unguarded
            }
            Err(e) => {
                if e.is_full() {
                    tracing::warn!(error = %e, "idempotency store full; a new key was refused");
                } else {
                    tracing::warn!(error = %e, "idempotency store failed; nothing runs (fail-closed)");
                }
                return Err(ClaimError {
                    source: e,
                    retry_after: self.cfg.unavailable_retry_after,
                });
            }
        };
        Ok((claimed, remaining))
    }
}
