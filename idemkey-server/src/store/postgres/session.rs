//! The PostgreSQL store's request path (claim, complete, renew, release) on
//! tokio-postgres, on sessions that the requests in flight share.
//!
//! The same statements cost less CPU from tokio-postgres than from sqlx, and less again
//! when a client carries several requests' statements at once (one write and one read
//! of the socket for all of them): measured with `load` (`BENCHMARKS.md`, "Stores").
//!
//! A session is a tokio-postgres client with the four statements prepared on it
//! (together, in one round trip, at its first statement). A statement goes to the
//! first open session that carries none, else to a new session while the store's
//! budget allows, else to the one that carries the fewest, [`PIPELINE_DEPTH`] at most;
//! beyond that a request waits for room, at most the acquire timeout, and is then
//! answered unavailable (503), as when the pool's connections were all taken. A
//! statement that waits for a lock holds up the statements behind it on its session:
//! the request path's statements take row locks only for the instant of one statement,
//! so this matters only while something else holds the table (a migration's `ALTER
//! TABLE`, a `LOCK TABLE`), when every request waits anyway.
//!
//! A request cancelled mid-statement leaves its session serving the others: the
//! client's connection task reads the statement's answer and discards it. A session
//! the server closed (a restart, `pg_terminate_backend`) is known closed to its client
//! and replaced before its slot takes another statement; its statements in flight fail
//! unavailable. Sessions age as the store's sqlx pool's connections do: one that carried
//! no statement for 10 minutes is closed, one opened 30 minutes ago is replaced, each
//! ending with the protocol's `Terminate` once its last statement has answered.
//!
//! The address and credentials are sqlx's reading of the store's URL
//! ([`PgConnectOptions`]), so that the two pools of a store reach the same database as
//! the same user: host or socket directory, port, user, password (the URL's, else
//! `PGPASSWORD`, else the password file's), database, `application_name` and
//! `options`. There is no TLS, as in
//! the store's sqlx pool (built without a TLS feature): `sslmode=disable`, `allow` and
//! `prefer` connect in plain text, `require` and stricter fail to connect.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use tokio::sync::{OnceCell, Semaphore, SemaphorePermit};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config, NoTls, Statement};

use super::super::StoreError;
use super::super::sql::{Ageing, REFUSED_SQLSTATES, RecordRow, refused};
use super::Statements;

/// What opening a session takes: the server and credentials, and the request path's
/// statements of the store's table.
pub(crate) struct Target {
    config: Config,
    sql: Arc<Statements>,
}

