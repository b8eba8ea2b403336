//! The embedded durable journal on SQLite, with group commit.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, Sqlite, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::journal::{Enqueued, Journal, JournalError, Operation, Outcome};
use super::sql::{
    DEFAULT_TABLE, OperationRow, OutcomeRow, Statements, bind_operation, bind_outcome,
    decode_operation, table_name, unavailable,
};
use crate::store::sql::sql;

/// The most writes committed together in one transaction.
const MAX_BATCH: usize = 256;

/// A durable journal in one SQLite file (feature `outbox-sqlite`): the embedded
/// default.
///
/// The file is opened in WAL mode with `synchronous = FULL`: an operation is on disk
/// before [`Journal::enqueue`] returns, so before the first byte of its request goes out,
/// and it survives a crash of the process or of the machine.
///
/// **Group commit.** All writes go to one writer task on one connection. It takes every
/// write that is waiting (up to 256), runs them in one transaction, commits once (one
/// WAL sync), and only then answers each caller. One caller alone pays one commit per
/// write; many concurrent callers share commits, so that the cost per call falls well
/// under one synced commit. [`SqliteJournal::commits`] counts the commits.
///
/// **Deferred outcomes.** [`Journal::complete_deferred`] (what the outbox records an
/// answer with) queues the outcome to the writer and returns without waiting for its
/// commit: the caller gets its answer one synced commit sooner. Reads of this journal see
/// the queued outcome at once (read-your-writes); it is on disk after the next group
/// commit, and [`Journal::flush`] waits for it. A crash before then leaves the operation
/// pending, and a resume gets the server's replay with the same key (see the
/// [journal contract](Journal), point 6). Because every write goes through the one
/// writer in order, an enqueue or attempt that returned was committed after every
/// outcome queued before it.
///
/// Reads ([`Journal::get`], [`Journal::pending`]) use a pool of their own. With
/// [`SqliteJournal::enqueue_in`] an operation is written inside the application's own
/// transaction on the same file (the transactional outbox).
///
/// ```
/// use idemkey::client::outbox::{Outbox, SqliteJournal};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("idemkey-outbox-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let journal = SqliteJournal::open(dir.join("outbox.db")).await?;
/// let outbox = Outbox::new(journal);
/// # drop(outbox); std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteJournal {
    writes: mpsc::UnboundedSender<Write>,
    readers: SqlitePool,
    sql: Arc<Statements>,
    commits: Arc<AtomicU64>,
    queued: Arc<Queued>,
    path: PathBuf,
}

/// The outcomes queued by [`Journal::complete_deferred`] and not committed yet (what
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

impl std::fmt::Debug for SqliteJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteJournal")
            .field("path", &self.path)
            .field("commits", &self.commits())
            .finish_non_exhaustive()
    }
}

/// Configures a [`SqliteJournal`]; made by [`SqliteJournal::builder`].
#[derive(Debug, Clone)]
pub struct SqliteJournalBuilder {
    path: PathBuf,
    table: String,
    busy_timeout: Duration,
}

impl SqliteJournalBuilder {
    /// The table (default `idemkey_outbox`): letters, digits and `_` only.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long a write waits for another process's write on the same file (the
    /// application's own transactions) before it fails (default 5 s).
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Opens the file (creating it if needed), creates the table if missing, and
    /// starts the writer task on the current tokio runtime.
    ///
    /// # Errors
    /// The table name is invalid, or the file cannot be opened or written.
    pub async fn open(self) -> Result<SqliteJournal, JournalError> {
        let table = table_name(&self.table)?;
        let options = SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(self.busy_timeout);
        let opening = |e| unavailable(&format!("opening {}", self.path.display()), e);
        let mut writer = SqliteConnection::connect_with(&options)
            .await
            .map_err(opening)?;
        let sql = Arc::new(Statements::new(&table, "BLOB"));
        let mut tx = writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| unavailable("creating the schema", e))?;
        sqlx::raw_sql(AssertSqlSafe(sql.schema.clone()))
            .execute(&mut *tx)
            .await
            .map_err(|e| unavailable("creating the schema", e))?;
        tx.commit()
            .await
            .map_err(|e| unavailable("creating the schema", e))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(self.busy_timeout)
            .connect_with(options)
            .await
            .map_err(opening)?;
        let (writes, queue) = mpsc::unbounded_channel();
        let commits = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(Queued::default());
        tokio::spawn(write_loop(
            writer,
            queue,
            sql.clone(),
            commits.clone(),
            queued.clone(),
        ));
        Ok(SqliteJournal {
            writes,
            readers,
            sql,
            commits,
            queued,
            path: self.path,
        })
    }
}

impl SqliteJournal {
    /// A builder for a journal in the file at `path`.
    #[must_use]
    pub fn builder(path: impl AsRef<Path>) -> SqliteJournalBuilder {
        SqliteJournalBuilder {
            path: path.as_ref().to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            busy_timeout: Duration::from_secs(5),
        }
    }

