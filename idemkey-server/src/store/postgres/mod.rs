//! The shared durable store on PostgreSQL (feature `postgres`).
//!
//! The schema and what it costs are documented on [`PostgresStore`]; here, how the
//! statements work.
//!
//! # Statements
//!
//! The claim is one statement around `INSERT ... ON CONFLICT (id) DO UPDATE ...
//! RETURNING`:
//!
//! 1. A CTE reads the live row (`expires_at > now()`) as the statement's snapshot sees
//!    it. If there is one (a replay, or a duplicate of a running request), it is the
//!    answer, and the statement writes and locks nothing.
//! 2. Otherwise the `INSERT` runs. On a conflict (an expired row, or a row a concurrent
//!    claim inserted after the snapshot was taken) the update keeps every column of a
//!    live row (each `SET` is `CASE WHEN <expired> THEN <new> ELSE <old> END`), so it
//!    always returns the row as it stands after the claim, under its row lock: the
//!    claim won when the returned token is its own, and otherwise the returned row is
//!    the live record. A plain `DO UPDATE ... WHERE <expired>` would return nothing in
//!    the race (the new row is invisible to the snapshot) and need a second statement.
//!
//! Complete, renew and release are `UPDATE`/`DELETE ... WHERE id = $1 AND token = $2
//! AND payload IS NULL AND <kept>`, where `<kept>` is "lease end + retention is still
//! ahead": a taken-over token matches no row, while an owner whose lease expired and
//! whom nobody took over still writes (contract rule 3). Every time decision uses the
//! database's `now()`, so all instances agree on one clock.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgListener, PgPool, Postgres};
use sqlx::{AssertSqlSafe, Row};
use tokio_postgres::types::ToSql;

use self::session::{Prepared, Sessions, Target};
use super::inbox::{DEFAULT_INBOX_RETENTION, InboxSql};
use super::sql::{
    ADDED_COLUMNS, DEFAULT_TABLE, SqlxRow, TableName, claim_sets, connect_failed, decode_claim,
    decode_info, fenced, fenced_by, pool_options, split_budget, sql, sweep_lock_name, unavailable,
};
use super::sweeper::{Batch, batched_pass};
use super::{
    Claim, ClaimRequest, FencingToken, PollingWatch, RecordId, RecordInfo, Settlements, Store,
    StoreError, SweepOptions, SweepReport, Watch, clamp_forever,
};

mod session;