impl Target {
    /// The target of sqlx's reading of the store's URL (`options`, from `url`), for
    /// the statements `sql`.
    pub(crate) fn new(url: &str, options: &PgConnectOptions, sql: Arc<Statements>) -> Self {
        let mut config = Config::new();
        match options.get_socket() {
            Some(directory) => config.host_path(directory),
            None => config.host(options.get_host()),
        };
        config.port(options.get_port()).user(options.get_username());
        if let Some(database) = options.get_database() {
            config.dbname(database);
        }
        if let Some(name) = options.get_application_name() {
            config.application_name(name);
        }
        if let Some(settings) = options.get_options() {
            config.options(settings);
        }
        if let Some(password) = password(url, options) {
            config.password(password);
        }
        config.ssl_mode(match options.get_ssl_mode() {
            PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => {
                tokio_postgres::config::SslMode::Prefer
            }
            PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
        Self { config, sql }
    }
}

/// The password as sqlx reads it for the store's URL (sqlx-postgres 0.9
/// `src/options/parse.rs`, `PgConnectOptions::new_without_pgpass` and `apply_pgpass`):
/// the URL's (`user:password@`, then a `password` parameter), else `PGPASSWORD`, else
/// the password file's line for this server, database and user ([`password_file`]).
/// sqlx's URL parser accepted `url` already.
fn password(url: &str, options: &PgConnectOptions) -> Option<String> {
    let mut from_url = None;
    if let Ok(url) = url::Url::parse(url) {
        // sqlx refuses a password that is not UTF-8 once decoded.
        if let Some(p) = url.password() {
            let decoded = percent_encoding::percent_decode_str(p).decode_utf8();
            from_url = decoded.ok().map(String::from);
        }
        if let Some((_, p)) = url.query_pairs().filter(|(k, _)| k == "password").last() {
            from_url = Some(p.into_owned());
        }
    }
    from_url
        .or_else(|| std::env::var("PGPASSWORD").ok())
        .or_else(|| {
            let wanted = [
                options.get_host().to_owned(),
                options.get_port().to_string(),
                options.get_database().unwrap_or_default().to_owned(),
                options.get_username().to_owned(),
            ];
            let files = [
                std::env::var_os("PGPASSFILE").map(std::path::PathBuf::from),
                std::env::home_dir().map(|home| home.join(".pgpass")),
            ];
            files
                .into_iter()
                .flatten()
                .find_map(|file| password_file(&file, &wanted))
        })
}

/// The password of the first line of the password file at `path` (libpq's format,
/// `host:port:database:user:password`, `*` matching anything, `\` escaping `:` and `\`)
/// whose first four fields match `wanted`. As sqlx does, a file others may read or
/// write is ignored on Linux, and so is one that cannot be read.
fn password_file(path: &std::path::Path, wanted: &[String; 4]) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::PermissionsExt;
        if file.metadata().ok()?.permissions().mode() & 0o77 != 0 {
            tracing::warn!(path = %path.display(), "the password file is ignored: others may read it");
            return None;
        }
    }
    let text = std::io::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        if line.starts_with('#') {
            return None;
        }
        let mut fields = Vec::with_capacity(5);
        let mut field = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => field.extend(chars.next()),
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
                c => field.push(c),
            }
        }
        fields.push(field);
        let [host, port, database, user, password] = <[String; 5]>::try_from(fields).ok()?;
        [host, port, database, user]
            .iter()
            .zip(wanted)
            .all(|(field, wanted)| field == "*" || field == wanted)
            .then_some(password)
    })
}

/// How many statements one session carries at once, at most: requests share a session
/// (its client pipelines them), and when every session carries this many, a request
/// waits for room, at most the acquire timeout.
const PIPELINE_DEPTH: usize = 4;

/// The request path's sessions of one store (cheap to clone: clones share them).
#[derive(Clone)]
pub(crate) struct Sessions(Arc<Inner>);

struct Inner {
    slots: Box<[Slot]>,
    /// One per statement in flight: [`PIPELINE_DEPTH`] per slot.
    permits: Semaphore,
    target: Target,
    acquire_timeout: Duration,
    ageing: Ageing,
    /// The origin of [`Live::last_used`].
    epoch: Instant,
}

/// A place for one session: empty until a request needs it, and again once its session
/// closed, aged out or sat idle.
#[derive(Default)]
struct Slot {
    live: Mutex<Option<Arc<Live>>>,
    /// Whether `live` holds a session: a hint for choosing a slot, read without the lock.
    open: AtomicBool,
    /// The statements this slot carries now, and the requests waiting for it to open.
    in_flight: AtomicUsize,
    /// Held while a session opens in this slot, so that one request opens it and those
    /// that chose the slot meanwhile wait for it.
    opening: tokio::sync::Mutex<()>,
}

/// An open session: a tokio-postgres client (its connection's task ends when the
/// client is dropped, with the protocol's `Terminate`) and its prepared statements.
struct Live {
    client: Client,
    /// Prepared at the session's first statement, not as it opens: the table may not
    /// exist yet (a store connects before [`PostgresStore::migrate`] makes it), and
    /// preparing waits for a lock on the table, which opening a session must not.
    ///
    /// [`PostgresStore::migrate`]: super::PostgresStore::migrate
    prepared: OnceCell<Prepared>,
    opened: Instant,
    /// When its last statement ended, in milliseconds since [`Inner::epoch`].
    last_used: AtomicU64,
}

/// The request path's statements, prepared on one session.
pub(crate) struct Prepared {
    pub(crate) claim: Statement,
    pub(crate) complete: Statement,
    pub(crate) renew: Statement,
    pub(crate) release: Statement,
}

