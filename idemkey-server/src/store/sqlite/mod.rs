//! The embedded durable store on SQLite (feature `sqlite`).
//!
//! One file, opened in WAL mode with `synchronous = FULL`: a completed record is on
//! disk before [`Store::complete`] returns, and survives a crash of the process (or of
//! the machine) and a restart. The schema is created when the store opens, and a table
//! of the previous schema (without the `created` and `retention` columns) is upgraded
//! in place: its rows show the time of the upgrade as `created`, and its abandoned
//! claims are not kept past their lease.
//!
//! The statements are those of the PostgreSQL store, with the time passed in: SQLite
//! has no clock of its own, so leases and retention are measured in milliseconds of this
//! machine's wall clock (`SystemTime`), which also holds across restarts.
//!
//! Every connection is rusqlite's, served by a thread of its own (`threads.rs`): a
//! runtime thread never waits for the file or a disk sync. A claim first reads the live
//! record on a reading connection; a replay or a duplicate of a running request ends
//! there, with no write lock and no disk sync. Otherwise the claim is one `INSERT ... ON
//! CONFLICT (id) DO UPDATE ... RETURNING` that takes over an expired row and returns a
//! live one (inserted by a concurrent claim since the read) unchanged, so claims stay
//! atomic. All of the store's writes (the request path's, sweeps, force-release) go
//! through one connection: SQLite runs one writer at a time, and queueing writes in the
//! process is faster than contending for the file lock and its sleeping busy handler. A
//! fresh request costs 3 statements (read, claim, complete; 2 writes), a replay 1 read.
//! The transactional inbox ([`SqliteStore::once_in`]) runs on the caller's sqlx
//! connection, inside the caller's transaction.
//!
//! Complete, renew and release hold while the token matches and lease end + retention
//! is still ahead, so an owner whose lease expired and whom nobody took over still
//! writes (contract rule 3). Expired rows stay until [`Store::sweep`] deletes them
//! (abandoned claims are kept for their retention past their lease).
//! [`Store::list_in_progress`] reads a partial index of the in-progress rows by `created`.
//!
//! Use it for a single node whose records must survive restarts; use PostgreSQL or
//! Redis when several instances share records.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rusqlite::types::{ToSql, Value};
use rusqlite::{Connection, TransactionBehavior, named_params};
use sqlx::sqlite::{Sqlite, SqliteConnection};

mod threads;

use self::threads::{Role, Threads, failed};
use super::inbox::{DEFAULT_INBOX_RETENTION, InboxSql};
use super::sql::{
    ADDED_COLUMNS, DEFAULT_TABLE, SqlxRow, TableName, claim_sets, decode_claim, decode_info,
    fenced, fenced_by, sql, unavailable,
};
use super::sweeper::{Batch, batched_pass};
use super::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, Store, StoreError, SweepOptions,
    SweepReport, clamp_forever,
};

/// A durable store in one SQLite file, for a single node.
///
/// Cheap to clone (clones share the connections). A completed record is on disk
/// (WAL, `synchronous = FULL`) before [`Store::complete`] returns and survives a crash
/// and a restart. Leases and retention are measured by this machine's wall clock.
///
/// Opening creates the table `idemkey_records` (or [`SqliteStoreBuilder::table`]) and
/// its indexes if missing, and upgrades a table of the previous schema (without the
/// `created` and `retention` columns) in place: its rows show the time of the upgrade as
/// `created`, and its abandoned claims are not kept past their lease.
///
/// A fresh request costs 3 statements (read, claim, complete; 2 writes), a replay 1
/// read. Expired rows stay until [`Store::sweep`] deletes them (abandoned claims are kept
/// for their retention past their lease): schedule it with
/// [`spawn_sweeper`](crate::store::spawn_sweeper). [`Store::list_in_progress`] reads an
/// index of the in-progress rows by claim time.
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
    /// The one writing connection: SQLite runs one writer at a time, and a single
    /// writing connection queues writes in the process instead of contending for the
    /// file lock.
    writing: Arc<Threads>,
    /// The reading connections (the claims' reads of the live record and the admin
    /// operations' reads). In memory, the writing connection, where the one database
    /// lives.
    reading: Arc<Threads>,
    path: PathBuf,
    sql: Arc<Statements>,
    inbox_retention: Duration,
}

struct Statements {
    live: Arc<str>,
    claim: Arc<str>,
    complete: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    sweep: Arc<str>,
    sweep_lag: Arc<str>,
    inspect: Arc<str>,
    force_release: Arc<str>,
    list_in_progress: Arc<str>,
    inbox_record: Arc<str>,
}

