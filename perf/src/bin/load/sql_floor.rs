//! The floor of a verifier over a SQL store, for the load program (`load --store URL`
//! with a `postgres://`, `mysql://`/`mariadb://` or `sqlite://` URL): what the SQL
//! store's own statements cost from the least client that can run them, so that the
//! verifier's CPU per request over the store is measured against the database's part of
//! the job and not only against a handler without one.
//!
//! Per keyed request it does what the memory floor of `floor.rs` does (hash scope and
//! key, fingerprint the request, run the handler, keep its answer), with the record in
//! the database instead of a map, through the statements of the store of that URL, on
//! as many connections as the store's request path has, on the store's request path's
//! driver (tokio-postgres on PostgreSQL, sqlx elsewhere), prepared once per connection:
//!
//! - PostgreSQL: the claim (one statement: a live row is the answer, else insert or take
//!   over), then the completion; 14 clients.
//! - MySQL/MariaDB: the claim (`INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`,
//!   MariaDB 10.5 or later), then the completion; 14 connections.
//! - SQLite: a read of the live row on one of 4 reading connections, and only for a new
//!   key the claim and the completion on the one writing connection (WAL,
//!   `synchronous = FULL`).
//!
//! The statements are the stores' own, read from the store (`request_path_sql`), on a table of
//! the floor's own (`idemkey_floor_records`, made with the store's schema by the store's
//! builder), so that the floor's keys and the verifier's never meet.
//!
//! The client is the least one on the driver, one round trip per statement and nothing
//! else: that is the floor the issue defines ("the same statements from a minimal
//! client on the same driver"). On PostgreSQL, 14 tokio-postgres clients with the
//! statements prepared on each, taken round-robin by the requests, which share them (a
//! client pipelines; the store hands a client to one statement at a time). On MySQL,
//! 14 sqlx connections without a pool, each behind a lock, the first free one taken
//! from the next in turn on. On SQLite, rusqlite: the writes on a thread of their own,
//! the reads on 4 threads of their own, as the store's. `LOAD_SQL_FLOOR` chooses another
//! client, to tell the driver's cost from a pool's and to measure drivers side by side:
//! `connections` (on PostgreSQL too: sqlx's, the store's driver before), `pool` (sqlx's
//! pool, with no ping as a connection is taken, `test_before_acquire(false)`; it still
//! pings every connection it takes back, a second round trip per statement); on
//! PostgreSQL, `tokio-postgres` (the default there), `tokio-postgres:N` (N clients:
//! with fewer clients than requests in flight each pipelines, so one write carries
//! several requests' statements) and `tokio-postgres-inline` (14 clients each used by
//! one statement at a time, whose connection the request's own task drives: no
//! connection task, no hand-off between tasks); on MySQL, `mysql_async` (14
//! connections of that driver, taken as `connections` takes sqlx's); on SQLite,
//! `rusqlite-threads` (the default), `rusqlite` (the reads on the request's own thread)
//! and `sqlx` (sqlx pools of 4 reading connections and 1 writing, the store's driver
//! before):
//!
//! ```sh
//! LOAD_SQL_FLOOR=connections cargo run --release -p perf --bin load -- \
//!     --store postgres://root@127.0.0.1:5432/test --seconds 3 --rounds 3
//! ```
//!
//! What it leaves out: decoding anything but the columns the answer needs, the stored
//! response's headers but `Content-Type`, and everything `floor.rs` leaves out (key
//! validation, the protocol's answers, renewals, telemetry).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::charge_app::ChargeApp;
use crate::floor::{self, Id};

/// The floor's table, beside the store's.
const TABLE: &str = "idemkey_floor_records";
/// The engine's default lease and retention, as the verifier claims with them.
const LEASE_US: i64 = 5_000_000;
const RETENTION_US: i64 = 24 * 3600 * 1_000_000;

