//! What the SQL stores (PostgreSQL, SQLite, MySQL) share: the default table, table
//! names, the claim's `SET` list, decoding rows, and the outcome of a fenced write.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sqlx::{ColumnIndex, Decode, Row, Type};

use super::{Claim, RecordId, RecordInfo, RecordState, StoreError};

/// The table of the SQL stores unless configured otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idemkey_records";

/// The columns the previous schema lacked, added in place by the stores' schema
/// upgrade: the claim's time and the claim's retention (how long an abandoned claim is
/// kept past its lease).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const ADDED_COLUMNS: [&str; 2] = ["created", "retention"];

/// How long a pooled connection may have sat idle before the pool checks it (a ping)
/// as it hands it out; see [`pool_options`] and the request path's pool
/// (`request_pool.rs`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const CHECK_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A pooled connection idle this long is closed (sqlx's default `idle_timeout`), in
/// [`pool_options`]' pools and the request path's alike.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// A pooled connection this old is closed instead of handed out (sqlx's default
/// `max_lifetime`), in [`pool_options`]' pools and the request path's alike.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// The options of the PostgreSQL and MySQL stores' sqlx pools (their connections off the
/// request path): sqlx's, except that a connection is checked
/// with a ping as it is taken from the pool only when it has been idle for more than
/// [`CHECK_AFTER_IDLE`], not every time (sqlx's default, `test_before_acquire`, is a
/// round trip to the database before every statement: on PostgreSQL a third of a
/// replay's CPU). A busy pool's connections are in use every few milliseconds, and each
/// use is a check of its own (sqlx also pings every connection it takes back); one that
/// fails (the server restarted, the connection was cut) is closed, and that request
/// gets the store's unavailable answer. The ping after an idle spell finds the
/// connections a quiet pool lost meanwhile before a request does. The pattern is
/// sqlx's own (`PoolOptions::before_acquire`). Connections age out after
/// [`IDLE_TIMEOUT`] idle and [`MAX_LIFETIME`] in all, named here so that the request
/// path's pool ages its connections the same.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn pool_options<DB: sqlx::Database>() -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .idle_timeout(IDLE_TIMEOUT)
        .max_lifetime(MAX_LIFETIME)
        .test_before_acquire(false)
        .before_acquire(check_if_idle::<DB>)
}

/// [`pool_options`]' check of a connection taken from the pool: a ping if it has been
/// idle for more than [`CHECK_AFTER_IDLE`]; `false` (the pool closes the connection and
/// takes or opens another) when the ping fails.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn check_if_idle<DB: sqlx::Database>(
    conn: &mut DB::Connection,
    meta: sqlx::pool::PoolConnectionMetadata,
) -> futures_util::future::BoxFuture<'_, Result<bool, sqlx::Error>> {
    use sqlx::Connection;
    Box::pin(async move { Ok(meta.idle_for <= CHECK_AFTER_IDLE || conn.ping().await.is_ok()) })
}

/// How the store's `max_connections` is shared: `others` (or all but one, when the
/// budget is smaller) for the sqlx pool of everything off the request path, the rest
/// for the request path. The two never hold more than `total` connections together.
///
/// # Errors
///
/// A configuration error when `total` is below 2: each pool needs a connection.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn split_budget(db: &str, total: u32, others: u32) -> Result<(u32, u32), StoreError> {
    if total < 2 {
        return Err(StoreError::configuration(format!(
            "{db}: max_connections is {total}; it must be at least 2 (one for requests, \
             one for migrations, sweeps and the admin operations); {} or more lets a \
             sweep run beside them",
            others + 1
        )));
    }
    let others = others.clamp(1, total - 1);
    Ok((total - others, others))
}

