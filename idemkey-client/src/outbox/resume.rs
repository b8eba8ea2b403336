//! Recovery: finishing the operations whose outcome is unknown.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest_middleware::ClientWithMiddleware;
use tokio::task::JoinHandle;

use super::Outbox;
use super::error::OutboxError;
use super::journal::{Operation, Outcome};

/// How many pending operations one [`Outbox::resume`] reads from the journal.
const RESUME_BATCH: usize = 10_000;

/// What [`Outbox::resume`] did with one pending operation.
#[derive(Debug)]
pub enum Resumed {
    /// Re-sent (or found completed meanwhile); its outcome is recorded. A replayed
    /// outcome ([`Outcome::replayed`]) means the crash had come after the server
    /// executed it.
    Done(Outcome),
    /// Older than the retention window: not sent. The application decides.
    Expired,
    /// Re-sent, and again no final answer: still pending, for the next resume.
    Pending(OutboxError),
}

/// What [`Outbox::resume`] did, operation by operation.
#[derive(Debug, Default)]
pub struct ResumeReport {
    /// Each pending operation found, by id, and what became of it, oldest first.
    pub operations: Vec<(String, Resumed)>,
}

impl ResumeReport {
    /// How many were finished (their outcome is now recorded).
    #[must_use]
    pub fn done(&self) -> usize {
        self.count(|r| matches!(r, Resumed::Done(_)))
    }

    /// How many were left alone as expired.
    #[must_use]
    pub fn expired(&self) -> usize {
        self.count(|r| matches!(r, Resumed::Expired))
    }

    /// How many are still pending.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.count(|r| matches!(r, Resumed::Pending(_)))
    }

    fn count(&self, f: impl Fn(&Resumed) -> bool) -> usize {
        self.operations.iter().filter(|(_, r)| f(r)).count()
    }
}

impl Outbox {
    /// The operations whose outcome is unknown, oldest first: sent (or enqueued) and
    /// never answered, as a crash leaves them. Those past the retention window are
    /// included; [`Outbox::is_expired`] tells them apart.
    ///
    /// # Errors
    /// The journal failed.
    pub async fn pending(&self) -> Result<Vec<Operation>, OutboxError> {
        Ok(self.inner.journal.pending(RESUME_BATCH).await?)
    }

    /// Re-sends every pending operation with its original key and body through
    /// `client` (at most [`OutboxBuilder::concurrency`](super::OutboxBuilder::concurrency)
    /// at once), records each outcome, and reports what happened to each. Operations
    /// older than the retention window are reported as [`Resumed::Expired`] and not
    /// sent.
    ///
    /// ```
    /// use idemkey::client::IdempotentClientBuilder;
    /// use idemkey::client::outbox::{MemoryJournal, Outbox, OutboxExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = IdempotentClientBuilder::new(reqwest::Client::new()).without_retry_budget().build();
    /// let outbox = Outbox::new(MemoryJournal::new());
    /// // Nothing listens on port 9: the charge stays pending.
    /// let err = client.post("http://127.0.0.1:9/charges").body("{}")
    ///     .outbox(&outbox, "charge:1").send().await.expect_err("nothing listens");
    /// assert!(err.is_outcome_unknown());
    ///
    /// let report = outbox.resume(&client).await?;
    /// assert_eq!(report.pending(), 1, "still nothing listens");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The journal could not list the pending operations.
    pub async fn resume(&self, client: &ClientWithMiddleware) -> Result<ResumeReport, OutboxError> {
        let pending = self.pending().await?;
        let operations = futures_util::stream::iter(pending)
            .map(|op| async move {
                let id = op.id.clone();
                let resumed = match self.finish(client, op, None).await {
                    Ok(outcome) => Resumed::Done(outcome),
                    Err(e) if e.is_expired() => Resumed::Expired,
                    Err(e) => Resumed::Pending(e),
                };
                (id, resumed)
            })
            .buffered(self.inner.concurrency)
            .collect()
            .await;
        Ok(ResumeReport { operations })
    }

    /// Runs [`Outbox::resume`] now and then every `every` on the current tokio runtime,
    /// until the returned [`Resumer`] is dropped. Failures are logged (`tracing`) and
    /// tried again at the next turn.
    #[must_use = "the resumer stops when dropped"]
    pub fn spawn_resumer(&self, client: ClientWithMiddleware, every: Duration) -> Resumer {
        let outbox = self.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match outbox.resume(&client).await {
                    Ok(report) => {
                        for (id, resumed) in &report.operations {
                            match resumed {
                                Resumed::Done(_) => tracing::debug!(id, "outbox: resumed"),
                                Resumed::Expired => tracing::warn!(
                                    id,
                                    "outbox: operation past the retention window, not re-sent"
                                ),
                                Resumed::Pending(e) => {
                                    tracing::info!(id, error = %e, "outbox: still pending");
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "outbox: resume failed"),
                }
            }
        });
        Resumer { task }
    }
}

/// The background resumer of [`Outbox::spawn_resumer`]; stops when dropped.
#[derive(Debug)]
pub struct Resumer {
    task: JoinHandle<()>,
}

impl Resumer {
    /// Stops the resumer (as dropping it does).
    pub fn stop(self) {}
}

impl Drop for Resumer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