/// A store shared by every instance of an application through one PostgreSQL database.
///
/// Cheap to clone (clones share its connections). Connection failures and pool
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
///
/// # Schema
///
/// One table (default `idemkey_records`), created by [`PostgresStore::migrate`] or by your
/// own migrations from [`PostgresStore::schema_sql`]:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS idemkey_records (
///     id          bytea       PRIMARY KEY,        -- RecordId: SHA-256 of scope and key
///     fingerprint bytea       NOT NULL,
///     token       bytea,                          -- the owner's token while in progress
///     payload     bytea,                          -- set once completed
///     taken_over  boolean     NOT NULL DEFAULT false,
///     expires_at  timestamptz NOT NULL,           -- lease end, or retention end
///     created     timestamptz NOT NULL DEFAULT now(), -- the current claim's time
///     retention   bigint      NOT NULL DEFAULT 0, -- µs an abandoned claim is kept
///                                                 -- past its lease
///     sweep_at    timestamptz NOT NULL DEFAULT '-infinity' -- the row's earliest end
/// );
/// ALTER TABLE idemkey_records ADD COLUMN IF NOT EXISTS
///     created timestamptz NOT NULL DEFAULT now();
/// ALTER TABLE idemkey_records ADD COLUMN IF NOT EXISTS
///     retention bigint NOT NULL DEFAULT 0;
/// ALTER TABLE idemkey_records ADD COLUMN IF NOT EXISTS
///     sweep_at timestamptz NOT NULL DEFAULT '-infinity';
/// ALTER TABLE idemkey_records SET (fillfactor = 95,
///     autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
///     autovacuum_analyze_scale_factor = 0.02);
/// CREATE INDEX IF NOT EXISTS idemkey_records_sweep_at ON idemkey_records (sweep_at);
/// DROP INDEX IF EXISTS idemkey_records_expires_at;
/// DROP INDEX IF EXISTS idemkey_records_in_progress;
/// ```
///
/// The layout is made for churn: every record is inserted, renewed, completed and
/// deleted within its retention. Renewals and completions change no indexed column, so
/// PostgreSQL makes them heap-only (HOT) updates: the new row version goes on the same
/// page, no index gets a new entry, and the old version is pruned from the page
/// without waiting for vacuum. The fill factor leaves a twentieth of each page for
/// those versions (with 400-byte responses, 97 % of the updates stay on their page;
/// 90 makes it 99 % for 9 % more storage, 100 makes it 90 %). `sweep_at` is set by the claim to the claim's time plus its retention,
/// the earliest the row can end whatever follows (a completion with the same
/// retention ends it later; one with a shorter retention lowers it); the sweep finds
/// rows through its index and checks the row's real end. Autovacuum starts at 1 % of
/// the table dead rather than 20 %, so that at tens of millions of records the space
/// of swept rows is reused within minutes rather than hours (autovacuum must be on in
/// the server: these settings only tune it). [`Store::list_in_progress`], an operator's
/// query, reads the whole table (no index on in-progress rows: a completion would
/// have to change it).
///
/// # Upgrading
///
/// The statements upgrade a table of an earlier schema in place, and are safe to run
/// again. Rows of the schema before `created` and `retention` show the time of the
/// upgrade as `created`, and their abandoned claims are not kept past their lease. Rows
/// written before `sweep_at` take `'-infinity'` without the table being rewritten, and
/// each sweep batch dates up to a batch of them (then they are swept as any other).
/// The fill factor applies to pages written from then on. On a large table, do the
/// steps that take locks yourself first, without blocking writes: add the column
/// (`ALTER TABLE ... ADD COLUMN sweep_at ...`, instant), `CREATE INDEX CONCURRENTLY
/// idemkey_records_sweep_at ON idemkey_records (sweep_at)` and `DROP INDEX
/// CONCURRENTLY` of the two old indexes; the upgrade then skips them. Upgrade every
/// instance together: an instance of an earlier version still sweeps by `expires_at`,
/// which has no index any more. [`PostgresStore::migrate`] runs nothing once the schema
/// is current, so starting an instance takes no lock on the table.
///
/// # Costs
///
/// A fresh request costs 2 statements (claim, complete), a replay 1, and every time
/// decision uses the database's `now()`, so all instances agree on one clock. Expired
/// rows stay until [`Store::sweep`] deletes them (they count as absent meanwhile;
/// abandoned claims are kept for their retention past their lease): schedule it, e.g.
/// every few minutes with [`spawn_sweeper`](crate::store::spawn_sweeper).
/// `BENCHMARKS.md` has what the layout does under churn (HOT updates, table and index
/// sizes after many sweeps).
///
/// # Connections
///
/// The request path (claim, complete, renew, release) runs on tokio-postgres
/// connections that the requests in flight share, whose statements cost less CPU than
/// on sqlx's; the statements are prepared once per connection. Everything else
/// (migrations, sweeps, `LISTEN`, the admin operations) runs on a sqlx pool. Both read
/// the same URL: host (or a socket directory, `?host=/path`), port, user, password (the
/// URL's, else `PGPASSWORD`, else the password file's, `PGPASSFILE` or `~/.pgpass`),
/// database, `application_name` and `options`. The connections are not encrypted:
/// `sslmode=prefer` (the default) connects in plain text, `require` and stricter fail
/// to connect; keep the database on a private network or behind a local TLS proxy.
#[derive(Clone)]
pub struct PostgresStore {
    /// Everything off the request path: migrations, sweeps, `LISTEN`, admin.
    pool: PgPool,
    /// The request path: claim, complete, renew, release (on tokio-postgres: see
    /// `session.rs`).
    requests: Sessions,
    table: TableName,
    sql: Arc<Statements>,
    inbox_retention: Duration,

    /// With [`PostgresStoreBuilder::notify`]: the waiters woken by `LISTEN`.
    notifier: Option<Arc<Notifier>>,
}

/// The table's storage parameters (`ALTER TABLE ... SET (...)`): room on every page for
/// a completion's new row version, so that it stays on its page as a heap-only (HOT)
/// update, and vacuum triggered by 1 % of the table dead instead of 20 %. The fill
/// factor is the one `pg_churn` measured as the best trade (`BENCHMARKS.md`).
const RELOPTIONS: [&str; 4] = [
    "fillfactor = 95",
    "autovacuum_vacuum_scale_factor = 0.01",
    "autovacuum_vacuum_threshold = 1000",
    "autovacuum_analyze_scale_factor = 0.02",
];

