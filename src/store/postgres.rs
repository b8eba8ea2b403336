//! The shared durable store on PostgreSQL (feature `postgres`).
//!
//! # Schema
//!
//! One table (default `idemkey_records`), created by [`PostgresStore::migrate`] or by your
//! own migrations from [`PostgresStore::schema_sql`]:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS idemkey_records (
//!     id          bytea       PRIMARY KEY,          -- RecordId: SHA-256 of scope and key
//!     fingerprint bytea       NOT NULL,
//!     token       bytea,                            -- the owner's token while in progress
//!     payload     bytea,                            -- set once completed
//!     taken_over  boolean     NOT NULL DEFAULT false,
//!     expires_at  timestamptz NOT NULL              -- lease end, or retention end
//! );
//! CREATE INDEX IF NOT EXISTS idemkey_records_expires_at ON idemkey_records (expires_at);
//! ```
//!
//! # Statements
//!
//! The claim is one `INSERT ... ON CONFLICT (id) DO UPDATE ... RETURNING`. On a conflict
//! the update keeps every column of a live record (each `SET` is `CASE WHEN <expired>
//! THEN <new> ELSE <old> END`), so the statement always returns the row as it stands
//! after the claim: the claim won when the returned token is its own, and otherwise the
//! returned row *is* the live record (in progress or completed). Unlike `DO UPDATE ...
//! WHERE <expired>` followed by a `SELECT`, this also returns a row that a concurrent
//! claim inserted after the statement began, so the claim never needs a second
//! statement. The price is a row version per claim on an existing record (a replay
//! writes a tuple; the payload itself, TOASTed, is not copied).
//!
//! Complete, renew and release are `UPDATE`/`DELETE ... WHERE id = $1 AND token = $2
//! AND payload IS NULL AND expires_at > now()`: a stale token matches no row. Every
//! time decision uses the database's `now()`, so all instances agree on one clock.
//!
//! A fresh request costs 2 statements (claim, complete), a replay 1. Expired rows stay
//! until [`Store::sweep`] deletes them (they count as absent meanwhile): schedule it,
//! e.g. every few minutes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::sql::{TableName, claim_sets, decode_claim, micros, sql, unavailable};
use super::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// The default table name.
const DEFAULT_TABLE: &str = "idemkey_records";

/// A store shared by every instance of an application through one PostgreSQL database.
///
/// Cheap to clone (clones share one connection pool). Connection failures and pool
/// timeouts are [`StoreError::is_unavailable`], so the verifier answers 503 while the
/// database is down and resumes by itself when it is back.
///
/// ```no_run
/// use idemkey::store::PostgresStore;
/// # async fn demo() -> Result<(), idemkey::store::StoreError> {
/// let store = PostgresStore::builder("postgres://app@db/payments")
///     .table("idempotency_records")
///     .connect()
///     .await?;
/// store.migrate().await?; // CREATE TABLE IF NOT EXISTS ...
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    table: TableName,
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
    fn new(t: &str) -> Self {
        let sets = claim_sets("r.expires_at <= now()", "r.");
        let held = "id = $1 AND token = $2 AND payload IS NULL AND expires_at > now()";
        Self {
            claim: format!(
                "INSERT INTO {t} AS r (id, fingerprint, token, payload, taken_over, expires_at)
VALUES ($1, $2, $3, NULL, false, now() + $4 * interval '1 microsecond')
ON CONFLICT (id) DO UPDATE SET
  {sets}
RETURNING coalesce(token = $3, false) AS won, taken_over, fingerprint, payload,
  (extract(epoch FROM expires_at - now()) * 1000000)::bigint AS remaining"
            )
            .into(),
            complete: format!(
                "UPDATE {t} SET payload = $3, token = NULL,
  expires_at = now() + $4 * interval '1 microsecond' WHERE {held}"
            )
            .into(),
            renew: format!(
                "UPDATE {t} SET expires_at = now() + $3 * interval '1 microsecond' WHERE {held}"
            )
            .into(),
            release: format!("DELETE FROM {t} WHERE {held}").into(),
            sweep: format!("DELETE FROM {t} WHERE expires_at <= now()").into(),
        }
    }
}