impl Statements {
    /// `$1` is always the time now, in milliseconds since the Unix epoch.
    fn new(t: &str) -> Self {
        let sets = claim_sets("expires_at <= $1", "");
        // The end of the time a row is kept: retention end once completed, lease end
        // plus the claim's retention while in progress (an abandoned claim, rule 4).
        let kept_until =
            "CASE WHEN payload IS NULL THEN expires_at + retention ELSE expires_at END";
        let held = "id = $2 AND token = $3 AND payload IS NULL AND expires_at + retention > $1";
        let info = "id, payload IS NULL AS in_progress, fingerprint,
  length(payload) AS payload_len, created, expires_at AS expires";
        Self {
            live: format!(
                "SELECT 0 AS won, taken_over, fingerprint, payload, expires_at - $1 AS remaining
FROM {t} WHERE id = $2 AND expires_at > $1"
            )
            .into(),
            claim: format!(
                "INSERT INTO {t} (id, fingerprint, token, payload, taken_over, expires_at, created,
  retention)
VALUES ($2, $3, $4, NULL, 0, $1 + $5, $1, $6)
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
            // One bounded batch, the oldest first through the expiry index.
            sweep: format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE expires_at <= $1
  AND (payload IS NOT NULL OR expires_at + retention <= $1) ORDER BY expires_at LIMIT $2)"
            )
            .into(),
            sweep_lag: format!(
                "SELECT $1 - min(expires_at) FROM {t} WHERE expires_at <= $1
  AND (payload IS NOT NULL OR expires_at + retention <= $1)"
            )
            .into(),
            inspect: format!("SELECT {info} FROM {t} WHERE id = $2 AND {kept_until} > $1").into(),
            force_release: format!(
                "DELETE FROM {t} WHERE id = $2 RETURNING {kept_until} > $1 AS shown"
            )
            .into(),
            list_in_progress: format!(
                "SELECT {info} FROM {t} WHERE payload IS NULL AND expires_at + retention > $1
ORDER BY created LIMIT $2"
            )
            .into(),
            inbox_record: format!("UPDATE {t} SET payload = $2, token = NULL WHERE id = $1").into(),
        }
    }
}

/// The most reading connections a [`SqliteStore`] opens
/// ([`SqliteStoreBuilder::max_connections`]): each has a thread of its own, opened with
/// the store, so a setting meant for a server's pool (thousands) is refused, not obeyed.
const MAX_READERS: u32 = 64;

/// Configures a [`SqliteStore`]; made by [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    table: String,
    max_connections: u32,
    busy_timeout: Duration,
    inbox_retention: Duration,
}

impl SqliteStoreBuilder {
    /// The table (default `idemkey_records`): letters, digits and `_` only.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The number of reading connections (default 4, at most 64), each served by a
    /// thread of its own, opened with the store: the claims' reads of the live record
    /// and the admin operations' reads. Writes go through one connection of their own:
    /// SQLite runs one writer at a time.
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long an operation waits for its connection's thread to take it (the
    /// writing connection, or a free reading one), and a statement for a lock another
    /// connection to the file holds, before the request gets a 503 (default 5 s). An
    /// operation no thread took in time was not run.
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How long [`SqliteStore::once_in`] keeps a processed message's record (default
    /// 7 days): a redelivery within it is recognised; one after it runs again.
    #[must_use]
    pub fn inbox_retention(mut self, retention: Duration) -> Self {
        self.inbox_retention = retention;
        self
    }

