//! Growth: fresh-key requests through `charge_server` at a nearly empty table and at N
//! records, and while a sweep of M expired records runs; the sweep's rate; storage per
//! live record before and after the churn. Every comparison is made in one run, in
//! alternating rounds, so that a shared machine affects both sides alike.
//!
//! ```sh
//! cargo build --release -p perf --bin growth
//! cargo build --release --example charge_server --features postgres,mysql,sqlite
//! target/release/growth --store postgres|mysql|sqlite [--records N] [--expired M]
//!     [--seconds S] [--rounds R] [--connections C] [--charge-server PATH] [--url URL]
//!     [--pause-ratio X]
//! ```
//!
//! 1. Two stores of the kind chosen, side by side: PostgreSQL and MySQL/MariaDB each get
//!    two databases of their own on the server at `--url` (default `IDEMKEY_POSTGRES_URL`
//!    or `IDEMKEY_MYSQL_URL`, else the local defaults of the repository's README),
//!    dropped at the end; SQLite two files beside this program (under `target/`),
//!    removed at the end. A `charge_server` process serves each (`--store URL`, which
//!    creates the table with the store's own schema), on a free port of 127.0.0.1.
//! 2. One request to each makes a record the store wrote itself (the template: its
//!    fingerprint, token, flags and stored response, a small JSON charge). Then N
//!    copies of it go into the `full` store by server-side SQL (`generate_series` on
//!    PostgreSQL, a `seq_1_to_N` table of MariaDB's Sequence engine, a recursive CTE on
//!    SQLite), each with an id of the same form (32 bytes, SHA-256 of a number on
//!    PostgreSQL and MariaDB, random on SQLite) and an expiry spread over 90 % of the
//!    template's retention, as a day of traffic leaves them. Then `VACUUM ANALYZE`
//!    (PostgreSQL), `ANALYZE TABLE` (MariaDB) or `ANALYZE` (SQLite), and the storage
//!    per live record is read (before the churn).
//! 3. Growth: R rounds of S seconds against each server, the order alternating, over C
//!    keep-alive connections posting fresh keys: requests per second, p50 and p99 of
//!    each round; the medians of the rounds are compared (`full/empty`).
//! 4. The sweep's rate: M expired records (the template's, with a past expiry) are
//!    inserted into the `full` store, then one `Store::sweep_pass` removes them with no
//!    requests running: rows per second, against the request rate of step 3. Every
//!    pass here pauses between its batches as `--pause-ratio` says (the store's default,
//!    `DEFAULT_SWEEP_PAUSE_RATIO`, unless given; 0 runs them back to back).
//! 5. Sweeping: R pairs of rounds against the `full` server, the order alternating: one
//!    while a sweep pass of M freshly inserted expired records runs (the round lasts as
//!    long as the pass) and one of the same length without. The `charge_server`
//!    processes run their own sweeper every 5 minutes as well; expired records are
//!    inserted just before a pass, so it finds nothing outside the passes, and the pass
//!    here is not exclusive: a tick during a pass shares the work (the rows it removes
//!    are missing from the pass's count, which is printed).
//! 6. After a last pass and a vacuum (PostgreSQL `VACUUM ANALYZE`, MariaDB `ANALYZE
//!    TABLE`, SQLite: pages in use, without the freelist a `VACUUM` would drop), the
//!    storage per live record again, against step 2's.
//!
//! Storage is PostgreSQL's `pg_total_relation_size` (table, TOAST, indexes),
//! MariaDB's `DATA_LENGTH + INDEX_LENGTH` (InnoDB's estimate, in whole pages) and
//! SQLite's `(page_count - freelist_count) * page_size`. It prints the ratios against
//! the targets: p99 at N at most 1.25x the near-empty p99 and the rate at least 0.8x;
//! p99 while sweeping at most 1.5x; the sweep at least 5x the request rate; storage per
//! live record after the churn at most 1.5x.
#![allow(
    clippy::print_stdout,
    reason = "a command-line program prints its results"
)]

#[path = "../charge_connection.rs"]
mod charge_connection;
#[path = "../growth_args.rs"]
mod growth_args;
#[path = "../own_database.rs"]
mod own_database;
#[path = "../rounds.rs"]
mod rounds;
#[path = "../table_storage.rs"]
mod table_storage;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use charge_connection::ChargeConnection;
use growth_args::{Args, Kind};
use idemkey::store::Store;
use own_database::with_database;
use rounds::{Figures, median, medians};
use sqlx::Row;
use tokio::io::{AsyncBufReadExt, BufReader};