/// The indexes of earlier schemas that the upgrade drops (by suffix): on `expires_at`,
/// which completions and renewals change, and on in-progress rows, whose predicate
/// completions change; either made every completion write a new entry in every index.
const DROPPED_INDEXES: [&str; 2] = ["expires_at", "in_progress"];

/// The connections of the store's budget ([`PostgresStoreBuilder::max_connections`])
/// kept off the request path, for migrations, sweeps (a pass holds two: its lock's and
/// its batches') and the admin operations; one more with
/// [`PostgresStoreBuilder::notify`], for `LISTEN`.
const OTHER_CONNECTIONS: u32 = 2;

/// The most connections a PostgreSQL server accepts (its source's `MAX_BACKENDS`,
/// `0x3FFFF`): the most a store may ask for.
const MAX_BACKENDS: u32 = (1 << 18) - 1;

/// The channel complete and release notify (with `notify(true)`), the record id in hex
/// as payload.
const CHANNEL: &str = "idemkey_settled";

/// The waiters of this store's records, woken by one `LISTEN` connection per store,
/// opened at the first watch (and again at the next watch once it was lost).
struct Notifier {
    settlements: Settlements,
    listener: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.get_mut().take() {
            listener.abort();
        }
    }
}

struct Statements {
    claim: Arc<str>,
    complete: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    sweep: Arc<str>,
    sweep_lag: Arc<str>,
    sweep_lock: Arc<str>,
    inspect: Arc<str>,
    force_release: Arc<str>,
    list_in_progress: Arc<str>,
    schema_is_current: Arc<str>,
    inbox_insert: Arc<str>,
    inbox_lock: Arc<str>,
    inbox_take: Arc<str>,
    inbox_record: Arc<str>,
}