/// The floor verifier over the store at `store` (its SQL statements and its pool
/// shape), or the memory floor of `floor.rs` for any other store or none.
pub(crate) async fn router(app: &ChargeApp, store: Option<&str>) -> Result<Router, String> {
    let scheme = store.and_then(|url| url.split_once("://")).map(|(s, _)| s);
    let db = match (scheme, store) {
        (Some("postgres" | "postgresql"), Some(url)) => Db::postgres(url).await?,
        (Some("mysql" | "mariadb"), Some(url)) => Db::mysql(url).await?,
        (Some("sqlite"), Some(url)) => Db::sqlite(url).await?,
        _ => return Ok(app.bare_router().layer(floor::FloorLayer::new())),
    };
    Ok(app
        .bare_router()
        .layer(axum::middleware::from_fn_with_state(Arc::new(db), verify)))
}

/// A client and the statements of one database.
enum Db {
    Postgres(Pg, Statements),
    MySql(My, Statements),
    Sqlite {
        readers: sqlx::SqlitePool,
        writer: sqlx::SqlitePool,
        statements: Statements,
    },
    /// SQLite on rusqlite (`LOAD_SQL_FLOOR=rusqlite`).
    Rusqlite(Rusqlite, Statements),
}

/// SQLite on rusqlite, the same libsqlite3-sys as sqlx's, the store's statements with
/// their parameters bound by name (SQLite numbers `$N` parameters in the order they
/// first appear): the claim and the completion on one writing connection that a thread
/// of its own serves (its fsync must not hold a runtime thread), answering through a
/// oneshot channel; the read of the live row on a connection of the request's own
/// thread (`rusqlite`: a read of a WAL database waits for no writer) or on one of 4
/// reading threads as the writes are (`rusqlite-threads`: no runtime thread ever
/// waits for the file). sqlx runs every statement on a worker thread of its
/// connection, and its pool returns each connection through a task.
struct Rusqlite {
    path: Arc<str>,
    writer: std::sync::mpsc::Sender<Job>,
    /// The reading threads, if reads are not made on the request's thread.
    readers: Vec<std::sync::mpsc::Sender<Job>>,
    next: AtomicUsize,
}

/// A statement for the connection of a thread.
type Job = Box<dyn FnOnce(&mut rusqlite::Connection) + Send>;

impl Rusqlite {
    fn open(path: &str, reading_threads: usize) -> Result<Self, String> {
        let serve = |name: &str| -> Result<std::sync::mpsc::Sender<Job>, String> {
            let mut conn = Self::connect(path)?;
            let (jobs, queue) = std::sync::mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    for job in queue {
                        job(&mut conn);
                    }
                })
                .map_err(failed("starting a thread"))?;
            Ok(jobs)
        };
        Ok(Self {
            path: path.into(),
            writer: serve("rusqlite-writer")?,
            readers: (0..reading_threads)
                .map(|_| serve("rusqlite-reader"))
                .collect::<Result<_, _>>()?,
            next: AtomicUsize::new(0),
        })
    }

    /// A connection as the store's: WAL, `synchronous = FULL`, a 5 s busy timeout.
    fn connect(path: &str) -> Result<rusqlite::Connection, String> {
        let conn = rusqlite::Connection::open(path).map_err(failed("opening"))?;
        conn.busy_timeout(Duration::from_secs(5))
            .and_then(|()| conn.pragma_update(None, "journal_mode", "WAL"))
            .and_then(|()| conn.pragma_update(None, "synchronous", "FULL"))
            .map_err(failed("setting up a connection"))?;
        Ok(conn)
    }

    /// `read`'s answer from a reading thread, or from this thread's reading connection
    /// (opened at its first read).
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, String> {
        thread_local! {
            static READER: std::cell::RefCell<Option<(Arc<str>, rusqlite::Connection)>> =
                const { std::cell::RefCell::new(None) };
        }
        if !self.readers.is_empty() {
            let reader = &self.readers[turn(self.readers.len(), &self.next)];
            return Self::on(reader, read).await;
        }
        READER.with_borrow_mut(|reader| {
            if reader.as_ref().is_none_or(|(path, _)| *path != self.path) {
                *reader = Some((self.path.clone(), Self::connect(&self.path)?));
            }
            let (_, conn) = reader.as_mut().ok_or("no reader")?;
            read(conn).map_err(failed("reading"))
        })
    }

    /// `write`'s answer from the writing connection.
    async fn write<T: Send + 'static>(
        &self,
        write: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, String> {
        Self::on(&self.writer, write).await
    }

    /// `job`'s answer from the thread of `thread`.
    async fn on<T: Send + 'static>(
        thread: &std::sync::mpsc::Sender<Job>,
        job: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, String> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        thread
            .send(Box::new(move |conn| {
                let _ = answer.send(job(conn));
            }))
            .map_err(|_| "the SQL floor: a connection's thread stopped")?;
        answered
            .await
            .map_err(|_| "the SQL floor: a connection's thread stopped")?
            .map_err(failed("running a statement"))
    }
}