const USAGE: &str = "usage: growth --store postgres|mysql|sqlite [--records N] [--expired M]
              [--seconds S] [--rounds R] [--connections C] [--charge-server PATH] [--url URL]
              [--pause-ratio X]
  fills a store with N records, then measures fresh-key requests through charge_server
  at a nearly empty table and at N records, and while a sweep of M expired records runs";

/// Rows per fill statement (each its own transaction).
const FILL_CHUNK: u64 = 500_000;

/// Where the ids of expired records start, past every live record's number.
const EXPIRED_BASE: i64 = 1 << 40;

fn main() -> ExitCode {
    let stores = [Kind::Postgres, Kind::MySql, Kind::Sqlite];
    let args = match growth_args::parse(USAGE, &stores, &["--charge-server"]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(run(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("growth: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---- the databases -------------------------------------------------------------------

/// A connection to one of the two stores' databases, for the SQL the stores do not do.
enum Db {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

/// One side: the store's URL (for `charge_server` and `idemkey::store::open`), and a
/// pool on its database.
struct Side {
    name: &'static str,
    url: String,
    db: Db,
}

/// The server's databases (or SQLite's files), created at the start and removed by
/// [`Databases::drop_all`].
struct Databases {
    kind: Kind,
    server: String,
    names: Vec<String>,
}

impl Databases {
    fn new(kind: Kind, url: Option<String>) -> Result<Self, String> {
        let server = match kind {
            Kind::Postgres => url
                .or_else(|| std::env::var("IDEMKEY_POSTGRES_URL").ok())
                .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
            Kind::MySql => url
                .or_else(|| std::env::var("IDEMKEY_MYSQL_URL").ok())
                .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_owned()),
            Kind::Sqlite => {
                let exe =
                    std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
                let dir = exe.parent().ok_or("this program has no directory")?;
                dir.display().to_string()
            }
        };
        Ok(Self {
            kind,
            server,
            names: Vec::new(),
        })
    }

    fn name(side: &str) -> String {
        format!("idemkey_growth_{side}_{}", std::process::id())
    }

    /// Creates the database (or names the file) of side `side` and connects to it.
    async fn create(&mut self, side: &'static str) -> Result<Side, String> {
        let name = Self::name(side);
        self.names.push(name.clone());
        match self.kind {
            Kind::Postgres => {
                let admin = sqlx::PgPool::connect(&with_database(&self.server, "postgres"))
                    .await
                    .map_err(|e| format!("PostgreSQL at {}: {e}", self.server))?;
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&admin)
                    .await
                    .map_err(|e| format!("CREATE DATABASE {name}: {e}"))?;
                admin.close().await;
                let url = with_database(&self.server, &name);
                let pool = sqlx::PgPool::connect(&url)
                    .await
                    .map_err(|e| format!("PostgreSQL {name}: {e}"))?;
                Ok(Side {
                    name: side,
                    url,
                    db: Db::Pg(pool),
                })
            }
            Kind::MySql => {
                let admin = sqlx::MySqlPool::connect(&self.server)
                    .await
                    .map_err(|e| format!("MySQL at {}: {e}", self.server))?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&admin)
                    .await
                    .map_err(|e| format!("CREATE DATABASE {name}: {e}"))?;
                admin.close().await;
                let url = with_database(&self.server, &name);
                let pool = sqlx::MySqlPool::connect(&url)
                    .await
                    .map_err(|e| format!("MySQL {name}: {e}"))?;
                Ok(Side {
                    name: side,
                    url,
                    db: Db::My(pool),
                })
            }
            Kind::Sqlite => {
                let path = format!("{}/{name}.db", self.server);
                let url = format!("sqlite://{path}");
                // The store creates the file; this pool opens it once it exists.
                idemkey::store::open(&url)
                    .await
                    .map_err(|e| format!("SQLite {path}: {e}"))?;
                let pool = sqlx::SqlitePool::connect(&url)
                    .await
                    .map_err(|e| format!("SQLite {path}: {e}"))?;
                Ok(Side {
                    name: side,
                    url,
                    db: Db::Lite(pool),
                })
            }
        }
    }

    /// Drops the databases (or removes the files); reports what it could not.
    async fn drop_all(&self) {
        for name in &self.names {
            let done = match self.kind {
                Kind::Postgres => {
                    match sqlx::PgPool::connect(&with_database(&self.server, "postgres")).await {
                        Ok(admin) => sqlx::query(sqlx::AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                        )))
                        .execute(&admin)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
                Kind::MySql => match sqlx::MySqlPool::connect(&self.server).await {
                    Ok(admin) => sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name}"
                    )))
                    .execute(&admin)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
                Kind::Sqlite => {
                    for suffix in ["", "-wal", "-shm"] {
                        let _ = std::fs::remove_file(format!("{}/{name}.db{suffix}", self.server));
                    }
                    Ok(())
                }
            };
            if let Err(e) = done {
                eprintln!("growth: could not remove {name}: {e}; remove it by hand");
            }
        }
    }
}