impl Statements {
    fn new(t: &str, notify: bool) -> Self {
        let taken = "r.expires_at <= now()";
        // `sweep_at` is the claim's: set with the other columns on a takeover.
        let sets = format!(
            "{},\n  sweep_at = CASE WHEN {taken} THEN excluded.sweep_at ELSE r.sweep_at END",
            claim_sets(taken, "r.")
        );
        let remaining = "(extract(epoch FROM expires_at - now()) * 1000000)::bigint AS remaining";
        // The end of the time a row is kept: retention end once completed, lease end
        // plus the claim's retention while in progress (an abandoned claim, rule 4).
        let kept_until = "CASE WHEN payload IS NULL \
            THEN expires_at + retention * interval '1 microsecond' ELSE expires_at END";
        let held = "id = $1 AND token = $2 AND payload IS NULL \
            AND expires_at + retention * interval '1 microsecond' > now()";
        let expired = "expires_at <= now() AND (payload IS NOT NULL
  OR expires_at + retention * interval '1 microsecond' <= now())";
        let due = format!("sweep_at > '-infinity' AND sweep_at <= now() AND {expired}");
        let info = "id, payload IS NULL AS in_progress, fingerprint,
  octet_length(payload)::bigint AS payload_len,
  (extract(epoch FROM created) * 1000000)::bigint AS created,
  (extract(epoch FROM expires_at) * 1000000)::bigint AS expires";
        Self {
            claim: format!(
                "WITH live AS (
  SELECT false AS won, taken_over, fingerprint, payload, {remaining}
  FROM {t} WHERE id = $1::bytea AND expires_at > now()
), claimed AS (
  INSERT INTO {t} AS r (id, fingerprint, token, payload, taken_over, expires_at, created,
    retention, sweep_at)
  SELECT $1::bytea, $2::bytea, $3::bytea, NULL, false,
    now() + $4::bigint * interval '1 microsecond', now(), $5::bigint,
    now() + $5::bigint * interval '1 microsecond'
  WHERE NOT EXISTS (SELECT 1 FROM live)
  ON CONFLICT (id) DO UPDATE SET
    {sets}
  RETURNING coalesce(token = $3::bytea, false) AS won, taken_over, fingerprint, payload,
    {remaining}
)
SELECT * FROM claimed UNION ALL SELECT * FROM live"
            )
            .into(),
            complete: notified(
                &format!(
                    "UPDATE {t} SET payload = $3, token = NULL,
  expires_at = now() + $4 * interval '1 microsecond',
  sweep_at = least(sweep_at, now() + $4 * interval '1 microsecond') WHERE {held}"
                ),
                notify,
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = now() + $3 * interval '1 microsecond' WHERE {held}"
            )
            .into(),
            release: notified(&format!("DELETE FROM {t} WHERE {held}"), notify),
            // One bounded batch in one short statement: the expired rows first in
            // `sweep_at` order (through its index; `sweep_at` is a lower bound of the
            // row's end, and the expiry itself is checked on the row), locked (so that
            // deleting them by id deletes what was checked) and removed; rows a claim
            // holds at that moment are skipped, not waited for. The ids go through
            // `ARRAY(...)`, which the planner runs once and then looks up by primary
            // key (`IN (SELECT ...)` may become a join that reads the whole table).
            // Besides, up to a batch of rows written before `sweep_at` existed
            // (`'-infinity'`, the column's default) is given its `sweep_at`.
            sweep: format!(
                "WITH dated AS (
  UPDATE {t} SET sweep_at = CASE WHEN payload IS NULL
      THEN created + retention * interval '1 microsecond' ELSE expires_at END
  WHERE id = ANY(ARRAY(SELECT id FROM {t} WHERE sweep_at = '-infinity'
    LIMIT $1 FOR UPDATE SKIP LOCKED))
  RETURNING 1
), swept AS (
  DELETE FROM {t} WHERE id = ANY(ARRAY(SELECT id FROM {t} WHERE {due}
    ORDER BY sweep_at LIMIT $1 FOR UPDATE SKIP LOCKED))
  RETURNING 1
)
SELECT (SELECT count(*) FROM swept) AS removed, (SELECT count(*) FROM dated) AS dated"
            )
            .into(),
            sweep_lag: format!(
                "SELECT extract(epoch FROM now() - ({kept_until}))::float8 FROM {t} WHERE {due}
ORDER BY sweep_at LIMIT 1"
            )
            .into(),
            // A session-level advisory lock, keyed by the table's name: one sweeper per
            // table of a database, however many instances.
            sweep_lock: "SELECT pg_try_advisory_lock(hashtextextended($1, 0))".into(),
            inspect: format!("SELECT {info} FROM {t} WHERE id = $1 AND {kept_until} > now()")
                .into(),
            force_release: format!(
                "DELETE FROM {t} WHERE id = $1 RETURNING {kept_until} > now() AS shown"
            )
            .into(),
            list_in_progress: format!(
                "SELECT {info} FROM {t} WHERE payload IS NULL
  AND expires_at + retention * interval '1 microsecond' > now()
ORDER BY created LIMIT $1"
            )
            .into(),
            schema_is_current: "SELECT to_regclass($1) IS NOT NULL
  AND (SELECT count(*) FROM pg_attribute
       WHERE attrelid = to_regclass($1) AND attname = ANY($2) AND NOT attisdropped)
      = cardinality($2)
  AND (SELECT coalesce(reloptions, '{}') @> $3 FROM pg_class WHERE oid = to_regclass($1))
  AND to_regclass($4) IS NOT NULL AND to_regclass($5) IS NULL AND to_regclass($6) IS NULL"
                .into(),
            // The inbox's statements run in the caller's transaction, where `now()` is
            // the transaction's start: `statement_timestamp()` is the time now.
            inbox_insert: format!(
                "INSERT INTO {t} (id, fingerprint, token, payload, taken_over, expires_at, created,
    retention, sweep_at)
  VALUES ($1, $2, NULL, NULL, false,
    statement_timestamp() + $3 * interval '1 microsecond', statement_timestamp(), 0,
    statement_timestamp() + $3 * interval '1 microsecond')
  ON CONFLICT (id) DO NOTHING"
            )
            .into(),
            inbox_lock: format!(
                "SELECT false AS won, false AS taken_over, fingerprint, payload,
  expires_at > statement_timestamp() AS live,
  (extract(epoch FROM expires_at - statement_timestamp()) * 1000000)::bigint AS remaining
FROM {t} WHERE id = $1 FOR UPDATE"
            )
            .into(),
            inbox_take: format!(
                "UPDATE {t} SET fingerprint = $2, token = NULL, payload = NULL, taken_over = false,
  expires_at = statement_timestamp() + $3 * interval '1 microsecond',
  sweep_at = statement_timestamp() + $3 * interval '1 microsecond',
  created = statement_timestamp(), retention = 0
WHERE id = $1"
            )
            .into(),
            inbox_record: format!("UPDATE {t} SET payload = $2 WHERE id = $1").into(),
        }
    }
}