    /// Opens the journal in the file at `path` with the default settings.
    ///
    /// # Errors
    /// The file cannot be opened or written.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Self::builder(path).open().await
    }

    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Transactions the writer committed so far (each one WAL sync under
    /// `synchronous = FULL`); with [`Journal::enqueue`] and [`Journal::complete`]
    /// calls counted by the caller, the commits per call.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Records `op` inside the application's transaction `tx` on the same file, so that
    /// the application's rows and the operation commit together or not at all. The
    /// operation is delivered after the commit, by
    /// [`Outbox::deliver`](super::Outbox::deliver) or the resumer. Make `op` with
    /// [`Outbox::prepare`](super::Outbox::prepare).
    ///
    /// ```
    /// use idemkey::client::outbox::{Outbox, SqliteJournal};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("idemkey-outbox-tx-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("app.db");
    /// let journal = SqliteJournal::open(&path).await?;
    /// let outbox = Outbox::new(journal.clone());
    /// let app = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await?;
    /// sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)").execute(&app).await?;
    ///
    /// let client = reqwest_middleware::ClientWithMiddleware::from(reqwest::Client::new());
    /// let charge = client.post("http://127.0.0.1:9/v1/charges").body(r#"{"amount":100}"#).build()?;
    /// let op = outbox.prepare("charge:order-42", charge)?;
    /// let mut tx = app.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES ('order-42')").execute(&mut *tx).await?;
    /// journal.enqueue_in(&mut tx, &op).await?;
    /// tx.commit().await?;
    /// assert!(outbox.outcome("charge:order-42").await?.is_none(), "pending until delivered");
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The statement failed (the transaction should then be rolled back).
    pub async fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        op: &Operation,
    ) -> Result<Enqueued, JournalError> {
        enqueue_on(tx, &self.sql, op).await
    }

    async fn write(&self, write: impl FnOnce(oneshot::Sender<Reply>) -> Write) -> Reply {
        let (tx, rx) = oneshot::channel();
        let gone = || {
            Reply::Failed(JournalError::unavailable(
                "outbox journal: the SQLite writer task has stopped (its runtime shut down)",
                "writer stopped",
            ))
        };
        if self.writes.send(write(tx)).is_err() {
            return gone();
        }
        rx.await.unwrap_or_else(|_| gone())
    }
}

async fn enqueue_on(
    conn: &mut SqliteConnection,
    statements: &Statements,
    op: &Operation,
) -> Result<Enqueued, JournalError> {
    let inserted = bind_operation!(sqlx::query(sql(&statements.insert)), OperationRow::new(op))
        .execute(&mut *conn)
        .await
        .map_err(|e| unavailable("enqueue", e))?
        .rows_affected();
    if inserted == 1 {
        return Ok(Enqueued::Inserted);
    }
    let row = sqlx::query(sql(&statements.get))
        .bind(op.id.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| unavailable("enqueue (reading the existing operation)", e))?;
    Ok(Enqueued::Existing(Box::new(decode_operation(&row)?)))
}

enum Write {
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
}

enum Reply {
    Flushed,
    Enqueued(Enqueued),
    Attempts(Option<u32>),
    Completed(bool),
    Failed(JournalError),
}

/// The writer: takes every waiting write, runs them in one transaction, commits once,
/// answers each, then the flushes. Ends when every journal handle is gone and the queue
/// is drained (so dropping the journal loses no queued outcome; a runtime shutdown or a
/// crash does).
async fn write_loop(
    mut conn: SqliteConnection,
    mut queue: mpsc::UnboundedReceiver<Write>,
    sql: Arc<Statements>,
    commits: Arc<AtomicU64>,
    queued: Arc<Queued>,
) {
    let mut received = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut received, MAX_BATCH).await > 0 {
        let (flushes, mut batch): (Vec<Write>, Vec<Write>) = received
            .drain(..)
            .partition(|w| matches!(w, Write::Flush(_)));
        if !batch.is_empty() {
            let deferred: Vec<String> = batch
                .iter()
                .filter_map(|w| match w {
                    Write::Complete(id, _, None) => Some(id.clone()),
                    _ => None,
                })
                .collect();
            let mut replies = Vec::with_capacity(batch.len());
            let result = run_batch(&mut conn, &sql, &mut batch, &mut replies).await;
            match result {
                Ok(()) => {
                    commits.fetch_add(1, Ordering::Relaxed);
                    queued.settled(&deferred, None);
                    for (reply, answer) in replies {
                        if let Some(reply) = reply {
                            let _ = reply.send(answer);
                        }
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    queued.settled(&deferred, Some(&message));
                    for (reply, _) in replies {
                        if let Some(reply) = reply {
                            let _ = reply.send(Reply::Failed(JournalError::unavailable(
                                format!("outbox journal: the commit failed ({message}); nothing of this write was kept"),
                                message.clone(),
                            )));
                        }
                    }
                }
            }
        }
        for flush in flushes {
            if let Some(reply) = flush.reply() {
                let _ = reply.send(Reply::Flushed);
            }
        }
    }
    let _ = conn.close().await;
}