/// The claim's answer from a rusqlite row (as `answer` reads sqlx's).
fn lite_answer(row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<Live>> {
    if row.get::<_, bool>(0)? {
        return Ok(None);
    }
    Ok(Some((row.get(2)?, row.get(3)?)))
}

/// The PostgreSQL client of the floor, chosen by `LOAD_SQL_FLOOR`.
enum Pg {
    /// `connections` (the default): the least client on sqlx.
    Connections(Connections<sqlx::PgConnection>),
    /// `pool`: sqlx's pool, which pings each connection it takes back.
    Pool(sqlx::PgPool),
    /// `tokio-postgres` (or `tokio-postgres:N`): 14 (or N) clients of that driver,
    /// each with the two statements prepared, taken round-robin (a client is shared:
    /// it pipelines).
    TokioPostgres(
        Vec<(
            tokio_postgres::Client,
            tokio_postgres::Statement,
            tokio_postgres::Statement,
        )>,
        AtomicUsize,
    ),
    /// `tokio-postgres-inline`: 14 clients of that driver, each used by one statement
    /// at a time, whose connection the request's own task drives while its statement
    /// runs (no connection task: no hand-off between tasks).
    Inline(Connections<Inline>),
}

/// A tokio-postgres client and its connection, driven by whoever holds it.
struct Inline {
    client: tokio_postgres::Client,
    connection:
        tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
    claim: tokio_postgres::Statement,
    complete: tokio_postgres::Statement,
}

impl Inline {
    /// `statement`'s answer, driving the connection while it runs.
    async fn run<T>(
        connection: &mut tokio_postgres::Connection<
            tokio_postgres::Socket,
            tokio_postgres::tls::NoTlsStream,
        >,
        statement: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, String> {
        use std::task::Poll;
        let mut statement = std::pin::pin!(statement);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = statement.as_mut().poll(cx) {
                return Poll::Ready(r.map_err(|e| e.to_string()));
            }
            if let Poll::Ready(end) = std::pin::Pin::new(&mut *connection).poll(cx) {
                return Poll::Ready(Err(format!("the connection ended: {end:?}")));
            }
            statement.as_mut().poll(cx).map_err(|e| e.to_string())
        })
        .await
    }
}

/// The MySQL client of the floor, chosen by `LOAD_SQL_FLOOR`.
enum My {
    /// `connections` (the default): the least client on sqlx.
    Connections(Connections<sqlx::MySqlConnection>),
    /// `pool`: sqlx's pool, which pings each connection it takes back.
    Pool(sqlx::MySqlPool),
    /// `mysql_async`: 14 connections of that driver without its pool, each with the
    /// two statements prepared, taken as `connections` takes sqlx's (a connection runs
    /// one statement at a time: the protocol has no pipelining to share it).
    MysqlAsync(Connections<MysqlAsync>),
}

/// A mysql_async connection with the claim and the completion prepared on it.
struct MysqlAsync {
    conn: mysql_async::Conn,
    claim: mysql_async::Statement,
    complete: mysql_async::Statement,
}

impl MysqlAsync {
    async fn open(url: &str, sql: &Statements) -> Result<Self, String> {
        let opts = mysql_async::Opts::from_url(url).map_err(failed("reading the URL"))?;
        let mut conn = mysql_async::Conn::new(opts)
            .await
            .map_err(failed("connecting"))?;
        use mysql_async::prelude::Queryable;
        let claim = conn.prep(&*sql.claim).await.map_err(failed("preparing"))?;
        let complete = conn
            .prep(&*sql.complete)
            .await
            .map_err(failed("preparing"))?;
        Ok(Self {
            conn,
            claim,
            complete,
        })
    }
}

/// The floor's client chosen by `LOAD_SQL_FLOOR`, else `default` (the store's own
/// driver, least used: `tokio-postgres` on PostgreSQL, `connections` elsewhere).
fn chosen_client(default: &str) -> String {
    std::env::var("LOAD_SQL_FLOOR").unwrap_or_else(|_| default.to_owned())
}