/// How long the request path's connections live (the PostgreSQL and MySQL stores'):
/// [`IDLE_TIMEOUT`] and [`MAX_LIFETIME`], as in the store's other pool, but in tests.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ageing {
    pub(crate) idle_timeout: Duration,
    pub(crate) max_lifetime: Duration,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Default for Ageing {
    fn default() -> Self {
        Self {
            idle_timeout: IDLE_TIMEOUT,
            max_lifetime: MAX_LIFETIME,
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Ageing {
    /// Whether a connection last used `idle` ago and opened `age` ago is kept.
    pub(crate) fn keeps(&self, idle: Duration, age: Duration) -> bool {
        idle < self.idle_timeout && age < self.max_lifetime
    }

    /// How often a pool looks for connections to close: a few times per idle timeout.
    pub(crate) fn check_every(&self) -> Duration {
        (self.idle_timeout / 4).max(Duration::from_millis(10))
    }
}

/// A validated table name, optionally schema-qualified, kept quoted for SQL.
#[derive(Debug, Clone)]
pub(crate) struct TableName {
    quoted: String,
    /// The unqualified name, for naming the table's index.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    base: String,
}

impl TableName {
    /// Accepts `name` or `schema.name`, each part an identifier of letters, digits and
    /// `_` (not starting with a digit), at most 63 bytes: nothing that needs escaping.
    pub(crate) fn parse(name: &str) -> Result<Self, StoreError> {
        let parts: Vec<&str> = name.split('.').collect();
        let valid = |p: &&str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !p.as_bytes()[0].is_ascii_digit()
        };
        if parts.len() > 2 || !parts.iter().all(valid) {
            return Err(StoreError::configuration(format!(
                "invalid table name {name:?}: use letters, digits and '_' (optionally \
                 'schema.table')"
            )));
        }
        Ok(Self {
            quoted: parts
                .iter()
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join("."),
            base: parts[parts.len() - 1].to_owned(),
        })
    }

    /// The unqualified name, unquoted (for `pragma_table_info`).
    #[cfg(feature = "sqlite")]
    pub(crate) fn unquoted(&self) -> &str {
        &self.base
    }

    /// The name as it goes into SQL: `"table"` or `"schema"."table"`.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// The name quoted for MySQL: `` `table` `` or `` `schema`.`table` ``.
    #[cfg(feature = "mysql")]
    pub(crate) fn backquoted(&self) -> String {
        self.quoted().replace('"', "`")
    }

    /// `"<table>_<suffix>"`, unqualified (an index lives in its table's schema).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn index_name(&self, suffix: &str) -> String {
        format!("\"{}_{suffix}\"", self.base)
    }

    /// `"<table>_<suffix>"` in the table's schema, `"schema"."<table>_<suffix>"` when the
    /// table is schema-qualified: the index's name for a catalog look-up.
    #[cfg(feature = "postgres")]
    pub(crate) fn qualified_index_name(&self, suffix: &str) -> String {
        let index = self.index_name(suffix);
        match self.quoted.rsplit_once('.') {
            Some((schema, _)) => format!("{schema}.{index}"),
            None => index,
        }
    }
}

/// The `SET` list of the claim's `ON CONFLICT (id) DO UPDATE`: every column takes the
/// claim's value when the existing row has `expired`, and keeps its own otherwise, so the
/// statement returns the live row unchanged (see the PostgreSQL store's docs).
/// `old` qualifies the existing row's columns (`r.` or empty).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn claim_sets(expired: &str, old: &str) -> String {
    [
        ("taken_over", format!("{old}payload IS NULL")),
        ("fingerprint", "excluded.fingerprint".to_owned()),
        ("token", "excluded.token".to_owned()),
        ("payload", "NULL".to_owned()),
        ("expires_at", "excluded.expires_at".to_owned()),
        ("created", "excluded.created".to_owned()),
        ("retention", "excluded.retention".to_owned()),
    ]
    .iter()
    .map(|(col, new)| format!("{col} = CASE WHEN {expired} THEN {new} ELSE {old}{col} END"))
    .collect::<Vec<_>>()
    .join(",\n  ")
}

/// Like [`claim_sets`], for any columns, in the order given: each `(column, new)` takes
/// `new` when the existing row has `expired` and keeps its own value otherwise. MySQL
/// evaluates the assignments of one `UPDATE` left to right, each seeing the ones
/// before, so the columns that `expired` reads go last.
#[cfg(feature = "mysql")]
pub(crate) fn takeover_sets(expired: &str, columns: &[(&str, &str)]) -> String {
    columns
        .iter()
        .map(|(col, new)| format!("{col} = CASE WHEN {expired} THEN {new} ELSE {col} END"))
        .collect::<Vec<_>>()
        .join(",\n  ")
}