    /// Opens (creating the file if needed) and creates the schema if missing.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_configuration`] when the table name is invalid, the file's
    /// directory does not exist, the file is not a SQLite database or
    /// [`max_connections`](Self::max_connections) is above 64;
    /// [`StoreError::is_unavailable`] when the file cannot be opened or written.
    ///
    /// The path `:memory:` opens one in-memory database on a single connection (for
    /// tests: records are lost when the store is dropped; [`MemoryStore`] is faster).
    ///
    /// [`MemoryStore`]: crate::store::MemoryStore
    pub async fn open(self) -> Result<SqliteStore, StoreError> {
        let table = TableName::parse(&self.table)?;
        if self.max_connections > MAX_READERS {
            return Err(StoreError::configuration(format!(
                "SQLite: max_connections {} is more reading connections than the store \
                 opens (at most {MAX_READERS}, each with a thread of its own); reads of one \
                 file gain nothing from more threads than the machine has cores",
                self.max_connections
            )));
        }
        if table.quoted().contains('.') {
            return Err(StoreError::configuration(format!(
                "invalid SQLite table name {:?}: name the table without a schema",
                self.table
            )));
        }
        // `:memory:` on each of several connections would be several empty databases:
        // one connection holds the one database, kept open for the store's life.
        let in_memory = self.path.as_os_str() == ":memory:";
        if !in_memory
            && let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(StoreError::configuration(format!(
                "SQLite: the directory {} of {} does not exist; create it, or \
                         choose a file in an existing directory",
                dir.display(),
                self.path.display()
            )));
        }
        let (path, busy) = (&self.path, self.busy_timeout);
        let writing = Arc::new(Threads::open(Role::Writing, 1, path, busy).await?);
        let migrating = table.clone();
        writing
            .run("creating the schema", move |conn| {
                migrate(conn, &migrating).map_err(failed("creating the schema"))
            })
            .await?;
        let reading = if in_memory {
            Arc::clone(&writing)
        } else {
            let n = usize::try_from(self.max_connections).unwrap_or(usize::MAX);
            Arc::new(Threads::open(Role::Reading, n, path, busy).await?)
        };
        Ok(SqliteStore {
            writing,
            reading,
            path: self.path,
            sql: Arc::new(Statements::new(table.quoted())),
            inbox_retention: self.inbox_retention,
        })
    }
}

/// The first row of `statement` run with `params`, decoded by `decode`; the statement
/// is stepped to its end, where an autocommitted write commits and reports its errors
/// (a reset would commit it too, and drop them), before the decoding's error is
/// returned. `what` the request does, for errors.
fn first_row<T>(
    conn: &mut Connection,
    what: &'static str,
    statement: &str,
    params: &[(&str, &dyn ToSql)],
    decode: impl FnOnce(&rusqlite::Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut statement = conn.prepare_cached(statement).map_err(failed(what))?;
    let mut rows = statement.query(params).map_err(failed(what))?;
    let first = rows.next().map_err(failed(what))?.map(decode);
    // To the end even when the row cannot be decoded: a reset commits a write too.
    while rows.next().map_err(failed(what))?.is_some() {}
    first.transpose()
}

impl SqliteStore {
    /// The live record of `id` as a claim meets it, if there is one: a replay, or a
    /// duplicate of a running request.
    async fn read_live(&self, id: &RecordId) -> Result<Option<Claim>, StoreError> {
        let live: fn(&Statements) -> &str = |s| &s.live;
        self.by_id(&self.reading, "reading a record", live, id, |row| {
            decode_claim(row, Duration::from_millis)
        })
        .await
    }

    /// The row `statement` returns with the time now as `$1` and `id` as `$2`, if any,
    /// decoded by `decode`, on one of `threads`' connections.
    async fn by_id<T: Send + 'static>(
        &self,
        threads: &Threads,
        what: &'static str,
        statement: fn(&Statements) -> &str,
        id: &RecordId,
        decode: fn(&rusqlite::Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let (sql, id) = (Arc::clone(&self.sql), *id.as_bytes());
        threads
            .run(what, move |conn| {
                // The time the statement runs, not of its queueing: a record that
                // expired meanwhile is not live. By name: SQLite numbers `$N`
                // parameters in the order they first appear.
                let params = named_params! {"$1": now_ms(), "$2": id.as_slice()};
                first_row(conn, what, statement(&sql), params, decode)
            })
            .await
    }

    /// A fenced write (complete, renew, release): `statement` with the time now, `id`
    /// and `token` as `$1` to `$3`, and `more` after them, on the writing connection.
    async fn fenced_write(
        &self,
        what: &'static str,
        statement: fn(&Statements) -> &str,
        id: &RecordId,
        token: FencingToken,
        more: Vec<(&'static str, Value)>,
    ) -> Result<(), StoreError> {
        let (sql, id, token) = (Arc::clone(&self.sql), *id.as_bytes(), token.to_bytes());
        let written = self
            .writing
            .run(what, move |conn| {
                let (now, id, token) = (now_ms(), id.as_slice(), token.as_slice());
                let mut params: Vec<(&str, &dyn ToSql)> =
                    vec![("$1", &now), ("$2", &id), ("$3", &token)];
                params.extend(more.iter().map(|(name, v)| (*name, v as &dyn ToSql)));
                conn.prepare_cached(statement(&sql))
                    .and_then(|mut s| s.execute(params.as_slice()))
                    .map_err(failed(what))
            })
            .await;
        fenced_by(written.map(|n| u64::try_from(n).unwrap_or(u64::MAX)), |e| e)
    }

    /// The statements of the request path, exactly as this store runs them: the read of
    /// a live record, the claim and the completion. For measuring tools that must run
    /// the store's own SQL (perf's SQL floor); not part of the API.
    #[doc(hidden)]
    #[must_use]
    pub fn request_path_sql(&self) -> (Arc<str>, Arc<str>, Arc<str>) {
        (
            self.sql.live.clone(),
            self.sql.claim.clone(),
            self.sql.complete.clone(),
        )
    }

    /// Removes at most `limit` expired records in one statement (one short write
    /// transaction).
    async fn sweep_batch(&self, limit: u32) -> Result<u64, StoreError> {
        const WHAT: &str = "sweeping expired records";
        let sql = Arc::clone(&self.sql);
        let removed = self
            .writing
            .run(WHAT, move |conn| {
                conn.prepare_cached(&sql.sweep)
                    .and_then(|mut s| {
                        s.execute(named_params! {"$1": now_ms(), "$2": i64::from(limit)})
                    })
                    .map_err(failed(WHAT))
            })
            .await?;
        Ok(u64::try_from(removed).unwrap_or(u64::MAX))
    }

    /// How long the oldest expired record still present has been expired.
    async fn sweep_lag(&self) -> Option<Duration> {
        const WHAT: &str = "measuring the sweep's lag";
        let sql = Arc::clone(&self.sql);
        let ms: Option<i64> = self
            .reading
            .run(WHAT, move |conn| {
                conn.prepare_cached(&sql.sweep_lag)
                    .and_then(|mut s| s.query_row(named_params! {"$1": now_ms()}, |r| r.get(0)))
                    .map_err(failed(WHAT))
            })
            .await
            .ok()?;
        Some(ms.map_or(Duration::ZERO, |ms| {
            Duration::from_millis(u64::try_from(ms).unwrap_or(0))
        }))
    }

    /// A builder for a store in the file at `path`.
    #[must_use]
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 4,
            busy_timeout: Duration::from_secs(5),
            inbox_retention: DEFAULT_INBOX_RETENTION,
        }
    }

    /// Opens the store in the file at `path` with the default settings, creating the
    /// file and the schema if needed.
    ///
    /// # Errors
    ///
    /// As [`SqliteStoreBuilder::open`]: [`StoreError::is_configuration`] when the
    /// file's directory does not exist or the file is not a SQLite database,
    /// [`StoreError::is_unavailable`] when the file cannot be opened or written.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder(path).open().await
    }

    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes every connection, once the statements already queued have run (the last
    /// to close checkpoints the WAL); clones stop working.
    pub async fn close(&self) {
        self.reading.close().await;
        self.writing.close().await;
    }
}

