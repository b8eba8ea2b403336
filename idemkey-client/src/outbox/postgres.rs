//! The shared durable journal on PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::journal::{Enqueued, JournalError, Operation};
use super::sql::{
    DEFAULT_TABLE, OperationRow, OutcomeRow, Statements, bind_operation, bind_outcome,
    decode_operation, enqueue_on, table_name, unavailable,
};
use super::writer::{
    Backend, Reply, RoundRows, Write, Writer, answered, journal_over_writer, rounds,
};

/// A durable journal in a PostgreSQL table (feature `outbox-postgres`), for
/// applications whose instances share their outbox, or whose own data lives in
/// PostgreSQL ([`PostgresJournal::enqueue_in`]).
///
/// **Group commit**, as `SqliteJournal` does: all writes of
/// this journal (and its clones) go to one writer task, which takes every write that
/// is waiting, cuts them into batches (up to 256 writes and 16 MiB of request and
/// answer bodies each, so that a batch stays far below PostgreSQL's 1 GB limit on one
/// message; a write with a larger body is a batch of its own), runs each batch in one
/// transaction with one multi-row statement per kind of write, commits once, and only
/// then answers each caller. [`PostgresJournal::commits`] counts the commits. Reads go
/// to the pool. The table is created when the journal connects.
///
/// **A failure fails the whole batch**, as on SQLite: when a statement fails (the
/// connection is lost, the server refuses a statement), the transaction rolls back and
/// every write of the batch is answered with the error. An enqueue that fails recorded
/// nothing and the outbox sent nothing: retrying it is safe. A deferred outcome in a
/// failed batch leaves its operation pending, reported by
/// [`Journal::flush`](super::Journal::flush).
///
/// **Deferred outcomes**, as on SQLite: [`Journal::complete_deferred`](super::Journal::complete_deferred)
/// queues the outcome to the writer and returns; this journal reads it back at once, it
/// is committed with the next batch, and [`Journal::flush`](super::Journal::flush) waits
/// for it. The one ordered writer keeps the journal contract's point 6: an enqueue or
/// attempt that returned was committed after every outcome queued before it. Other
/// processes sharing the table see an outcome once it is committed.
///
/// ```no_run
/// use idemkey::client::outbox::{Outbox, PostgresJournal};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let journal = PostgresJournal::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let outbox = Outbox::new(journal);
/// # drop(outbox); Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresJournal {
    writer: Writer,
    readers: PgPool,
    sql: Arc<Statements>,
}

impl std::fmt::Debug for PostgresJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresJournal")
            .field("commits", &self.commits())
            .finish_non_exhaustive()
    }
}

/// Configures a [`PostgresJournal`]; made by [`PostgresJournal::builder`].
#[derive(Debug, Clone)]
pub struct PostgresJournalBuilder {
    url: String,
    table: String,
    max_connections: u32,
    acquire_timeout: Duration,
}

impl PostgresJournalBuilder {
    /// The table (default `idemkey_outbox`), optionally `schema.table`: letters, digits
    /// and `_` only.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The size of the connection pool (default 16).
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long a write waits for a pooled connection before it fails (default 5 s).
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Connects and creates the table if missing.
    ///
    /// # Errors
    /// The table name is invalid, the database cannot be reached, or the table cannot be
    /// created.
    pub async fn connect(self) -> Result<PostgresJournal, JournalError> {
        let table = table_name(&self.table)?;
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections.max(1))
            .acquire_timeout(self.acquire_timeout)
            .connect(&self.url)
            .await
            .map_err(|e| unavailable("connecting to PostgreSQL", e))?;
        let sql = Arc::new(Statements::new(&table, "BYTEA"));
        sqlx::raw_sql(AssertSqlSafe(sql.schema.clone()))
            .execute(&pool)
            .await
            .map_err(|e| unavailable("creating the schema", e))?;
        Ok(PostgresJournal {
            writer: Writer::spawn(PostgresWriter(pool.clone()), sql.clone()),
            readers: pool,
            sql,
        })
    }
}

impl PostgresJournal {
    /// A builder for a journal in the database at `url`.
    #[must_use]
    pub fn builder(url: impl Into<String>) -> PostgresJournalBuilder {
        PostgresJournalBuilder {
            url: url.into(),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
        }
    }

    /// Connects with the default settings and creates the table if missing.
    ///
    /// # Errors
    /// As [`PostgresJournalBuilder::connect`].
    pub async fn connect(url: impl Into<String>) -> Result<Self, JournalError> {
        Self::builder(url).connect().await
    }

