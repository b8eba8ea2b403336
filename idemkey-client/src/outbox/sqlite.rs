//! The embedded durable journal on SQLite, with group commit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, Row, Sqlite, Transaction};

use super::journal::{Enqueued, JournalError, Operation};
use super::sql::{
    DEFAULT_TABLE, OperationRow, OutcomeRow, Statements, bind_operation, bind_outcome,
    decode_operation, enqueue_on, table_name, unavailable,
};
use super::writer::{
    Backend, MAX_BATCH, Reply, Round, RoundRows, Write, Writer, answered, journal_over_writer,
    rounds,
};

/// A durable journal in one SQLite file (feature `outbox-sqlite`): the embedded
/// default.
///
/// The file is opened in WAL mode with `synchronous = FULL`: an operation is on disk
/// before [`Journal::enqueue`](super::Journal::enqueue) returns, so before the first byte of its request goes out,
/// and it survives a crash of the process or of the machine.
///
/// **Group commit.** All writes go to one writer task on one connection. It takes every
/// write that is waiting, cuts them into batches (up to 256 writes and 16 MiB of request
/// and answer bodies each; a write with a larger body is a batch of its own, never
/// refused for its size), runs each batch in one transaction with one multi-row
/// statement per kind of write (all the enqueues in one `INSERT`, all the outcomes in
/// one `UPDATE .. FROM (VALUES ..)`), commits once (one WAL sync), and only then answers
/// each caller. One caller alone pays one commit per write; many concurrent callers
/// share commits and statements, so that the cost per call falls well under one synced
/// commit. [`SqliteJournal::commits`] counts the commits.
///
/// **A failure fails the whole batch.** When a statement of a batch fails (the disk is
/// full, another process holds the file past the busy timeout, a body is over SQLite's
/// length limit), its transaction rolls back and every write of the batch is answered
/// with that error, also those that would have succeeded alone. Each caller sees its own
/// call's [`JournalError`]: an enqueue that fails recorded nothing, and the outbox sends
/// nothing ([`OutboxError::is_journal`](super::OutboxError::is_journal)), so retrying it
/// (the same id, so the same key) is safe. An awaited attempt or outcome that fails
/// changed nothing: the operation stays as it was. A deferred outcome in a failed batch
/// leaves its operation pending; [`Journal::flush`](super::Journal::flush) reports it and
/// a resume finishes it.
///
/// **Deferred outcomes.** [`Journal::complete_deferred`](super::Journal::complete_deferred) (what the outbox records an
/// answer with) queues the outcome to the writer and returns without waiting for its
/// commit: the caller gets its answer one synced commit sooner. Reads of this journal see
/// the queued outcome at once (read-your-writes); it is on disk after the next group
/// commit, and [`Journal::flush`](super::Journal::flush) waits for it. A crash before then leaves the operation
/// pending, and a resume gets the server's replay with the same key (see the
/// [journal contract](super::Journal), point 6). Because every write goes through the one
/// writer in order, an enqueue or attempt that returned was committed after every
/// outcome queued before it.
///
/// Reads ([`Journal::get`](super::Journal::get), [`Journal::pending`](super::Journal::pending)) use a pool of their own. With
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
    writer: Writer,
    readers: SqlitePool,
    sql: Arc<Statements>,
    path: PathBuf,
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
        // Room for everything a batch script sends back (a row per write, a result per
        // statement), so that the worker thread never waits for the writer to read.
        let mut writer =
            SqliteConnection::connect_with(&options.clone().row_buffer_size(6 * MAX_BATCH))
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
        Ok(SqliteJournal {
            writer: Writer::spawn(SqliteWriter(writer), sql.clone()),
            readers,
            sql,
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
    /// `synchronous = FULL`); with [`Journal::enqueue`](super::Journal::enqueue) and [`Journal::complete`](super::Journal::complete)
    /// calls counted by the caller, the commits per call.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.writer.commits()
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
        enqueue_on!(&mut **tx, &self.sql, op).await
    }
}

/// The writer's connection. A batch is one script, `BEGIN IMMEDIATE; ..; COMMIT`, sent
/// to sqlx's SQLite worker thread in one request: each request is a hop to that thread,
/// and on a busy machine each hop waits for the thread to be scheduled, so one per batch
/// instead of one per statement. `BEGIN IMMEDIATE` takes the file's write lock at once
/// (waiting up to the busy timeout for the application's transactions).
struct SqliteWriter(SqliteConnection);

