//! The shared durable store on MySQL or MariaDB (feature `mysql`). See [`MySqlStore`].

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySql, MySqlArguments, MySqlConnection, MySqlPool, MySqlRow};
use sqlx::pool::PoolConnection;

use super::request_pool::RequestPool;
use super::sql::{
    DEFAULT_TABLE, SqlxRow, TableName, connect_failed, decode_claim, decode_info, fenced,
    pool_options, split_budget, sql, sweep_lock_name, takeover_sets, unavailable,
};
use super::sweeper::{Batch, batched_pass};
use super::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, Store, StoreError, SweepOptions,
    SweepReport,
};
/// The longest lease or retention, in microseconds: 100 years ("forever"), well within
/// `DATETIME`'s range (to the year 9999).
const MAX_US: i64 = 100 * 365 * 24 * 3600 * 1_000_000;
/// How often a claim on MySQL starts over when the row vanished between its `INSERT`
/// and its `SELECT` (its owner released it), before it gives up.
const CLAIM_ATTEMPTS: usize = 3;
/// "Now" in every statement: the database's clock, in UTC.
const NOW: &str = "UTC_TIMESTAMP(6)";
/// The connections of the store's budget ([`MySqlStoreBuilder::max_connections`]) kept
/// off the request path, for migrations, sweeps (a pass holds two: its lock's and its
/// batches') and the admin operations.
const OTHER_CONNECTIONS: u32 = 2;

/// How the claim returns the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    /// MariaDB 10.5+: `INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`.
    Returning,
    /// MySQL: the `INSERT` and a `SELECT` in one multi-statement query.
    InsertThenSelect,
}

