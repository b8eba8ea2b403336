//! The store contract and the stores that implement it.
//!
//! A store keeps one record per [`RecordId`] (a hash of scope and key; raw keys are never
//! kept at rest). A record is either **in progress** (someone holds a lease on it, named
//! by a [`FencingToken`]) or **completed** (an opaque payload kept for the retention
//! period). The engine decides what the payload holds; a store only keeps bytes.
//!
//! Every store must honour this contract, checked by the conformance suite
//! (`idemkey::testing::conformance`, feature `test-util`):
//!
//! 1. [`Store::claim`] is atomic in the store itself: of any number of concurrent claims
//!    on an absent (or expired) record, exactly one returns [`Claim::Acquired`]. A claim
//!    that finds a live record returns it in the same call ([`Claim::InProgress`] or
//!    [`Claim::Completed`]).
//! 2. For a claim, an in-progress record whose lease has expired counts as absent: the
//!    next claim takes it over with its own token, whatever the fingerprint
//!    (`takeover: true`). Lease decisions use the store's clock where the store has one.
//! 3. [`Store::complete`], [`Store::renew`] and [`Store::release`] are compare-and-set on
//!    the token. They succeed with the token that holds the record, **even when its
//!    lease has expired**, as long as no other claim has taken the record over: fencing
//!    stops a stale owner from overwriting a *new* owner, not from recording the only
//!    outcome there is (a renew then extends the lease again). With any other token (a
//!    taken-over, released or force-released claim, a completed record, or a record
//!    removed after lease + retention) they change nothing and fail with
//!    [`StoreError::is_fenced`].
//! 4. An abandoned claim (lease expired, nobody took it over) is kept for
//!    [`ClaimRequest::retention`] past the end of its lease, so that its owner can still
//!    complete it; then it is removed (by TTL or by [`Store::sweep`]). Stores that
//!    expire by TTL give an in-progress record a TTL of lease + retention.
//! 5. A completed record is returned by every claim until its retention ends, then it
//!    counts as absent and is removed (by TTL or by [`Store::sweep`]).
//! 6. [`Store::inspect`] shows what the store holds for an id (an abandoned claim
//!    included, until rule 4 removes it); [`Store::force_release`] removes a record
//!    whatever its state or token, fencing its owner; [`Store::list_in_progress`] lists
//!    in-progress records, oldest claim first. They are tools for operators (stuck keys),
//!    not for the request path.
//!
//! "Forever" ([`Duration::MAX`] as a lease or retention) is held to 100 years by every
//! store, so that no clock arithmetic overflows.
//!
//! Stores: [`MemoryStore`] (embedded, the default); `SqliteStore` (feature `sqlite`,
//! embedded and durable); `RedisStore` (feature `redis`, shared); `PostgresStore`
//! (feature `postgres`, shared and durable); `MySqlStore` (feature `mysql`, shared and
//! durable, MySQL or MariaDB); `DynamoStore` (feature `dynamodb`, shared, on Amazon
//! DynamoDB). [`open`] picks one by connection string.
//!
#![doc = include_str!("guide.md")]

#[cfg(feature = "dynamodb")]
mod dynamodb;
pub(crate) mod id_hash;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod inbox;
mod memory;
#[cfg(feature = "mysql")]
mod mysql;
mod open;
#[cfg(feature = "postgres")]
mod postgres;
mod quota;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "mysql")]
mod request_pool;
pub mod sizing;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod sweeper;
mod watch;

use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