/// A row of the request path (the claim statement's) or of the admin operations
/// (`inspect`, `list_in_progress`), read by column name, whatever the driver: sqlx's
/// rows through [`SqlxRow`], tokio-postgres's (the PostgreSQL store's request path) and
/// rusqlite's (the SQLite store's) by impls of their own. A column that cannot be read
/// as asked says why.
pub(crate) trait RecordRow {
    fn boolean(&self, column: &str) -> Result<bool, String>;
    /// An integer column that may be `NULL`.
    fn integer(&self, column: &str) -> Result<Option<i64>, String>;
    /// A `bytea`/`BLOB` column that may be `NULL`.
    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, String>;
}

/// A sqlx row, as a [`RecordRow`].
pub(crate) struct SqlxRow<'a, R>(pub(crate) &'a R);

impl<R> RecordRow for SqlxRow<'_, R>
where
    R: Row,
    for<'s> &'s str: ColumnIndex<R>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    fn boolean(&self, column: &str) -> Result<bool, String> {
        self.0.try_get(column).map_err(|e| e.to_string())
    }

    fn integer(&self, column: &str) -> Result<Option<i64>, String> {
        self.0.try_get(column).map_err(|e| e.to_string())
    }

    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, String> {
        self.0.try_get(column).map_err(|e| e.to_string())
    }
}

/// `column` of `row`, which must not be `NULL`.
fn required<T>(value: Result<Option<T>, String>, column: &str) -> Result<T, String> {
    value?.ok_or_else(|| format!("a NULL {column}"))
}

/// Reads the row returned by the claim statement: columns `won`, `taken_over`,
/// `fingerprint`, `payload` and `remaining` (the lease left, converted by `remaining`).
pub(crate) fn decode_claim<R: RecordRow>(
    row: &R,
    remaining: impl FnOnce(u64) -> Duration,
) -> Result<Claim, StoreError> {
    let corrupt = |e: String| StoreError::corrupt(format!("the claim returned {e}"));
    if row.boolean("won").map_err(corrupt)? {
        return Ok(Claim::Acquired {
            takeover: row.boolean("taken_over").map_err(corrupt)?,
        });
    }
    let fingerprint = required(row.bytes("fingerprint"), "fingerprint").map_err(corrupt)?;
    Ok(match row.bytes("payload").map_err(corrupt)? {
        Some(payload) => Claim::Completed {
            fingerprint: fingerprint.into(),
            payload: payload.into(),
        },
        None => {
            let left = required(row.integer("remaining"), "remaining").map_err(corrupt)?;
            Claim::InProgress {
                fingerprint: fingerprint.into(),
                lease_remaining: remaining(u64::try_from(left).unwrap_or(0)),
            }
        }
    })
}

/// Reads a row of `inspect` or `list_in_progress`: columns `id`, `in_progress`,
/// `fingerprint`, `payload_len` (NULL in progress), `created` and `expires` (integers
/// since the Unix epoch, in the unit of `since_epoch`).
pub(crate) fn decode_info<R: RecordRow>(
    row: &R,
    since_epoch: impl Fn(u64) -> Duration,
) -> Result<RecordInfo, StoreError> {
    let corrupt = |e: String| StoreError::corrupt(format!("a record's row: {e}"));
    let id = required(row.bytes("id"), "id").map_err(corrupt)?;
    let id = <[u8; 32]>::try_from(id.as_slice())
        .map_err(|_| StoreError::corrupt(format!("a record id of {} bytes", id.len())))?;
    let time = |column: &str| {
        let n = required(row.integer(column), column).map_err(corrupt)?;
        Ok::<_, StoreError>(
            SystemTime::UNIX_EPOCH
                .checked_add(since_epoch(u64::try_from(n).unwrap_or(0)))
                .unwrap_or(SystemTime::UNIX_EPOCH),
        )
    };
    Ok(RecordInfo {
        id: RecordId::from_bytes(id),
        state: if row.boolean("in_progress").map_err(corrupt)? {
            RecordState::InProgress
        } else {
            RecordState::Completed
        },
        fingerprint: Bytes::from(
            required(row.bytes("fingerprint"), "fingerprint").map_err(corrupt)?,
        ),
        created: time("created")?,
        expires: time("expires")?,
        payload_len: row
            .integer("payload_len")
            .map_err(corrupt)?
            .map(|n| u64::try_from(n).unwrap_or(0)),
    })
}

