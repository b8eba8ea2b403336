//! The in-memory journal: for tests and for processes that need no recovery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use super::journal::{Enqueued, Journal, JournalError, Operation, Outcome};

/// A journal in this process's memory: lost when the process ends, so it protects
/// against nothing a crash does. Use it in tests, and where the
/// [`Outbox`](super::Outbox) is only wanted for its bookkeeping.
///
/// Cheap to clone; clones share the operations.
///
/// ```
/// use idemkey::client::outbox::{MemoryJournal, Outbox};
/// let outbox = Outbox::new(MemoryJournal::new());
/// # let _ = outbox;
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryJournal {
    ops: Arc<Mutex<HashMap<String, Operation>>>,
}

impl MemoryJournal {
    /// An empty journal.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Operation>) -> T) -> T {
        // A panic elsewhere while holding the lock leaves the map consistent (every
        // change is one insert or one field write), so a poisoned lock is still usable.
        let mut ops = self.ops.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut ops)
    }
}

#[async_trait]
impl Journal for MemoryJournal {
    async fn enqueue(&self, op: &Operation) -> Result<Enqueued, JournalError> {
        Ok(self.with(|ops| match ops.get(&op.id) {
            Some(existing) => Enqueued::Existing(Box::new(existing.clone())),
            None => {
                ops.insert(op.id.clone(), op.clone());
                Enqueued::Inserted
            }
        }))
    }

    async fn begin_attempt(&self, id: &str) -> Result<Option<u32>, JournalError> {
        Ok(self.with(|ops| {
            let op = ops.get_mut(id).filter(|op| op.is_pending())?;
            op.attempts = op.attempts.saturating_add(1);
            Some(op.attempts)
        }))
    }

    async fn complete(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError> {
        Ok(
            self.with(|ops| match ops.get_mut(id).filter(|op| op.is_pending()) {
                Some(op) => {
                    op.outcome = Some(outcome.clone());
                    true
                }
                None => false,
            }),
        )
    }

    async fn get(&self, id: &str) -> Result<Option<Operation>, JournalError> {
        Ok(self.with(|ops| ops.get(id).cloned()))
    }

    async fn pending(&self, limit: usize) -> Result<Vec<Operation>, JournalError> {
        Ok(self.with(|ops| {
            let mut pending: Vec<Operation> =
                ops.values().filter(|op| op.is_pending()).cloned().collect();
            pending.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.id.cmp(&b.id)));
            pending.truncate(limit);
            pending
        }))
    }
}