/// The record the store wrote for one real request, copied by [`insert`]: its columns
/// but the id, and its times relative to the database's clock (µs; ms on SQLite).
enum Template {
    Pg {
        fingerprint: Vec<u8>,
        token: Option<Vec<u8>>,
        payload: Vec<u8>,
        taken_over: bool,
        retention: i64,
        expires: i64,
        created: i64,
        sweep: i64,
    },
    My {
        fingerprint: Vec<u8>,
        token: Option<Vec<u8>>,
        payload: Vec<u8>,
        completed: bool,
        taken_over: bool,
        created: i64,
        expires: i64,
        purge: i64,
    },
    Lite {
        fingerprint: Vec<u8>,
        token: Option<Vec<u8>>,
        payload: Vec<u8>,
        taken_over: i64,
        retention: i64,
        expires: i64,
        created: i64,
    },
}

impl Template {
    /// How long until the template leaves the store (in its unit).
    fn remaining(&self) -> i64 {
        match self {
            Template::Pg { expires, .. } | Template::Lite { expires, .. } => *expires,
            Template::My { expires, purge, .. } => (*expires).max(*purge),
        }
    }

    /// The store's unit of time in microseconds.
    fn unit_us(&self) -> i64 {
        match self {
            Template::Lite { .. } => 1_000,
            _ => 1,
        }
    }
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

fn sql_err(what: &'static str) -> impl Fn(sqlx::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// The store's only record (written by one real request).
async fn template(db: &Db) -> Result<Template, String> {
    let err = sql_err("reading the template record");
    Ok(match db {
        Db::Pg(pool) => {
            let row = sqlx::query(
                "SELECT fingerprint, token, payload, taken_over, retention,
                    (extract(epoch FROM expires_at - now()) * 1000000)::bigint AS expires,
                    (extract(epoch FROM created - now()) * 1000000)::bigint AS created,
                    (extract(epoch FROM sweep_at - now()) * 1000000)::bigint AS sweep
                 FROM idemkey_records LIMIT 1",
            )
            .fetch_one(pool)
            .await
            .map_err(&err)?;
            Template::Pg {
                fingerprint: row.try_get("fingerprint").map_err(&err)?,
                token: row.try_get("token").map_err(&err)?,
                payload: row.try_get("payload").map_err(&err)?,
                taken_over: row.try_get("taken_over").map_err(&err)?,
                retention: row.try_get("retention").map_err(&err)?,
                expires: row.try_get("expires").map_err(&err)?,
                created: row.try_get("created").map_err(&err)?,
                sweep: row.try_get("sweep").map_err(&err)?,
            }
        }
        Db::My(pool) => {
            let row = sqlx::query(
                "SELECT fingerprint, token, payload, completed, taken_over,
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), created_at) AS created,
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) AS expires,
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), purge_at) AS purge_in
                 FROM idemkey_records LIMIT 1",
            )
            .fetch_one(pool)
            .await
            .map_err(&err)?;
            Template::My {
                fingerprint: row.try_get("fingerprint").map_err(&err)?,
                token: row.try_get("token").map_err(&err)?,
                payload: row.try_get("payload").map_err(&err)?,
                completed: row.try_get("completed").map_err(&err)?,
                taken_over: row.try_get("taken_over").map_err(&err)?,
                created: row.try_get("created").map_err(&err)?,
                expires: row.try_get("expires").map_err(&err)?,
                purge: row.try_get("purge_in").map_err(&err)?,
            }
        }
        Db::Lite(pool) => {
            let row = sqlx::query(
                "SELECT fingerprint, token, payload, taken_over, retention,
                    expires_at - ?1 AS expires, created - ?1 AS created
                 FROM idemkey_records LIMIT 1",
            )
            .bind(now_ms())
            .fetch_one(pool)
            .await
            .map_err(&err)?;
            Template::Lite {
                fingerprint: row.try_get("fingerprint").map_err(&err)?,
                token: row.try_get("token").map_err(&err)?,
                payload: row.try_get("payload").map_err(&err)?,
                taken_over: row.try_get("taken_over").map_err(&err)?,
                retention: row.try_get("retention").map_err(&err)?,
                expires: row.try_get("expires").map_err(&err)?,
                created: row.try_get("created").map_err(&err)?,
            }
        }
    })
}

