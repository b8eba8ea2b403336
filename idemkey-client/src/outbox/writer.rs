//! The group-commit writer the SQL journals (SQLite, PostgreSQL) share.
//!
//! Every write of a journal goes to one writer task, in order. The task takes every
//! write that is waiting (up to [`MAX_BATCH`] writes, cut into batches of at most
//! [`MAX_BATCH_BYTES`] body bytes), runs each batch in one transaction with one
//! multi-row statement per kind of write (see [`Round`]), commits once, and only then
//! answers each caller. A failing statement fails its whole batch: the transaction
//! rolls back and every write in it is answered with the error. A deferred outcome is
//! answered at once by the journal and committed with the next batch; [`Queued`] is
//! what this process reads meanwhile.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::journal::{Enqueued, JournalError, Operation, Outcome};
use super::sql::Statements;

/// The most writes committed together in one transaction.
pub(crate) const MAX_BATCH: usize = 256;

/// The most body bytes (request bodies of enqueues, answer bodies of outcomes)
/// committed together in one transaction, 16 MiB. A multi-row statement carries every
/// row's body in one message, and PostgreSQL refuses a message over 1 GB: without this
/// bound, 256 concurrent enqueues of 5 MB bodies would form one batch that fails for all
/// of them. A write larger than this goes in a batch of its own (never refused here for
/// its size).
pub(crate) const MAX_BATCH_BYTES: usize = 16 << 20;

/// One write, as queued to the writer.
pub(crate) enum Write {
    Enqueue(Box<Operation>, oneshot::Sender<Reply>),
    BeginAttempt(String, oneshot::Sender<Reply>),
    /// Without a reply: a deferred outcome, nobody waits for it.
    Complete(String, Box<Outcome>, Option<oneshot::Sender<Reply>>),
    /// Answered once every write queued before it is committed (or failed).
    Flush(oneshot::Sender<Reply>),
}

impl Write {
    fn reply(self) -> Option<oneshot::Sender<Reply>> {
        match self {
            Write::Enqueue(_, r) | Write::BeginAttempt(_, r) | Write::Flush(r) => Some(r),
            Write::Complete(_, _, r) => r,
        }
    }

    /// The body bytes this write carries to the database.
    fn body_bytes(&self) -> usize {
        match self {
            Write::Enqueue(op, _) => op.body.len(),
            Write::Complete(_, outcome, _) => outcome.body.len(),
            Write::BeginAttempt(..) | Write::Flush(_) => 0,
        }
    }

    fn id(&self) -> Option<&str> {
        match self {
            Write::Enqueue(op, _) => Some(&op.id),
            Write::BeginAttempt(id, _) | Write::Complete(id, _, _) => Some(id),
            Write::Flush(_) => None,
        }
    }
}

/// The writer's answer to one write.
pub(crate) enum Reply {
    Flushed,
    Enqueued(Enqueued),
    Attempts(Option<u32>),
    Completed(bool),
    Failed(JournalError),
}

/// Writes of one batch that touch distinct operations, grouped by kind: the `k`-th
/// write of each operation in the batch goes to round `k`. Writes on distinct rows
/// commute, so running a round as one statement per kind gives every write the answer
/// it would get run alone in queue order; rounds run in order.
#[derive(Default)]
pub(crate) struct Round<'a> {
    /// Position in the batch, operation.
    pub(crate) enqueues: Vec<(usize, &'a Operation)>,
    /// Position in the batch, operation id.
    pub(crate) attempts: Vec<(usize, &'a str)>,
    /// Position in the batch, operation id, outcome.
    pub(crate) completes: Vec<(usize, &'a str, &'a Outcome)>,
}

/// The rounds of `batch` (which holds no flush), in order.
pub(crate) fn rounds(batch: &[Write]) -> Vec<Round<'_>> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(batch.len());
    let mut rounds: Vec<Round<'_>> = Vec::new();
    for (i, write) in batch.iter().enumerate() {
        let Some(id) = write.id() else { continue };
        let k = seen.entry(id).or_insert(0);
        if rounds.len() <= *k {
            rounds.push(Round::default());
        }
        let round = &mut rounds[*k];
        *k += 1;
        match write {
            Write::Enqueue(op, _) => round.enqueues.push((i, &**op)),
            Write::BeginAttempt(id, _) => round.attempts.push((i, id.as_str())),
            Write::Complete(id, outcome, _) => round.completes.push((i, id.as_str(), &**outcome)),
            Write::Flush(_) => {}
        }
    }
    rounds
}