impl Prepared {
    /// Prepares the four together: the client sends them all before it reads an answer.
    async fn on(client: &Client, sql: &Statements) -> Result<Self, tokio_postgres::Error> {
        const ID: Type = Type::BYTEA;
        let (claim, complete, renew, release) = tokio::try_join!(
            client.prepare_typed(&sql.claim, &[ID, ID, ID, Type::INT8, Type::INT8]),
            client.prepare_typed(&sql.complete, &[ID, ID, ID, Type::INT8]),
            client.prepare_typed(&sql.renew, &[ID, ID, Type::INT8]),
            client.prepare_typed(&sql.release, &[ID, ID]),
        )?;
        Ok(Self {
            claim,
            complete,
            renew,
            release,
        })
    }
}

impl Slot {
    /// The slot's session if it may take a statement; a session that closed or outlived
    /// `ageing` is taken out (and ends once its statements in flight have).
    fn usable(&self, ageing: &Ageing) -> Option<Arc<Live>> {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        match &*live {
            Some(l) if !l.client.is_closed() && l.opened.elapsed() < ageing.max_lifetime => {
                Some(Arc::clone(l))
            }
            Some(_) => {
                *live = None;
                self.open.store(false, Ordering::Release);
                None
            }
            None => None,
        }
    }
}

impl Sessions {
    /// At most `size` sessions opened with `target` (none opened yet); a request waits at
    /// most `acquire_timeout` for room on one, including the time to open it.
    ///
    /// Must be called within a Tokio runtime: it starts the task that closes idle
    /// sessions, which ends when the sessions are dropped.
    pub(crate) fn new(
        target: Target,
        size: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::with_ageing(target, size, acquire_timeout, Ageing::default())
    }

    pub(crate) fn with_ageing(
        target: Target,
        size: u32,
        acquire_timeout: Duration,
        ageing: Ageing,
    ) -> Result<Self, StoreError> {
        let size = usize::try_from(size.max(1)).unwrap_or(1);
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            StoreError::configuration(
                "the request path's connections must be made within a Tokio runtime",
            )
        })?;
        let inner = Arc::new(Inner {
            slots: (0..size).map(|_| Slot::default()).collect(),
            permits: Semaphore::new(size.saturating_mul(PIPELINE_DEPTH)),
            target,
            acquire_timeout,
            ageing,
            epoch: Instant::now(),
        });
        runtime.spawn(close_idle(Arc::downgrade(&inner), ageing));
        Ok(Self(inner))
    }

    /// Opens the first session now, so that a wrong URL or an unreachable server is
    /// found when the store connects (at `at`, host:port), within the acquire timeout.
    ///
    /// # Errors
    ///
    /// [`connect_failed`]'s, or unavailable when the server did not answer in time.
    pub(crate) async fn open_first(&self, at: &str) -> Result<(), StoreError> {
        match tokio::time::timeout(self.0.acquire_timeout, self.0.open(0)).await {
            Ok(opened) => opened.map(drop).map_err(|e| connect_failed(at, e)),
            Err(_) => Err(StoreError::unavailable(
                format!(
                    "PostgreSQL: connecting to {at} took more than {:?} (the acquire \
                     timeout); is the server answering?",
                    self.0.acquire_timeout
                ),
                "timed out connecting",
            )),
        }
    }

    /// A session for one statement of `what` (a description such as "PostgreSQL:
    /// claiming a record"), within the acquire timeout: an open one that carries no
    /// statement, else a new one while the budget allows, else the one that carries
    /// the fewest.
    ///
    /// # Errors
    ///
    /// Unavailable: no session had room in time, or a new one could not be opened.
    pub(crate) async fn get(&self, what: &str) -> Result<Lease<'_>, StoreError> {
        let inner = &*self.0;
        let deadline = tokio::time::Instant::now() + inner.acquire_timeout;
        let timed_out = || {
            StoreError::unavailable(
                format!(
                    "{what} failed: none of the {} request connections had room for it \
                     within {:?} (each carries {PIPELINE_DEPTH} statements at most); \
                     raise max_connections or acquire_timeout, or look for what holds \
                     the database's locks",
                    inner.slots.len(),
                    inner.acquire_timeout
                ),
                "timed out waiting for a connection",
            )
        };
        let permit = match tokio::time::timeout_at(deadline, inner.permits.acquire()).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed.
            Ok(Err(closed)) => return Err(StoreError::unavailable(what, closed)),
            Err(_) => return Err(timed_out()),
        };
        let i = inner.choose();
        let slot = &inner.slots[i];
        slot.in_flight.fetch_add(1, Ordering::AcqRel);
        let in_flight = InFlight(slot);
        let live = match slot.usable(&inner.ageing) {
            Some(live) => live,
            None => match tokio::time::timeout_at(deadline, inner.open(i)).await {
                Ok(Ok(live)) => live,
                Ok(Err(e)) => {
                    let message = format!(
                        "{what} failed: opening a connection failed ({})",
                        describe(&e)
                    );
                    return Err(StoreError::unavailable(message, e));
                }
                Err(_) => {
                    let message = format!(
                        "{what} failed: opening a connection took more than {:?}; is the \
                         database overloaded or far away? Raise acquire_timeout if so",
                        inner.acquire_timeout
                    );
                    return Err(StoreError::unavailable(message, "timed out connecting"));
                }
            },
        };
        Ok(Lease {
            inner,
            live,
            _in_flight: in_flight,
            _permit: permit,
        })
    }

    /// How many sessions are open now.
    #[cfg(test)]
    fn open_sessions(&self) -> usize {
        self.0
            .slots
            .iter()
            .filter(|s| s.live.lock().is_ok_and(|l| l.is_some()))
            .count()
    }
}