/// Inserts copies of `tpl` numbered `from..=to` in one statement, every time of the
/// template moved by `a * number + b` (in the store's unit of time).
async fn insert(
    db: &Db,
    tpl: &Template,
    from: i64,
    to: i64,
    a: i64,
    b: i64,
) -> Result<u64, String> {
    let err = sql_err("inserting records");
    let done = match (db, tpl) {
        (
            Db::Pg(pool),
            Template::Pg {
                fingerprint,
                token,
                payload,
                taken_over,
                retention,
                expires,
                created,
                sweep,
            },
        ) => sqlx::query(
            "INSERT INTO idemkey_records
                (id, fingerprint, token, payload, taken_over, expires_at, created, retention,
                sweep_at)
             SELECT sha256(int8send(g)), $5, $6, $7, $8,
                now() + ($10 + $3 * g + $4) * interval '1 microsecond',
                now() + ($11 + $3 * g + $4) * interval '1 microsecond', $9,
                now() + ($12 + $3 * g + $4) * interval '1 microsecond'
             FROM generate_series($1::bigint, $2::bigint) g",
        )
        .bind(from)
        .bind(to)
        .bind(a)
        .bind(b)
        .bind(fingerprint)
        .bind(token)
        .bind(payload)
        .bind(taken_over)
        .bind(retention)
        .bind(expires)
        .bind(created)
        .bind(sweep)
        .execute(pool)
        .await
        .map_err(err)?
        .rows_affected(),
        (
            Db::My(pool),
            Template::My {
                fingerprint,
                token,
                payload,
                completed,
                taken_over,
                created,
                expires,
                purge,
            },
        ) => {
            // MariaDB's Sequence engine: `seq_FROM_to_TO` is a table of those numbers.
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO idemkey_records (id, fingerprint, token, payload, completed,
                    taken_over, created_at, expires_at, purge_at)
                 SELECT UNHEX(SHA2(seq, 256)), ?, ?, ?, ?, ?,
                    UTC_TIMESTAMP(6) + INTERVAL (? + ? * CAST(seq AS SIGNED) + ?) MICROSECOND,
                    UTC_TIMESTAMP(6) + INTERVAL (? + ? * CAST(seq AS SIGNED) + ?) MICROSECOND,
                    UTC_TIMESTAMP(6) + INTERVAL (? + ? * CAST(seq AS SIGNED) + ?) MICROSECOND
                 FROM seq_{from}_to_{to}"
            )))
            .bind(fingerprint)
            .bind(token)
            .bind(payload)
            .bind(completed)
            .bind(taken_over);
            for time in [created, expires, purge] {
                q = q.bind(time).bind(a).bind(b);
            }
            q.execute(pool).await.map_err(err)?.rows_affected()
        }
        (
            Db::Lite(pool),
            Template::Lite {
                fingerprint,
                token,
                payload,
                taken_over,
                retention,
                expires,
                created,
            },
        ) => sqlx::query(
            "WITH RECURSIVE s(g) AS (SELECT ?1 UNION ALL SELECT g + 1 FROM s WHERE g < ?2)
             INSERT INTO idemkey_records
                (id, fingerprint, token, payload, taken_over, expires_at, created, retention)
             SELECT randomblob(32), ?5, ?6, ?7, ?8, ?11 + ?9 + ?3 * g + ?4,
                ?11 + ?10 + ?3 * g + ?4, ?12
             FROM s",
        )
        .bind(from)
        .bind(to)
        .bind(a)
        .bind(b)
        .bind(fingerprint)
        .bind(token)
        .bind(payload)
        .bind(taken_over)
        .bind(expires)
        .bind(created)
        .bind(now_ms())
        .bind(retention)
        .execute(pool)
        .await
        .map_err(err)?
        .rows_affected(),
        _ => return Err("the template is of another store".to_owned()),
    };
    Ok(done)
}