#[cfg(feature = "redis")]
pub use self::redis::{RedisMemory, RedisStore, RedisStoreBuilder};
/// The AWS SDK crate whose client [`DynamoStore::builder`] takes (feature `dynamodb`).
#[cfg(feature = "dynamodb")]
pub use aws_sdk_dynamodb;
#[cfg(feature = "dynamodb")]
pub use dynamodb::{DynamoStore, DynamoStoreBuilder};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use inbox::InboxSql;
pub use memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "mysql")]
pub use mysql::{MySqlStore, MySqlStoreBuilder};
pub use open::{OpenError, open};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
pub use quota::{ChargedClaim, QuotaCharge};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteStoreBuilder};
pub use sweeper::{
    DEFAULT_SWEEP_BATCH, DEFAULT_SWEEP_PAUSE_RATIO, SweepOptions, SweepOutcome, SweepReport,
    spawn_sweeper, spawn_sweeper_with, sweep_and_report,
};
#[allow(
    unused_imports,
    reason = "used by the notifying stores behind features"
)]
pub(crate) use watch::{ChannelWatch, Settlements};
pub use watch::{POLL_INTERVAL, PollingWatch, Watch};

/// The longest lease, retention or period any store keeps: 100 years, as good as never.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `d`, held to 100 years: what every store does with "forever" ([`Duration::MAX`]), so
/// that `now + d` neither overflows nor leaves the range of the store's clock.
pub(crate) fn clamp_forever(d: Duration) -> Duration {
    d.min(FOREVER)
}

/// The address of a record: SHA-256 over the length-prefixed scope and key.
///
/// Raw keys never reach a store; two scopes using the same key get different ids.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId([u8; 32]);

impl RecordId {
    /// The id of `key` within `scope` (use `""` for unscoped records).
    ///
    /// ```
    /// use idemkey::store::RecordId;
    /// assert_ne!(RecordId::new("tenant-a", "k1"), RecordId::new("tenant-b", "k1"));
    /// assert_ne!(RecordId::new("ab", "c"), RecordId::new("a", "bc"));
    /// ```
    #[must_use]
    pub fn new(scope: &str, key: &str) -> Self {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"idemkey/record/v1\0");
        idemkey_core::framing::field(&mut h, scope.as_bytes());
        idemkey_core::framing::field(&mut h, key.as_bytes());
        Self(h.finalize().into())
    }

    /// Wraps raw digest bytes (as read back from a store).
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The digest bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex form, 64 characters (used in store keys).
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordId({})", self.to_hex())
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Names one claim on a record. Completing, renewing and releasing are compare-and-set on
/// it, so an owner whose lease was taken over can no longer write.
///
/// Tokens are random 128-bit values made by the caller of [`Store::claim`], unique across
/// records, releases and takeovers (a counter per record would repeat after a release).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(u128);

impl FencingToken {
    /// A fresh random token.
    #[must_use]
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().as_u128())
    }

    /// Wraps a raw value (as read back from a store).
    #[must_use]
    pub const fn from_u128(v: u128) -> Self {
        Self(v)
    }

    /// The raw value.
    #[must_use]
    pub const fn as_u128(&self) -> u128 {
        self.0
    }

    /// Big-endian bytes, for stores that keep binary values.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// From big-endian bytes.
    #[must_use]
    pub const fn from_bytes(b: [u8; 16]) -> Self {
        Self(u128::from_be_bytes(b))
    }

    /// 32-character lower-case hex form, for stores that keep text.
    #[must_use]
    pub fn to_hex(&self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses the form made by [`FencingToken::to_hex`].
    #[must_use]
    pub fn from_hex(s: &str) -> Option<Self> {
        (s.len() == 32)
            .then(|| u128::from_str_radix(s, 16).ok().map(Self))
            .flatten()
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.to_hex())
    }
}

/// What the store is asked to record by a claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The record's address.
    pub id: &'a RecordId,
    /// The request fingerprint, opaque to the store (kept and returned as is).
    pub fingerprint: &'a [u8],
    /// The token that names this claim if it wins.
    pub token: FencingToken,
    /// How long the claim holds the record unless renewed.
    pub lease: Duration,
    /// How long a completed record will be kept, and also how long an abandoned claim
    /// (lease expired, nobody took it over) is kept past its lease, so that its owner can
    /// still complete it (contract rule 4). Stores that expire by TTL give the
    /// in-progress record a TTL of `lease + retention`.
    pub retention: Duration,
}

