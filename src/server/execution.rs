//! A claimed key: the operation runs while its lease is renewed, then its outcome is
//! recorded or the key released.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;

use crate::store::{FencingToken, RecordId, Store, StoreError};

/// A claimed key: run the operation, then complete or release.
///
/// Dropping an execution that was neither completed nor released releases the key in
/// the background (when a tokio runtime is running), so that a retry executes again; a
/// crashed process leaves the lease to expire instead.
pub struct Execution {
    store: Arc<dyn Store>,
    lease: Lease,
    id: RecordId,
    token: FencingToken,
    takeover: bool,
    retention: Duration,
    lost: bool,
    done: bool,
}

/// A claim's lease: how long it holds, and how often a running operation renews it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) length: Duration,
    pub(super) renew_every: Duration,
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("id", &self.id)
            .field("token", &self.token)
            .field("takeover", &self.takeover)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl Execution {
    pub(super) fn new(
        store: Arc<dyn Store>,
        lease: Lease,
        id: RecordId,
        token: FencingToken,
        takeover: bool,
        retention: Duration,
    ) -> Self {
        Self {
            store,
            lease,
            id,
            token,
            takeover,
            retention,
            lost: false,
            done: false,
        }
    }

    /// `true` when this claim took the key over from an owner whose lease expired (that
    /// owner may have done part of the work).
    #[must_use]
    pub fn is_takeover(&self) -> bool {
        self.takeover
    }

    /// The fencing token of this claim.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The record's address.
    #[must_use]
    pub fn record_id(&self) -> RecordId {
        self.id
    }

    /// `true` once a renewal found the key taken over: completing will fail fenced.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Keep the completed record for `retention` instead of the engine's default.
    pub fn set_retention(&mut self, retention: Duration) {
        self.retention = retention;
    }

    /// Drives `fut` to completion while renewing the lease every third of it. If a
    /// renewal finds the key taken over, renewing stops and [`Execution::is_lost`]
    /// turns `true`; `fut` still runs to its end.
    pub async fn run<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        // Most handlers answer in their first poll; only arm the renewal timer for those
        // that wait (arming one costs a timer registration and often a driver wake-up).
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = first {
            return out;
        }
        if !self.lost {
            let store = Arc::clone(&self.store);
            let (id, token) = (self.id, self.token);
            let (lease, every) = (self.lease.length, self.lease.renew_every);
            let renew = async move {
                loop {
                    tokio::time::sleep(every).await;
                    match store.renew(&id, token, lease).await {
                        Ok(()) => {}
                        Err(e) if e.is_fenced() => {
                            tracing::warn!(record = %id, "lease lost while running: another request took the key over");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(record = %id, error = %e, "lease renewal failed; will retry")
                        }
                    }
                }
            };
            tokio::select! {
                biased;
                out = &mut fut => return out,
                () = renew => self.lost = true,
            }
        }
        fut.await
    }

    /// Completes the key with `payload`, kept for the retention period and handed to
    /// every later request with the same key and fingerprint as
    /// [`Claimed::Replay`](super::Claimed::Replay).
    ///
    /// # Errors
    /// [`StoreError::is_fenced`] when the key was taken over (this owner's lease
    /// expired): the other owner's outcome wins. A store that is unavailable is asked
    /// again, with a doubling pause from 20 ms, for up to half the lease (the operation
    /// already ran: losing its outcome would run it a second time after the lease);
    /// if it still fails, the outcome is not recorded and the key is released by its
    /// lease.
    pub async fn complete(mut self, payload: Bytes) -> Result<(), StoreError> {
        self.done = true;
        let store = &self.store;
        let give_up = tokio::time::Instant::now() + self.lease.length / 2;
        let mut pause = Duration::from_millis(20);
        loop {
            let result = store
                .complete(&self.id, self.token, payload.clone(), self.retention)
                .await;
            match result {
                Err(e) if e.is_unavailable() && tokio::time::Instant::now() + pause < give_up => {
                    tracing::warn!(record = %self.id, error = %e, "recording the outcome failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2);
                }
                other => return other,
            }
        }
    }

    /// Releases the key without an outcome: the next request executes again.
    ///
    /// # Errors
    /// [`StoreError::is_fenced`] when the key was already taken over; other store errors
    /// leave the key to its lease.
    pub async fn release(mut self) -> Result<(), StoreError> {
        self.done = true;
        self.store.release(&self.id, self.token).await
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (store, id, token) = (Arc::clone(&self.store), self.id, self.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.release(&id, token).await {
                    tracing::debug!(record = %id, error = %e, "release of an abandoned claim failed");
                }
            });
        }
    }
}