/// A store shared by every instance of an application through one MySQL or MariaDB
/// database.
///
/// Cheap to clone (clones share its connections). Connection failures and pool
/// timeouts are [`StoreError::is_unavailable`], so the verifier answers 503 while the
/// database is down and resumes by itself when it is back. Below: the schema and the
/// statements.
///
/// ```no_run
/// use idemkey::store::MySqlStore;
/// # async fn demo() -> Result<(), idemkey::store::StoreError> {
/// let store = MySqlStore::builder("mysql://app:secret@db/payments")
///     .table("idempotency_records")
///     .connect()
///     .await?;
/// store.migrate().await?; // CREATE TABLE IF NOT EXISTS ...
/// # Ok(()) }
/// ```
///
/// # Schema
///
/// One InnoDB table (default `idemkey_records`), created by [`MySqlStore::migrate`] or
/// by your own migrations from [`MySqlStore::schema_sql`]:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS `idemkey_records` (
///     id          BINARY(32)  NOT NULL PRIMARY KEY, -- RecordId: SHA-256 of scope and key
///     fingerprint BLOB        NOT NULL,
///     token       BINARY(16)  NULL,                 -- the owner's token while in progress
///     payload     LONGBLOB    NULL,                 -- set once completed
///     completed   BOOLEAN     NOT NULL DEFAULT FALSE,
///     taken_over  BOOLEAN     NOT NULL DEFAULT FALSE,
///     created_at  DATETIME(6) NOT NULL,             -- when the claim was made (UTC)
///     expires_at  DATETIME(6) NOT NULL,             -- lease end, or retention end (UTC)
///     purge_at    DATETIME(6) NOT NULL,             -- end of the row's life (UTC)
///     KEY purge_at (purge_at),
///     KEY open_claims (completed, created_at)
/// ) ENGINE = InnoDB
/// ```
///
/// `purge_at` is `expires_at` for a completed record; for a claim it is the lease plus
/// the claim's retention ([`ClaimRequest::retention`]): an abandoned claim stays, so that
/// its owner can still complete it and a takeover is told apart from a fresh claim,
/// until then; [`Store::sweep`] deletes rows past it.
///
/// # Statements
///
/// The claim is one `INSERT ... ON DUPLICATE KEY UPDATE`: a new id inserts the claim;
/// on an existing id every column takes the claim's value when the row has expired
/// (`expires_at <= UTC_TIMESTAMP(6)`) and keeps its own otherwise (each assignment is
/// `CASE WHEN <expired> THEN <new> ELSE <old> END`; `expires_at`, which the condition
/// reads, is assigned last, as MySQL applies assignments left to right).
///
/// - **MariaDB 10.5 and later** end the statement with `RETURNING`, which gives the row
///   as it stands after the statement: the claim won when the row holds its token, and
///   otherwise the row is the live record (in progress or completed). One statement,
///   one round trip, for every outcome.
/// - **MySQL** has no `RETURNING`: the same `INSERT` and a `SELECT` of the row go
///   together in one multi-statement query (text protocol, binary values as hex
///   literals), still one round trip. Between the two, only the row's owner could have
///   changed it (completed or released it): the `SELECT` then reads that newer state,
///   or no row, and the claim starts over.
///
/// A claim on a live record changes nothing, but it is still an `INSERT`: it takes the
/// row's lock for the statement, so concurrent replays of one key queue briefly on it.
///
/// Complete, renew and release are `UPDATE`/`DELETE ... WHERE id = ? AND token = ? AND
/// completed = FALSE AND purge_at > UTC_TIMESTAMP(6)`: a token that another claim
/// replaced matches no row, and an owner whose lease ended but whom nobody took over
/// still records its outcome. A renewal moves `purge_at` with the lease, keeping the
/// claim's retention past it.
///
/// [`Store::inspect`] reads the row by its id; [`Store::list_in_progress`] uses the
/// index on `(completed, created_at)`; [`Store::force_release`] deletes the row.
/// Every time decision uses the database's clock (`UTC_TIMESTAMP(6)`, whatever the
/// session's time zone), so all instances agree on one clock.
///
/// A fresh request costs 2 statements (claim, complete), a replay 1 (counted with the
/// server's `Com_*` status counters in the tests). Expired rows count as absent at once;
/// schedule their deletion with [`spawn_sweeper`](super::spawn_sweeper). Payloads are
/// limited by the server's `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on
/// MySQL 8); the verifier stores responses up to 1 MiB by default.
#[derive(Clone)]
pub struct MySqlStore {
    /// Everything off the request path: migrations, sweeps, admin.
    pool: MySqlPool,
    /// The request path: claim, complete, renew, release.
    requests: RequestPool<MySqlConnection>,
    table: TableName,
    dialect: Dialect,
    sql: Arc<Statements>,
}

struct Statements {
    /// The claim's `INSERT ... ON DUPLICATE KEY UPDATE`, binding id, fingerprint,
    /// token, lease (µs) and lease plus keep (µs); `RETURNING ...` appended (binding the
    /// token again) on MariaDB.
    claim: Arc<str>,
    /// The columns `decode_claim` reads, for the row `WHERE id = ...` (MySQL dialect).
    claimed_row: String,
    complete: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    sweep: Arc<str>,
    sweep_lag: Arc<str>,
    sweep_lock: Arc<str>,
    inspect: Arc<str>,
    force_release: Arc<str>,
    list_in_progress: Arc<str>,
}

