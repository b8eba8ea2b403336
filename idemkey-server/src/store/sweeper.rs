//! A background task that sweeps a store on a schedule.

use std::sync::Arc;
use std::time::Duration;

use super::{Store, clamp_forever};

/// Spawns a task that calls [`Store::sweep`] every `every` (first after one period),
/// for stores that keep expired records until swept (PostgreSQL, SQLite). A failed sweep
/// is logged (`tracing`, warn) and tried again next period. The task ends when the
/// returned handle is aborted or the runtime shuts down.
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
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store.sweep().await {
                Ok(n) => tracing::debug!(removed = n, "idempotency store swept"),
                Err(e) => tracing::warn!(error = %e, "idempotency store sweep failed"),
            }
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
