//! The shared durable journal on PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::journal::{Enqueued, Journal, JournalError, Operation, Outcome};
use super::sql::{
    DEFAULT_TABLE, OperationRow, OutcomeRow, Statements, bind_operation, bind_outcome,
    decode_operation, table_name, unavailable,
};
use crate::store::sql::sql;

/// A durable journal in a PostgreSQL table (feature `outbox-postgres`), for
/// applications whose instances share their outbox, or whose own data lives in
/// PostgreSQL ([`PostgresJournal::enqueue_in`]).
///
/// Each write is one statement, committed when it returns (PostgreSQL groups the
/// commits of concurrent sessions itself, `commit_delay` permitting).
/// [`PostgresJournal::commits`] counts them. The table is created when the journal
/// connects.
///
/// Outcomes are not deferred here: [`Journal::complete_deferred`] awaits its commit as
/// [`Journal::complete`] does (the trait's default), and [`Journal::flush`] has nothing
/// to wait for. The writes go to a pool, not through one ordered writer, so a deferred
/// outcome could commit after a later enqueue or attempt (journal contract, point 6).
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
    pool: PgPool,
    sql: Arc<Statements>,
    commits: Arc<AtomicU64>,
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
            pool,
            sql,
            commits: Arc::new(AtomicU64::new(0)),
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

    /// Write statements committed so far (enqueues, attempts, outcomes).
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
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
        enqueue_on(tx, &self.sql, op).await
    }
}

async fn enqueue_on(
    conn: &mut PgConnection,
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

#[async_trait]
impl Journal for PostgresJournal {
    async fn enqueue(&self, op: &Operation) -> Result<Enqueued, JournalError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| unavailable("enqueue", e))?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        enqueue_on(&mut conn, &self.sql, op).await
    }

    async fn begin_attempt(&self, id: &str) -> Result<Option<u32>, JournalError> {
        self.commits.fetch_add(1, Ordering::Relaxed);
        let n = sqlx::query_scalar::<_, i64>(sql(&self.sql.begin_attempt))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| unavailable("begin_attempt", e))?;
        Ok(n.map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
    }

    async fn complete(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError> {
        self.commits.fetch_add(1, Ordering::Relaxed);
        let done = bind_outcome!(
            sqlx::query(sql(&self.sql.complete)),
            id,
            OutcomeRow::new(outcome)
        )
        .execute(&self.pool)
        .await
        .map_err(|e| unavailable("complete", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn get(&self, id: &str) -> Result<Option<Operation>, JournalError> {
        let row = sqlx::query(sql(&self.sql.get))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| unavailable("get", e))?;
        row.as_ref().map(decode_operation).transpose()
    }

    async fn pending(&self, limit: usize) -> Result<Vec<Operation>, JournalError> {
        let rows = sqlx::query(sql(&self.sql.pending))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| unavailable("pending", e))?;
        rows.iter().map(decode_operation).collect()
    }
}
