//! The embedded in-memory store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::time::Instant;

use super::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// How many claims pass between two opportunistic sweeps.
const SWEEP_EVERY: u64 = 4096;

/// `now + d`, saturating far in the future: `Instant + Duration` panics on overflow, and
/// a caller may well ask for `Duration::MAX` ("keep forever").
fn deadline(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 60 * 60))
}

/// An in-memory store: fast, shared by every clone, and lost when the process exits.
///
/// Concurrent without a global lock (a sharded map: claims on different records do not
/// contend). Expired records are swept every few thousand claims and by
/// [`Store::sweep`]. Time is read from [`tokio::time::Instant`], so tests can drive
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

#[derive(Default)]
struct Inner {
    records: DashMap<RecordId, Record>,
    claims: AtomicU64,
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
        if self.inner.claims.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.sweep_now();
        }
        let now = Instant::now();
        let fresh = || Record {
            fingerprint: Bytes::copy_from_slice(req.fingerprint),
            expires: deadline(now, req.lease),
            state: State::InProgress(req.token),
        };
        match self.inner.records.entry(*req.id) {
            Entry::Vacant(v) => {
                v.insert(fresh());
                Ok(Claim::Acquired { takeover: false })
            }
            Entry::Occupied(mut o) => {
                let r = o.get();
                if r.expires <= now {
                    let takeover = matches!(r.state, State::InProgress(_));
                    o.insert(fresh());
                    return Ok(Claim::Acquired { takeover });
                }
                Ok(match &r.state {
                    State::InProgress(_) => Claim::InProgress {
                        fingerprint: r.fingerprint.clone(),
                        lease_remaining: r.expires - now,
                    },
                    State::Completed(payload) => Claim::Completed {
                        fingerprint: r.fingerprint.clone(),
                        payload: payload.clone(),
                    },
                })
            }
        }
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