/// One record as a store holds it, for operators: [`Store::inspect`],
/// [`Store::list_in_progress`] (stuck keys).
///
/// Its fields are public so that third-party stores can build it.
///
/// ```
/// use idemkey::store::{MemoryStore, Store, ClaimRequest, FencingToken, RecordId, RecordState};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idemkey::store::StoreError> {
/// let store = MemoryStore::new();
/// let id = RecordId::new("tenant", "key-1");
/// let lease = Duration::from_secs(5);
/// let claim = ClaimRequest { id: &id, fingerprint: b"fp", token: FencingToken::random(), lease, retention: lease };
/// store.claim(claim).await?;
/// let info = store.inspect(&id).await?.expect("just claimed");
/// assert_eq!((info.state, info.payload_len), (RecordState::InProgress, None));
/// assert_eq!(info.expires.duration_since(info.created).ok(), Some(lease));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    /// The record's address.
    pub id: RecordId,
    /// In progress or completed.
    pub state: RecordState,
    /// The fingerprint the current claim (or the completed request) was made with.
    pub fingerprint: Bytes,
    /// When the current claim was made, by the store's clock, as wall-clock time.
    pub created: SystemTime,
    /// End of the lease (in progress; in the past for an abandoned claim, a stuck key)
    /// or of the retention (completed).
    pub expires: SystemTime,
    /// Size of the stored payload in bytes (completed records), `None` in progress.
    pub payload_len: Option<u64>,
}

/// The state of a record, in [`RecordInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// A claim holds the record (or held it: its lease may have expired).
    InProgress,
    /// The record holds a payload, kept until its retention ends.
    Completed,
}

/// The result of [`Store::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The claim won: the caller owns the record until its lease ends.
    Acquired {
        /// `true` when an expired lease of an earlier owner was taken over. Best
        /// effort: a store that already removed the expired record (TTL, sweep) cannot
        /// tell and reports `false`.
        takeover: bool,
    },
    /// Another claim holds a live lease.
    InProgress {
        /// The fingerprint the owner claimed with.
        fingerprint: Bytes,
        /// Time left on that owner's lease, by the store's clock.
        lease_remaining: Duration,
    },
    /// The record is completed.
    Completed {
        /// The fingerprint of the request that completed it.
        fingerprint: Bytes,
        /// The payload stored by [`Store::complete`].
        payload: Bytes,
    },
}