impl Inner {
    /// The slot for the next statement: the first open one that carries none, else the
    /// first empty one (none waiting for it to open), else the one carrying the fewest.
    /// Earlier slots are preferred, so that the later ones sit idle and close when the
    /// load falls.
    fn choose(&self) -> usize {
        let mut fewest: Option<(usize, usize)> = None;
        let mut empty = None;
        for (i, slot) in self.slots.iter().enumerate() {
            let n = slot.in_flight.load(Ordering::Acquire);
            if slot.open.load(Ordering::Acquire) || n > 0 {
                if n == 0 {
                    return i;
                }
                if fewest.is_none_or(|(least, _)| n < least) {
                    fewest = Some((n, i));
                }
            } else if empty.is_none() {
                empty = Some(i);
            }
        }
        match (empty, fewest) {
            (Some(i), _) | (None, Some((_, i))) => i,
            (None, None) => 0,
        }
    }

    /// The session of slot `i`, opened now unless a request that chose the slot before
    /// opened it meanwhile.
    async fn open(&self, i: usize) -> Result<Arc<Live>, tokio_postgres::Error> {
        let slot = &self.slots[i];
        let _opening = slot.opening.lock().await;
        if let Some(live) = slot.usable(&self.ageing) {
            return Ok(live);
        }
        let (client, connection) = self.target.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL request connection ended");
            }
        });
        let live = Arc::new(Live {
            client,
            prepared: OnceCell::new(),
            opened: Instant::now(),
            last_used: AtomicU64::new(self.now()),
        });
        *slot.live.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&live));
        slot.open.store(true, Ordering::Release);
        Ok(live)
    }

    /// Milliseconds since [`Inner::epoch`].
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Closes the sessions that carried no statement for `ageing.idle_timeout` (or
/// outlived `ageing.max_lifetime`), looking a few times per idle timeout, until the
/// sessions are dropped.
async fn close_idle(inner: Weak<Inner>, ageing: Ageing) {
    loop {
        tokio::time::sleep(ageing.check_every()).await;
        let Some(inner) = inner.upgrade() else { return };
        let now = inner.now();
        for slot in &inner.slots {
            if slot.in_flight.load(Ordering::Acquire) > 0 {
                continue;
            }
            let mut live = slot.live.lock().unwrap_or_else(PoisonError::into_inner);
            let idle = |l: &Live| {
                Duration::from_millis(now.saturating_sub(l.last_used.load(Ordering::Relaxed)))
            };
            if live
                .as_deref()
                .is_some_and(|l| !ageing.keeps(idle(l), l.opened.elapsed()))
            {
                *live = None;
                slot.open.store(false, Ordering::Release);
            }
        }
    }
}

/// Counts a statement (or a request waiting for its slot to open) against its slot
/// until dropped.
struct InFlight<'a>(&'a Slot);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A session lent to one statement. Dropping it (the statement answered, or its
/// request cancelled) makes room for another; a cancelled statement's answer is read
/// and discarded by the session's connection task, and the session goes on serving.
pub(crate) struct Lease<'a> {
    inner: &'a Inner,
    live: Arc<Live>,
    _in_flight: InFlight<'a>,
    _permit: SemaphorePermit<'a>,
}