/// How many tokio-postgres clients `LOAD_SQL_FLOOR=tokio-postgres` or
/// `tokio-postgres:N` asks for ([`CONNECTIONS`], or N). Requests share them and a
/// client pipelines what it is given, so with fewer clients than requests in flight
/// one write to the database carries several requests' statements.
fn pipelined_clients(chosen: &str) -> Result<usize, String> {
    let Some(n) = chosen.strip_prefix("tokio-postgres:") else {
        return Ok(CONNECTIONS);
    };
    n.parse::<usize>().ok().filter(|&n| n > 0).ok_or(format!(
        "LOAD_SQL_FLOOR={chosen}: N of tokio-postgres:N is at least 1"
    ))
}

/// [`CONNECTIONS`] sqlx connections without a pool, each behind a lock: sqlx's driver
/// without a pool's work (sqlx's ping as it takes a connection back, its task).
struct Connections<C> {
    connections: Vec<tokio::sync::Mutex<C>>,
    next: AtomicUsize,
}

impl<C: Connection> Connections<C> {
    async fn open(url: &str) -> Result<Self, String> {
        let mut connections = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            connections.push(C::connect(url).await.map_err(failed("connecting"))?);
        }
        Ok(Self::of(connections))
    }
}

impl<C> Connections<C> {
    fn of(connections: Vec<C>) -> Self {
        Self {
            connections: connections
                .into_iter()
                .map(tokio::sync::Mutex::new)
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// A free connection if there is one (from the next in turn on), else the next in
    /// turn once it is free.
    async fn take(&self) -> tokio::sync::MutexGuard<'_, C> {
        let n = self.connections.len();
        let first = turn(n, &self.next);
        for i in 0..n {
            if let Ok(conn) = self.connections[(first + i) % n].try_lock() {
                return conn;
            }
        }
        self.connections[first].lock().await
    }
}

/// A live record a claim met: its fingerprint, and its payload once completed.
type Live = (Vec<u8>, Option<Vec<u8>>);

/// How many connections every PostgreSQL and MySQL floor holds: those of the store's
/// request path with the default budget (16, of which 2 serve everything else).
const CONNECTIONS: usize = 14;

struct Statements {
    /// SQLite: the read of the live row before the claim.
    live: Arc<str>,
    claim: Arc<str>,
    complete: Arc<str>,
}

/// What the floor reports when `what` failed with any driver's error `e`.
fn failed<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("the SQL floor: {what}: {e}")
}

impl Db {
    async fn postgres(url: &str) -> Result<Self, String> {
        // The store's builder makes the table with the store's schema.
        let store = idemkey::store::PostgresStore::builder(url)
            .table(TABLE)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let (claim, complete) = store.request_path_sql();
        let client = match chosen_client("tokio-postgres").as_str() {
            "connections" => Pg::Connections(Connections::open(url).await?),
            "pool" => Pg::Pool(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(CONNECTIONS as u32)
                    .test_before_acquire(false)
                    .connect(url)
                    .await
                    .map_err(failed("connecting"))?,
            ),
            "tokio-postgres-inline" => {
                use tokio_postgres::types::Type;
                let mut all = Vec::with_capacity(CONNECTIONS);
                for _ in 0..CONNECTIONS {
                    let (client, mut connection) =
                        tokio_postgres::connect(url, tokio_postgres::NoTls)
                            .await
                            .map_err(failed("connecting"))?;
                    let id = Type::BYTEA;
                    let claim = Inline::run(
                        &mut connection,
                        client.prepare_typed(
                            &claim,
                            &[id.clone(), id.clone(), id.clone(), Type::INT8, Type::INT8],
                        ),
                    )
                    .await?;
                    let complete = Inline::run(
                        &mut connection,
                        client.prepare_typed(&complete, &[id.clone(), id.clone(), id, Type::INT8]),
                    )
                    .await?;
                    all.push(Inline {
                        client,
                        connection,
                        claim,
                        complete,
                    });
                }
                Pg::Inline(Connections::of(all))
            }
            chosen if chosen == "tokio-postgres" || chosen.starts_with("tokio-postgres:") => {
                use tokio_postgres::types::Type;
                let n = pipelined_clients(chosen)?;
                let mut clients = Vec::with_capacity(n);
                for _ in 0..n {
                    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                        .await
                        .map_err(failed("connecting"))?;
                    tokio::spawn(connection);
                    let prepare = async |sql: &str, types: &[Type]| {
                        client
                            .prepare_typed(sql, types)
                            .await
                            .map_err(failed("preparing"))
                    };
                    let claim = prepare(
                        &claim,
                        &[
                            Type::BYTEA,
                            Type::BYTEA,
                            Type::BYTEA,
                            Type::INT8,
                            Type::INT8,
                        ],
                    )
                    .await?;
                    let complete = prepare(
                        &complete,
                        &[Type::BYTEA, Type::BYTEA, Type::BYTEA, Type::INT8],
                    )
                    .await?;
                    clients.push((client, claim, complete));
                }
                Pg::TokioPostgres(clients, AtomicUsize::new(0))
            }
            other => {
                return Err(format!(
                    "LOAD_SQL_FLOOR={other}: use connections, pool, tokio-postgres or \
                     tokio-postgres:N"
                ));
            }
        };
        Ok(Db::Postgres(
            client,
            Statements {
                live: "".into(),
                claim,
                complete,
            },
        ))
    }