impl Statements {
    fn new(t: &str, dialect: Dialect) -> Self {
        let expired = format!("expires_at <= {NOW}");
        let sets = takeover_sets(
            &expired,
            &[
                ("taken_over", "payload IS NULL"),
                ("fingerprint", "VALUES(fingerprint)"),
                ("token", "VALUES(token)"),
                ("payload", "NULL"),
                ("completed", "FALSE"),
                ("created_at", "VALUES(created_at)"),
                ("purge_at", "VALUES(purge_at)"),
                ("expires_at", "VALUES(expires_at)"),
            ],
        );
        let columns = format!(
            "taken_over, fingerprint, payload, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) AS remaining"
        );
        let insert = format!(
            "INSERT INTO {t} (id, fingerprint, token, payload, completed, taken_over, created_at, expires_at, purge_at)
VALUES (?, ?, ?, NULL, FALSE, FALSE, {NOW}, {NOW} + INTERVAL ? MICROSECOND, {NOW} + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  {sets}"
        );
        let claim = match dialect {
            Dialect::Returning => format!("{insert}\nRETURNING token <=> ? AS won, {columns}"),
            Dialect::InsertThenSelect => insert,
        };
        // The owner writes until another claim replaces its token or the row's life ends,
        // also after its lease (contract rule 3).
        let held = format!("id = ? AND token = ? AND completed = FALSE AND purge_at > {NOW}");
        let micros_since_epoch =
            |col: &str| format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {col})");
        let info = format!(
            "NOT completed AS in_progress, fingerprint, {} AS created, {} AS expires, LENGTH(payload) AS payload_len",
            micros_since_epoch("created_at"),
            micros_since_epoch("expires_at")
        );
        Self {
            claim: claim.into(),
            claimed_row: format!("{columns} FROM {t} WHERE id = "),
            complete: format!(
                "UPDATE {t} SET payload = ?, token = NULL, completed = TRUE,
  expires_at = {NOW} + INTERVAL ? MICROSECOND, purge_at = {NOW} + INTERVAL ? MICROSECOND
WHERE {held}"
            )
            .into(),
            // `purge_at` first: it keeps the claim's keep past the old lease end, whether
            // the server assigns left to right (MySQL) or all at once (MariaDB's
            // SIMULTANEOUS_ASSIGNMENT mode).
            renew: format!(
                "UPDATE {t} SET
  purge_at = {NOW} + INTERVAL (? + TIMESTAMPDIFF(MICROSECOND, expires_at, purge_at)) MICROSECOND,
  expires_at = {NOW} + INTERVAL ? MICROSECOND
WHERE {held}"
            )
            .into(),
            release: format!("DELETE FROM {t} WHERE {held}").into(),
            // One bounded batch, the oldest first through the `purge_at` index; the order
            // is total (id breaks ties), so the statement is safe to replicate.
            sweep: format!(
                "DELETE FROM {t} WHERE purge_at <= {NOW} ORDER BY purge_at, id LIMIT ?"
            )
            .into(),
            sweep_lag: format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(purge_at), {NOW}) FROM {t} WHERE purge_at <= {NOW}"
            )
            .into(),
            // `GET_LOCK` names are server-wide and at most 64 characters: the database
            // and the table, hashed.
            sweep_lock: "SELECT GET_LOCK(CONCAT('idemkey.sweep:', \
                LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40)), 0)"
                .into(),
            inspect: format!("SELECT id, {info} FROM {t} WHERE id = ? AND purge_at > {NOW}").into(),
            force_release: format!("DELETE FROM {t} WHERE id = ? AND purge_at > {NOW}").into(),
            list_in_progress: format!(
                "SELECT id, {info} FROM {t} WHERE completed = FALSE AND purge_at > {NOW}
ORDER BY created_at, id LIMIT ?"
            )
            .into(),
        }
    }
}

/// Configures a [`MySqlStore`]; made by [`MySqlStore::builder`].
#[derive(Clone)]
pub struct MySqlStoreBuilder {
    url: String,
    table: String,
    max_connections: u32,
    acquire_timeout: Duration,
    dialect: Option<Dialect>,
}

impl std::fmt::Debug for MySqlStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: not shown.
        f.debug_struct("MySqlStoreBuilder")
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .finish_non_exhaustive()
    }
}