/// A pluggable record store. See the [module docs](self) for the contract.
///
/// Implementations are shared between requests (`Arc<dyn Store>`), so methods take
/// `&self`.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short, fixed name of the kind of store (`"memory"`, `"redis"`, `"postgres"`,
    /// ...): the `idemkey.store.kind` of its spans and the `store` label of its metrics
    /// ([`telemetry`](idemkey_core::telemetry)). The default is `"custom"`; a store of your own
    /// may name itself (keep it one fixed word: it is a metric label).
    ///
    /// ```
    /// use idemkey::store::{MemoryStore, Store};
    /// assert_eq!(MemoryStore::new().kind(), "memory");
    /// ```
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Claims the record, or returns the live record in the same call.
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError>;

    /// The same store's request path answered in the caller's thread, for a store that
    /// keeps its records in this process and never waits: the engine then claims and
    /// completes through it, without the boxed future each call of an `async` trait
    /// method makes (an allocation and a free, twice per fresh request). `None`, the
    /// default, for a store that does I/O; [`MemoryStore`] returns itself.
    ///
    /// A store that returns `Some` must answer there exactly as [`Store::claim`] and
    /// [`Store::complete`] do; the conformance suite (`idemkey::testing::conformance`,
    /// feature `test-util`) runs every check through both.
    ///
    /// ```
    /// use idemkey::store::{MemoryStore, Store};
    /// assert!(MemoryStore::new().in_process().is_some());
    /// ```
    fn in_process(&self) -> Option<&dyn InProcessStore> {
        None
    }

    /// Completes a record held by `token`: stores `payload`, kept for `retention`.
    ///
    /// Succeeds even when the lease of `token` has expired, as long as no other claim
    /// took the record over (contract rule 3). Fails with [`StoreError::is_fenced`] when
    /// `token` no longer holds the record.
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Extends the lease held by `token` to `lease` from now (by the store's clock).
    ///
    /// An expired lease that nobody took over is extended again (contract rule 3).
    /// Fails with [`StoreError::is_fenced`] when `token` no longer holds the record.
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError>;

    /// Removes an in-progress record held by `token`, so the next claim executes anew.
    ///
    /// Works after the lease of `token` expired too, as long as no other claim took the
    /// record over (contract rule 3). Fails with [`StoreError::is_fenced`] when `token`
    /// no longer holds the record.
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError>;

    /// Removes expired records; returns how many. Stores that expire records themselves
    /// (Redis TTL) return `Ok(0)`. Schedule it where the store needs it (PostgreSQL,
    /// MySQL/MariaDB, SQLite); the memory store also sweeps by itself. The SQL stores
    /// remove in bounded batches until nothing expired is left, paced as
    /// [`SweepOptions::default`] (a pause as long as each batch), without the sweep lock
    /// (see [`Store::sweep_pass`] for a pass with a budget, the lock or other pacing).
    async fn sweep(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// One sweep pass under `options`: bounded batches, a time budget, and (when
    /// exclusive) the store's sweep lock, so that one instance sweeps at a time
    /// ([`SweepOptions`]). The default runs [`Store::sweep`] once, for stores that
    /// expire records themselves; the memory store sweeps in steps of a batch.
    async fn sweep_pass(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        let _ = options;
        let started = tokio::time::Instant::now();
        let removed = self.sweep().await?;
        Ok(
            SweepReport::new(removed, 1, started.elapsed(), SweepOutcome::Complete)
                .with_lag(Some(Duration::ZERO)),
        )
    }

    /// What the store holds for `id`: `None` when nothing (or only a completed record
    /// past its retention, or an abandoned claim past lease + retention). An in-progress
    /// record whose lease expired is still shown (state
    /// [`InProgress`](RecordState::InProgress), `expires` in the past): that is a stuck
    /// key.
    ///
    /// The default implementation fails with [`StoreError::is_unsupported`]; every
    /// store of this crate implements it.
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let _ = id;
        Err(StoreError::unsupported("inspect"))
    }

    /// Removes the record whatever its state or token. Returns `true` when a record was
    /// removed (one that [`Store::inspect`] would have shown). An owner that was running
    /// is fenced afterwards: its complete, renew and release fail
    /// [`StoreError::is_fenced`], and the next claim executes anew.
    ///
    /// The default implementation fails with [`StoreError::is_unsupported`]; every
    /// store of this crate implements it.
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let _ = id;
        Err(StoreError::unsupported("force_release"))
    }

    /// Claims like [`Store::claim`], and charges a new record to the token bucket of
    /// `charge`, kept in the store so that every instance over the store spends one
    /// quota ([`Quota::shared`](crate::policy::Quota::shared)), atomically with the
    /// claim: a live record is returned without taking a token (replays and in-progress
    /// answers never spend quota); an absent one is written only when the bucket has a
    /// token, and [`ChargedClaim::OverQuota`] leaves the store as it was otherwise. A
    /// takeover of an expired claim is not a new record and takes no token.
    ///
    /// The default fails with [`StoreError::is_configuration`]: a store without buckets
    /// of its own (every store but Redis today) serves per-process quotas, which the
    /// engine keeps itself.
    async fn claim_charged(
        &self,
        req: ClaimRequest<'_>,
        charge: QuotaCharge<'_>,
    ) -> Result<ChargedClaim, StoreError> {
        let _ = (req, charge);
        Err(StoreError::configuration(format!(
            "a quota shared through the store (Quota::shared) needs a store that keeps buckets, and this {} store does not: use a per-process quota with it (leave out Quota::shared), or a store that does (RedisStore)",
            self.kind()
        )))
    }

    /// Up to `limit` in-progress records (live, or abandoned with an expired lease),
    /// oldest claim first.
    ///
    /// The default implementation fails with [`StoreError::is_unsupported`]; every
    /// store of this crate implements it (each store's docs say what it costs).
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let _ = limit;
        Err(StoreError::unsupported("list_in_progress"))
    }

    /// A [`Watch`] of `id`: what a duplicate that waits for a running request's outcome
    /// (the layer's [`InProgressPolicy::Wait`](crate::policy::InProgressPolicy::Wait),
    /// [`Engine::claim_or_wait`](crate::Engine::claim_or_wait)) waits on
    /// between two looks at the record. Made before the look, so that a settling in
    /// between is not missed.
    ///
    /// Stores that can notify wake it when the record is completed or released:
    /// [`MemoryStore`] at once, `RedisStore` by pub/sub, `PostgresStore` by
    /// `LISTEN`/`NOTIFY` when built with `notify(true)`. The default implementation
    /// polls ([`PollingWatch`]). A store that fails to subscribe may return a
    /// [`PollingWatch`] rather than an error.
    ///
    /// # Errors
    /// The store's; the engine then polls.
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        let _ = id;
        Ok(Box::new(PollingWatch::default()))
    }
}