impl Lease<'_> {
    /// The client and the statements prepared on it (prepared now if they were not).
    ///
    /// # Errors
    ///
    /// The driver's: the database cannot prepare them (no table yet), or the session
    /// failed.
    pub(crate) async fn prepared(&self) -> Result<(&Client, &Prepared), tokio_postgres::Error> {
        let live = &*self.live;
        let prepared = live
            .prepared
            .get_or_try_init(|| Prepared::on(&live.client, &self.inner.target.sql))
            .await?;
        Ok((&live.client, prepared))
    }

    /// The client, for statements of tests.
    #[cfg(test)]
    fn client(&self) -> &Client {
        &self.live.client
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.live
            .last_used
            .store(self.inner.now(), Ordering::Relaxed);
    }
}

/// What a driver error says, without the driver's internals: a database's own error is
/// its message and code.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} [code {}]", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

/// A failed connection to PostgreSQL at `at` (host:port): a configuration error when
/// the server refused what the URL asks for (no such database, an unknown user, a
/// wrong or missing password); otherwise unavailable, naming the address tried.
pub(crate) fn connect_failed(at: &str, e: tokio_postgres::Error) -> StoreError {
    if let Some(d) = e.as_db_error()
        && REFUSED_SQLSTATES.contains(&d.code().code())
    {
        let message = refused("PostgreSQL", at, d.message());
        return StoreError::configuration_from(message, e);
    }
    // tokio-postgres's error for a server that asks for a password the URL does not
    // give: its kind (`Config`, shown as "invalid configuration") is not public.
    if e.to_string().starts_with("invalid configuration") {
        let message = refused("PostgreSQL", at, &e.to_string());
        return StoreError::configuration_from(message, e);
    }
    StoreError::unavailable(
        format!("PostgreSQL: connecting to {at} failed ({})", describe(&e)),
        e,
    )
}

/// A failed statement of the request path: the store is unavailable.
pub(crate) fn unavailable(what: &str, e: tokio_postgres::Error) -> StoreError {
    StoreError::unavailable(format!("{what} failed ({})", describe(&e)), e)
}

impl RecordRow for tokio_postgres::Row {
    fn boolean(&self, column: &str) -> Result<bool, String> {
        self.try_get(column).map_err(|e| e.to_string())
    }

    fn integer(&self, column: &str) -> Result<Option<i64>, String> {
        self.try_get(column).map_err(|e| e.to_string())
    }

    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, String> {
        self.try_get(column).map_err(|e| e.to_string())
    }
}

/// Sessions on a real PostgreSQL (`IDEMKEY_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`): how they age (the checks both request
/// paths pass, `sql::ageing_checks`), and what of the URL they carry.
#[cfg(test)]
mod on_postgres {
    use std::str::FromStr;
    use std::sync::Arc;
    use std::time::Duration;

    use sqlx::postgres::PgConnectOptions;

    use super::super::super::sql::Ageing;
    use super::super::super::sql::ageing_checks::{self, AgeingPool, SHORT_IDLE, SHORT_LIFETIME};
    use super::super::{PostgresStore, Statements};
    use super::{Sessions, Target};

    /// The request path's sessions, whose statements are prepared on the store's table
    /// `idemkey_ageing_records` (made here).
    async fn pool(ageing: Ageing) -> Sessions {
        let url = ageing_checks::url();
        let table = "idemkey_ageing_records";
        let store = PostgresStore::builder(&url).table(table).connect().await;
        let store = store
            .unwrap_or_else(|e| panic!("PostgreSQL unreachable (set IDEMKEY_POSTGRES_URL): {e}"));
        store.migrate().await.expect("the table");
        let options = PgConnectOptions::from_str(&url).expect("IDEMKEY_POSTGRES_URL");
        let sql = Arc::new(Statements::new(store.table.quoted(), false));
        let target = Target::new(&url, &options, sql);
        Sessions::with_ageing(target, 4, Duration::from_secs(10), ageing).expect("sessions")
    }