impl MySqlStoreBuilder {
    /// The table (default `idemkey_records`), optionally database-qualified
    /// (`"billing.idempotency"`). Letters, digits and `_` only.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The most connections the store holds to the database at once (default 16, at
    /// least 2): all but 2 serve the request path (claim, complete, renew, release),
    /// the other 2 migrations, sweeps (a pass takes two) and the admin operations,
    /// each on a pool of its own so that neither waits for the other. With 2, each
    /// side has one. Connections are opened on demand (one at
    /// [`connect`](Self::connect)); as in sqlx's pool, one idle for 10 minutes is
    /// closed and one is replaced after 30. A connection cut while its statement runs (a
    /// request cancelled) is closed at once and the server may keep its session until
    /// it notices.
    ///
    /// ```
    /// // 30 for requests, 2 for the rest.
    /// let builder = idemkey::store::MySqlStore::builder("mysql://localhost/app")
    ///     .max_connections(32);
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long a store operation waits for a connection, including the time to open
    /// one, before it fails as unavailable: the verifier answers 503 (default 3 s).
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Claims as on MySQL (an `INSERT` and a `SELECT`) whatever the server, so that
    /// the tests run that path on MariaDB too.
    #[cfg(test)]
    fn insert_then_select(mut self) -> Self {
        self.dialect = Some(Dialect::InsertThenSelect);
        self
    }

    /// Connects (one connection now, the rest on demand) and asks the server's version
    /// to choose the claim statement. Does not create the table: call
    /// [`MySqlStore::migrate`] or run [`MySqlStore::schema_sql`] yourself.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_configuration`] when the table name or the URL is invalid,
    /// `max_connections` is below 2, or the server refuses the URL's database, user
    /// or password; [`StoreError::is_unavailable`] when the server cannot be reached
    /// (the message names the host and port tried).
    pub async fn connect(self) -> Result<MySqlStore, StoreError> {
        let table = TableName::parse(&self.table)?;
        let options = sqlx::mysql::MySqlConnectOptions::from_str(&self.url)
            .map_err(|e| connect_failed("MySQL", "?", e))?;
        let at = format!("{}:{}", options.get_host(), options.get_port());
        let (for_requests, for_others) =
            split_budget("MySQL", self.max_connections, OTHER_CONNECTIONS)?;
        let requests = RequestPool::new(options.clone(), for_requests, self.acquire_timeout)?;
        requests
            .open_one()
            .await
            .map_err(|e| connect_failed("MySQL", &at, e))?;
        // Opened on demand: the request path's first connection checked the URL.
        let pool = pool_options::<MySql>()
            .max_connections(for_others)
            .acquire_timeout(self.acquire_timeout)
            .connect_lazy_with(options);
        let dialect = match self.dialect {
            Some(dialect) => dialect,
            None => {
                let what = "MySQL: reading the server version";
                let mut conn = requests.get(what).await?;
                let version = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(conn.conn())
                    .await;
                let version: String = conn.finish(version).map_err(|e| unavailable(what, e))?;
                dialect_of(&version)
            }
        };
        let sql = Arc::new(Statements::new(&table.backquoted(), dialect));
        Ok(MySqlStore {
            pool,
            requests,
            table,
            dialect,
            sql,
        })
    }
}

/// MariaDB from 10.5 has `INSERT ... RETURNING`; MySQL has not. MariaDB's version
/// is the one before `-MariaDB` (some report `5.5.5-` in front of it).
fn dialect_of(version: &str) -> Dialect {
    let Some((before, _)) = version.split_once("-MariaDB") else {
        return Dialect::InsertThenSelect;
    };
    let mut numbers = before
        .rsplit('-')
        .next()
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if (major, minor) >= (10, 5) {
        Dialect::Returning
    } else {
        Dialect::InsertThenSelect
    }
}

impl MySqlStore {
    /// The statements of the request path, exactly as this store runs them: the claim (with `RETURNING` on MariaDB) and the completion.
    /// For measuring tools that must run the store's own SQL (perf's SQL floor); not
    /// part of the API.
    #[doc(hidden)]
    #[must_use]
    pub fn request_path_sql(&self) -> (Arc<str>, Arc<str>) {
        (self.sql.claim.clone(), self.sql.complete.clone())
    }