/// The request path of a store that answers without waiting ([`Store::in_process`]):
/// what [`Store::claim`] and [`Store::complete`] do, as plain calls.
///
/// ```
/// use idemkey::store::{Claim, ClaimRequest, FencingToken, MemoryStore, RecordId, Store};
/// use std::time::Duration;
///
/// let store = MemoryStore::new();
/// let now = store.in_process().expect("the memory store answers in process");
/// let id = RecordId::new("tenant-1", "order-7");
/// let token = FencingToken::random();
/// let req = ClaimRequest {
///     id: &id,
///     fingerprint: b"fp",
///     token,
///     lease: Duration::from_secs(5),
///     retention: Duration::from_secs(60),
/// };
/// assert!(matches!(now.claim_now(&req)?, Claim::Acquired { takeover: false }));
/// now.complete_now(&id, token, "done".into(), Duration::from_secs(60))?;
/// assert!(matches!(now.claim_now(&req)?, Claim::Completed { payload, .. } if payload == "done"));
/// # Ok::<(), idemkey::store::StoreError>(())
/// ```
pub trait InProcessStore: Send + Sync {
    /// [`Store::claim`], answered at once.
    ///
    /// # Errors
    /// As [`Store::claim`].
    fn claim_now(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError>;

    /// [`Store::complete`], answered at once.
    ///
    /// # Errors
    /// As [`Store::complete`].
    fn complete_now(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError>;
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        (**self).claim(req).await
    }
    fn in_process(&self) -> Option<&dyn InProcessStore> {
        (**self).in_process()
    }
    async fn claim_charged(
        &self,
        req: ClaimRequest<'_>,
        charge: QuotaCharge<'_>,
    ) -> Result<ChargedClaim, StoreError> {
        (**self).claim_charged(req, charge).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        (**self).complete(id, token, payload, retention).await
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        (**self).renew(id, token, lease).await
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        (**self).release(id, token).await
    }
    async fn sweep(&self) -> Result<u64, StoreError> {
        (**self).sweep().await
    }
    async fn sweep_pass(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        (**self).sweep_pass(options).await
    }
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        (**self).inspect(id).await
    }
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        (**self).force_release(id).await
    }
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        (**self).list_in_progress(limit).await
    }
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        (**self).watch(id).await
    }
}