/// A fenced write (one row, or none when fenced) that, with `notify`, also notifies
/// [`CHANNEL`] of the row it wrote, in the same statement (so in its transaction: the
/// notice goes out when the write commits). The statement then counts the rows it
/// selected, one per row written, as the write alone would.
fn notified(write: &str, notify: bool) -> Arc<str> {
    if notify {
        format!(
            "WITH written AS ({write} RETURNING id)
SELECT pg_notify('{CHANNEL}', encode(id, 'hex')) FROM written"
        )
        .into()
    } else {
        write.into()
    }
}

/// Configures a [`PostgresStore`]; made by [`PostgresStore::builder`].
#[derive(Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    table: String,
    max_connections: u32,
    acquire_timeout: Duration,
    inbox_retention: Duration,

    notify: bool,
}

impl std::fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: not shown.
        f.debug_struct("PostgresStoreBuilder")
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("inbox_retention", &self.inbox_retention)
            .field("notify", &self.notify)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    /// The table (default `idemkey_records`), optionally schema-qualified
    /// (`"billing.idempotency"`). Letters, digits and `_` only.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The most connections the store holds to the database at once (default 16, at
    /// least 2, at most PostgreSQL's 262,143): all but 2 (3 with
    /// [`notify`](Self::notify)) serve the request path (claim, complete, renew,
    /// release), the others migrations, sweeps (a pass takes two), `LISTEN` and the
    /// admin operations, each on a pool of its own so that neither waits for the other.
    /// With fewer than 3 (4 with `notify`), the request path keeps one and the rest
    /// share what is left. Connections are opened on demand (one at
    /// [`connect`](Self::connect)): the request path opens another only when each open
    /// one carries a statement, and beyond its budget a request connection carries up
    /// to 4 statements at once (sent together, answered in order); as in sqlx's pool,
    /// one idle for 10 minutes is closed and one is replaced after 30. A request
    /// cancelled while its statement runs leaves the statement to finish and the
    /// connection serving the others.
    ///
    /// ```
    /// // 30 for requests, 2 for the rest.
    /// let builder = idemkey::store::PostgresStore::builder("postgres://localhost/app")
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

    /// How long [`PostgresStore::once_in`] keeps a processed message's record
    /// (default 7 days): a redelivery within it is recognised; one after it runs again.
    #[must_use]
    pub fn inbox_retention(mut self, retention: Duration) -> Self {
        self.inbox_retention = retention;
        self
    }

    /// Notify waiting duplicates (default off): complete and release `NOTIFY` the
    /// channel `idemkey_settled`, and [`Store::watch`] `LISTEN`s on it (one connection
    /// per store, opened at the first watch), so that a duplicate that waits for a
    /// running request ([`InProgressPolicy::Wait`](crate::policy::InProgressPolicy::Wait))
    /// is answered as soon as the outcome commits instead of at its next poll.
    ///
    /// Off by default because a `NOTIFY` takes a database-wide lock at commit, which
    /// serializes the commits of every transaction that notifies; turn it on where
    /// duplicates wait, on every instance that writes to the table (an instance
    /// without it completes records silently, and the waiters of the others poll).
    ///
    /// ```
    /// let builder = idemkey::store::PostgresStore::builder("postgres://localhost/app").notify(true);
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// Connects (one connection now, the rest on demand). Does not create the table:
    /// call [`PostgresStore::migrate`] or run [`PostgresStore::schema_sql`] yourself.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_configuration`] when the table name or the URL is invalid,
    /// `max_connections` is below 2, or the server refuses the URL's database, user
    /// or password;
    /// [`StoreError::is_unavailable`] when the server cannot be reached (the message
    /// names the host and port tried).
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        let table = TableName::parse(&self.table)?;
        if self.max_connections > MAX_BACKENDS {
            return Err(StoreError::configuration(format!(
                "PostgreSQL: max_connections is {}; PostgreSQL serves at most {MAX_BACKENDS} \
                 connections",
                self.max_connections
            )));
        }
        let options = sqlx::postgres::PgConnectOptions::from_str(&self.url)
            .map_err(|e| connect_failed("PostgreSQL", "?", e))?;
        let at = format!("{}:{}", options.get_host(), options.get_port());
        let (for_requests, for_others) = split_budget(
            "PostgreSQL",
            self.max_connections,
            OTHER_CONNECTIONS + u32::from(self.notify),
        )?;
        let sql = Arc::new(Statements::new(table.quoted(), self.notify));
        let target = Target::new(&self.url, &options, Arc::clone(&sql));
        let requests = Sessions::new(target, for_requests, self.acquire_timeout)?;
        requests.open_first(&at).await?;
        // Opened on demand: the request path's first connection checked the URL.
        let pool = pool_options::<Postgres>()
            .max_connections(for_others)
            .acquire_timeout(self.acquire_timeout)
            .connect_lazy_with(options);
        let notifier = self.notify.then(|| {
            Arc::new(Notifier {
                settlements: Settlements::default(),
                listener: tokio::sync::Mutex::new(None),
            })
        });
        Ok(PostgresStore {
            pool,
            requests,
            table,
            sql,
            inbox_retention: self.inbox_retention,

            notifier,
        })
    }
}