/// Inserts `count` expired copies of `tpl` (expired a minute ago and before), numbered
/// from `first`.
async fn insert_expired(db: &Db, tpl: &Template, first: i64, count: u64) -> Result<(), String> {
    let unit = tpl.unit_us();
    let mut from = first;
    let last = first + i64::try_from(count).unwrap_or(i64::MAX) - 1;
    while from <= last {
        let to = (from + i64::try_from(FILL_CHUNK).unwrap_or(i64::MAX) - 1).min(last);
        // Each a unit of time further in the past than the one before.
        let b = first - tpl.remaining() - 60_000_000 / unit;
        insert(db, tpl, from, to, -1, b).await?;
        from = to + 1;
    }
    Ok(())
}

/// Updates the planner's statistics (and, on PostgreSQL, vacuums).
async fn maintain(db: &Db) -> Result<(), String> {
    match db {
        Db::Pg(pool) => sqlx::query("VACUUM ANALYZE idemkey_records")
            .execute(pool)
            .await
            .map(drop)
            .map_err(sql_err("VACUUM ANALYZE")),
        Db::My(pool) => table_storage::analyze_mysql(pool).await,
        Db::Lite(pool) => table_storage::analyze_sqlite(pool).await,
    }
}

/// The store's storage in bytes and its records, after [`maintain`].
async fn storage(db: &Db) -> Result<(u64, u64), String> {
    let err = sql_err("reading the storage");
    let (bytes, rows): (i64, i64) = match db {
        Db::Pg(pool) => sqlx::query_as(
            "SELECT pg_total_relation_size('idemkey_records'), (SELECT count(*) FROM idemkey_records)",
        )
        .fetch_one(pool)
        .await
        .map_err(err)?,
        Db::My(pool) => table_storage::storage_mysql(pool).await?,
        Db::Lite(pool) => table_storage::storage_sqlite(pool).await?,
    };
    Ok((
        u64::try_from(bytes).unwrap_or(0),
        u64::try_from(rows).unwrap_or(0),
    ))
}

// ---- the servers ----------------------------------------------------------------------

/// A `charge_server` process over `url`, and where it listens.
async fn start_server(
    exe: &std::path::Path,
    url: &str,
) -> Result<(tokio::process::Child, SocketAddr), String> {
    let mut child = tokio::process::Command::new(exe)
        .args(["--addr", "127.0.0.1:0", "--store", url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let stderr = child.stderr.take().ok_or("charge_server has no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("charge_server exited before it was listening")?;
        if let Some(rest) = line.strip_prefix("charge_server listening on http://") {
            let addr = rest
                .split_whitespace()
                .next()
                .and_then(|a| a.parse().ok())
                .ok_or(format!("unexpected line from charge_server: {line}"))?;
            // Its later warnings, as they come (and the pipe never fills).
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("charge_server: {line}");
                }
            });
            return Ok((child, addr));
        }
        eprintln!("charge_server: {line}");
    }
}

// ---- the load -------------------------------------------------------------------------

/// Fresh keys over `connections` connections to `addr` until `until` is done: the rate
/// and the latencies of the requests answered.
async fn round(
    addr: SocketAddr,
    connections: usize,
    tag: &str,
    until: impl std::future::Future<Output = ()>,
) -> Result<Figures, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let body = Bytes::from_static(br#"{"amount":100}"#);
    let mut tasks = Vec::with_capacity(connections);
    for conn in 0..connections {
        let (stop, body) = (stop.clone(), body.clone());
        let prefix = format!("{:x}.{tag}-c{conn}", std::process::id());
        tasks.push(tokio::spawn(async move {
            let mut charges = ChargeConnection::open(addr).await?;
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 14);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let status = charges.post(&format!("{prefix}-{n}"), &body).await?;
                if status != http::StatusCode::OK {
                    return Err(format!("a fresh key was answered {status}"));
                }
                latencies.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
                n += 1;
            }
            Ok::<_, String>(latencies)
        }));
    }
    rounds::finish(tasks, &stop, until).await
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

