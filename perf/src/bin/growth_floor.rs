//! Growth's floor: the least work a fresh idempotent request needs on the database, at a
//! nearly empty table and at N records, and the fastest a batched sweep of expired rows
//! goes, measured the way `growth` measures idemkey (alternating rounds, medians, ratios),
//! so that `growth`'s figures can be split into the database's own floor on this machine
//! and idemkey's overhead above it.
//!
//! ```sh
//! cargo build --release -p perf --bin growth_floor
//! target/release/growth_floor --store mysql|sqlite [--records N] [--expired M]
//!     [--seconds S] [--rounds R] [--connections C] [--payload-bytes P] [--url URL]
//!     [--pause-ratio X]
//! ```
//!
//! 1. Two databases of its own (MySQL/MariaDB: `idemkey_floor_empty_PID` and
//!    `idemkey_floor_full_PID` on the server at `--url`, default `IDEMKEY_MYSQL_URL` or
//!    `mysql://root@127.0.0.1:3306/test`; SQLite: two files beside this program, under
//!    `target/`), removed at the end. Each gets the store's own table: opened once with
//!    `idemkey::store::open`, which creates it with the store's schema.
//! 2. N completed records go into `full` by server-side SQL (ids of 32 bytes, random on
//!    SQLite, SHA-256 of a number on MariaDB; a `P`-byte payload; expiries spread over
//!    the day ahead), then `ANALYZE`, and the storage per live record is read.
//! 3. A request of the floor is what a fresh key needs at the least, from a bare sqlx
//!    pool shaped as the store's (SQLite: one writer connection, WAL, `synchronous =
//!    FULL`; MariaDB: 16 connections): the store's `INSERT` of the new in-progress
//!    record with a random 32-byte id, committed, then the `UPDATE` that completes it,
//!    committed. No HTTP, no engine, no fingerprinting. C tasks send them back to back,
//!    R rounds of S seconds per database in alternating order; rate, p50 and p99 per
//!    round, medians compared (`full/empty`).
//! 4. The sweep's floor: M expired records are inserted, then the store's own batch
//!    statement (1,000 rows, through the expiry index) runs until a batch comes back
//!    short, each batch followed by the pause the store's sweep takes after it
//!    (`SweepOptions::pause_after` with `--pause-ratio`, the store's default unless
//!    given; 0: back to back), with nothing else running and no lock taken: rows per second
//!    against the request rate at N. Then R pairs of rounds at N records, one while such
//!    a pass over M fresh expired records runs and one of the same length without.
//! 5. Storage per live record after the churn (the passes, then `ANALYZE TABLE` on
//!    MariaDB; SQLite's pages in use, without the freelist), against step 2's.
//!
//! Storage is MariaDB's `DATA_LENGTH + INDEX_LENGTH` and SQLite's `(page_count -
//! freelist_count) * page_size`, as `growth` reads it.
#![allow(
    clippy::print_stdout,
    reason = "a command-line program prints its results"
)]

#[path = "../growth_args.rs"]
mod growth_args;
#[path = "../own_database.rs"]
mod own_database;
#[path = "../rounds.rs"]
mod rounds;
#[path = "../table_storage.rs"]
mod table_storage;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use growth_args::{Args, Kind};
use idemkey::store::SweepOptions;
use own_database::with_database;
use rounds::{Figures, medians};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

const USAGE: &str = "usage: growth_floor --store mysql|sqlite [--records N] [--expired M]
              [--seconds S] [--rounds R] [--connections C] [--payload-bytes P] [--url URL]
              [--pause-ratio X]
  the least database work of a fresh idempotent request (INSERT, then the completing
  UPDATE) at a nearly empty table against N records, and a bare batched sweep";

/// Rows per fill statement (each its own transaction).
const FILL_CHUNK: u64 = 500_000;

/// Why `--store postgres` is refused (the parser accepts only mysql and sqlite).
const POSTGRES: &str = "growth_floor measures mysql and sqlite; PostgreSQL's floor is not built";

/// The sweep's batch, as the store's default (`idemkey::store::DEFAULT_SWEEP_BATCH`).
const BATCH: i64 = 1_000;

/// A completed record's retention and an in-progress record's lease, in milliseconds.
const RETENTION_MS: i64 = 86_400_000;
const LEASE_MS: i64 = 30_000;