async fn run_batch(
    conn: &mut SqliteConnection,
    statements: &Statements,
    batch: &mut Vec<Write>,
    replies: &mut Vec<(Option<oneshot::Sender<Reply>>, Reply)>,
) -> Result<(), sqlx::Error> {
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(e) => {
            // The caller answers every write with the error.
            replies.extend(
                batch
                    .drain(..)
                    .map(|w| (w.reply(), Reply::Completed(false))),
            );
            return Err(e);
        }
    };
    for write in batch.drain(..) {
        let (reply, answer) = match write {
            Write::Enqueue(op, r) => (
                Some(r),
                match enqueue_on(&mut tx, statements, &op).await {
                    Ok(e) => Reply::Enqueued(e),
                    Err(e) => Reply::Failed(e),
                },
            ),
            Write::BeginAttempt(id, r) => (
                Some(r),
                match sqlx::query_scalar::<_, i64>(sql(&statements.begin_attempt))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                {
                    Ok(n) => Reply::Attempts(n.map(|n| u32::try_from(n).unwrap_or(u32::MAX))),
                    Err(e) => Reply::Failed(unavailable("begin_attempt", e)),
                },
            ),
            Write::Complete(id, outcome, r) => (
                r,
                match bind_outcome!(
                    sqlx::query(sql(&statements.complete)),
                    id,
                    OutcomeRow::new(&outcome)
                )
                .execute(&mut *tx)
                .await
                {
                    Ok(done) => Reply::Completed(done.rows_affected() == 1),
                    Err(e) => Reply::Failed(unavailable("complete", e)),
                },
            ),
            // Taken out of the batch by the writer.
            Write::Flush(r) => (Some(r), Reply::Flushed),
        };
        replies.push((reply, answer));
    }
    tx.commit().await
}

fn unexpected(reply: Reply) -> JournalError {
    match reply {
        Reply::Failed(e) => e,
        _ => JournalError::corrupt("outbox journal: the writer answered a different request"),
    }
}

#[async_trait]
impl Journal for SqliteJournal {
    async fn enqueue(&self, op: &Operation) -> Result<Enqueued, JournalError> {
        match self
            .write(|r| Write::Enqueue(Box::new(op.clone()), r))
            .await
        {
            Reply::Enqueued(e) => Ok(e),
            other => Err(unexpected(other)),
        }
    }

    async fn begin_attempt(&self, id: &str) -> Result<Option<u32>, JournalError> {
        match self.write(|r| Write::BeginAttempt(id.to_owned(), r)).await {
            Reply::Attempts(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    async fn complete(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError> {
        match self
            .write(|r| Write::Complete(id.to_owned(), Box::new(outcome.clone()), Some(r)))
            .await
        {
            Reply::Completed(done) => Ok(done),
            other => Err(unexpected(other)),
        }
    }

    async fn complete_deferred(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError> {
        if !self.queued.insert(id, outcome) {
            return Ok(false);
        }
        let write = Write::Complete(id.to_owned(), Box::new(outcome.clone()), None);
        if self.writes.send(write).is_err() {
            self.queued.settled(&[id.to_owned()], None);
            return Err(JournalError::unavailable(
                "outbox journal: the SQLite writer task has stopped (its runtime shut down); \
                 the outcome was not recorded and the operation stays pending",
                "writer stopped",
            ));
        }
        Ok(true)
    }

    async fn flush(&self) -> Result<(), JournalError> {
        match self.write(Write::Flush).await {
            Reply::Flushed => self.queued.take_failures(),
            other => Err(unexpected(other)),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<Operation>, JournalError> {
        // The queue is read before the file: an outcome committed in between is then in
        // the file, so none is missed.
        let queued = self.queued.get(id);
        let row = sqlx::query(sql(&self.sql.get))
            .bind(id)
            .fetch_optional(&self.readers)
            .await
            .map_err(|e| unavailable("get", e))?;
        let op = row.as_ref().map(decode_operation).transpose()?;
        Ok(op.map(|op| Queued::overlay(queued, op)))
    }

    async fn pending(&self, limit: usize) -> Result<Vec<Operation>, JournalError> {
        // As in `get`: the queue first. Rows whose outcome is queued are left out, so
        // read that many more.
        let queued = self.queued.ids();
        let rows = sqlx::query(sql(&self.sql.pending))
            .bind(i64::try_from(limit.saturating_add(queued.len())).unwrap_or(i64::MAX))
            .fetch_all(&self.readers)
            .await
            .map_err(|e| unavailable("pending", e))?;
        let mut pending = Vec::with_capacity(rows.len().min(limit));
        for row in &rows {
            let op = decode_operation(row)?;
            if !queued.contains(&op.id) {
                pending.push(op);
            }
        }
        pending.truncate(limit);
        Ok(pending)
    }
}
