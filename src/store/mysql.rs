//! The shared durable store on MySQL or MariaDB (feature `mysql`). See [`MySqlStore`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Row};

use super::pending_v2::{RecordInfo, RecordState};
use super::sql::{TableName, decode_claim, sql, takeover_sets, unavailable};
use super::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// The default table name.
const DEFAULT_TABLE: &str = "idemkey_records";
/// How long an abandoned claim (lease ended, nobody took it over) is kept past its
/// lease, until claim requests carry the retention (store contract v2).
const ABANDONED_KEEP: Duration = Duration::from_secs(24 * 3600);
/// The longest lease or retention, in microseconds: 100 years ("forever"), well within
/// `DATETIME`'s range (to the year 9999).
const MAX_US: i64 = 100 * 365 * 24 * 3600 * 1_000_000;
/// How often a claim on MySQL starts over when the row vanished between its `INSERT`
/// and its `SELECT` (its owner released it), before it gives up.
const CLAIM_ATTEMPTS: usize = 3;
/// "Now" in every statement: the database's clock, in UTC.
const NOW: &str = "UTC_TIMESTAMP(6)";

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
/// Cheap to clone (clones share one connection pool). Connection failures and pool
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
/// a retention, so that an abandoned claim stays visible (and a takeover is told apart
/// from a fresh claim) until [`Store::sweep`] deletes it.
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
/// completed = FALSE AND expires_at > UTC_TIMESTAMP(6)`: a stale token matches no row.
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
    pool: MySqlPool,
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
    inspect: Arc<str>,
    force_release: Arc<str>,
    list_in_progress: Arc<str>,
}