/// Configures a [`PostgresStore`]; made by [`PostgresStore::builder`].
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    table: String,
    max_connections: u32,
    acquire_timeout: Duration,
}

impl PostgresStoreBuilder {
    /// The table (default `idemkey_records`), optionally schema-qualified
    /// (`"billing.idempotency"`). Letters, digits and `_` only.
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

    /// How long a request waits for a pooled connection before it gets a 503
    /// (default 3 s).
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Connects (one connection now, the rest on demand). Does not create the table:
    /// call [`PostgresStore::migrate`] or run [`PostgresStore::schema_sql`] yourself.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the table name is invalid, or the URL is
    /// invalid or the database cannot be reached.
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        let table = TableName::parse(&self.table)?;
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .connect(&self.url)
            .await
            .map_err(|e| unavailable("PostgreSQL: connecting", e))?;
        let sql = Arc::new(Statements::new(table.quoted()));
        Ok(PostgresStore { pool, table, sql })
    }
}

impl PostgresStore {
    /// A builder for a store at `url` (`postgres://user[:password]@host[:port]/database`).
    #[must_use]
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.into(),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(3),
        }
    }

    /// Connects to `url` with the default settings (and does not create the table).
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the URL is invalid or the database cannot be
    /// reached.
    pub async fn connect(url: impl Into<String>) -> Result<Self, StoreError> {
        Self::builder(url).connect().await
    }

    /// The schema this store needs, as SQL (`CREATE ... IF NOT EXISTS`, so it can be
    /// run again), for applications that run their own migrations.
    #[must_use]
    pub fn schema_sql(&self) -> String {
        let (t, index) = (self.table.quoted(), self.table.index_name("expires_at"));
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
    id          bytea       PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       bytea,
    payload     bytea,
    taken_over  boolean     NOT NULL DEFAULT false,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at);"
        )
    }

    /// Creates the table and its index if they do not exist. Safe to call from every
    /// instance at start-up: concurrent calls are serialised by an advisory lock.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the database cannot be reached or refuses the
    /// DDL (for example for lack of privileges).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let err = |e| unavailable("PostgreSQL: creating the schema", e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("idemkey schema {}", self.table.quoted()))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::raw_sql(AssertSqlSafe(self.schema_sql()))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)
    }

    /// The connection pool, for health checks and administration.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn fenced(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<(), StoreError> {
        let done = query
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable(&format!("PostgreSQL: {what}"), e))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let row = sqlx::query(sql(&self.sql.claim))
            .bind(req.id.as_bytes().as_slice())
            .bind(req.fingerprint)
            .bind(req.token.to_bytes().as_slice())
            .bind(micros(req.lease))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| unavailable("PostgreSQL: claiming a record", e))?;
        decode_claim(&row, Duration::from_micros)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(sql(&self.sql.complete))
            .bind(id.as_bytes().as_slice())
            .bind(token.to_bytes().as_slice())
            .bind(payload.as_ref())
            .bind(micros(retention));
        self.fenced("completing a record", q).await
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(sql(&self.sql.renew))
            .bind(id.as_bytes().as_slice())
            .bind(token.to_bytes().as_slice())
            .bind(micros(lease));
        self.fenced("renewing a lease", q).await
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let q = sqlx::query(sql(&self.sql.release))
            .bind(id.as_bytes().as_slice())
            .bind(token.to_bytes().as_slice());
        self.fenced("releasing a record", q).await
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(sql(&self.sql.sweep))
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable("PostgreSQL: sweeping expired records", e))?;
        Ok(done.rows_affected())
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table.quoted())
            .finish_non_exhaustive()
    }
}