/// What the database said of one round's writes, by operation id.
#[derive(Default)]
pub(crate) struct RoundRows {
    /// Enqueued operations whose id existed before the round, as stored (or why they
    /// could not be read).
    pub(crate) existing: HashMap<String, Result<Operation, JournalError>>,
    /// Enqueued operations inserted by the round.
    pub(crate) inserted: HashSet<String>,
    /// Attempts so far of the operations whose attempt began.
    pub(crate) attempts: HashMap<String, i64>,
    /// Operations whose outcome was recorded.
    pub(crate) completed: HashSet<String>,
}

impl Round<'_> {
    /// Answers each write of this round (at its position in `answers`) from what the
    /// database said of it.
    pub(crate) fn answer(&self, mut rows: RoundRows, answers: &mut [Option<Reply>]) {
        for (i, op) in &self.enqueues {
            answers[*i] = Some(if rows.inserted.contains(&op.id) {
                Reply::Enqueued(Enqueued::Inserted)
            } else {
                match rows.existing.remove(&op.id) {
                    Some(Ok(found)) => Reply::Enqueued(Enqueued::Existing(Box::new(found))),
                    Some(Err(e)) => Reply::Failed(e),
                    None => Reply::Failed(JournalError::corrupt(format!(
                        "outbox journal: operation {:?} was neither inserted nor found",
                        op.id
                    ))),
                }
            });
        }
        for (i, id) in &self.attempts {
            answers[*i] = Some(Reply::Attempts(
                rows.attempts
                    .get(*id)
                    .map(|n| u32::try_from(*n).unwrap_or(u32::MAX)),
            ));
        }
        for (i, id, _) in &self.completes {
            answers[*i] = Some(Reply::Completed(rows.completed.contains(*id)));
        }
    }
}

/// The answers to a batch's writes, one per write, from what its rounds filled in (a
/// write left without one is answered with an error, never silently).
pub(crate) fn answered(answers: Vec<Option<Reply>>) -> Vec<Reply> {
    answers
        .into_iter()
        .map(|a| {
            a.unwrap_or_else(|| {
                Reply::Failed(JournalError::corrupt(
                    "outbox journal: the writer lost a write's answer",
                ))
            })
        })
        .collect()
}

/// Runs one batch in one transaction on one database.
#[async_trait]
pub(crate) trait Backend: Send + 'static {
    /// Runs `batch` (no flush in it) in one transaction and commits it: the answer to
    /// each write, in order. An error means nothing of the batch was kept.
    async fn run(&mut self, sql: &Statements, batch: &[Write]) -> Result<Vec<Reply>, sqlx::Error>;

    /// The queue is closed and drained.
    async fn close(self);
}

/// A journal's handle on its writer task, and what it queued and has not committed.
#[derive(Clone)]
pub(crate) struct Writer {
    writes: mpsc::UnboundedSender<Write>,
    commits: Arc<AtomicU64>,
    queued: Arc<Queued>,
}

impl Writer {
    /// Starts the writer task over `backend` on the current tokio runtime. It ends when
    /// every handle is gone and the queue is drained (so dropping the journal loses no
    /// queued outcome; a runtime shutdown or a crash does).
    pub(crate) fn spawn(backend: impl Backend, sql: Arc<Statements>) -> Self {
        let (writes, queue) = mpsc::unbounded_channel();
        let commits = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(Queued::default());
        tokio::spawn(write_loop(
            backend,
            queue,
            sql,
            commits.clone(),
            queued.clone(),
        ));
        Self {
            writes,
            commits,
            queued,
        }
    }

    /// Transactions committed so far.
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    async fn write(&self, write: impl FnOnce(oneshot::Sender<Reply>) -> Write) -> Reply {
        let (tx, rx) = oneshot::channel();
        if self.writes.send(write(tx)).is_err() {
            return Reply::Failed(stopped(""));
        }
        rx.await.unwrap_or_else(|_| Reply::Failed(stopped("")))
    }

