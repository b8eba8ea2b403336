//! The embedded in-memory store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::time::Instant;

use super::id_hash::IdHashBuilder;
use super::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, RecordState, Settlements, Store,
    StoreError, Watch, clamp_forever,
};

/// The shortest time between two automatic sweeps, in microseconds of store time.
const SWEEP_INTERVAL_US: u64 = 5_000_000;

/// An in-memory store: fast, shared by every clone, and lost when the process exits.
///
/// Concurrent without a global lock (a sharded map: claims on different records do not
/// contend). Expired records are swept by [`Store::sweep`], and automatically at most
/// every 5 s while claims arrive, off the request path (on tokio's blocking pool) so no
/// request pays for a scan of the whole map. An abandoned claim is kept for its
/// retention past its lease (contract rule 4) by both. Time is read from
/// [`tokio::time::Instant`], so tests can drive leases and retention with
/// `tokio::time::pause`.
///
/// [`Store::list_in_progress`] scans the whole map (one shard locked at a time).
///
/// Use it for a single process, and in tests; use Redis or PostgreSQL when several
/// instances must agree, SQLite when records must survive a restart.
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
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    records: DashMap<RecordId, Record, IdHashBuilder>,
    /// Duplicates waiting for a record to settle ([`Store::watch`]).
    settlements: Settlements,
    /// Store time after which the next claim starts a sweep.
    next_sweep_us: AtomicU64,
    /// Store time zero: every time a record keeps is microseconds since this instant.
    epoch: Instant,
    /// The wall-clock time at `epoch`, for [`RecordInfo`]'s times (one fixed pair, so
    /// a record shows the same times at every look).
    epoch_wall: SystemTime,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            records: DashMap::default(),
            settlements: Settlements::default(),
            next_sweep_us: AtomicU64::new(SWEEP_INTERVAL_US),
            epoch: Instant::now(),
            epoch_wall: SystemTime::now(),
        }
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

    fn held_by(&self, token: [u64; 2], now: u64) -> bool {
        matches!(self.state, State::InProgress { token: t, .. } if t == token)
            && self.kept_until() > now
    }
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of records held, expired ones not yet swept included.
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

    fn sweep_now(&self) -> u64 {
        let now = self.now();
        let before = self.inner.records.len();
        self.inner.records.retain(|_, r| r.kept_until() > now);
        self.inner.settlements.prune();
        before.saturating_sub(self.inner.records.len()) as u64
    }

    fn claim_at(&self, req: &ClaimRequest<'_>, now: u64) -> Claim {
        let fresh = || Record {
            fingerprint: Bytes::copy_from_slice(req.fingerprint),
            created: now,
            expires: now.saturating_add(micros(req.lease)),
            state: State::InProgress {
                token: token_words(req.token),
                retention: micros(req.retention),
            },
        };
        match self.inner.records.entry(*req.id) {
            Entry::Vacant(v) => {
                v.insert(fresh());
                Claim::Acquired { takeover: false }
            }
            Entry::Occupied(mut o) => {
                let r = o.get();
                if r.expires <= now {
                    let takeover = matches!(r.state, State::InProgress { .. });
                    o.insert(fresh());
                    return Claim::Acquired { takeover };
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
        }
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
        let store = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || store.sweep_now());
            }
            Err(_) => {
                store.sweep_now();
            }
        }
    }

    /// Applies `f` to the record held by `token` (its lease expired or not, rule 3), or
    /// fails fenced.
    fn with_owned(
        &self,
        id: &RecordId,
        token: FencingToken,
        f: impl FnOnce(Entry<'_, RecordId, Record>, u64),
    ) -> Result<(), StoreError> {
        let now = self.now();
        match self.inner.records.entry(*id) {
            Entry::Occupied(e) if e.get().held_by(token_words(token), now) => {
                f(Entry::Occupied(e), now);
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

#[async_trait::async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let now = self.now();
        let claim = self.claim_at(&req, now);
        // After the claim, so a claim never races the sweep it starts.
        self.sweep_if_due(now);
        Ok(claim)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.with_owned(id, token, |e, now| {
            if let Entry::Occupied(mut e) = e {
                let r = e.get_mut();
                r.state = State::Completed(payload);
                r.expires = now.saturating_add(micros(retention));
            }
        })?;
        self.inner.settlements.notify(id);
        Ok(())
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.with_owned(id, token, |e, now| {
            if let Entry::Occupied(mut e) = e {
                e.get_mut().expires = now.saturating_add(micros(lease));
            }
        })
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.with_owned(id, token, |e, _| {
            if let Entry::Occupied(e) = e {
                e.remove();
            }
        })?;
        self.inner.settlements.notify(id);
        Ok(())
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        Ok(self.sweep_now())
    }

    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let now = self.now();
        Ok(self
            .inner
            .records
            .get(id)
            .and_then(|r| self.info(*id, &r, now)))
    }

    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let now = self.now();
        let removed = self
            .inner
            .records
            .remove(id)
            .is_some_and(|(_, r)| r.kept_until() > now);
        self.inner.settlements.notify(id);
        Ok(removed)
    }

    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        Ok(Box::new(self.inner.settlements.subscribe(id)))
    }

    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let now = self.now();
        let mut found: Vec<(u64, RecordInfo)> = self
            .inner
            .records
            .iter()
            .filter(|r| matches!(r.state, State::InProgress { .. }))
            .filter_map(|r| Some((r.created, self.info(*r.key(), &r, now)?)))
            .collect();
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