/// A store operation that failed.
///
/// Query the kind with [`StoreError::is_fenced`], [`StoreError::is_unavailable`],
/// [`StoreError::is_configuration`], [`StoreError::is_corrupt`],
/// [`StoreError::is_unsupported`], [`StoreError::is_unreplicated`] and
/// [`StoreError::is_full`].
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct StoreError {
    kind: StoreErrorKind,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

#[derive(Debug)]
enum StoreErrorKind {
    Fenced,
    Unavailable(String),
    Configuration(String),
    Corrupt(String),
    Unsupported(&'static str),
    Full(String),
    Unreplicated {
        acked: usize,
        wanted: usize,
        timeout: Duration,
    },
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fenced => f.write_str(
                "the fencing token no longer holds this record (another request took it over after its lease expired, or it was released, force-released or completed, or it expired); nothing was written",
            ),
            Self::Unavailable(m) => write!(f, "the idempotency store is unreachable or failing: {m}; retry later"),
            Self::Configuration(m) => write!(f, "the idempotency store is misconfigured: {m}; retrying will not help"),
            Self::Corrupt(m) => write!(f, "the idempotency store holds a record this version cannot read: {m}"),
            Self::Unreplicated { acked, wanted, timeout } => write!(f, "the completion is written on the primary, but only {acked} of the {wanted} replicas asked for acknowledged it within {timeout:?}: it would be lost if the primary failed now (check the replicas' health and lag, or wait for fewer)"),
            Self::Full(m) => write!(f, "the idempotency store is full ({m}): the key was not claimed, nothing ran and no record was evicted; retry with the same key later (expired records free their room when swept), and raise the store's bound if this lasts"),
            Self::Unsupported(op) => write!(f, "this idempotency store does not implement `{op}`: use one of idemkey's stores (they all do), or look the record up with the backing database's own tools"),
        }
    }
}

impl StoreError {
    /// The token did not hold the record: nothing was written.
    #[must_use]
    pub fn fenced() -> Self {
        Self {
            kind: StoreErrorKind::Fenced,
            source: None,
        }
    }