    /// Runs the fenced write `q` (complete, renew, release) on a request connection.
    /// The connection reports rows matched, not changed (sqlx sets
    /// `CLIENT_FOUND_ROWS`): a renewal to the same instant still counts.
    async fn fenced_write(
        &self,
        what: &str,
        q: sqlx::query::Query<'_, MySql, MySqlArguments>,
    ) -> Result<(), StoreError> {
        let mut conn = self.requests.get(what).await?;
        let done = q.execute(conn.conn()).await.map(|r| r.rows_affected());
        fenced(what, conn.finish(done))
    }

    /// Removes at most `limit` expired records in one statement.
    async fn sweep_batch(&self, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(sql(&self.sql.sweep))
            .bind(limit)
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: sweeping expired records", e))?;
        Ok(done.rows_affected())
    }

    /// How long the oldest expired record still present has been expired.
    async fn sweep_lag(&self) -> Option<Duration> {
        let micros: Option<i64> = sqlx::query_scalar(sql(&self.sql.sweep_lag))
            .fetch_one(&self.pool)
            .await
            .ok()?;
        Some(micros.map_or(Duration::ZERO, |us| {
            Duration::from_micros(u64::try_from(us).unwrap_or(0))
        }))
    }

    /// The table's sweep lock (`GET_LOCK`), on a connection of its own that is closed
    /// when dropped; `None` when another session holds it.
    async fn try_sweep_lock(&self) -> Result<Option<PoolConnection<MySql>>, StoreError> {
        let failed = |e| unavailable("MySQL: taking the sweep lock", e);
        let mut conn = self.pool.acquire().await.map_err(failed)?;
        let got: Option<i64> = sqlx::query_scalar(sql(&self.sql.sweep_lock))
            .bind(sweep_lock_name(&self.table))
            .fetch_one(&mut *conn)
            .await
            .map_err(failed)?;
        if got != Some(1) {
            return Ok(None);
        }
        conn.close_on_drop();
        Ok(Some(conn))
    }

    /// A builder for a store at `url` (`mysql://user[:password]@host[:port]/database`;
    /// `mariadb://` is the same).
    #[must_use]
    pub fn builder(url: impl Into<String>) -> MySqlStoreBuilder {
        MySqlStoreBuilder {
            url: url.into(),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(3),
            dialect: None,
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

    /// The schema this store needs, as SQL (`CREATE TABLE IF NOT EXISTS`, so it can be
    /// run again), for applications that run their own migrations.
    #[must_use]
    pub fn schema_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (
    id          BINARY(32)  NOT NULL PRIMARY KEY,
    fingerprint BLOB        NOT NULL,
    token       BINARY(16)  NULL,
    payload     LONGBLOB    NULL,
    completed   BOOLEAN     NOT NULL DEFAULT FALSE,
    taken_over  BOOLEAN     NOT NULL DEFAULT FALSE,
    created_at  DATETIME(6) NOT NULL,
    expires_at  DATETIME(6) NOT NULL,
    purge_at    DATETIME(6) NOT NULL,
    KEY purge_at (purge_at),
    KEY open_claims (completed, created_at)
) ENGINE = InnoDB",
            self.table.backquoted()
        )
    }