    async fn mysql(url: &str) -> Result<Self, String> {
        let store = idemkey::store::MySqlStore::builder(url)
            .table(TABLE)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let (claim, complete) = store.request_path_sql();
        let sql = Statements {
            live: "".into(),
            claim,
            complete,
        };
        let client = match chosen_client("connections").as_str() {
            "connections" => My::Connections(Connections::open(url).await?),
            "mysql_async" => {
                let mut connections = Vec::with_capacity(CONNECTIONS);
                for _ in 0..CONNECTIONS {
                    connections.push(MysqlAsync::open(url, &sql).await?);
                }
                My::MysqlAsync(Connections::of(connections))
            }
            "pool" => My::Pool(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(CONNECTIONS as u32)
                    .test_before_acquire(false)
                    .connect(url)
                    .await
                    .map_err(failed("connecting"))?,
            ),
            other => {
                return Err(format!(
                    "LOAD_SQL_FLOOR={other}: use connections, pool or mysql_async on MySQL"
                ));
            }
        };
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(failed("connecting"))?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut conn)
            .await
            .map_err(failed("reading the version"))?;
        conn.close().await.map_err(failed("closing"))?;
        if !version.contains("MariaDB") {
            return Err(format!(
                "the SQL floor runs the MariaDB store's claim (INSERT ... RETURNING); the \
                 server is {version}"
            ));
        }
        Ok(Db::MySql(client, sql))
    }

    async fn sqlite(url: &str) -> Result<Self, String> {
        let path = url.trim_start_matches("sqlite://");
        let store = idemkey::store::SqliteStore::builder(path)
            .table(TABLE)
            .open()
            .await
            .map_err(|e| e.to_string())?;
        let (live, claim, complete) = store.request_path_sql();
        store.close().await;
        let statements = Statements {
            live,
            claim,
            complete,
        };
        match chosen_client("rusqlite-threads").as_str() {
            "rusqlite" => return Ok(Db::Rusqlite(Rusqlite::open(path, 0)?, statements)),
            "rusqlite-threads" => return Ok(Db::Rusqlite(Rusqlite::open(path, 4)?, statements)),
            "sqlx" => {}
            other => {
                return Err(format!(
                    "LOAD_SQL_FLOOR={other}: use rusqlite-threads, rusqlite or sqlx on SQLite"
                ));
            }
        }
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = |n: u32| {
            sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(n)
                .test_before_acquire(false)
                .connect_with(options.clone())
        };
        Ok(Db::Sqlite {
            readers: pool(4).await.map_err(failed("opening"))?,
            writer: pool(1).await.map_err(failed("opening"))?,
            statements,
        })
    }

    /// The claim: `Ok(None)` when this request won the key, else the live record's
    /// fingerprint and its payload (`None` while it is in progress).
    async fn claim(
        &self,
        id: &Id,
        fingerprint: &Id,
        token: &[u8; 16],
    ) -> Result<Option<Live>, String> {
        let err = failed("claiming");
        fn answer<'r, R: Row>(row: &'r R) -> Result<Option<Live>, String>
        where
            usize: sqlx::ColumnIndex<R>,
            bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        {
            let err = failed("decoding the claim");
            if row.try_get::<bool, _>(0).map_err(&err)? {
                return Ok(None);
            }
            Ok(Some((
                row.try_get(2).map_err(&err)?,
                row.try_get(3).map_err(&err)?,
            )))
        }
        match self {
            Db::Postgres(client, sql) => {
                let query = sqlx::query(AssertSqlSafe(sql.claim.clone()))
                    .bind(id.as_slice())
                    .bind(fingerprint.as_slice())
                    .bind(token.as_slice())
                    .bind(LEASE_US)
                    .bind(RETENTION_US);
                let row = match client {
                    Pg::Pool(pool) => query.fetch_one(pool).await,
                    Pg::Connections(connections) => {
                        query.fetch_one(&mut *connections.take().await).await
                    }
                    Pg::TokioPostgres(clients, next) => {
                        let (client, claim, _) = &clients[turn(clients.len(), next)];
                        let ids = [id.as_slice(), fingerprint.as_slice(), token.as_slice()];
                        let params = pg_claim_params(&ids);
                        let row = client.query_one(claim, &params).await;
                        return pg_answer(row.map_err(|e| e.to_string()));
                    }
                    Pg::Inline(all) => {
                        let mut c = all.take().await;
                        let c = &mut *c;
                        let ids = [id.as_slice(), fingerprint.as_slice(), token.as_slice()];
                        let params = pg_claim_params(&ids);
                        let row = c.client.query_one(&c.claim, &params);
                        return pg_answer(Inline::run(&mut c.connection, row).await);
                    }
                };
                answer(&row.map_err(err)?)
            }
            Db::MySql(client, sql) => {
                let query = sqlx::query(AssertSqlSafe(sql.claim.clone()))
                    .bind(id.as_slice())
                    .bind(fingerprint.as_slice())
                    .bind(token.as_slice())
                    .bind(LEASE_US)
                    .bind(LEASE_US + RETENTION_US)
                    .bind(token.as_slice());
                let row = match client {
                    My::Connections(connections) => {
                        query.fetch_one(&mut *connections.take().await).await
                    }
                    My::Pool(pool) => query.fetch_one(pool).await,
                    My::MysqlAsync(connections) => {
                        use mysql_async::prelude::Queryable;
                        let decoding = failed("decoding the claim");
                        let mut c = connections.take().await;
                        let c = &mut *c;
                        let params = (
                            id.as_slice(),
                            fingerprint.as_slice(),
                            token.as_slice(),
                            LEASE_US,
                            LEASE_US + RETENTION_US,
                            token.as_slice(),
                        );
                        let mut row: mysql_async::Row = c
                            .conn
                            .exec_first(&c.claim, params)
                            .await
                            .map_err(failed("claiming"))?
                            .ok_or("the SQL floor: the claim returned no row")?;
                        let won: bool = row.take_opt(0).ok_or("no column 0")?.map_err(&decoding)?;
                        if won {
                            return Ok(None);
                        }
                        let fingerprint: Vec<u8> =
                            row.take_opt(2).ok_or("no column 2")?.map_err(&decoding)?;
                        let payload: Option<Vec<u8>> =
                            row.take_opt(3).ok_or("no column 3")?.map_err(&decoding)?;
                        return Ok(Some((fingerprint, payload)));
                    }
                };
                answer(&row.map_err(err)?)
            }
            Db::Rusqlite(db, sql) => {
                use rusqlite::OptionalExtension;
                let (live, id_) = (sql.live.clone(), *id);
                let live = db
                    .read(move |conn| {
                        conn.prepare_cached(&live)?
                            .query_row(
                                rusqlite::named_params! {"$1": now_ms(), "$2": id_.as_slice()},
                                lite_answer,
                            )
                            .optional()
                    })
                    .await?;
                if let Some(live) = live {
                    return Ok(live);
                }
                let (claim, id, fingerprint, token) =
                    (sql.claim.clone(), *id, *fingerprint, *token);
                db.write(move |conn| {
                    conn.prepare_cached(&claim)?.query_row(
                        rusqlite::named_params! {
                            "$1": now_ms(),
                            "$2": id.as_slice(),
                            "$3": fingerprint.as_slice(),
                            "$4": token.as_slice(),
                            "$5": LEASE_US / 1000,
                            "$6": RETENTION_US / 1000,
                        },
                        lite_answer,
                    )
                })
                .await
            }
            Db::Sqlite {
                readers,
                writer,
                statements: sql,
            } => {
                let live = sqlx::query(AssertSqlSafe(sql.live.clone()))
                    .bind(now_ms())
                    .bind(id.as_slice())
                    .fetch_optional(readers)
                    .await
                    .map_err(&err)?;
                if let Some(row) = live {
                    return answer(&row);
                }
                let row = sqlx::query(AssertSqlSafe(sql.claim.clone()))
                    .bind(now_ms())
                    .bind(id.as_slice())
                    .bind(fingerprint.as_slice())
                    .bind(token.as_slice())
                    .bind(LEASE_US / 1000)
                    .bind(RETENTION_US / 1000)
                    .fetch_one(writer)
                    .await
                    .map_err(err)?;
                answer(&row)
            }
        }
    }

    /// The completion of a won claim with `payload`.
    async fn complete(&self, id: &Id, token: &[u8; 16], payload: &[u8]) -> Result<(), String> {
        let err = failed("completing");
        let written = match self {
            Db::Postgres(client, sql) => {
                let query = sqlx::query(AssertSqlSafe(sql.complete.clone()))
                    .bind(id.as_slice())
                    .bind(token.as_slice())
                    .bind(payload)
                    .bind(RETENTION_US);
                match client {
                    Pg::Pool(pool) => query.execute(pool).await.map_err(err)?.rows_affected(),
                    Pg::Connections(connections) => query
                        .execute(&mut *connections.take().await)
                        .await
                        .map_err(err)?
                        .rows_affected(),
                    Pg::TokioPostgres(clients, next) => {
                        let (client, _, complete) = &clients[turn(clients.len(), next)];
                        client
                            .execute(
                                complete,
                                &[&id.as_slice(), &token.as_slice(), &payload, &RETENTION_US],
                            )
                            .await
                            .map_err(failed("completing"))?
                    }
                    Pg::Inline(all) => {
                        let mut c = all.take().await;
                        let c = &mut *c;
                        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                            [&id.as_slice(), &token.as_slice(), &payload, &RETENTION_US];
                        Inline::run(&mut c.connection, c.client.execute(&c.complete, &params))
                            .await
                            .map_err(failed("completing"))?
                    }
                }
            }
            Db::MySql(client, sql) => {
                let query = sqlx::query(AssertSqlSafe(sql.complete.clone()))
                    .bind(payload)
                    .bind(RETENTION_US)
                    .bind(RETENTION_US)
                    .bind(id.as_slice())
                    .bind(token.as_slice());
                match client {
                    My::Connections(connections) => query
                        .execute(&mut *connections.take().await)
                        .await
                        .map_err(err)?
                        .rows_affected(),
                    My::Pool(pool) => query.execute(pool).await.map_err(err)?.rows_affected(),
                    My::MysqlAsync(connections) => {
                        use mysql_async::prelude::Queryable;
                        let mut c = connections.take().await;
                        let c = &mut *c;
                        let params = (
                            payload,
                            RETENTION_US,
                            RETENTION_US,
                            id.as_slice(),
                            token.as_slice(),
                        );
                        c.conn
                            .exec_drop(&c.complete, params)
                            .await
                            .map_err(failed("completing"))?;
                        c.conn.affected_rows()
                    }
                }
            }
            Db::Rusqlite(db, sql) => {
                let (complete, id, token) = (sql.complete.clone(), *id, *token);
                let payload = payload.to_vec();
                db.write(move |conn| {
                    conn.prepare_cached(&complete)?
                        .execute(rusqlite::named_params! {
                            "$1": now_ms(),
                            "$2": id.as_slice(),
                            "$3": token.as_slice(),
                            "$4": payload,
                            "$5": RETENTION_US / 1000,
                        })
                })
                .await? as u64
            }
            Db::Sqlite {
                writer,
                statements: sql,
                ..
            } => sqlx::query(AssertSqlSafe(sql.complete.clone()))
                .bind(now_ms())
                .bind(id.as_slice())
                .bind(token.as_slice())
                .bind(payload)
                .bind(RETENTION_US / 1000)
                .execute(writer)
                .await
                .map_err(err)?
                .rows_affected(),
        };
        match written {
            1 => Ok(()),
            n => Err(format!("the SQL floor's completion wrote {n} rows")),
        }
    }
}