    /// The store could not be reached or failed; `what` says what was attempted.
    #[must_use]
    pub fn unavailable(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind: StoreErrorKind::Unavailable(what.into()),
            source: Some(source.into()),
        }
    }

    /// The store's configuration is wrong (a database that does not exist, a user the
    /// server refuses, a Redis database number out of range, a file in a directory that
    /// does not exist, an invalid table name): retrying will not help. `what` says what
    /// to fix.
    ///
    /// ```
    /// let e = idemkey::store::StoreError::configuration("database \"app\" does not exist");
    /// assert!(e.is_configuration() && !e.is_unavailable());
    /// assert!(e.to_string().contains("does not exist"));
    /// ```
    #[must_use]
    pub fn configuration(what: impl Into<String>) -> Self {
        Self {
            kind: StoreErrorKind::Configuration(what.into()),
            source: None,
        }
    }

    /// [`StoreError::configuration`], keeping the driver's error as the source.
    #[cfg_attr(
        not(any(
            feature = "redis",
            feature = "postgres",
            feature = "mysql",
            feature = "sqlite"
        )),
        allow(dead_code)
    )]
    pub(crate) fn configuration_from(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind: StoreErrorKind::Configuration(what.into()),
            source: Some(source.into()),
        }
    }

    /// The store answered with data this version cannot read.
    #[must_use]
    pub fn corrupt(what: impl Into<String>) -> Self {
        Self {
            kind: StoreErrorKind::Corrupt(what.into()),
            source: None,
        }
    }

    /// The store does not implement `op` (the default of an optional [`Store`] method,
    /// such as [`Store::inspect`]).
    ///
    /// ```
    /// let e = idemkey::store::StoreError::unsupported("inspect");
    /// assert!(e.is_unsupported());
    /// assert!(e.to_string().contains("`inspect`"));
    /// ```
    #[must_use]
    pub fn unsupported(op: &'static str) -> Self {
        Self {
            kind: StoreErrorKind::Unsupported(op),
            source: None,
        }
    }

    /// The kind as a fixed name, for telemetry (`error.type`, the `error` label).
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.kind {
            StoreErrorKind::Fenced => "fenced",
            StoreErrorKind::Unavailable(_) => "unavailable",
            StoreErrorKind::Corrupt(_) => "corrupt",
            StoreErrorKind::Unsupported(_) => "unsupported",
            StoreErrorKind::Configuration(_) => "configuration",
            StoreErrorKind::Unreplicated { .. } => "unreplicated",
            StoreErrorKind::Full(_) => "full",
        }
    }

    /// The store is at its bound (records or bytes) and refused a **new** record; `what`
    /// says which bound. Nothing was written and nothing evicted; claims that find an
    /// existing record, and the complete, renew and release of claims already made, are
    /// not refused for room. The verifier answers `503 store-full` with `Retry-After`,
    /// even when it fails open: a full store is not an outage.
    ///
    /// ```
    /// let e = idemkey::store::StoreError::full("the memory store holds its max_records of 10 records");
    /// assert!(e.is_full() && !e.is_unavailable());
    /// assert!(e.to_string().contains("max_records"));
    /// ```
    #[must_use]
    pub fn full(what: impl Into<String>) -> Self {
        Self {
            kind: StoreErrorKind::Full(what.into()),
            source: None,
        }
    }

    /// `true` when the store refused a new record because it is at its bound
    /// ([`StoreError::full`]): retry later, when expired records were swept, or raise
    /// the bound ([`MemoryStoreBuilder::max_records`], [`MemoryStoreBuilder::max_bytes`]).
    #[must_use]
    pub fn is_full(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Full(_))
    }

    /// A completion written on the primary that fewer than `wanted` replicas
    /// acknowledged within `timeout` (`RedisStoreBuilder::wait_for_replicas`, feature
    /// `redis`).
    ///
    /// ```
    /// use std::time::Duration;
    /// let e = idemkey::store::StoreError::unreplicated(0, 1, Duration::from_millis(100));
    /// assert!(e.is_unreplicated() && !e.is_unavailable());
    /// assert!(e.to_string().contains("0 of the 1 replicas"));
    /// ```
    #[must_use]
    pub fn unreplicated(acked: usize, wanted: usize, timeout: Duration) -> Self {
        Self {
            kind: StoreErrorKind::Unreplicated {
                acked,
                wanted,
                timeout,
            },
            source: None,
        }
    }

    /// `true` when a completion was written but not acknowledged by as many replicas as
    /// the store was asked to wait for ([`StoreError::unreplicated`]): it may be lost if
    /// the primary fails, and is not retried (the record already holds it).
    #[must_use]
    pub fn is_unreplicated(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Unreplicated { .. })
    }

    /// `true` when a complete, renew or release was refused because the token no longer
    /// holds the record.
    #[must_use]
    pub fn is_fenced(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Fenced)
    }

    /// `true` when the store could not be reached or failed (the verifier answers
    /// `503 store-unavailable`).
    ///
    /// One fact, named after its receiver: on a store's own error the store is implied
    /// (`is_unavailable`, as on [`OpenError::is_unavailable`](crate::store::OpenError::is_unavailable));
    /// the errors of the verifier's ways in, whose failures have other causes too, say
    /// whose it is: [`OnceError::is_store_unavailable`](crate::OnceError::is_store_unavailable),
    /// [`BatchError::is_store_unavailable`](crate::webhook::BatchError::is_store_unavailable).
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Unavailable(_))
    }

    /// `true` when the store's configuration is wrong and retrying will not help
    /// ([`StoreError::configuration`]): fix what the message names.
    #[must_use]
    pub fn is_configuration(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Configuration(_))
    }

    /// `true` when a record could not be decoded.
    #[must_use]
    pub fn is_corrupt(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Corrupt(_))
    }

    /// `true` when the store does not implement the operation
    /// ([`StoreError::unsupported`]).
    #[must_use]
    pub fn is_unsupported(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Unsupported(_))
    }
}