impl InboxSql for SqliteStore {
    type Db = Sqlite;
    type Conn = SqliteConnection;

    /// The store's own claim statement, on the caller's connection, with the
    /// retention as the lease: it takes over an expired row and returns a live one
    /// unchanged. The row stays invisible to others until the transaction commits
    /// (with its result), so nobody sees it in progress.
    async fn claim(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordId,
        fingerprint: &[u8],
    ) -> Result<Claim, StoreError> {
        let row = sqlx::query(sql(&self.sql.claim))
            .bind(now_ms())
            .bind(id.as_bytes().to_vec())
            .bind(fingerprint.to_vec())
            .bind(FencingToken::random().to_bytes().to_vec())
            .bind(millis(self.inbox_retention))
            .bind(0_i64)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| unavailable("SQLite: the inbox claiming a record", e))?;
        decode_claim(&SqlxRow(&row), Duration::from_millis)
    }

    async fn record(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordId,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let done = sqlx::query(sql(&self.sql.inbox_record))
            .bind(id.as_bytes().to_vec())
            .bind(payload.to_vec())
            .execute(&mut *conn)
            .await
            .map(|r| r.rows_affected());
        fenced("SQLite: the inbox recording a result", done)
    }
}

/// This machine's wall clock in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

/// A duration in whole milliseconds, "forever" held to 100 years.
fn millis(d: Duration) -> i64 {
    // 100 years in milliseconds is far below i64::MAX.
    i64::try_from(clamp_forever(d).as_millis()).unwrap_or(i64::MAX)
}