    /// Transactions the writer committed so far (each batch of enqueues, attempts and
    /// outcomes is one); with the calls counted by the caller, the commits per call.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.writer.commits()
    }

    /// Records `op` inside the application's transaction `tx`, so that the
    /// application's rows and the operation commit together or not at all. The
    /// operation is delivered after the commit, by
    /// [`Outbox::deliver`](super::Outbox::deliver) or the resumer. Make `op` with
    /// [`Outbox::prepare`](super::Outbox::prepare).
    ///
    /// ```no_run
    /// use idemkey::client::outbox::{Outbox, PostgresJournal};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "postgres://postgres@127.0.0.1:5432/test";
    /// let journal = PostgresJournal::connect(url).await?;
    /// let outbox = Outbox::new(journal.clone());
    /// let app = sqlx::PgPool::connect(url).await?;
    /// let client = reqwest_middleware::ClientWithMiddleware::from(reqwest::Client::new());
    /// let op = outbox.prepare("charge:order-42", client.post("https://api.example/charges").build()?)?;
    ///
    /// let mut tx = app.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES ('order-42')").execute(&mut *tx).await?;
    /// journal.enqueue_in(&mut tx, &op).await?;
    /// tx.commit().await?;
    /// outbox.deliver(&client, "charge:order-42").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The statement failed (the transaction should then be rolled back).
    pub async fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        op: &Operation,
    ) -> Result<Enqueued, JournalError> {
        enqueue_on!(&mut **tx, &self.sql, op).await
    }
}

/// The writer's connections: a pooled one per batch, so that a lost connection costs one
/// failed batch, not the writer.
struct PostgresWriter(PgPool);

#[async_trait]
impl Backend for PostgresWriter {
    async fn run(&mut self, sql: &Statements, batch: &[Write]) -> Result<Vec<Reply>, sqlx::Error> {
        let mut tx = self.0.begin().await?;
        let answers = run_rounds(&mut tx, sql, batch).await?;
        tx.commit().await?;
        Ok(answers)
    }

    async fn close(self) {}
}

/// Runs the rounds of `batch` on `conn` (inside the batch's transaction), each round one
/// statement per kind of write (PostgreSQL takes one statement per request): the answer
/// to each write, in order.
async fn run_rounds(
    conn: &mut PgConnection,
    statements: &Statements,
    batch: &[Write],
) -> Result<Vec<Reply>, sqlx::Error> {
    let mut answers: Vec<Option<Reply>> = batch.iter().map(|_| None).collect();
    for round in rounds(batch) {
        let mut rows = RoundRows::default();
        if !round.enqueues.is_empty() {
            let mut q = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(
                statements.insert_many(Some(1), round.enqueues.len(), ""),
            ));
            for (_, op) in &round.enqueues {
                q = bind_operation!(q, OperationRow::new(op));
            }
            rows.inserted = q.fetch_all(&mut *conn).await?.into_iter().collect();
        }
        if !round.attempts.is_empty() {
            let mut q = sqlx::query_as::<_, (String, i64)>(sqlx::AssertSqlSafe(
                statements.begin_attempt_many(Some(1), round.attempts.len(), ""),
            ));
            for (_, id) in &round.attempts {
                q = q.bind(*id);
            }
            rows.attempts = q.fetch_all(&mut *conn).await?.into_iter().collect();
        }
        if !round.completes.is_empty() {
            let mut q = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(
                statements.complete_many(Some(1), round.completes.len(), ""),
            ));
            for (_, id, outcome) in &round.completes {
                q = bind_outcome!(q, *id, OutcomeRow::new(outcome));
            }
            rows.completed = q.fetch_all(&mut *conn).await?.into_iter().collect();
        }
        let existing: Vec<&str> = round
            .enqueues
            .iter()
            .map(|(_, op)| op.id.as_str())
            .filter(|id| !rows.inserted.contains(*id))
            .collect();
        if !existing.is_empty() {
            // Read within the round: what a write alone in queue order would see.
            let mut q = sqlx::query(sqlx::AssertSqlSafe(statements.get_many(
                Some(1),
                existing.len(),
                "",
            )));
            for id in &existing {
                q = q.bind(*id);
            }
            for row in q.fetch_all(&mut *conn).await? {
                let op = decode_operation(&row);
                let id: String = sqlx::Row::try_get(&row, "id")?;
                rows.existing.insert(id, op);
            }
        }
        round.answer(rows, &mut answers);
    }
    Ok(answered(answers))
}

journal_over_writer!(PostgresJournal);