    pub(crate) async fn enqueue(&self, op: &Operation) -> Result<Enqueued, JournalError> {
        match self
            .write(|r| Write::Enqueue(Box::new(op.clone()), r))
            .await
        {
            Reply::Enqueued(e) => Ok(e),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn begin_attempt(&self, id: &str) -> Result<Option<u32>, JournalError> {
        match self.write(|r| Write::BeginAttempt(id.to_owned(), r)).await {
            Reply::Attempts(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn complete(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError> {
        match self
            .write(|r| Write::Complete(id.to_owned(), Box::new(outcome.clone()), Some(r)))
            .await
        {
            Reply::Completed(done) => Ok(done),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) fn complete_deferred(
        &self,
        id: &str,
        outcome: &Outcome,
    ) -> Result<bool, JournalError> {
        if !self.queued.insert(id, outcome) {
            return Ok(false);
        }
        let write = Write::Complete(id.to_owned(), Box::new(outcome.clone()), None);
        if self.writes.send(write).is_err() {
            self.queued.settled(&[id.to_owned()], None);
            return Err(stopped(
                "; the outcome was not recorded and the operation stays pending",
            ));
        }
        Ok(true)
    }

    pub(crate) async fn flush(&self) -> Result<(), JournalError> {
        match self.write(Write::Flush).await {
            Reply::Flushed => self.queued.take_failures(),
            other => Err(unexpected(other)),
        }
    }

    /// `read` (the stored operation `id`) with its queued outcome. The queue is read
    /// before the database: an outcome committed in between is then in the database, so
    /// none is missed.
    pub(crate) async fn get(
        &self,
        id: &str,
        read: impl Future<Output = Result<Option<Operation>, JournalError>>,
    ) -> Result<Option<Operation>, JournalError> {
        let queued = self.queued.get(id);
        Ok(read.await?.map(|op| Queued::overlay(queued, op)))
    }

    /// Up to `limit` pending operations from `read` (given how many to read), leaving out
    /// those whose outcome is queued. As in [`Writer::get`], the queue first.
    pub(crate) async fn pending<F, Fut>(
        &self,
        limit: usize,
        read: F,
    ) -> Result<Vec<Operation>, JournalError>
    where
        F: FnOnce(usize) -> Fut,
        Fut: Future<Output = Result<Vec<Operation>, JournalError>>,
    {
        let queued = self.queued.ids();
        let mut pending = read(limit.saturating_add(queued.len())).await?;
        pending.retain(|op| !queued.contains(&op.id));
        pending.truncate(limit);
        Ok(pending)
    }
}

fn stopped(consequence: &str) -> JournalError {
    JournalError::unavailable(
        format!("outbox journal: the writer task has stopped (its runtime shut down){consequence}"),
        "writer stopped",
    )
}

fn unexpected(reply: Reply) -> JournalError {
    match reply {
        Reply::Failed(e) => e,
        _ => JournalError::corrupt("outbox journal: the writer answered a different request"),
    }
}

/// How many of the writes whose body bytes are `sizes` (in queue order) make the next
/// batch: as many as fit in [`MAX_BATCH_BYTES`], and at least one.
fn batch_len(sizes: impl IntoIterator<Item = usize>) -> usize {
    let mut bytes = 0usize;
    let mut len = 0;
    for size in sizes {
        bytes = bytes.saturating_add(size);
        if bytes > MAX_BATCH_BYTES && len > 0 {
            break;
        }
        len += 1;
    }
    len
}

/// The writer: takes every waiting write, runs them in batches (one transaction each,
/// in order, cut by [`batch_len`]), answers each write once its batch is committed,
/// then the flushes.
async fn write_loop(
    mut backend: impl Backend,
    mut queue: mpsc::UnboundedReceiver<Write>,
    sql: Arc<Statements>,
    commits: Arc<AtomicU64>,
    queued: Arc<Queued>,
) {
    let mut received = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut received, MAX_BATCH).await > 0 {
        let (flushes, mut writes): (Vec<Write>, Vec<Write>) = received
            .drain(..)
            .partition(|w| matches!(w, Write::Flush(_)));
        while !writes.is_empty() {
            let rest = writes.split_off(batch_len(writes.iter().map(Write::body_bytes)));
            commit(&mut backend, &sql, &commits, &queued, writes).await;
            writes = rest;
        }
        for flush in flushes {
            if let Some(reply) = flush.reply() {
                let _ = reply.send(Reply::Flushed);
            }
        }
    }
    backend.close().await;
}

/// Runs `batch` (not empty, no flush in it) in one transaction and answers each of its
/// writes: with its answer once committed, or all with the error.
async fn commit(
    backend: &mut impl Backend,
    sql: &Statements,
    commits: &AtomicU64,
    queued: &Queued,
    batch: Vec<Write>,
) {
    let deferred: Vec<String> = batch
        .iter()
        .filter_map(|w| match w {
            Write::Complete(id, _, None) => Some(id.clone()),
            _ => None,
        })
        .collect();
    match backend.run(sql, &batch).await {
        Ok(answers) => {
            commits.fetch_add(1, Ordering::Relaxed);
            queued.settled(&deferred, None);
            for (write, answer) in batch.into_iter().zip(answers) {
                if let Some(reply) = write.reply() {
                    let _ = reply.send(answer);
                }
            }
        }
        Err(e) => {
            let message = e.to_string();
            queued.settled(&deferred, Some(&message));
            for write in batch {
                if let Some(reply) = write.reply() {
                    let _ = reply.send(Reply::Failed(JournalError::unavailable(
                        format!(
                            "outbox journal: the commit failed ({message}); nothing \
                             of this write was kept"
                        ),
                        message.clone(),
                    )));
                }
            }
        }
    }
}

/// The outcomes queued by [`Writer::complete_deferred`] and not committed yet (what
/// this process reads meanwhile), and what went wrong with those that could not be.
#[derive(Default)]
struct Queued {
    outcomes: Mutex<HashMap<String, Outcome>>,
    failures: Mutex<Vec<String>>,
}

impl Queued {
    fn outcomes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Outcome>> {
        // Every change is one insert or remove: a poisoned lock is still consistent.
        self.outcomes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `outcome` for `id`: `false` when one is queued already (the first stays).
    fn insert(&self, id: &str, outcome: &Outcome) -> bool {
        let mut outcomes = self.outcomes();
        if outcomes.contains_key(id) {
            return false;
        }
        outcomes.insert(id.to_owned(), outcome.clone());
        true
    }

    fn get(&self, id: &str) -> Option<Outcome> {
        self.outcomes().get(id).cloned()
    }

    fn ids(&self) -> HashSet<String> {
        self.outcomes().keys().cloned().collect()
    }

    /// The writer is done with `ids`: committed, or failed with `failure`.
    fn settled(&self, ids: &[String], failure: Option<&str>) {
        if ids.is_empty() {
            return;
        }
        let mut outcomes = self.outcomes();
        for id in ids {
            outcomes.remove(id);
        }
        drop(outcomes);
        if let Some(message) = failure {
            tracing::warn!(
                operations = ids.len(),
                error = message,
                "outbox journal: queued outcomes could not be committed; their operations \
                 stay pending and a resume finishes them"
            );
            self.failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("{} outcome(s): {message}", ids.len()));
        }
    }

    /// The failures since the last call, as one error.
    fn take_failures(&self) -> Result<(), JournalError> {
        let failures =
            std::mem::take(&mut *self.failures.lock().unwrap_or_else(PoisonError::into_inner));
        if failures.is_empty() {
            return Ok(());
        }
        Err(JournalError::unavailable(
            format!(
                "outbox journal: queued outcomes could not be committed ({}); their \
                 operations stay pending: run Outbox::resume to finish them (the server \
                 replays what it executed)",
                failures.join("; ")
            ),
            "deferred outcome not committed",
        ))
    }

    /// `op` as this process sees it: with its queued outcome while the row is pending.
    fn overlay(queued: Option<Outcome>, mut op: Operation) -> Operation {
        if op.outcome.is_none() {
            op.outcome = queued;
        }
        op
    }
}

/// Implements [`Journal`](super::Journal) for `$journal`, a struct with a `writer`
/// ([`Writer`]), its `sql` ([`Statements`]) and a pool of `readers`: every write through
/// the writer, every read from the pool with the queued outcomes laid over it. One
/// place for the SQL journals.
macro_rules! journal_over_writer {
    ($journal:ty) => {
        #[async_trait::async_trait]
        impl $crate::outbox::Journal for $journal {
            async fn enqueue(
                &self,
                op: &$crate::outbox::Operation,
            ) -> Result<$crate::outbox::Enqueued, $crate::outbox::JournalError> {
                self.writer.enqueue(op).await
            }

            async fn begin_attempt(
                &self,
                id: &str,
            ) -> Result<Option<u32>, $crate::outbox::JournalError> {
                self.writer.begin_attempt(id).await
            }

            async fn complete(
                &self,
                id: &str,
                outcome: &$crate::outbox::Outcome,
            ) -> Result<bool, $crate::outbox::JournalError> {
                self.writer.complete(id, outcome).await
            }

            async fn complete_deferred(
                &self,
                id: &str,
                outcome: &$crate::outbox::Outcome,
            ) -> Result<bool, $crate::outbox::JournalError> {
                self.writer.complete_deferred(id, outcome)
            }

            async fn flush(&self) -> Result<(), $crate::outbox::JournalError> {
                self.writer.flush().await
            }

            async fn get(
                &self,
                id: &str,
            ) -> Result<Option<$crate::outbox::Operation>, $crate::outbox::JournalError> {
                use $crate::outbox::sql::{decode_operation, unavailable};
                self.writer
                    .get(id, async {
                        let row = sqlx::query($crate::outbox::sql::sql(&self.sql.get))
                            .bind(id)
                            .fetch_optional(&self.readers)
                            .await
                            .map_err(|e| unavailable("get", e))?;
                        row.as_ref().map(decode_operation).transpose()
                    })
                    .await
            }

            async fn pending(
                &self,
                limit: usize,
            ) -> Result<Vec<$crate::outbox::Operation>, $crate::outbox::JournalError> {
                use $crate::outbox::sql::{decode_operation, unavailable};
                self.writer
                    .pending(limit, |n| async move {
                        let rows = sqlx::query($crate::outbox::sql::sql(&self.sql.pending))
                            .bind(i64::try_from(n).unwrap_or(i64::MAX))
                            .fetch_all(&self.readers)
                            .await
                            .map_err(|e| unavailable("pending", e))?;
                        rows.iter().map(decode_operation).collect()
                    })
                    .await
            }
        }
    };
}
pub(crate) use journal_over_writer;

#[cfg(test)]
mod tests {
    use super::{MAX_BATCH_BYTES, batch_len};

    const MIB: usize = 1 << 20;

    /// The lengths of the batches `sizes` is cut into.
    fn batches(mut sizes: &[usize]) -> Vec<usize> {
        let mut lens = Vec::new();
        while !sizes.is_empty() {
            let len = batch_len(sizes.iter().copied());
            lens.push(len);
            sizes = &sizes[len..];
        }
        lens
    }

    #[test]
    fn small_writes_share_one_batch() {
        assert_eq!(batches(&[100; 256]), [256]);
        assert_eq!(batches(&[0, 0, 0]), [3]);
        assert_eq!(batches(&[MAX_BATCH_BYTES]), [1]);
    }

    #[test]
    fn a_batch_stops_before_the_write_that_would_pass_the_budget() {
        assert_eq!(batches(&[6 * MIB; 5]), [2, 2, 1]);
        assert_eq!(
            batches(&[MAX_BATCH_BYTES / 2, MAX_BATCH_BYTES / 2, 1]),
            [2, 1]
        );
    }

    #[test]
    fn a_write_over_the_budget_goes_alone_and_is_not_refused() {
        assert_eq!(batches(&[MAX_BATCH_BYTES + 1]), [1]);
        assert_eq!(batches(&[1, 3 * MAX_BATCH_BYTES, 1]), [1, 1, 1]);
        assert_eq!(batches(&[usize::MAX, usize::MAX]), [1, 1]);
    }
}