fn main() -> std::process::ExitCode {
    let args = match growth_args::parse(USAGE, &[Kind::MySql, Kind::Sqlite], &["--payload-bytes"]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(run(args)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("growth_floor: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn sql_err(what: &'static str) -> impl Fn(sqlx::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 16);
    while out.len() < n {
        out.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    out.truncate(n);
    out
}

// ---- the databases -------------------------------------------------------------------

/// A pool on one database, shaped as the store's own.
#[derive(Clone)]
enum Db {
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

struct Side {
    name: &'static str,
    db: Db,
    /// The database to drop (MariaDB) or the file to remove (SQLite).
    place: String,
}

async fn create(kind: Kind, server: &str, side: &'static str) -> Result<Side, String> {
    let name = format!("idemkey_floor_{side}_{}", std::process::id());
    match kind {
        Kind::MySql => {
            let admin = sqlx::MySqlPool::connect(server)
                .await
                .map_err(|e| format!("MySQL at {server}: {e}"))?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&admin)
                .await
                .map_err(|e| format!("CREATE DATABASE {name}: {e}"))?;
            admin.close().await;
            let url = with_database(server, &name);
            // The store's schema, created by the store.
            drop(
                idemkey::store::open(&url)
                    .await
                    .map_err(|e| format!("opening the store on {name}: {e}"))?,
            );
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(16)
                .connect(&url)
                .await
                .map_err(|e| format!("MySQL {name}: {e}"))?;
            Ok(Side {
                name: side,
                db: Db::My(pool),
                place: name,
            })
        }
        Kind::Postgres => Err(POSTGRES.to_owned()),
        Kind::Sqlite => {
            let path = format!("{server}/{name}.db");
            drop(
                idemkey::store::open(&format!("sqlite://{path}"))
                    .await
                    .map_err(|e| format!("opening the store on {path}: {e}"))?,
            );
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await
                .map_err(|e| format!("SQLite {path}: {e}"))?;
            Ok(Side {
                name: side,
                db: Db::Lite(pool),
                place: path,
            })
        }
    }
}

async fn remove(server: &str, side: Side) {
    match side.db {
        Db::My(pool) => {
            pool.close().await;
            if let Ok(admin) = sqlx::MySqlPool::connect(server).await {
                let drop_it = format!("DROP DATABASE IF EXISTS {}", side.place);
                if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(drop_it))
                    .execute(&admin)
                    .await
                {
                    eprintln!("dropping {}: {e}", side.place);
                }
            }
        }
        Db::Lite(pool) => {
            pool.close().await;
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", side.place));
            }
        }
    }
}

/// Inserts completed records numbered `from..=to` (`tag` makes their ids distinct from
/// other fills), expiring `expiry_ms(number)` from now: positive for live records,
/// negative for expired ones.
async fn fill(
    db: &Db,
    tag: &str,
    from: u64,
    to: u64,
    payload: u64,
    first_expiry_ms: i64,
    step_ms: i64,
) -> Result<(), String> {
    let err = sql_err("inserting records");
    match db {
        Db::My(pool) => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO idemkey_records (id, fingerprint, token, payload, completed,
                    taken_over, created_at, expires_at, purge_at)
                 SELECT UNHEX(SHA2(CONCAT(?, seq), 256)), UNHEX(SHA2(seq, 256)), NULL,
                    REPEAT('x', ?), TRUE, FALSE, UTC_TIMESTAMP(6),
                    UTC_TIMESTAMP(6) + INTERVAL (? + ? * CAST(seq AS SIGNED)) * 1000 MICROSECOND,
                    UTC_TIMESTAMP(6) + INTERVAL (? + ? * CAST(seq AS SIGNED)) * 1000 MICROSECOND
                 FROM seq_{from}_to_{to}"
            )))
            .bind(tag)
            .bind(payload)
            .bind(first_expiry_ms)
            .bind(step_ms)
            .bind(first_expiry_ms)
            .bind(step_ms)
            .execute(pool)
            .await
            .map_err(err)?;
        }
        Db::Lite(pool) => {
            let now = now_ms();
            sqlx::query(
                "WITH RECURSIVE s(g) AS (SELECT ?1 UNION ALL SELECT g + 1 FROM s WHERE g < ?2)
                 INSERT INTO idemkey_records
                    (id, fingerprint, token, payload, taken_over, expires_at, created, retention)
                 SELECT randomblob(32), randomblob(32), NULL, randomblob(?3), 0,
                    ?4 + ?5 + ?6 * g, ?4, ?7
                 FROM s",
            )
            .bind(i64::try_from(from).unwrap_or(i64::MAX))
            .bind(i64::try_from(to).unwrap_or(i64::MAX))
            .bind(i64::try_from(payload).unwrap_or(100))
            .bind(now)
            .bind(first_expiry_ms)
            .bind(step_ms)
            .bind(RETENTION_MS)
            .execute(pool)
            .await
            .map_err(err)?;
        }
    }
    Ok(())
}