/// Creates the table and its indexes if missing, and upgrades a table of the previous
/// schema in place: SQLite has no `ADD COLUMN IF NOT EXISTS`, so the columns are read
/// first, inside one write transaction (`BEGIN IMMEDIATE`), so that two processes
/// opening one file do not both add a column.
fn migrate(conn: &mut Connection, table: &TableName) -> rusqlite::Result<()> {
    let t = table.quoted();
    let (expiry, in_progress) = (
        table.index_name("expires_at"),
        table.index_name("in_progress"),
    );
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {t} (
    id          BLOB    PRIMARY KEY,
    fingerprint BLOB    NOT NULL,
    token       BLOB,
    payload     BLOB,
    taken_over  INTEGER NOT NULL DEFAULT 0,
    expires_at  INTEGER NOT NULL,
    created     INTEGER NOT NULL DEFAULT 0,
    retention   INTEGER NOT NULL DEFAULT 0
)"
    ))?;
    let columns = tx
        .prepare("SELECT name FROM pragma_table_info(?1)")?
        .query_map([table.unquoted()], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for column in ADDED_COLUMNS {
        if columns.iter().any(|c| c == column) {
            continue;
        }
        // The columns the previous schema lacked; rows written by it show the time of
        // the upgrade as their claim's time, and keep no abandoned claim past its lease.
        tx.execute_batch(&format!(
            "ALTER TABLE {t} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0"
        ))?;
        if column == "created" {
            tx.execute(&format!("UPDATE {t} SET created = ?1"), [now_ms()])?;
        }
    }
    tx.execute_batch(&format!(
        "CREATE INDEX IF NOT EXISTS {expiry} ON {t} (expires_at);
CREATE INDEX IF NOT EXISTS {in_progress} ON {t} (created) WHERE payload IS NULL;"
    ))?;
    tx.commit()
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        const WHAT: &str = "claiming a record";
        if let Some(live) = self.read_live(req.id).await? {
            return Ok(live);
        }
        // None live as of the read: claim atomically (a concurrent claim may have won
        // since; the statement then returns its row).
        let (sql, id, fingerprint, token) = (
            Arc::clone(&self.sql),
            *req.id.as_bytes(),
            req.fingerprint.to_vec(),
            req.token.to_bytes(),
        );
        let (lease, retention) = (millis(req.lease), millis(req.retention));
        self.writing
            .run(WHAT, move |conn| {
                let params = named_params! {
                    "$1": now_ms(),
                    "$2": id.as_slice(),
                    "$3": fingerprint,
                    "$4": token.as_slice(),
                    "$5": lease,
                    "$6": retention,
                };
                first_row(conn, WHAT, &sql.claim, params, |row| {
                    decode_claim(row, Duration::from_millis)
                })?
                .ok_or_else(|| StoreError::corrupt("the claim returned no row"))
            })
            .await
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let more = vec![
            ("$4", Value::Blob(payload.into())),
            ("$5", Value::Integer(millis(retention))),
        ];
        self.fenced_write("completing a record", |s| &s.complete, id, token, more)
            .await
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let more = vec![("$4", Value::Integer(millis(lease)))];
        self.fenced_write("renewing a lease", |s| &s.renew, id, token, more)
            .await
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.fenced_write("releasing a record", |s| &s.release, id, token, Vec::new())
            .await
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        Ok(self.sweep_pass(&SweepOptions::default()).await?.removed())
    }

    /// SQLite has one writer: batches of concurrent passes (in this process or another
    /// on the same file) take turns, so no lock is taken.
    async fn sweep_pass(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        batched_pass(
            options,
            || async { Ok(Some(())) },
            |limit| async move { Ok(Batch::removed(self.sweep_batch(limit).await?, limit)) },
            || self.sweep_lag(),
        )
        .await
    }

    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let inspect: fn(&Statements) -> &str = |s| &s.inspect;
        self.by_id(&self.reading, "inspecting a record", inspect, id, |row| {
            decode_info(row, Duration::from_millis)
        })
        .await
    }

    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let force_release: fn(&Statements) -> &str = |s| &s.force_release;
        let shown = self
            .by_id(
                &self.writing,
                "force-releasing a record",
                force_release,
                id,
                |row| {
                    row.get::<_, bool>("shown")
                        .map_err(failed("force-releasing a record"))
                },
            )
            .await?;
        Ok(shown.unwrap_or(false))
    }

    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        const WHAT: &str = "listing records in progress";
        let sql = Arc::clone(&self.sql);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.reading
            .run(WHAT, move |conn| {
                let mut statement = conn
                    .prepare_cached(&sql.list_in_progress)
                    .map_err(failed(WHAT))?;
                let mut rows = statement
                    .query(named_params! {"$1": now_ms(), "$2": limit})
                    .map_err(failed(WHAT))?;
                let mut listed = Vec::new();
                while let Some(row) = rows.next().map_err(failed(WHAT))? {
                    listed.push(decode_info(row, Duration::from_millis)?);
                }
                Ok(listed)
            })
            .await
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