impl PostgresStore {
    /// The statements of the request path, exactly as this store runs them: the claim and the completion.
    /// For measuring tools that must run the store's own SQL (perf's SQL floor); not
    /// part of the API.
    #[doc(hidden)]
    #[must_use]
    pub fn request_path_sql(&self) -> (Arc<str>, Arc<str>) {
        (self.sql.claim.clone(), self.sql.complete.clone())
    }

    /// A builder for a store at `url` (`postgres://user[:password]@host[:port]/database`).
    #[must_use]
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.into(),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(3),
            inbox_retention: DEFAULT_INBOX_RETENTION,

            notify: false,
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

    /// The schema this store needs, as SQL, for applications that run their own
    /// migrations: `CREATE ... IF NOT EXISTS` and `ADD COLUMN IF NOT EXISTS`, so it can
    /// be run again, and it upgrades a table of the previous schema in place (see
    /// [`PostgresStore`]).
    #[must_use]
    pub fn schema_sql(&self) -> String {
        let t = self.table.quoted();
        let sweep = self.table.index_name("sweep_at");
        let [expiry, in_progress] =
            DROPPED_INDEXES.map(|suffix| self.table.qualified_index_name(suffix));
        let options = RELOPTIONS.join(", ");
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
    id          bytea       PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       bytea,
    payload     bytea,
    taken_over  boolean     NOT NULL DEFAULT false,
    expires_at  timestamptz NOT NULL,
    created     timestamptz NOT NULL DEFAULT now(),
    retention   bigint      NOT NULL DEFAULT 0,
    sweep_at    timestamptz NOT NULL DEFAULT '-infinity'
);
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS created timestamptz NOT NULL DEFAULT now();
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS retention bigint NOT NULL DEFAULT 0;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS sweep_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE {t} SET ({options});
CREATE INDEX IF NOT EXISTS {sweep} ON {t} (sweep_at);
DROP INDEX IF EXISTS {expiry};
DROP INDEX IF EXISTS {in_progress};"
        )
    }

    /// Creates the table and its indexes if they do not exist, and upgrades a table of
    /// the previous schema in place ([`PostgresStore::schema_sql`]). Safe to call from
    /// every instance at start-up: it reads the catalog first and runs no DDL (takes no
    /// lock on the table) once the schema is current, and concurrent upgrades are
    /// serialised by an advisory lock.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the database cannot be reached or refuses the
    /// DDL (for example for lack of privileges).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let err = |e| unavailable("PostgreSQL: creating the schema", e);
        let columns = [ADDED_COLUMNS.as_slice(), &["sweep_at"]].concat();
        let [expiry, in_progress] =
            DROPPED_INDEXES.map(|suffix| self.table.qualified_index_name(suffix));
        let current: bool = sqlx::query_scalar(sql(&self.sql.schema_is_current))
            .bind(self.table.quoted())
            .bind(columns)
            .bind(RELOPTIONS.map(|o| o.replace(' ', "")).as_slice())
            .bind(self.table.qualified_index_name("sweep_at"))
            .bind(expiry)
            .bind(in_progress)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        if current {
            return Ok(());
        }
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
}

impl InboxSql for PostgresStore {
    type Db = Postgres;
    type Conn = PgConnection;

