//! The embedded in-memory store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::time::Instant;

use super::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// The shortest time between two automatic sweeps, in milliseconds of store time.
const SWEEP_INTERVAL_MS: u64 = 5_000;

/// `now + d`, saturating far in the future: `Instant + Duration` panics on overflow, and
/// a caller may well ask for `Duration::MAX` ("keep forever").
fn deadline(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 60 * 60))
}

/// An in-memory store: fast, shared by every clone, and lost when the process exits.
///
/// Concurrent without a global lock (a sharded map: claims on different records do not
/// contend). Expired records are swept by [`Store::sweep`], and automatically at most
/// every 5 s while claims arrive, off the request path (on tokio's blocking pool) so no
/// request pays for a scan of the whole map. Time is read from [`tokio::time::Instant`], so tests can drive
/// leases and retention with `tokio::time::pause`.
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
/// let claim = store.claim(ClaimRequest { id: &id, fingerprint: b"fp", token, lease: Duration::from_secs(5) }).await?;
/// assert_eq!(claim, Claim::Acquired { takeover: false });
/// store.complete(&id, token, "stored".into(), Duration::from_secs(3600)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    records: DashMap<RecordId, Record>,
    /// Store time (ms since `epoch`) after which the next claim starts a sweep.
    next_sweep_ms: AtomicU64,
    epoch: Instant,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            records: DashMap::new(),
            next_sweep_ms: AtomicU64::new(SWEEP_INTERVAL_MS),
            epoch: Instant::now(),
        }
    }
}

struct Record {
    fingerprint: Bytes,
    expires: Instant,
    state: State,
}

enum State {
    InProgress(FencingToken),
    Completed(Bytes),
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

    fn sweep_now(&self) -> u64 {
        let now = Instant::now();
        let before = self.inner.records.len();
        self.inner.records.retain(|_, r| r.expires > now);
        before.saturating_sub(self.inner.records.len()) as u64
    }

    fn claim_at(&self, req: &ClaimRequest<'_>, now: Instant) -> Claim {
        let fresh = || Record {
            fingerprint: Bytes::copy_from_slice(req.fingerprint),
            expires: deadline(now, req.lease),
            state: State::InProgress(req.token),
        };
        match self.inner.records.entry(*req.id) {
            Entry::Vacant(v) => {
                v.insert(fresh());
                Claim::Acquired { takeover: false }
            }
            Entry::Occupied(mut o) => {
                let r = o.get();
                if r.expires <= now {
                    let takeover = matches!(r.state, State::InProgress(_));
                    o.insert(fresh());
                    return Claim::Acquired { takeover };
                }
                match &r.state {
                    State::InProgress(_) => Claim::InProgress {
                        fingerprint: r.fingerprint.clone(),
                        lease_remaining: r.expires - now,
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
    fn sweep_if_due(&self, now: Instant) {
        let ms = u64::try_from(now.saturating_duration_since(self.inner.epoch).as_millis())
            .unwrap_or(u64::MAX);
        let due = self.inner.next_sweep_ms.load(Ordering::Relaxed);
        if ms < due
            || self
                .inner
                .next_sweep_ms
                .compare_exchange(
                    due,
                    ms.saturating_add(SWEEP_INTERVAL_MS),
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

    /// Applies `f` to the record held by `token`, or fails fenced.
    fn with_owned(
        &self,
        id: &RecordId,
        token: FencingToken,
        f: impl FnOnce(Entry<'_, RecordId, Record>),
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        match self.inner.records.entry(*id) {
            Entry::Occupied(e)
                if e.get().expires > now
                    && matches!(e.get().state, State::InProgress(t) if t == token) =>
            {
                f(Entry::Occupied(e));
                Ok(())
            }
            _ => Err(StoreError::fenced()),
        }
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let now = Instant::now();
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
        self.with_owned(id, token, |e| {
            if let Entry::Occupied(mut e) = e {
                let r = e.get_mut();
                r.state = State::Completed(payload);
                r.expires = deadline(Instant::now(), retention);
            }
        })
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.with_owned(id, token, |e| {
            if let Entry::Occupied(mut e) = e {
                e.get_mut().expires = deadline(Instant::now(), lease);
            }
        })
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.with_owned(id, token, |e| {
            if let Entry::Occupied(e) = e {
                e.remove();
            }
        })
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        Ok(self.sweep_now())
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
            };
            store.claim(claim).await.expect("claim");
        }
        assert_eq!(store.len(), 100);
        tokio::time::advance(Duration::from_millis(SWEEP_INTERVAL_MS)).await;
        let id = RecordId::new("", "trigger");
        let claim = ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: Duration::from_secs(60),
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
}