/// `count` records in chunks, numbered from `first`.
async fn fill_many(
    db: &Db,
    tag: &str,
    first: u64,
    count: u64,
    payload: u64,
    first_expiry_ms: i64,
    step_ms: i64,
) -> Result<(), String> {
    let mut from = first;
    let last = first + count - 1;
    while from <= last {
        let to = (from + FILL_CHUNK - 1).min(last);
        fill(db, tag, from, to, payload, first_expiry_ms, step_ms).await?;
        from = to + 1;
    }
    Ok(())
}

/// `ANALYZE` (and on SQLite a checkpoint).
async fn maintain(db: &Db) -> Result<(), String> {
    match db {
        Db::My(pool) => table_storage::analyze_mysql(pool).await,
        Db::Lite(pool) => table_storage::analyze_sqlite(pool).await,
    }
}

/// The table's storage in bytes and its rows, after [`maintain`].
async fn storage(db: &Db) -> Result<(f64, i64), String> {
    let (bytes, rows) = match db {
        Db::My(pool) => table_storage::storage_mysql(pool).await?,
        Db::Lite(pool) => table_storage::storage_sqlite(pool).await?,
    };
    Ok((bytes as f64, rows))
}

// ---- a request of the floor ------------------------------------------------------------

/// The store's claim of a new key (the `INSERT`), committed, then its completion (the
/// `UPDATE`), committed: each statement its own transaction, as the store runs them.
async fn request(db: &Db, payload: &[u8]) -> Result<(), String> {
    let id = random_bytes(32);
    let fingerprint = random_bytes(32);
    let token = random_bytes(16);
    let done = match db {
        Db::My(pool) => {
            sqlx::query(
                "INSERT INTO idemkey_records (id, fingerprint, token, payload, completed,
                    taken_over, created_at, expires_at, purge_at)
                 VALUES (?, ?, ?, NULL, FALSE, FALSE, UTC_TIMESTAMP(6),
                    UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                    UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)",
            )
            .bind(&id)
            .bind(&fingerprint)
            .bind(&token)
            .bind(LEASE_MS * 1000)
            .bind((LEASE_MS + RETENTION_MS) * 1000)
            .execute(pool)
            .await
            .map_err(sql_err("the claim's INSERT"))?;
            sqlx::query(
                "UPDATE idemkey_records SET payload = ?, token = NULL, completed = TRUE,
                    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                    purge_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                 WHERE id = ? AND token = ? AND completed = FALSE
                    AND purge_at > UTC_TIMESTAMP(6)",
            )
            .bind(payload)
            .bind(RETENTION_MS * 1000)
            .bind(RETENTION_MS * 1000)
            .bind(&id)
            .bind(&token)
            .execute(pool)
            .await
            .map_err(sql_err("the completion's UPDATE"))?
            .rows_affected()
        }
        Db::Lite(pool) => {
            let now = now_ms();
            sqlx::query(
                "INSERT INTO idemkey_records (id, fingerprint, token, payload, taken_over,
                    expires_at, created, retention)
                 VALUES (?2, ?3, ?4, NULL, 0, ?1 + ?5, ?1, ?6)",
            )
            .bind(now)
            .bind(&id)
            .bind(&fingerprint)
            .bind(&token)
            .bind(LEASE_MS)
            .bind(RETENTION_MS)
            .execute(pool)
            .await
            .map_err(sql_err("the claim's INSERT"))?;
            let now = now_ms();
            sqlx::query(
                "UPDATE idemkey_records SET payload = ?4, token = NULL, expires_at = ?1 + ?5
                 WHERE id = ?2 AND token = ?3 AND payload IS NULL
                    AND expires_at + retention > ?1",
            )
            .bind(now)
            .bind(&id)
            .bind(&token)
            .bind(payload)
            .bind(RETENTION_MS)
            .execute(pool)
            .await
            .map_err(sql_err("the completion's UPDATE"))?
            .rows_affected()
        }
    };
    if done == 1 {
        Ok(())
    } else {
        Err(format!("the completion updated {done} rows, not 1"))
    }
}