impl Statements {
    fn new(t: &str, dialect: Dialect, expired_owner_writes: bool) -> Self {
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
        // Store contract v2 lets an owner whose lease ended write until the record is
        // taken over or removed; today's contract fences it at the lease's end.
        let alive = if expired_owner_writes {
            "purge_at"
        } else {
            "expires_at"
        };
        let held = format!("id = ? AND token = ? AND completed = FALSE AND {alive} > {NOW}");
        let micros_since_epoch =
            |col: &str| format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {col})");
        let info = format!(
            "completed, fingerprint, {} AS created, {} AS expires, LENGTH(payload) AS payload_len",
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
            sweep: format!("DELETE FROM {t} WHERE purge_at <= {NOW}").into(),
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
    /// [`StoreError::is_unavailable`] when the table name is invalid, or the URL is
    /// invalid or the database cannot be reached.
    pub async fn connect(self) -> Result<MySqlStore, StoreError> {
        let table = TableName::parse(&self.table)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .connect(&self.url)
            .await
            .map_err(|e| unavailable("MySQL: connecting", e))?;
        let dialect = match self.dialect {
            Some(dialect) => dialect,
            None => {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&pool)
                    .await
                    .map_err(|e| unavailable("MySQL: reading the server version", e))?;
                dialect_of(&version)
            }
        };
        let sql = Arc::new(Statements::new(&table.backquoted(), dialect, false));
        Ok(MySqlStore {
            pool,
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

    /// The connection pool, for health checks and administration.
    #[must_use]
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Store contract v2: an owner whose lease ended may still complete, renew and
    /// release while nobody took the record over. Off until the v2 conformance suite
    /// lands (today's suite fences such an owner); set by this module's tests.
    #[cfg(test)]
    fn expired_owner_writes(mut self) -> Self {
        self.sql = Arc::new(Statements::new(
            &self.table.backquoted(),
            self.dialect,
            true,
        ));
        self
    }

    /// The claim, keeping an abandoned claim for `retention` past its lease (store
    /// contract v2 passes it in the claim request).
    pub(crate) async fn claim_keeping(
        &self,
        req: ClaimRequest<'_>,
        retention: Duration,
    ) -> Result<Claim, StoreError> {
        let lease = micros(req.lease);
        let keep = lease.saturating_add(micros(retention)).min(2 * MAX_US);
        let failed = |e| unavailable("MySQL: claiming a record", e);
        match self.dialect {
            Dialect::Returning => {
                let row = sqlx::query(sql(&self.sql.claim))
                    .bind(req.id.as_bytes().as_slice())
                    .bind(req.fingerprint)
                    .bind(req.token.to_bytes().as_slice())
                    .bind(lease)
                    .bind(keep)
                    .bind(req.token.to_bytes().as_slice())
                    .fetch_one(&self.pool)
                    .await
                    .map_err(failed)?;
                decode_claim(&row, Duration::from_micros)
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
                for _ in 0..CLAIM_ATTEMPTS {
                    let rows: Vec<MySqlRow> = sqlx::raw_sql(AssertSqlSafe(text.as_str()))
                        .fetch_all(&self.pool)
                        .await
                        .map_err(failed)?;
                    if let Some(row) = rows.first() {
                        return decode_claim(row, Duration::from_micros);
                    }
                    // Released between the two statements: claim again.
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

    async fn fenced(
        &self,
        what: &str,
        query: sqlx::query::Query<'_, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    ) -> Result<(), StoreError> {
        // The connection reports rows matched, not changed (sqlx sets
        // CLIENT_FOUND_ROWS): a renewal to the same instant still counts.
        let done = query
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable(&format!("MySQL: {what}"), e))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }

    /// What the store holds for `id` (store contract v2's `inspect`): `None` when
    /// nothing, or only a row past its life. An in-progress record whose lease ended
    /// is shown, with `expires` in the past.
    #[cfg_attr(not(test), allow(dead_code))] // until the Store trait has it (v2)
    pub(crate) async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let row = sqlx::query(sql(&self.sql.inspect))
            .bind(id.as_bytes().as_slice())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: reading a record", e))?;
        row.as_ref().map(record_info).transpose()
    }

    /// Removes the record whatever its state or token (store contract v2's
    /// `force_release`); `true` when there was one. Its owner is fenced afterwards,
    /// and the next claim executes anew.
    #[cfg_attr(not(test), allow(dead_code))] // until the Store trait has it (v2)
    pub(crate) async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let done = sqlx::query(sql(&self.sql.force_release))
            .bind(id.as_bytes().as_slice())
            .execute(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: removing a record", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// Up to `limit` in-progress records, live or with an expired lease, oldest claim
    /// first (store contract v2's `list_in_progress`), through the index on
    /// `(completed, created_at)`.
    #[cfg_attr(not(test), allow(dead_code))] // until the Store trait has it (v2)
    pub(crate) async fn list_in_progress(
        &self,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        let rows = sqlx::query(sql(&self.sql.list_in_progress))
            .bind(u64::try_from(limit).unwrap_or(u64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| unavailable("MySQL: listing records in progress", e))?;
        rows.iter().map(record_info).collect()
    }
}

/// A row of the `inspect` and `list_in_progress` statements.
#[cfg_attr(not(test), allow(dead_code))] // until the Store trait has inspect (v2)
fn record_info(row: &MySqlRow) -> Result<RecordInfo, StoreError> {
    let corrupt = |e: sqlx::Error| StoreError::corrupt(format!("MySQL: a record row: {e}"));
    let id: Vec<u8> = row.try_get("id").map_err(corrupt)?;
    let id: [u8; 32] = id
        .try_into()
        .map_err(|_| StoreError::corrupt("MySQL: a record id is not 32 bytes"))?;
    let time = |col: &str| -> Result<SystemTime, StoreError> {
        let us: i64 = row.try_get(col).map_err(corrupt)?;
        Ok(UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0)))
    };
    let completed: bool = row.try_get("completed").map_err(corrupt)?;
    let payload_len: Option<i64> = row.try_get("payload_len").map_err(corrupt)?;
    Ok(RecordInfo {
        id: RecordId::from_bytes(id),
        state: if completed {
            RecordState::Completed
        } else {
            RecordState::InProgress
        },
        fingerprint: Bytes::from(row.try_get::<Vec<u8>, _>("fingerprint").map_err(corrupt)?),
        created: time("created")?,
        expires: time("expires")?,
        payload_len: payload_len.and_then(|n| u64::try_from(n).ok()),
    })
}

/// A duration in whole microseconds, capped at 100 years.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX).min(MAX_US)
}

#[async_trait::async_trait]
impl Store for MySqlStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.claim_keeping(req, ABANDONED_KEEP).await
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
        self.fenced("completing a record", q).await
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
            .map_err(|e| unavailable("MySQL: sweeping expired records", e))?;
        Ok(done.rows_affected())
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

/// The claim statement's choice, and store contract v2 behaviour (inspect,
/// force-release, list in progress, an expired owner's writes) until the `Store` trait
/// and the conformance suite carry it: against the MariaDB of `IDEMKEY_MYSQL_URL`
/// (default `mysql://root@127.0.0.1:3306/test`).
#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(600);
    const SHORT: Duration = Duration::from_millis(300);

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
                .execute(self.store.pool())
                .await
                .expect("drop the table");
        }
    }

    async fn claim(
        store: &MySqlStore,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Claim {
        store
            .claim_keeping(
                ClaimRequest {
                    id,
                    fingerprint: b"fp",
                    token,
                    lease,
                },
                LONG,
            )
            .await
            .expect("claim")
    }

    fn id(key: &str) -> RecordId {
        RecordId::new("v2", key)
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_mysql_claim_conforms_too() {
        // MySQL's path (INSERT, then SELECT, in one query) run on MariaDB.
        let table = Table::new(MySqlStoreBuilder::insert_then_select).await;
        assert_eq!(table.store.dialect, Dialect::InsertThenSelect);
        let store = table.store.clone();
        crate::testing::conformance::run(|| {
            let store = store.clone();
            async move { store }
        })
        .await;
        table.drop().await;
    }

    #[tokio::test]
    async fn inspect_shows_what_the_store_holds() {
        let table = Table::new(|b| b).await;
        let store = &table.store;
        assert_eq!(store.inspect(&id("absent")).await.expect("inspect"), None);
        let owner = FencingToken::random();
        claim(store, &id("k"), owner, LONG).await;
        let info = store
            .inspect(&id("k"))
            .await
            .expect("inspect")
            .expect("a record");
        assert_eq!(info.id, id("k"));
        assert_eq!(info.state, RecordState::InProgress);
        assert_eq!(info.fingerprint, b"fp".as_slice());
        assert_eq!(info.payload_len, None);
        let lease = info
            .expires
            .duration_since(info.created)
            .expect("expires after created");
        assert_eq!(lease, LONG, "expires is the lease's end");
        // The database's clock and this one agree to within a minute here.
        let skew = info
            .created
            .duration_since(SystemTime::now())
            .unwrap_or_else(|e| e.duration());
        assert!(
            skew < Duration::from_secs(60),
            "created is now: {skew:?} off"
        );

        store
            .complete(
                &id("k"),
                owner,
                Bytes::from_static(b"12345"),
                Duration::from_secs(3600),
            )
            .await
            .expect("complete");
        let info = store
            .inspect(&id("k"))
            .await
            .expect("inspect")
            .expect("a record");
        assert_eq!(info.state, RecordState::Completed);
        assert_eq!(info.payload_len, Some(5));
        let retention = info.expires.duration_since(info.created).expect("later");
        assert!(retention >= Duration::from_secs(3600), "{retention:?}");
        table.drop().await;
    }

    #[tokio::test]
    async fn an_abandoned_claim_is_kept_past_its_lease_for_the_retention() {
        let table = Table::new(|b| b).await;
        let store = &table.store;
        // The store reads its clock after `before` and before `claimed`.
        let before = tokio::time::Instant::now();
        let req = ClaimRequest {
            id: &id("k"),
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: SHORT,
        };
        store.claim_keeping(req, SHORT).await.expect("claim");
        let claimed = tokio::time::Instant::now();
        tokio::time::sleep_until(claimed + SHORT + Duration::from_millis(25)).await;
        let shown = store.inspect(&id("k")).await.expect("inspect");
        if tokio::time::Instant::now() < before + SHORT + SHORT {
            let info = shown.expect("an abandoned claim is still shown");
            assert_eq!(info.state, RecordState::InProgress);
            assert!(info.expires < SystemTime::now() + Duration::from_secs(60));
            assert_eq!(
                store.sweep().await.expect("sweep"),
                0,
                "not swept within the retention"
            );
        }
        let deadline = before + Duration::from_secs(10);
        while store.inspect(&id("k")).await.expect("inspect").is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "kept past lease + retention"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(
            tokio::time::Instant::now() >= before + SHORT + SHORT,
            "removed before lease + retention"
        );
        assert_eq!(
            store.sweep().await.expect("sweep"),
            1,
            "swept after lease + retention"
        );
        table.drop().await;
    }

    #[tokio::test]
    async fn force_release_removes_any_record_and_fences_its_owner() {
        let table = Table::new(|b| b).await;
        let store = &table.store;
        assert!(
            !store
                .force_release(&id("absent"))
                .await
                .expect("force_release")
        );
        let owner = FencingToken::random();
        claim(store, &id("running"), owner, LONG).await;
        assert!(
            store
                .force_release(&id("running"))
                .await
                .expect("force_release")
        );
        let err = store
            .complete(&id("running"), owner, Bytes::from_static(b"late"), LONG)
            .await
            .expect_err("fenced");
        assert!(err.is_fenced(), "{err}");
        assert_eq!(
            claim(store, &id("running"), FencingToken::random(), LONG).await,
            Claim::Acquired { takeover: false }
        );
        let owner = FencingToken::random();
        claim(store, &id("done"), owner, LONG).await;
        store
            .complete(&id("done"), owner, Bytes::from_static(b"p"), LONG)
            .await
            .expect("complete");
        assert!(
            store
                .force_release(&id("done"))
                .await
                .expect("force_release")
        );
        assert_eq!(
            claim(store, &id("done"), FencingToken::random(), LONG).await,
            Claim::Acquired { takeover: false },
            "the next claim executes anew"
        );
        table.drop().await;
    }

    #[tokio::test]
    async fn list_in_progress_is_oldest_first_with_expired_leases() {
        let table = Table::new(|b| b).await;
        let store = &table.store;
        for (key, lease) in [("a", LONG), ("b", SHORT), ("c", LONG)] {
            claim(store, &id(key), FencingToken::random(), lease).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let owner = FencingToken::random();
        claim(store, &id("done"), owner, LONG).await;
        store
            .complete(&id("done"), owner, Bytes::from_static(b"p"), LONG)
            .await
            .expect("complete");
        tokio::time::sleep(SHORT).await;
        let listed = store.list_in_progress(10).await.expect("list");
        let keys: Vec<RecordId> = listed.iter().map(|r| r.id).collect();
        assert_eq!(
            keys,
            [id("a"), id("b"), id("c")],
            "in progress, oldest first"
        );
        assert!(listed.iter().all(|r| r.state == RecordState::InProgress));
        assert!(
            listed[1].expires < listed[0].expires,
            "b's lease is the short one"
        );
        let first: Vec<RecordId> = store
            .list_in_progress(2)
            .await
            .expect("list")
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(first, [id("a"), id("b")], "limit");
        // The index can serve the listing (which one the optimizer picks for four rows
        // is its business).
        let plan: Vec<MySqlRow> = sqlx::raw_sql(AssertSqlSafe(format!(
            "EXPLAIN SELECT id FROM `{}` WHERE completed = FALSE AND purge_at > UTC_TIMESTAMP(6) ORDER BY created_at, id LIMIT 10",
            table.name
        )))
        .fetch_all(store.pool())
        .await
        .expect("explain");
        let keys: Option<String> = plan[0].try_get("possible_keys").expect("possible_keys");
        assert!(
            keys.unwrap_or_default().contains("open_claims"),
            "{:?}",
            plan[0].try_get::<Option<String>, _>("possible_keys")
        );
        table.drop().await;
    }

    #[tokio::test]
    async fn an_expired_owner_writes_until_another_claim_takes_over() {
        let table = Table::new(|b| b).await;
        let store = table.store.clone().expired_owner_writes();
        let expire = |key: &'static str| {
            let store = store.clone();
            async move {
                let owner = FencingToken::random();
                claim(&store, &id(key), owner, SHORT).await;
                tokio::time::sleep(SHORT + Duration::from_millis(25)).await;
                owner
            }
        };
        let owner = expire("complete").await;
        store
            .complete(&id("complete"), owner, Bytes::from_static(b"late"), LONG)
            .await
            .expect("an expired owner nobody took over completes");
        match claim(&store, &id("complete"), FencingToken::random(), LONG).await {
            Claim::Completed { payload, .. } => assert_eq!(payload, "late"),
            other => panic!("a replay, not a takeover: {other:?}"),
        }
        let owner = expire("renew").await;
        store.renew(&id("renew"), owner, LONG).await.expect("renew");
        assert!(matches!(
            claim(&store, &id("renew"), FencingToken::random(), LONG).await,
            Claim::InProgress { .. }
        ));
        let owner = expire("release").await;
        store.release(&id("release"), owner).await.expect("release");
        assert_eq!(store.inspect(&id("release")).await.expect("inspect"), None);
        let owner = expire("taken").await;
        assert_eq!(
            claim(&store, &id("taken"), FencingToken::random(), LONG).await,
            Claim::Acquired { takeover: true }
        );
        for result in [
            store
                .complete(&id("taken"), owner, Bytes::new(), LONG)
                .await,
            store.renew(&id("taken"), owner, LONG).await,
            store.release(&id("taken"), owner).await,
        ] {
            assert!(result.expect_err("fenced").is_fenced());
        }
        use crate::testing::conformance as c;
        let shared: std::sync::Arc<dyn Store> = std::sync::Arc::new(store);
        c::claim_returns_the_live_record(&shared).await;
        c::writes_are_fenced_by_token(&shared).await;
        c::takeover_after_lease_expiry(&shared).await;
        c::concurrent_takeover_is_atomic(&shared).await;
        c::release_makes_the_record_claimable(&shared).await;
        c::renew_extends_the_lease(&shared).await;
        c::retention_expiry(&shared).await;
        table.drop().await;
    }
}