/// Batches of at most this many writes keep their script prepared.
const KEPT_PREPARED: usize = 4;

/// What leads each row of a batch script: which statement returned it, and its round.
const EXISTING: i64 = 0;
const INSERTED: i64 = 1;
const ATTEMPTED: i64 = 2;
const COMPLETED: i64 = 3;

/// The script of a batch over `rounds`, its parameters anonymous (`?`) and bound in
/// script order by [`SqliteWriter::run`]: per round, the enqueued ids, the enqueues'
/// rows, the attempts' ids, the outcomes' rows. Each round reads the enqueued ids that
/// exist before inserting, so an enqueue that finds its id gets the operation as it was
/// before the round.
fn script(sql: &Statements, rounds: &[Round<'_>]) -> String {
    let mut script = String::from("BEGIN IMMEDIATE;\n");
    for (r, round) in rounds.iter().enumerate() {
        let mut push = |statement: String| {
            script.push_str(&statement);
            script.push_str(";\n");
        };
        let n = round.enqueues.len();
        if n > 0 {
            push(sql.get_many(None, n, &format!("{EXISTING} AS k, {r} AS r, ")));
            push(sql.insert_many(None, n, &format!("{INSERTED}, {r}, ")));
        }
        if !round.attempts.is_empty() {
            push(sql.begin_attempt_many(
                None,
                round.attempts.len(),
                &format!("{ATTEMPTED}, {r}, "),
            ));
        }
        if !round.completes.is_empty() {
            push(sql.complete_many(None, round.completes.len(), &format!("{COMPLETED}, {r}, ")));
        }
    }
    script.push_str("COMMIT;");
    script
}

/// The answer to each write of the batch whose script returned `rows` (committed).
fn answers(rounds: &[Round<'_>], len: usize, rows: &[SqliteRow]) -> Vec<Reply> {
    let mut seen: Vec<RoundRows> = rounds.iter().map(|_| RoundRows::default()).collect();
    for row in rows {
        let (Ok(k), Ok(r), Ok(id)) = (
            row.try_get::<i64, _>(0),
            row.try_get::<i64, _>(1),
            row.try_get::<String, _>(2),
        ) else {
            continue;
        };
        let Some(round) = usize::try_from(r).ok().and_then(|r| seen.get_mut(r)) else {
            continue;
        };
        match k {
            EXISTING => {
                round.existing.insert(id, decode_operation(row));
            }
            INSERTED => {
                round.inserted.insert(id);
            }
            ATTEMPTED => {
                if let Ok(n) = row.try_get::<i64, _>(3) {
                    round.attempts.insert(id, n);
                }
            }
            COMPLETED => {
                round.completed.insert(id);
            }
            _ => {}
        }
    }
    let mut answers: Vec<Option<Reply>> = (0..len).map(|_| None).collect();
    for (round, rows) in rounds.iter().zip(seen) {
        round.answer(rows, &mut answers);
    }
    answered(answers)
}

#[async_trait]
impl Backend for SqliteWriter {
    async fn run(&mut self, sql: &Statements, batch: &[Write]) -> Result<Vec<Reply>, sqlx::Error> {
        let rounds = rounds(batch);
        // The scripts of small batches recur (a lone caller's enqueue, its outcome, the
        // two together) and are kept prepared; a large batch's script rarely recurs, so
        // it is prepared for the one use and takes no slot in the statement cache.
        let mut q = sqlx::query(AssertSqlSafe(script(sql, &rounds)))
            .persistent(batch.len() <= KEPT_PREPARED);
        for round in &rounds {
            for (_, op) in &round.enqueues {
                q = q.bind(op.id.as_str());
            }
            for (_, op) in &round.enqueues {
                q = bind_operation!(q, OperationRow::new(op));
            }
            for (_, id) in &round.attempts {
                q = q.bind(*id);
            }
            for (_, id, outcome) in &round.completes {
                q = bind_outcome!(q, *id, OutcomeRow::new(outcome));
            }
        }
        match q.fetch_all(&mut self.0).await {
            Ok(rows) => Ok(answers(&rounds, batch.len(), &rows)),
            Err(e) => {
                // The script stopped inside its transaction (or before it began).
                let _ = sqlx::raw_sql(AssertSqlSafe("ROLLBACK"))
                    .execute(&mut self.0)
                    .await;
                Err(e)
            }
        }
    }

    async fn close(self) {
        let _ = self.0.close().await;
    }
}

journal_over_writer!(SqliteJournal);