/// The claim's parameters on tokio-postgres: `ids` are the record's id, the request's
/// fingerprint and the fencing token.
fn pg_claim_params<'a>(
    ids: &'a [&'a [u8]; 3],
) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 5] {
    [&ids[0], &ids[1], &ids[2], &LEASE_US, &RETENTION_US]
}

/// The claim's answer from a tokio-postgres row (as `answer` reads sqlx's).
fn pg_answer(row: Result<tokio_postgres::Row, String>) -> Result<Option<Live>, String> {
    let row = row.map_err(failed("claiming"))?;
    let err = failed::<tokio_postgres::Error>("decoding the claim");
    if row.try_get::<_, bool>(0).map_err(&err)? {
        return Ok(None);
    }
    Ok(Some((
        row.try_get(2).map_err(&err)?,
        row.try_get(3).map_err(&err)?,
    )))
}

/// The next of `n` connections or clients, round-robin.
fn turn(n: usize, next: &AtomicUsize) -> usize {
    next.fetch_add(1, Ordering::Relaxed) % n
}

/// This machine's time in milliseconds since the Unix epoch (the SQLite store's clock).
fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// The stored answer: status (2 bytes), `Content-Type` (its length in 1 byte, then
/// it), body.
fn encode(status: StatusCode, content_type: Option<&HeaderValue>, body: &[u8]) -> Bytes {
    let content_type = content_type.map_or(&b""[..], HeaderValue::as_bytes);
    let content_type = &content_type[..content_type.len().min(255)];
    let mut out = BytesMut::with_capacity(3 + content_type.len() + body.len());
    out.put_u16(status.as_u16());
    out.put_u8(content_type.len() as u8);
    out.put_slice(content_type);
    out.put_slice(body);
    out.freeze()
}