    async fn query_i64(pool: &Sessions, sql: &str, pid: Option<i32>) -> i64 {
        let lease = pool
            .get("test")
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL unreachable (set IDEMKEY_POSTGRES_URL): {e}"));
        let row = match pid {
            Some(pid) => lease.client().query_one(sql, &[&pid]).await,
            None => lease.client().query_one(sql, &[]).await,
        };
        row.expect(sql).get(0)
    }

    impl AgeingPool for Sessions {
        async fn backend(&self) -> i32 {
            let pid = query_i64(self, "SELECT pg_backend_pid()::int8", None).await;
            i32::try_from(pid).expect("a pid")
        }

        async fn alive(&self, pid: i32) -> bool {
            let sql = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1";
            query_i64(self, sql, Some(pid)).await == 1
        }

        fn size(&self) -> usize {
            self.open_sessions()
        }
    }

    #[tokio::test]
    async fn a_connection_past_its_lifetime_is_replaced() {
        ageing_checks::a_connection_past_its_lifetime_is_replaced(pool(SHORT_LIFETIME).await).await;
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed() {
        ageing_checks::an_idle_connection_is_closed(pool(SHORT_IDLE).await).await;
    }

    /// The URL's `options` and `application_name` reach the request path's sessions.
    #[tokio::test]
    async fn the_urls_settings_reach_the_session() {
        let base = ageing_checks::url();
        let joint = if base.contains('?') { '&' } else { '?' };
        let url = format!(
            "{base}{joint}application_name=idemkey_settings&options=-c%20statement_timeout%3D4321"
        );
        let options = PgConnectOptions::from_str(&url).expect("the URL");
        let sql = Arc::new(Statements::new("\"idemkey_records\"", false));
        let target = Target::new(&url, &options, sql);
        let sessions = Sessions::new(target, 1, Duration::from_secs(10)).expect("sessions");
        let lease = sessions
            .get("test")
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL unreachable (set IDEMKEY_POSTGRES_URL): {e}"));
        let row = lease
            .client()
            .query_one(
                "SELECT current_setting('statement_timeout'), \
                 current_setting('application_name')",
                &[],
            )
            .await;
        let row = row.expect("the settings");
        assert_eq!(row.get::<_, String>(0), "4321ms");
        assert_eq!(row.get::<_, String>(1), "idemkey_settings");
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use sqlx::postgres::PgConnectOptions;

    use super::password_file;

    #[test]
    fn the_password_is_the_urls_decoded() {
        let password = |url: &str| {
            let options = PgConnectOptions::from_str(url).expect("a URL");
            super::password(url, &options)
        };
        let url = "postgres://app:p%40ss%2Fw%C3%B6rd@db:5432/app";
        assert_eq!(password(url).as_deref(), Some("p@ss/w\u{f6}rd"));
        let url = "postgres://app:first@db/app?password=se%3Acond";
        assert_eq!(password(url).as_deref(), Some("se:cond"));
    }

    #[test]
    fn the_password_file_gives_the_first_matching_line() {
        let path = std::env::temp_dir().join(format!("idemkey-pgpass-{}", std::process::id()));
        let lines = "# comment\n\
            other:5432:app:app:wrong\n\
            db:5432:*:app:pa\\:ss\\\\word\n\
            *:*:*:*:fallback\n";
        std::fs::write(&path, lines).expect("a temporary file");
        let wanted = |host: &str| [host, "5432", "app", "app"].map(String::from);
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m));
            mode(0o644).expect("chmod");
            assert_eq!(
                password_file(&path, &wanted("db")),
                None,
                "others may read it"
            );
            mode(0o600).expect("chmod");
        }
        assert_eq!(
            password_file(&path, &wanted("db")).as_deref(),
            Some("pa:ss\\word")
        );
        assert_eq!(
            password_file(&path, &wanted("elsewhere")).as_deref(),
            Some("fallback")
        );
        std::fs::remove_file(&path).expect("remove the temporary file");
        assert_eq!(password_file(&path, &wanted("db")), None, "no file");
    }
}