    /// Creates the table if it does not exist. Safe to call from every instance at
    /// start-up (`CREATE TABLE IF NOT EXISTS` is atomic in MySQL and MariaDB).
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the database cannot be reached or refuses the
    /// DDL (for example for lack of privileges).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(AssertSqlSafe(self.schema_sql()))
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: creating the table", e))?;
        Ok(())
    }

    async fn claim_row(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let lease = micros(req.lease);
        let keep = lease.saturating_add(micros(req.retention)).min(2 * MAX_US);
        let what = "MySQL: claiming a record";
        let failed = |e| unavailable(what, e);
        let mut conn = self.requests.get(what).await?;
        match self.dialect {
            Dialect::Returning => {
                let row = sqlx::query(sql(&self.sql.claim))
                    .bind(req.id.as_bytes().as_slice())
                    .bind(req.fingerprint)
                    .bind(req.token.to_bytes().as_slice())
                    .bind(lease)
                    .bind(keep)
                    .bind(req.token.to_bytes().as_slice())
                    .fetch_one(conn.conn())
                    .await;
                let row = conn.finish(row).map_err(failed)?;
                decode_claim(&SqlxRow(&row), Duration::from_micros)
            }
            Dialect::InsertThenSelect => {
                // One round trip: prepared statements take one statement each, so the
                // values go in as literals (hex and integers: nothing to escape).
                let hex = |b: &[u8]| format!("X'{}'", hex::encode(b));
                let (id, token) = (hex(req.id.as_bytes()), hex(&req.token.to_bytes()));
                let mut insert = self.sql.claim.to_string();
                for value in [
                    id.clone(),
                    hex(req.fingerprint),
                    token.clone(),
                    lease.to_string(),
                    keep.to_string(),
                ] {
                    insert = insert.replacen('?', &value, 1);
                }
                let text = format!(
                    "{insert};\nSELECT token <=> {token} AS won, {}{id}",
                    self.sql.claimed_row
                );
                let mut claimed: Result<Option<MySqlRow>, sqlx::Error> = Ok(None);
                for _ in 0..CLAIM_ATTEMPTS {
                    match sqlx::raw_sql(AssertSqlSafe(text.as_str()))
                        .fetch_all(conn.conn())
                        .await
                    {
                        Ok(rows) if rows.is_empty() => {
                            // Released between the two statements: claim again.
                        }
                        found => {
                            claimed = found.map(|rows| rows.into_iter().next());
                            break;
                        }
                    }
                }
                if let Some(row) = conn.finish(claimed).map_err(failed)? {
                    return decode_claim(&SqlxRow(&row), Duration::from_micros);
                }
                Err(StoreError::unavailable(
                    format!(
                        "MySQL: record {} changed under {CLAIM_ATTEMPTS} claims in a row",
                        req.id
                    ),
                    "retry the request",
                ))
            }
        }
    }
}

/// A duration in whole microseconds, capped at 100 years.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX).min(MAX_US)
}

#[async_trait::async_trait]
impl Store for MySqlStore {
    fn kind(&self) -> &'static str {
        "mysql"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.claim_row(req).await
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(sql(&self.sql.complete))
            .bind(payload.as_ref())
            .bind(micros(retention))
            .bind(micros(retention))
            .bind(id.as_bytes().as_slice())
            .bind(token.to_bytes().as_slice());
        self.fenced_write("MySQL: completing a record", q).await
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let q = sqlx::query(sql(&self.sql.renew))
            .bind(micros(lease))
            .bind(micros(lease))
            .bind(id.as_bytes().as_slice())
            .bind(token.to_bytes().as_slice());
        self.fenced_write("MySQL: renewing a lease", q).await
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let q = sqlx::query(sql(&self.sql.release))
            .bind(id.as_bytes().as_slice())
            .bind(token.to_bytes().as_slice());
        self.fenced_write("MySQL: releasing a record", q).await
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let whole = SweepOptions::default().exclusive(false);
        Ok(self.sweep_pass(&whole).await?.removed())
    }

    async fn sweep_pass(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        // The lock's connection is closed (not returned to the pool) when dropped, so the
        // session and its `GET_LOCK` end even if the pass is cancelled.
        batched_pass(
            options,
            || self.try_sweep_lock(),
            |limit| async move { Ok(Batch::removed(self.sweep_batch(limit).await?, limit)) },
            || self.sweep_lag(),
        )
        .await
    }

    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let row = sqlx::query(sql(&self.sql.inspect))
            .bind(id.as_bytes().as_slice())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: reading a record", e))?;
        row.map(|row| decode_info(&SqlxRow(&row), Duration::from_micros))
            .transpose()
    }

    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let done = sqlx::query(sql(&self.sql.force_release))
            .bind(id.as_bytes().as_slice())
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: removing a record", e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let rows: Vec<MySqlRow> = sqlx::query(sql(&self.sql.list_in_progress))
            .bind(u64::try_from(limit).unwrap_or(u64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: listing records in progress", e))?;
        rows.iter()
            .map(|row| decode_info(&SqlxRow(row), Duration::from_micros))
            .collect()
    }
}

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.table.backquoted())
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