    async fn claim(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
        fingerprint: &[u8],
    ) -> Result<Claim, StoreError> {
        let err = |e| unavailable("PostgreSQL: the inbox claiming a record", e);
        let retention = micros(self.inbox_retention);
        // A row that disappears between the two statements (swept, released) is
        // inserted again; three rounds make that race practically impossible to lose.
        for _ in 0..3 {
            let inserted = sqlx::query(sql(&self.sql.inbox_insert))
                .bind(id.as_bytes().as_slice())
                .bind(fingerprint)
                .bind(retention)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            if inserted.rows_affected() == 1 {
                return Ok(Claim::Acquired { takeover: false });
            }
            let Some(row) = sqlx::query(sql(&self.sql.inbox_lock))
                .bind(id.as_bytes().as_slice())
                .fetch_optional(&mut *conn)
                .await
                .map_err(err)?
            else {
                continue;
            };
            let live: bool = row
                .try_get("live")
                .map_err(|e| StoreError::corrupt(format!("the inbox's claim returned {e}")))?;
            if live {
                return decode_claim(&SqlxRow(&row), Duration::from_micros);
            }
            sqlx::query(sql(&self.sql.inbox_take))
                .bind(id.as_bytes().as_slice())
                .bind(fingerprint)
                .bind(retention)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            return Ok(Claim::Acquired { takeover: true });
        }
        Err(StoreError::unavailable(
            "PostgreSQL: the inbox's record was removed three times while being claimed",
            "retry the message",
        ))
    }

    async fn record(
        &self,
        conn: &mut PgConnection,
        id: &RecordId,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let done = sqlx::query(sql(&self.sql.inbox_record))
            .bind(id.as_bytes().as_slice())
            .bind(payload)
            .execute(&mut *conn)
            .await
            .map(|r| r.rows_affected());
        fenced("PostgreSQL: the inbox recording a result", done)
    }
}

/// A duration in whole microseconds, "forever" held to 100 years.
fn micros(d: Duration) -> i64 {
    // 100 years in microseconds is far below i64::MAX.
    i64::try_from(clamp_forever(d).as_micros()).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let what = "PostgreSQL: claiming a record";
        let lease = self.requests.get(what).await?;
        let token = req.token.to_bytes();
        let params: [&(dyn ToSql + Sync); 5] = [
            &req.id.as_bytes().as_slice(),
            &req.fingerprint,
            &token.as_slice(),
            &micros(req.lease),
            &micros(req.retention),
        ];
        let row = async {
            let (client, prepared) = lease.prepared().await?;
            client.query_one(&prepared.claim, &params).await
        }
        .await;
        let row = row.map_err(|e| session::unavailable(what, e))?;
        decode_claim(&row, Duration::from_micros)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let what = "PostgreSQL: completing a record";
        let token = token.to_bytes();
        let params: [&(dyn ToSql + Sync); 4] = [
            &id.as_bytes().as_slice(),
            &token.as_slice(),
            &payload.as_ref(),
            &micros(retention),
        ];
        self.fenced_write(what, |s| &s.complete, &params).await
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let what = "PostgreSQL: renewing a lease";
        let token = token.to_bytes();
        let params: [&(dyn ToSql + Sync); 3] =
            [&id.as_bytes().as_slice(), &token.as_slice(), &micros(lease)];
        self.fenced_write(what, |s| &s.renew, &params).await
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let what = "PostgreSQL: releasing a record";
        let token = token.to_bytes();
        let params: [&(dyn ToSql + Sync); 2] = [&id.as_bytes().as_slice(), &token.as_slice()];
        self.fenced_write(what, |s| &s.release, &params).await
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let whole = SweepOptions::default().exclusive(false);
        Ok(self.sweep_pass(&whole).await?.removed())
    }

    async fn sweep_pass(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        // The lock's connection is closed (not returned to the pool) when dropped, so the
        // session and its advisory lock end even if the pass is cancelled.
        batched_pass(
            options,
            || self.try_sweep_lock(),
            |limit| self.sweep_batch(limit),
            || self.sweep_lag(),
        )
        .await
    }

    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let row = sqlx::query(sql(&self.sql.inspect))
            .bind(id.as_bytes().as_slice())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| unavailable("PostgreSQL: inspecting a record", e))?;
        row.map(|r| decode_info(&SqlxRow(&r), Duration::from_micros))
            .transpose()
    }

    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let shown: Option<bool> = sqlx::query_scalar(sql(&self.sql.force_release))
            .bind(id.as_bytes().as_slice())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| unavailable("PostgreSQL: force-releasing a record", e))?;
        Ok(shown.unwrap_or(false))
    }

    /// With [`PostgresStoreBuilder::notify`], woken by `LISTEN`; polling otherwise.
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        let Some(notifier) = &self.notifier else {
            return Ok(Box::new(PollingWatch::default()));
        };
        // Armed before the listener is known to listen: a notice from then on wakes it.
        let watch = notifier.settlements.subscribe(id);
        self.listen(notifier).await?;
        Ok(Box::new(watch))
    }

    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let rows = sqlx::query(sql(&self.sql.list_in_progress))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| unavailable("PostgreSQL: listing records in progress", e))?;
        rows.iter()
            .map(|r| decode_info(&SqlxRow(r), Duration::from_micros))
            .collect()
    }
}