// ---- the run --------------------------------------------------------------------------

async fn run(args: Args) -> Result<(), String> {
    let exe = match args.extra("--charge-server") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .map_err(|e| format!("this program's path: {e}"))?
            .with_file_name("examples")
            .join("charge_server"),
    };
    if !exe.is_file() {
        return Err(format!(
            "no charge_server at {}: build it (cargo build --release --example charge_server --features postgres,mysql,sqlite) or give --charge-server PATH",
            exe.display()
        ));
    }
    let mut dbs = Databases::new(args.kind, args.url.clone())?;
    let result = async {
        let empty = dbs.create("empty").await?;
        let full = dbs.create("full").await?;
        measure(&args, &exe, &empty, &full).await
    }
    .await;
    dbs.drop_all().await;
    result
}

async fn measure(
    args: &Args,
    exe: &std::path::Path,
    empty: &Side,
    full: &Side,
) -> Result<(), String> {
    let (mut empty_server, empty_addr) = start_server(exe, &empty.url).await?;
    let (mut full_server, full_addr) = start_server(exe, &full.url).await?;
    // One real record in each: the template, and the near-empty table's first.
    for addr in [empty_addr, full_addr] {
        let status = ChargeConnection::open(addr)
            .await?
            .post(
                &format!("{:x}.template", std::process::id()),
                &Bytes::from_static(br#"{"amount":100}"#),
            )
            .await?;
        if status != http::StatusCode::OK {
            return Err(format!("the template request was answered {status}"));
        }
    }
    let tpl = template(&full.db).await?;
    let unit = tpl.unit_us();

    // Fill: N live records, their expiries spread over 90 % of the retention left.
    let n = i64::try_from(args.records).map_err(|_| "--records is too large")?;
    let step = (tpl.remaining() * 9 / 10 / n).max(1);
    println!(
        "filling {} records (expiries {:.0} ms apart) ...",
        args.records,
        (step * unit) as f64 / 1000.0
    );
    let started = Instant::now();
    let mut from = 1i64;
    while from <= n {
        let to = (from + i64::try_from(FILL_CHUNK).unwrap_or(n) - 1).min(n);
        insert(&full.db, &tpl, from, to, step, -n * step).await?;
        from = to + 1;
    }
    let fill_s = started.elapsed().as_secs_f64();
    maintain(&full.db).await?;
    maintain(&empty.db).await?;
    let (bytes_before, rows_before) = storage(&full.db).await?;
    let per_record_before = bytes_before as f64 / rows_before.max(1) as f64;
    println!(
        "filled in {fill_s:.0} s ({:.0} rows/s), maintenance {:.0} s; {rows_before} records, {:.1} MiB, {per_record_before:.0} bytes per record",
        args.records as f64 / fill_s,
        started.elapsed().as_secs_f64() - fill_s,
        bytes_before as f64 / 1_048_576.0,
    );

    let c = args.connections;
    let window = Duration::from_secs(args.seconds);
    // Warm-up, not measured.
    for (i, addr) in [empty_addr, full_addr].into_iter().enumerate() {
        round(
            addr,
            c,
            &format!("w{i}"),
            tokio::time::sleep(Duration::from_secs(1)),
        )
        .await?;
    }

    // Growth: the two tables in alternating rounds.
    println!(
        "growth: {} round(s) of {} s per table, {c} connections",
        args.rounds, args.seconds
    );
    let (mut at_empty, mut at_full) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let (addr, name) = [(empty_addr, empty.name), (full_addr, full.name)][side];
            let figures =
                round(addr, c, &format!("g{r}{side}"), tokio::time::sleep(window)).await?;
            println!("round {} {name:>5}: {figures}", r + 1);
            [&mut at_empty, &mut at_full][side].push(figures);
        }
    }
    let (e, f) = (medians(&at_empty), medians(&at_full));

    // The sweep's rate with no requests running.
    let store = idemkey::store::open(&full.url)
        .await
        .map_err(|e| format!("opening {}: {e}", full.url))?;
    let options = args.sweep_options();
    let mut next_expired = EXPIRED_BASE;
    insert_expired(&full.db, &tpl, next_expired, args.expired).await?;
    next_expired += i64::try_from(args.expired).unwrap_or(0);
    let alone = store
        .sweep_pass(&options)
        .await
        .map_err(|e| format!("sweep pass: {e}"))?;
    println!(
        "sweep alone (pause ratio {}): {} expired records removed in {:.2} s ({:.0} rows/s, {} batches, paused {:.2} s)",
        args.pause_ratio,
        alone.removed(),
        alone.duration().as_secs_f64(),
        alone.rows_per_second(),
        alone.batches(),
        alone.paused().as_secs_f64()
    );

    // Sweeping against not sweeping, alternating; a sweep round lasts as long as its pass.
    println!(
        "sweeping: {} pair(s) of rounds, a pass over {} expired records against none",
        args.rounds, args.expired
    );
    let (mut sweeping, mut quiet) = (Vec::new(), Vec::new());
    let mut sweep_rates = Vec::new();
    let mut length = alone.duration().max(Duration::from_secs(1));
    for r in 0..args.rounds {
        let order = if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for sweep in order {
            if sweep {
                insert_expired(&full.db, &tpl, next_expired, args.expired).await?;
                next_expired += i64::try_from(args.expired).unwrap_or(0);
                let report = tokio::sync::Mutex::new(None);
                let pass = async {
                    let done = store.sweep_pass(&options).await;
                    *report.lock().await = Some(done);
                };
                let figures = round(full_addr, c, &format!("s{r}"), pass).await?;
                let report = report
                    .into_inner()
                    .ok_or("the sweep pass did not finish")?
                    .map_err(|e| format!("sweep pass: {e}"))?;
                length = report.duration().max(Duration::from_secs(1));
                println!(
                    "round {} sweeping: {figures}  ({} removed in {:.2} s, {:.0} rows/s)",
                    r + 1,
                    report.removed(),
                    report.duration().as_secs_f64(),
                    report.rows_per_second()
                );
                sweep_rates.push(report.rows_per_second());
                sweeping.push(figures);
            } else {
                let figures =
                    round(full_addr, c, &format!("q{r}"), tokio::time::sleep(length)).await?;
                println!("round {}    quiet: {figures}", r + 1);
                quiet.push(figures);
            }
        }
    }
    let (s, q) = (medians(&sweeping), medians(&quiet));

    // After the churn: a last pass, a vacuum, the storage again.
    let last = store
        .sweep_pass(&options)
        .await
        .map_err(|e| format!("sweep pass: {e}"))?;
    maintain(&full.db).await?;
    let (bytes_after, rows_after) = storage(&full.db).await?;
    let per_record_after = bytes_after as f64 / rows_after.max(1) as f64;
    println!(
        "after the churn ({} expired records inserted and swept, last pass {} removed): {rows_after} records, {:.1} MiB, {per_record_after:.0} bytes per record",
        next_expired - EXPIRED_BASE,
        last.removed(),
        bytes_after as f64 / 1_048_576.0
    );

    println!("medians:");
    println!("  near-empty  {e}");
    println!("  {:>10}  {f}", args.records);
    println!("  quiet       {q}");
    println!("  sweeping    {s}");
    let p99_growth = f.p99_us / e.p99_us.max(1.0);
    let rate_growth = f.rate / e.rate.max(1.0);
    let p99_sweep = s.p99_us / q.p99_us.max(1.0);
    let sweep_x = alone.rows_per_second() / f.rate.max(1.0);
    let sweep_loaded_x = median(sweep_rates) / f.rate.max(1.0);
    let storage_x = per_record_after / per_record_before.max(1.0);
    println!("targets:");
    println!(
        "  p99 at N / near-empty        {p99_growth:.2}  (at most 1.25: {})",
        verdict(p99_growth <= 1.25)
    );
    println!(
        "  rate at N / near-empty       {rate_growth:.2}  (at least 0.80: {})",
        verdict(rate_growth >= 0.8)
    );
    println!(
        "  p99 sweeping / quiet         {p99_sweep:.2}  (at most 1.50: {})",
        verdict(p99_sweep <= 1.5)
    );
    println!(
        "  sweep rate / request rate    {sweep_x:.1}  (at least 5: {}); under load {sweep_loaded_x:.1}",
        verdict(sweep_x >= 5.0)
    );
    println!(
        "  storage per record after/before  {storage_x:.2}  (at most 1.50: {})",
        verdict(storage_x <= 1.5)
    );
    empty_server.kill().await.map_err(|e| e.to_string())?;
    full_server.kill().await.map_err(|e| e.to_string())?;
    Ok(())
}