/// The response of a stored answer, marked as a replay.
fn replay(stored: &[u8]) -> Response {
    let Some((head, rest)) = stored.split_first_chunk::<3>() else {
        return floor::plain(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let status = StatusCode::from_u16(u16::from_be_bytes([head[0], head[1]]))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (content_type, body) = rest.split_at(usize::from(head[2]).min(rest.len()));
    let mut response = Response::new(Body::from(body.to_vec()));
    *response.status_mut() = status;
    if let Ok(value) = HeaderValue::from_bytes(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// The floor verifier's middleware.
async fn verify(State(db): State<Arc<Db>>, req: Request, next: Next) -> Response {
    let Some(key) = req.headers().get("idempotency-key") else {
        return next.run(req).await;
    };
    let id = floor::record_id(req.headers(), key);
    let (parts, body) = req.into_parts();
    let Ok(collected) = body.collect().await else {
        return floor::plain(StatusCode::BAD_REQUEST);
    };
    let bytes = collected.to_bytes();
    let fingerprint = floor::fingerprint(&parts, &bytes);
    let token = *uuid::Uuid::new_v4().as_bytes();
    match db.claim(&id, &fingerprint, &token).await {
        Ok(None) => {}
        Ok(Some((stored, payload))) => {
            return match payload {
                Some(payload) if stored == fingerprint => replay(&payload),
                None if stored == fingerprint => floor::plain(StatusCode::CONFLICT),
                _ => floor::plain(StatusCode::UNPROCESSABLE_ENTITY),
            };
        }
        Err(e) => {
            eprintln!("{e}");
            return floor::plain(StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let (head, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return floor::plain(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let body = collected.to_bytes();
    let stored = encode(head.status, head.headers.get(header::CONTENT_TYPE), &body);
    if let Err(e) = db.complete(&id, &token, &stored).await {
        eprintln!("{e}");
        return floor::plain(StatusCode::SERVICE_UNAVAILABLE);
    }
    Response::from_parts(head, Body::from(body))
}
