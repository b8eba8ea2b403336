//! The gate a handler waits at, with a signal that it arrived: how a test holds a request
//! inside its handler (to send duplicates meanwhile) and lets it go.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// A gate a handler waits at, with a signal that it arrived. Clones share the gate.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    entered: Arc<Semaphore>,
    open: Arc<Semaphore>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            entered: Arc::new(Semaphore::new(0)),
            open: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Gate {
    /// Called by the handler: signals arrival, waits until opened.
    pub(crate) async fn pass(&self) {
        self.entered.add_permits(1);
        self.open.acquire().await.expect("gate open").forget();
    }

    /// Waits until `n` handlers arrived.
    pub(crate) async fn wait_entered(&self, n: u32) {
        self.entered.acquire_many(n).await.expect("gate").forget();
    }

    /// Lets `n` waiting (or future) handlers through.
    pub(crate) fn open(&self, n: usize) {
        self.open.add_permits(n);
    }
}