/// One batch of the store's sweep statement: the rows it removed.
async fn sweep_batch(db: &Db) -> Result<u64, String> {
    let err = sql_err("sweeping");
    Ok(match db {
        Db::My(pool) => sqlx::query(
            "DELETE FROM idemkey_records WHERE purge_at <= UTC_TIMESTAMP(6)
             ORDER BY purge_at, id LIMIT ?",
        )
        .bind(BATCH)
        .execute(pool)
        .await
        .map_err(err)?
        .rows_affected(),
        Db::Lite(pool) => sqlx::query(
            "DELETE FROM idemkey_records WHERE rowid IN (SELECT rowid FROM idemkey_records
                WHERE expires_at <= ?1 AND (payload IS NOT NULL OR expires_at + retention <= ?1)
                ORDER BY expires_at LIMIT ?2)",
        )
        .bind(now_ms())
        .bind(BATCH)
        .execute(pool)
        .await
        .map_err(err)?
        .rows_affected(),
    })
}

/// Batches until one comes back short, each followed by the pause the store's sweep
/// would take (`SweepOptions::pause_after`; none with `--pause-ratio 0`): rows removed
/// and the time taken.
async fn sweep_pass(db: &Db, options: &SweepOptions) -> Result<(u64, Duration), String> {
    let started = Instant::now();
    let mut removed = 0;
    loop {
        let began = Instant::now();
        let n = sweep_batch(db).await?;
        removed += n;
        if n < u64::try_from(BATCH).unwrap_or(u64::MAX) {
            return Ok((removed, started.elapsed()));
        }
        tokio::time::sleep(options.pause_after(began.elapsed())).await;
    }
}

/// Inserts `args.expired` records that expired a minute ago and before (one
/// millisecond apart), numbered from `*next` on, for a sweep pass to remove.
async fn expire(db: &Db, tag: &str, next: &mut u64, args: &Args) -> Result<(), String> {
    fill_many(
        db,
        tag,
        *next,
        args.expired,
        payload_bytes(args)?,
        -60_000,
        -1,
    )
    .await?;
    *next += args.expired;
    Ok(())
}

// ---- the rounds ------------------------------------------------------------------------

/// Floor requests from `connections` tasks until `until` is done.
async fn round(
    db: &Db,
    connections: usize,
    payload: &Arc<Vec<u8>>,
    until: impl std::future::Future<Output = ()>,
) -> Result<Figures, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (stop, db, payload) = (stop.clone(), db.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 14);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                request(&db, &payload).await?;
                latencies.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            Ok::<_, String>(latencies)
        }));
    }
    rounds::finish(tasks, &stop, until).await
}

// ---- the run ---------------------------------------------------------------------------

async fn run(args: Args) -> Result<(), String> {
    let server = match args.kind {
        Kind::MySql => args
            .url
            .clone()
            .or_else(|| std::env::var("IDEMKEY_MYSQL_URL").ok())
            .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_owned()),
        Kind::Postgres => return Err(POSTGRES.to_owned()),
        Kind::Sqlite => {
            let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
            exe.parent()
                .ok_or("this program has no directory")?
                .display()
                .to_string()
        }
    };
    let empty = create(args.kind, &server, "empty").await?;
    let full = match create(args.kind, &server, "full").await {
        Ok(full) => full,
        Err(e) => {
            remove(&server, empty).await;
            return Err(e);
        }
    };
    let result = measure(&args, &empty, &full).await;
    remove(&server, empty).await;
    remove(&server, full).await;
    result
}

/// The payload of each record (`--payload-bytes`, 100 unless given).
fn payload_bytes(args: &Args) -> Result<u64, String> {
    args.extra("--payload-bytes").map_or(Ok(100), |v| {
        v.parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or(format!("--payload-bytes {v}: use a positive whole number"))
    })
}