/// The claim statement's choice by server version, MySQL's claim run on MariaDB, and
/// the listing's index, against the MariaDB of `IDEMKEY_MYSQL_URL` (default
/// `mysql://root@127.0.0.1:3306/test`).
#[cfg(test)]
mod tests {
    use super::*;

    /// A store with a table of its own, dropped by [`Table::drop`].
    struct Table {
        store: MySqlStore,
        name: String,
    }

    impl Table {
        async fn new(builder: impl FnOnce(MySqlStoreBuilder) -> MySqlStoreBuilder) -> Self {
            let url = std::env::var("IDEMKEY_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
            let name = format!(
                "idemkey_unit_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            );
            let store = builder(MySqlStore::builder(&url).table(&name))
                .connect()
                .await
                .unwrap_or_else(|e| panic!("the MySQL/MariaDB at {url} must be reachable: {e}"));
            store.migrate().await.expect("create the table");
            Self { store, name }
        }

        async fn drop(self) {
            sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE `{}`", self.name)))
                .execute(&self.store.pool)
                .await
                .expect("drop the table");
        }
    }

    #[test]
    fn the_server_version_picks_the_claim_statement() {
        for (version, dialect) in [
            ("10.11.19-MariaDB-0+deb12u1", Dialect::Returning),
            ("11.4.2-MariaDB", Dialect::Returning),
            ("10.5.0-MariaDB", Dialect::Returning),
            ("10.4.32-MariaDB", Dialect::InsertThenSelect),
            ("5.5.5-10.11.6-MariaDB", Dialect::Returning),
            ("5.5.5-10.3.39-MariaDB", Dialect::InsertThenSelect),
            ("8.0.36", Dialect::InsertThenSelect),
            ("8.4.0-commercial", Dialect::InsertThenSelect),
            ("", Dialect::InsertThenSelect),
        ] {
            assert_eq!(dialect_of(version), dialect, "{version}");
        }
    }

    // The suite is behind the `conformance` feature.
    #[cfg(feature = "conformance")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_mysql_claim_conforms_too() {
        // MySQL's path (INSERT, then SELECT, in one query) run on MariaDB.
        let table = Table::new(MySqlStoreBuilder::insert_then_select).await;
        assert_eq!(table.store.dialect, Dialect::InsertThenSelect);
        let store = table.store.clone();
        crate::conformance::run(|| {
            let store = store.clone();
            async move { store }
        })
        .await;
        table.drop().await;
    }

    #[tokio::test]
    async fn the_index_serves_the_listing() {
        let table = Table::new(|b| b).await;
        for key in ["a", "b", "c"] {
            let claim = table
                .store
                .claim(ClaimRequest {
                    id: &RecordId::new("index", key),
                    fingerprint: b"fp",
                    token: FencingToken::random(),
                    lease: Duration::from_secs(60),
                    retention: Duration::from_secs(60),
                })
                .await
                .expect("claim");
            assert_eq!(claim, Claim::Acquired { takeover: false });
        }
        // Which index the optimizer picks for three rows is its business; that it can
        // use this one is the schema's.
        let plan: Vec<MySqlRow> = sqlx::raw_sql(AssertSqlSafe(format!(
            "EXPLAIN SELECT id FROM `{}` WHERE completed = FALSE AND purge_at > UTC_TIMESTAMP(6) \
             ORDER BY created_at, id LIMIT 10",
            table.name
        )))
        .fetch_all(&table.store.pool)
        .await
        .expect("explain");
        let keys: Option<String> =
            sqlx::Row::try_get(&plan[0], "possible_keys").expect("possible_keys");
        assert!(
            keys.as_deref().unwrap_or_default().contains("open_claims"),
            "{keys:?}"
        );
        table.drop().await;
    }
}
