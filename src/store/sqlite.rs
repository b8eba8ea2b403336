//! The embedded durable store on SQLite (feature `sqlite`).
//!
//! One file, opened in WAL mode with `synchronous = FULL`: a completed record is on
//! disk before [`Store::complete`] returns, and survives a crash of the process (or of
//! the machine) and a restart. The schema is created when the store opens.
//!
//! The statements are those of the PostgreSQL store (the claim is one
//! `INSERT ... ON CONFLICT (id) DO UPDATE ... RETURNING` that returns the live row),
//! with the time passed in: SQLite has no clock of its own, so leases and retention are
//! measured in milliseconds of this machine's wall clock (`SystemTime`), which also
//! holds across restarts. SQLite runs one writer at a time; concurrent claims wait for
//! each other (bounded by the busy timeout), which keeps claims atomic.
//!
//! Use it for a single node whose records must survive restarts; use PostgreSQL or
//! Redis when several instances share records.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::sql::{TableName, claim_sets, decode_claim, sql, unavailable};
use super::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// The default table name.
const DEFAULT_TABLE: &str = "idemkey_records";

/// A durable store in one SQLite file, for a single node.
///
/// Cheap to clone (clones share one connection pool).
///
/// ```
/// use idemkey::store::SqliteStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idemkey::store::StoreError> {
/// # let dir = std::env::temp_dir().join(format!("idemkey-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).ok();
/// let store = SqliteStore::open(dir.join("idempotency.db")).await?;
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    path: PathBuf,
    sql: Arc<Statements>,
}

struct Statements {
    claim: Arc<str>,
    complete: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    sweep: Arc<str>,
}

impl Statements {
    /// `$1` is always the time now, in milliseconds since the Unix epoch.
    fn new(t: &str) -> Self {
        let sets = claim_sets("expires_at <= $1", "");
        let held = "id = $2 AND token = $3 AND payload IS NULL AND expires_at > $1";
        Self {
            claim: format!(
                "INSERT INTO {t} (id, fingerprint, token, payload, taken_over, expires_at)
VALUES ($2, $3, $4, NULL, 0, $1 + $5)
ON CONFLICT (id) DO UPDATE SET
  {sets}
RETURNING coalesce(token = $4, 0) AS won, taken_over, fingerprint, payload,
  expires_at - $1 AS remaining"
            )
            .into(),
            complete: format!(
                "UPDATE {t} SET payload = $4, token = NULL, expires_at = $1 + $5 WHERE {held}"
            )
            .into(),
            renew: format!("UPDATE {t} SET expires_at = $1 + $4 WHERE {held}").into(),
            release: format!("DELETE FROM {t} WHERE {held}").into(),
            sweep: format!("DELETE FROM {t} WHERE expires_at <= $1").into(),
        }
    }
}

/// Configures a [`SqliteStore`]; made by [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    table: String,
    max_connections: u32,
    busy_timeout: Duration,
}

impl SqliteStoreBuilder {
    /// The table (default `idemkey_records`): letters, digits and `_` only.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The size of the connection pool (default 4; SQLite runs one writer at a time).
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long a write waits for another to finish before the request gets a 503
    /// (default 5 s).
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Opens (creating the file if needed) and creates the schema if missing.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the table name is invalid or the file cannot
    /// be opened or written.
    pub async fn open(self) -> Result<SqliteStore, StoreError> {
        let table = TableName::parse(&self.table)?;
        if table.is_qualified() {
            return Err(StoreError::unavailable(
                format!("invalid SQLite table name {:?}", self.table),
                "name the table without a schema",
            ));
        }
        let options = SqliteConnectOptions::new()
            .filename(&self.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(self.busy_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.busy_timeout)
            .connect_with(options)
            .await
            .map_err(|e| unavailable(&format!("SQLite: opening {}", self.path.display()), e))?;
        let (t, index) = (table.quoted(), table.index_name("expires_at"));
        let schema = format!(
            "CREATE TABLE IF NOT EXISTS {t} (
    id          BLOB    PRIMARY KEY,
    fingerprint BLOB    NOT NULL,
    token       BLOB,
    payload     BLOB,
    taken_over  INTEGER NOT NULL DEFAULT 0,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at);"
        );
        sqlx::raw_sql(AssertSqlSafe(schema))
            .execute(&pool)
            .await
            .map_err(|e| unavailable("SQLite: creating the schema", e))?;
        Ok(SqliteStore {
            pool,
            path: self.path,
            sql: Arc::new(Statements::new(t)),
        })
    }
}

impl SqliteStore {
    /// A builder for a store in the file at `path`.
    #[must_use]
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 4,
            busy_timeout: Duration::from_secs(5),
        }
    }

    /// Opens the store in the file at `path` with the default settings, creating the
    /// file and the schema if needed.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the file cannot be opened or written.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder(path).open().await
    }

    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes every connection (checkpointing the WAL); clones stop working.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// The connection pool, for administration.
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn fenced(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<(), StoreError> {
        let done = query
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable(&format!("SQLite: {what}"), e))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }
}

/// This machine's wall clock in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Binds the arguments every fenced write starts with: now, id, token.
fn fenced_query<'q>(
    statement: &Arc<str>,
    id: &RecordId,
    token: FencingToken,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    sqlx::query(sql(statement))
        .bind(now_ms())
        .bind(id.as_bytes().to_vec())
        .bind(token.to_bytes().to_vec())
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let row = sqlx::query(sql(&self.sql.claim))
            .bind(now_ms())
            .bind(req.id.as_bytes().to_vec())
            .bind(req.fingerprint.to_vec())
            .bind(req.token.to_bytes().to_vec())
            .bind(millis(req.lease))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| unavailable("SQLite: claiming a record", e))?;
        decode_claim(&row, Duration::from_millis)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let q = fenced_query(&self.sql.complete, id, token)
            .bind(payload.to_vec())
            .bind(millis(retention));
        self.fenced("completing a record", q).await
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let q = fenced_query(&self.sql.renew, id, token).bind(millis(lease));
        self.fenced("renewing a lease", q).await
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let q = fenced_query(&self.sql.release, id, token);
        self.fenced("releasing a record", q).await
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(sql(&self.sql.sweep))
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable("SQLite: sweeping expired records", e))?;
        Ok(done.rows_affected())
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