/// The outcome of a fenced write (complete, renew, release: one statement whose
/// `WHERE` holds only while the token holds the record): one row written, or fenced.
pub(crate) fn fenced(what: &str, rows: Result<u64, sqlx::Error>) -> Result<(), StoreError> {
    fenced_by(rows, |e| unavailable(what, e))
}

/// [`fenced`], for any driver: its error goes through `failed`.
pub(crate) fn fenced_by<E>(
    rows: Result<u64, E>,
    failed: impl FnOnce(E) -> StoreError,
) -> Result<(), StoreError> {
    match rows {
        Ok(1) => Ok(()),
        Ok(_) => Err(StoreError::fenced()),
        Err(e) => Err(failed(e)),
    }
}

/// A prepared statement's text, built once from a validated [`TableName`].
/// The name of a table's sweep lock (a PostgreSQL advisory lock key, hashed; a MySQL
/// `GET_LOCK` name, hashed with the database there): one sweeper per table.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn sweep_lock_name(table: &TableName) -> String {
    format!("idemkey.sweep:{}", table.quoted())
}

pub(crate) fn sql(s: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(s))
}

/// A failed database call: the store is unavailable.
pub(crate) fn unavailable(what: &str, e: sqlx::Error) -> StoreError {
    StoreError::unavailable(format!("{what} failed ({})", describe(&e)), e)
}

/// What a driver error says, without the driver's internals: a database's own error is
/// its message and code (not PostgreSQL's "at line N" of its C source).
pub(crate) fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => match d.code() {
            Some(code) => format!("{} [code {code}]", d.message()),
            None => d.message().to_owned(),
        },
        other => other.to_string(),
    }
}

/// PostgreSQL's answers to a connection that retrying will not change: SQLSTATE 3D000
/// (no such database), 28000 (no such role, or no `pg_hba.conf` entry), 28P01 (wrong
/// password).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const REFUSED_SQLSTATES: [&str; 3] = ["3D000", "28000", "28P01"];

/// The advice of a connection the server refused: retrying will not help.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn refused(db: &str, at: &str, message: &str) -> String {
    format!(
        "{db} at {at} refused the connection: {message}; check the database name, user \
         and password in the URL"
    )
}

/// A failed connection to the database server `db` (PostgreSQL, MySQL) at `at`
/// (host:port): a configuration error when the server answered and refused what the URL
/// asks for (no such database, an unknown user, a wrong password) or the URL is
/// invalid; otherwise unavailable, naming the address tried.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn connect_failed(db: &str, at: &str, e: sqlx::Error) -> StoreError {
    // Errors of the server's answer to a connection that retrying will not change:
    // PostgreSQL's ([`REFUSED_SQLSTATES`]); MySQL's and MariaDB's error numbers 1044 and
    // 1045 (access denied), 1049 (unknown database), 1698 (access denied to a socket
    // user).
    const MYSQL_ERRORS: [u16; 4] = [1044, 1045, 1049, 1698];
    let is_refusal = |d: &dyn sqlx::error::DatabaseError| {
        #[cfg(feature = "mysql")]
        if let Some(m) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            return MYSQL_ERRORS.contains(&m.number());
        }
        let _ = MYSQL_ERRORS;
        d.code().is_some_and(|c| REFUSED_SQLSTATES.contains(&&*c))
    };
    match &e {
        sqlx::Error::Configuration(_) => {
            StoreError::configuration_from(format!("{db}: the URL is invalid ({e})"), e)
        }
        sqlx::Error::Database(d) if is_refusal(&**d) => {
            StoreError::configuration_from(refused(db, at, d.message()), e)
        }
        _ => StoreError::unavailable(
            format!("{db}: connecting to {at} failed ({})", describe(&e)),
            e,
        ),
    }
}