async fn measure(args: &Args, empty: &Side, full: &Side) -> Result<(), String> {
    let payload_len = payload_bytes(args)?;
    let payload = Arc::new(random_bytes(usize::try_from(payload_len).unwrap_or(100)));
    let options = args.sweep_options();
    let n = args.records;
    // Live records expiring over the next 90 % of a day, as a day of traffic leaves them.
    let step_ms = (RETENTION_MS * 9 / 10 / i64::try_from(n).unwrap_or(i64::MAX)).max(1);
    println!("filling {n} records ...");
    let started = Instant::now();
    fill_many(
        &full.db,
        "live",
        1,
        n,
        payload_len,
        RETENTION_MS / 10,
        step_ms,
    )
    .await?;
    let fill_s = started.elapsed().as_secs_f64();
    maintain(&full.db).await?;
    maintain(&empty.db).await?;
    let (bytes_before, rows_before) = storage(&full.db).await?;
    let per_before = bytes_before / rows_before.max(1) as f64;
    println!(
        "filled in {fill_s:.0} s ({:.0} rows/s); {rows_before} records, {:.1} MiB, {per_before:.0} bytes per record",
        n as f64 / fill_s,
        bytes_before / 1_048_576.0
    );

    let c = args.connections;
    let window = Duration::from_secs(args.seconds);
    for side in [empty, full] {
        round(
            &side.db,
            c,
            &payload,
            tokio::time::sleep(Duration::from_secs(1)),
        )
        .await?;
    }
    println!(
        "growth floor: {} round(s) of {} s per table, {c} tasks",
        args.rounds, args.seconds
    );
    let (mut at_empty, mut at_full) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let side = [empty, full][i];
            let figures = round(&side.db, c, &payload, tokio::time::sleep(window)).await?;
            println!("round {} {:>5}: {figures}", r + 1, side.name);
            [&mut at_empty, &mut at_full][i].push(figures);
        }
    }
    let (e, f) = (medians(&at_empty), medians(&at_full));

    // The sweep alone.
    let mut next = 1;
    expire(&full.db, "gone", &mut next, args).await?;
    let (removed, took) = sweep_pass(&full.db, &options).await?;
    let alone = removed as f64 / took.as_secs_f64().max(1e-9);
    println!(
        "sweep alone (pause ratio {}): {removed} removed in {:.2} s ({alone:.0} rows/s)",
        args.pause_ratio,
        took.as_secs_f64()
    );

    println!(
        "sweeping: {} pair(s) of rounds, a pass over {} expired records against none",
        args.rounds, args.expired
    );
    let (mut sweeping, mut quiet) = (Vec::new(), Vec::new());
    let mut length = took.max(Duration::from_secs(1));
    for r in 0..args.rounds {
        let order = if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for sweep in order {
            if sweep {
                expire(&full.db, &format!("gone{r}"), &mut next, args).await?;
                let outcome = tokio::sync::Mutex::new(None);
                let pass = async {
                    *outcome.lock().await = Some(sweep_pass(&full.db, &options).await);
                };
                let figures = round(&full.db, c, &payload, pass).await?;
                let (removed, took) = outcome.into_inner().ok_or("the pass did not finish")??;
                length = took.max(Duration::from_secs(1));
                println!(
                    "round {} sweeping: {figures}  ({removed} removed in {:.2} s)",
                    r + 1,
                    took.as_secs_f64()
                );
                sweeping.push(figures);
            } else {
                let figures = round(&full.db, c, &payload, tokio::time::sleep(length)).await?;
                println!("round {}    quiet: {figures}", r + 1);
                quiet.push(figures);
            }
        }
    }
    let (s, q) = (medians(&sweeping), medians(&quiet));

    sweep_pass(&full.db, &options).await?;
    maintain(&full.db).await?;
    let (bytes_after, rows_after) = storage(&full.db).await?;
    let per_after = bytes_after / rows_after.max(1) as f64;
    println!(
        "after the churn ({} expired records inserted and swept): {rows_after} records, {:.1} MiB, {per_after:.0} bytes per record",
        next - 1,
        bytes_after / 1_048_576.0
    );

    println!("medians (floor):");
    println!("  near-empty  {e}");
    println!("  {n:>10}  {f}");
    println!("  quiet       {q}");
    println!("  sweeping    {s}");
    println!("floor ratios (growth's targets in brackets):");
    println!(
        "  p99 at N / near-empty        {:.2}  (<= 1.25)",
        f.p99_us / e.p99_us.max(1.0)
    );
    println!(
        "  rate at N / near-empty       {:.2}  (>= 0.80)",
        f.rate / e.rate.max(1.0)
    );
    println!(
        "  p99 sweeping / quiet         {:.2}  (<= 1.50)",
        s.p99_us / q.p99_us.max(1.0)
    );
    println!(
        "  sweep rate / request rate    {:.1}  (>= 5)",
        alone / f.rate.max(1.0)
    );
    println!(
        "  storage per record after/before  {:.2}  (<= 1.50)",
        per_after / per_before.max(1.0)
    );
    Ok(())
}
