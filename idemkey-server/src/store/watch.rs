//! Waiting for a record to settle: [`Watch`], what [`Store::watch`](super::Store::watch)
//! returns, and the registry of local waiters that the notifying stores wake.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::watch;

use super::RecordId;
use super::id_hash::IdHashBuilder;

/// How often a [`PollingWatch`] looks again: the pause of a store that cannot notify.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A subscription to the settling of one record (completed or released), made by
/// [`Store::watch`](super::Store::watch) **before** the caller looks at the record, so
/// that a settling between the look and the wait is not missed.
///
/// [`Watch::settled`] may return early (a store that polls returns after its poll
/// interval); the caller looks at the record again to learn what became of it.
#[async_trait::async_trait]
pub trait Watch: Send {
    /// Waits until the record may have settled since the watch was made (or since this
    /// last returned), or until `timeout` passed.
    async fn settled(&mut self, timeout: Duration);
}

/// The [`Watch`] of a store that cannot notify: it returns after [`POLL_INTERVAL`] (or
/// the timeout, if shorter), and the caller looks again. The default of
/// [`Store::watch`](super::Store::watch).
///
/// ```
/// use idemkey::store::{PollingWatch, Watch};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let mut watch = PollingWatch::default();
/// let start = tokio::time::Instant::now();
/// watch.settled(Duration::from_secs(10)).await;
/// assert_eq!(start.elapsed(), idemkey::store::POLL_INTERVAL);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PollingWatch {
    interval: Duration,
}

impl PollingWatch {
    /// A watch that looks again every `interval`.
    #[must_use]
    pub const fn every(interval: Duration) -> Self {
        Self { interval }
    }
}

impl Default for PollingWatch {
    fn default() -> Self {
        Self::every(POLL_INTERVAL)
    }
}

#[async_trait::async_trait]
impl Watch for PollingWatch {
    async fn settled(&mut self, timeout: Duration) {
        tokio::time::sleep(timeout.min(self.interval)).await;
    }
}

/// The local waiters of a store's records, by id: the store (or its listener of the
/// database's notifications) calls [`Settlements::notify`] when a record settles.
#[derive(Debug, Default)]
pub(crate) struct Settlements {
    waiters: DashMap<RecordId, watch::Sender<()>, IdHashBuilder>,
    /// How many ids `waiters` holds, so that a settling nobody waits for (every
    /// completion of a fresh key) is one atomic read, not a look-up under a shard's
    /// lock. Counted up before a waiter looks at its record, so a settling that look
    /// missed sees it.
    watched: AtomicUsize,
}

impl Settlements {
    /// A watch of `id`, armed from now on.
    pub(crate) fn subscribe(&self, id: &RecordId) -> ChannelWatch {
        let rx = match self.waiters.entry(*id) {
            Entry::Occupied(e) => e.get().subscribe(),
            Entry::Vacant(e) => {
                self.watched.fetch_add(1, Ordering::SeqCst);
                e.insert(watch::Sender::new(())).subscribe()
            }
        };
        ChannelWatch { rx }
    }

    /// Wakes the waiters of `id`; forgets `id` once nobody waits for it. Returns
    /// whether anybody waited.
    pub(crate) fn notify(&self, id: &RecordId) -> bool {
        if self.watched.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let woke = self.waiters.get(id).is_some_and(|tx| {
            tx.send_replace(());
            true
        });
        // Nobody waited (every completion of a fresh key): nothing to forget, and no
        // second look-up under the shard's write lock. A waiter that subscribes meanwhile
        // keeps its entry either way.
        if woke
            && self
                .waiters
                .remove_if(id, |_, tx| tx.receiver_count() == 0)
                .is_some()
        {
            self.watched.fetch_sub(1, Ordering::SeqCst);
        }
        woke
    }

    /// Forgets the ids nobody waits for any more.
    pub(crate) fn prune(&self) {
        self.waiters.retain(|_, tx| {
            let keep = tx.receiver_count() > 0;
            if !keep {
                self.watched.fetch_sub(1, Ordering::SeqCst);
            }
            keep
        });
    }
}

/// A [`Watch`] woken by [`Settlements::notify`].
#[derive(Debug)]
pub(crate) struct ChannelWatch {
    rx: watch::Receiver<()>,
}

#[async_trait::async_trait]
impl Watch for ChannelWatch {
    async fn settled(&mut self, timeout: Duration) {
        // The sender outlives every receiver (it is forgotten only without receivers).
        let _ = tokio::time::timeout(timeout, self.rx.changed()).await;
    }
}