impl PostgresStore {
    /// Runs the fenced write (complete, renew, release) that `statement` picks of a
    /// request session's prepared statements, with `params`.
    async fn fenced_write(
        &self,
        what: &str,
        statement: impl FnOnce(&Prepared) -> &tokio_postgres::Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let lease = self.requests.get(what).await?;
        let done = async {
            let (client, prepared) = lease.prepared().await?;
            client.execute(statement(prepared), params).await
        }
        .await;
        fenced_by(done, |e| session::unavailable(what, e))
    }

    /// Removes at most `limit` expired records, and dates at most `limit` rows written
    /// before `sweep_at` existed, in one statement.
    async fn sweep_batch(&self, limit: u32) -> Result<Batch, StoreError> {
        let row = sqlx::query(sql(&self.sql.sweep))
            .bind(i64::from(limit))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| unavailable("PostgreSQL: sweeping expired records", e))?;
        let count = |column| {
            row.try_get::<i64, _>(column)
                .map(|n| u64::try_from(n).unwrap_or(0))
                .map_err(|e| StoreError::corrupt(format!("the sweep returned {e}")))
        };
        let (removed, dated) = (count("removed")?, count("dated")?);
        // Rows just dated are swept by the next batch.
        Ok(Batch {
            removed,
            more: removed >= u64::from(limit) || dated > 0,
        })
    }

    /// How long the first expired record in sweep order (within a request's duration of
    /// the oldest) has been expired.
    async fn sweep_lag(&self) -> Option<Duration> {
        let secs: Option<f64> = sqlx::query_scalar(sql(&self.sql.sweep_lag))
            .fetch_optional(&self.pool)
            .await
            .ok()?;
        Some(secs.map_or(Duration::ZERO, |s| Duration::from_secs_f64(s.max(0.0))))
    }

    /// The table's sweep lock (`pg_try_advisory_lock` on `idemkey.sweep:<table>`), on a
    /// connection of its own that is closed when dropped; `None` when another session
    /// holds it.
    async fn try_sweep_lock(&self) -> Result<Option<PoolConnection<Postgres>>, StoreError> {
        let failed = |e| unavailable("PostgreSQL: taking the sweep lock", e);
        let mut conn = self.pool.acquire().await.map_err(failed)?;
        let got: bool = sqlx::query_scalar(sql(&self.sql.sweep_lock))
            .bind(sweep_lock_name(&self.table))
            .fetch_one(&mut *conn)
            .await
            .map_err(failed)?;
        if !got {
            return Ok(None);
        }
        conn.close_on_drop();
        Ok(Some(conn))
    }

    /// Starts the `LISTEN` task of `notifier` unless it runs; returns once it listens.
    async fn listen(&self, notifier: &Arc<Notifier>) -> Result<(), StoreError> {
        let mut listener = notifier.listener.lock().await;
        if listener.as_ref().is_some_and(|l| !l.is_finished()) {
            return Ok(());
        }
        let mut pg = PgListener::connect_with(&self.pool)
            .await
            .map_err(|e| unavailable("PostgreSQL: connecting to LISTEN", e))?;
        pg.listen(CHANNEL)
            .await
            .map_err(|e| unavailable("PostgreSQL: LISTEN", e))?;
        // Not the notifier itself: its drop ends this task.
        let weak = Arc::downgrade(notifier);
        *listener = Some(tokio::spawn(async move {
            loop {
                let n = match pg.recv().await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::debug!(error = %e, "the LISTEN connection of the store's waiters failed; the next watch opens it again");
                        return;
                    }
                };
                let Some(notifier) = weak.upgrade() else {
                    return;
                };
                let mut id = [0_u8; 32];
                if hex::decode_to_slice(n.payload(), &mut id).is_ok() {
                    notifier.settlements.notify(&RecordId::from_bytes(id));
                }
            }
        }));
        Ok(())
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table.quoted())
            .finish_non_exhaustive()
    }
}