/// The ageing checks both request paths' pools pass on a real PostgreSQL
/// (`IDEMKEY_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`): which
/// backend serves each statement, and when it leaves `pg_stat_activity`.
#[cfg(all(test, feature = "postgres"))]
pub(crate) mod ageing_checks {
    use std::time::{Duration, Instant};

    use super::Ageing;

    const LONG: Duration = Duration::from_secs(3600);

    /// Connections replaced 300 ms after they open, never closed for idleness.
    pub(crate) const SHORT_LIFETIME: Ageing = Ageing {
        idle_timeout: LONG,
        max_lifetime: Duration::from_millis(300),
    };

    /// Connections closed after 200 ms idle, never replaced for age.
    pub(crate) const SHORT_IDLE: Ageing = Ageing {
        idle_timeout: Duration::from_millis(200),
        max_lifetime: LONG,
    };

    /// The database's URL for the checks.
    pub(crate) fn url() -> String {
        std::env::var("IDEMKEY_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    /// A request path's pool, as the checks drive it.
    pub(crate) trait AgeingPool {
        /// The backend (`pg_backend_pid()`) of the connection the next statement gets.
        async fn backend(&self) -> i32;
        /// Whether backend `pid` is in `pg_stat_activity`, asked through the pool.
        async fn alive(&self, pid: i32) -> bool;
        /// How many connections the pool holds now.
        fn size(&self) -> usize;
    }

    /// With [`SHORT_LIFETIME`]: a connection serves again within its lifetime, is
    /// replaced after it, and its backend ends.
    pub(crate) async fn a_connection_past_its_lifetime_is_replaced(pool: impl AgeingPool) {
        let first = pool.backend().await;
        assert_eq!(pool.backend().await, first, "reused within its lifetime");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let second = pool.backend().await;
        assert_ne!(second, first, "replaced after its lifetime");
        assert_eq!(pool.size(), 1, "the old one is gone");
        assert!(wait_gone(&pool, first).await, "backend {first} still there");
    }

    /// With [`SHORT_IDLE`]: an idle connection leaves the pool, and its backend ends.
    pub(crate) async fn an_idle_connection_is_closed(pool: impl AgeingPool) {
        let pid = pool.backend().await;
        assert_eq!(pool.size(), 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.size() > 0 {
            assert!(Instant::now() < deadline, "the idle connection stayed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Closed on the server too (asked on a new connection of the same pool).
        assert!(wait_gone(&pool, pid).await, "backend {pid} still there");
    }

    /// Whether backend `pid` leaves `pg_stat_activity` within a few seconds.
    async fn wait_gone(pool: &impl AgeingPool, pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !pool.alive(pid).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::TableName;
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    use super::split_budget;

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn the_budget_is_split_never_exceeded() {
        assert_eq!(split_budget("db", 16, 2).expect("valid"), (14, 2));
        assert_eq!(split_budget("db", 3, 3).expect("valid"), (1, 2));
        assert_eq!(split_budget("db", 2, 3).expect("valid"), (1, 1));
        for total in 2..40 {
            for others in 0..5 {
                let (requests, rest) = split_budget("db", total, others).expect("valid");
                assert_eq!(requests + rest, total);
                assert!(requests >= 1 && rest >= 1);
            }
        }
        let err = split_budget("PostgreSQL", 1, 2).expect_err("too small");
        assert!(err.is_configuration(), "{err}");
    }

    #[test]
    fn table_names_are_validated_and_quoted() {
        let t = TableName::parse("billing.idem_1").expect("valid");
        assert_eq!(t.quoted(), "\"billing\".\"idem_1\"");
        assert_eq!(t.index_name("expires_at"), "\"idem_1_expires_at\"");
        #[cfg(feature = "postgres")]
        {
            assert_eq!(
                t.qualified_index_name("in_progress"),
                "\"billing\".\"idem_1_in_progress\""
            );
            let t = TableName::parse("idem").expect("valid");
            assert_eq!(t.qualified_index_name("x"), "\"idem_x\"");
        }
        for bad in [
            "",
            "a.b.c",
            "1abc",
            "a-b",
            "a\"; DROP TABLE x; --",
            "a.",
            &"x".repeat(64),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} must be rejected");
        }
    }
}
