//! Bytes of storage per completed record in every store, split into a fixed cost per
//! record and a cost per response byte: the figures of `idemkey::store::sizing`.
//!
//! ```sh
//! cargo run --release -p perf --bin bytes_per_record -- \
//!     [--records 20000] [--sizes 100,1024,4096] [--stores memory,sqlite,postgres,mysql,redis,dynamodb] \
//!     [--memory-records 200000] [--dynamodb-records 300] [--dynamodb-endpoint http://127.0.0.1:PORT]
//! ```
//!
//! For each response size, N fresh keys are posted in-process (no network) to a charge
//! handler behind the verifier over the store, so every record holds what a real one
//! does: the hashed id, the fingerprint, the token, the times and the stored response
//! (status, `content-type`, a JSON body of exactly that many bytes, padded with
//! pseudo-random letters so that no store's compression flatters it). Then the store's own
//! figure is read, and its growth divided by N:
//!
//! - memory: the growth of the resident set of a child process (one per size, so one
//!   size's freed memory is not reused by the next), as `memory_per_record` does;
//! - SQLite: `page_count * page_size` after a WAL checkpoint (file in `/dev/shm` where
//!   there is one: the size is the same, without the syncs' wait);
//! - PostgreSQL: `pg_total_relation_size` (table, TOAST, indexes) after `VACUUM
//!   ANALYZE`, in a database of its own (`IDEMKEY_POSTGRES_URL`'s server) dropped at
//!   the end;
//! - MySQL / MariaDB: `DATA_LENGTH + INDEX_LENGTH` of `information_schema.TABLES` after
//!   `ANALYZE TABLE`, in a database of its own (`IDEMKEY_MYSQL_URL`'s server) dropped at
//!   the end; InnoDB counts whole 16 KiB pages, so the figure is page-granular;
//! - Redis: `used_memory` growth of a private `redis-server` (on `PATH`) started on a free
//!   port and killed at the end;
//! - DynamoDB: the item size by DynamoDB's documented rules (attribute names plus values,
//!   <https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html>),
//!   computed from the items the store wrote, read back with `Scan` from the server at
//!   `--dynamodb-endpoint` (moto or DynamoDB Local); left out without it.
//!
//! The fixed cost and the cost per response byte are the least-squares line through
//! the sizes' figures.

#[path = "../private_redis.rs"]
mod private_redis;

#[path = "../in_process.rs"]
mod in_process;

#[path = "../database_url.rs"]
mod database_url;

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;

use axum::Router;
use axum::routing::post;
use database_url::with_database;
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::{MemoryStore, Store};
use in_process::{post_charge, rss_growth};
use private_redis::PrivateRedis;
use sqlx::Row;

const USAGE: &str = "usage: bytes_per_record [--records N] [--sizes B,B,...] [--stores memory,sqlite,postgres,mysql,redis,dynamodb] [--memory-records N] [--dynamodb-records N] [--dynamodb-endpoint URL]";

/// Requests in flight at once against a shared store.
const CONCURRENCY: u64 = 16;

const ALL_STORES: [&str; 6] = ["memory", "sqlite", "postgres", "mysql", "redis", "dynamodb"];

struct Args {
    records: u64,
    memory_records: u64,
    dynamodb_records: u64,
    sizes: Vec<usize>,
    stores: Vec<String>,
    dynamodb_endpoint: Option<String>,
}

fn positive(flag: &str, v: &str) -> Result<u64, String> {
    v.parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(format!("{flag} {v}: use a positive integer"))
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut out = Args {
        records: 20_000,
        memory_records: 200_000,
        dynamodb_records: 300,
        sizes: vec![100, 1024, 4096],
        stores: ALL_STORES.iter().map(|s| (*s).to_owned()).collect(),
        dynamodb_endpoint: None,
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value; {USAGE}"));
        match arg.as_str() {
            "--records" => out.records = positive(&arg, &value()?)?,
            "--memory-records" => out.memory_records = positive(&arg, &value()?)?,
            "--dynamodb-records" => out.dynamodb_records = positive(&arg, &value()?)?,
            "--sizes" => {
                out.sizes = value()?
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|n| (60..=1 << 20).contains(n))
                            .ok_or(format!("--sizes {s}: sizes are 60 to 1048576 bytes"))
                    })
                    .collect::<Result<_, _>>()?;
                if out.sizes.len() < 2 {
                    return Err("--sizes needs at least two sizes to fit a line".into());
                }
            }
            "--stores" => {
                out.stores = value()?.split(',').map(|s| s.trim().to_owned()).collect();
                if let Some(bad) = out
                    .stores
                    .iter()
                    .find(|s| !ALL_STORES.contains(&s.as_str()))
                {
                    return Err(format!("--stores: unknown store {bad:?}; {USAGE}"));
                }
            }
            "--dynamodb-endpoint" => out.dynamodb_endpoint = Some(value()?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    Ok(out)
}

/// A JSON body of exactly `size` bytes (for `size` of at least 60), padded with
/// pseudo-random letters and digits: PostgreSQL compresses large values (TOAST), and a
/// padding of one repeated letter would measure the compressor, not the store.
fn charge_body(n: u64, size: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let head = format!(r#"{{"id":"ch_{n:016}","object":"charge","amount":100,"pad":""#);
    let pad = size.saturating_sub(head.len() + 2);
    let mut state = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let letters: String = (0..pad)
        .map(|_| {
            // xorshift64: fast, and as incompressible as the compressors can tell.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state >> 58) as usize])
        })
        .collect();
    format!("{head}{letters}\"}}")
}

fn app(store: Arc<dyn Store>, size: usize) -> Router {
    let layer = IdempotencyLayer::new(Engine::new(store));
    Router::new().route(
        "/v1/charges",
        post(move |body: String| async move {
            let n = body
                .chars()
                .filter(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(0);
            ([("content-type", "application/json")], charge_body(n, size))
        })
        .layer(layer),
    )
}

/// Posts keys `0..records` through `app`, `CONCURRENCY` at a time.
async fn fill(app: &Router, records: u64) -> Result<(), String> {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..CONCURRENCY {
        let app = app.clone();
        tasks.spawn(async move {
            let mut key = worker;
            while key < records {
                post_charge(&app, key).await?;
                key += CONCURRENCY;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("a writer failed: {e}"))??;
    }
    Ok(())
}

// ---- memory: a child process per size --------------------------------------------

/// In the child: fills a memory store and prints the resident set's growth.
async fn memory_child(size: usize, records: u64) -> Result<(), String> {
    let store = MemoryStore::builder()
        .max_records(records.saturating_mul(2))
        .max_bytes(u64::MAX)
        .build()
        .map_err(|e| format!("memory store: {e}"))?;
    let app = app(Arc::new(store), size);
    let grown = rss_growth(&app, records).await?;
    #[allow(clippy::print_stdout, reason = "the parent reads the figure")]
    {
        println!("{grown}");
    }
    Ok(())
}

fn measure_memory(size: usize, records: u64) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let out = Command::new(exe)
        .args(["--memory-child", &size.to_string(), &records.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("starting the memory child: {e}"))?;
    if !out.status.success() {
        return Err(format!("the memory child failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("the memory child printed no figure: {e}"))
}

// ---- SQLite --------------------------------------------------------------------------

async fn sqlite_bytes(path: &std::path::Path) -> Result<u64, String> {
    let url = format!("sqlite://{}", path.display());
    let pool = sqlx::SqlitePool::connect(&url)
        .await
        .map_err(|e| format!("SQLite {url}: {e}"))?;
    let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&pool)
        .await;
    let row = sqlx::query(
        "SELECT (SELECT page_count FROM pragma_page_count()) * (SELECT page_size FROM pragma_page_size())",
    )
    .fetch_one(&pool)
    .await
    .map_err(|e| format!("SQLite page count: {e}"))?;
    pool.close().await;
    Ok(u64::try_from(row.get::<i64, _>(0)).unwrap_or(0))
}

async fn measure_sqlite(size: usize, records: u64) -> Result<u64, String> {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("idemkey_bpr_{}_{size}.db", std::process::id()));
    let store = idemkey::store::SqliteStore::open(&path)
        .await
        .map_err(|e| format!("SQLite: {e}"))?;
    let before = sqlite_bytes(&path).await?;
    fill(&app(Arc::new(store.clone()), size), records).await?;
    store.close().await;
    let after = sqlite_bytes(&path).await?;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(after.saturating_sub(before))
}

// ---- PostgreSQL and MySQL: a database of their own -----------------------------------

fn database_name() -> String {
    format!("idemkey_bpr_{}", std::process::id())
}

async fn pg_size(pool: &sqlx::PgPool, table: &str) -> Result<u64, String> {
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
        .execute(pool)
        .await
        .map_err(|e| format!("VACUUM: {e}"))?;
    let size: i64 = sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
        .bind(table)
        .fetch_one(pool)
        .await
        .map_err(|e| format!("pg_total_relation_size: {e}"))?;
    Ok(u64::try_from(size).unwrap_or(0))
}

async fn measure_postgres(server: &str, sizes: &[usize], records: u64) -> Result<Vec<u64>, String> {
    let db = database_name();
    let admin = sqlx::PgPool::connect(&with_database(server, "postgres"))
        .await
        .map_err(|e| format!("PostgreSQL at {server}: {e}"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(&admin)
        .await
        .map_err(|e| format!("CREATE DATABASE: {e}"))?;
    let url = with_database(server, &db);
    let result = async {
        let pool = sqlx::PgPool::connect(&url)
            .await
            .map_err(|e| format!("PostgreSQL {db}: {e}"))?;
        let mut out = Vec::new();
        for &size in sizes {
            let table = format!("bpr_{size}");
            let store = idemkey::store::PostgresStore::builder(url.clone())
                .table(table.clone())
                .connect()
                .await
                .map_err(|e| format!("PostgreSQL: {e}"))?;
            store.migrate().await.map_err(|e| format!("migrate: {e}"))?;
            let before = pg_size(&pool, &table).await?;
            fill(&app(Arc::new(store), size), records).await?;
            out.push(pg_size(&pool, &table).await?.saturating_sub(before));
        }
        pool.close().await;
        Ok(out)
    }
    .await;
    // Sessions of the store's pools may linger a moment after they are dropped.
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(&admin)
    .await;
    result
}

async fn mysql_size(pool: &sqlx::MySqlPool, db: &str, table: &str) -> Result<u64, String> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ANALYZE TABLE {table}")))
        .execute(pool)
        .await
        .map_err(|e| format!("ANALYZE TABLE: {e}"))?;
    let size: u64 = sqlx::query_scalar(
        "SELECT CAST(DATA_LENGTH + INDEX_LENGTH AS UNSIGNED) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
    )
    .bind(db)
    .bind(table)
    .fetch_one(pool)
    .await
    .map_err(|e| format!("information_schema.TABLES: {e}"))?;
    Ok(size)
}

async fn measure_mysql(server: &str, sizes: &[usize], records: u64) -> Result<Vec<u64>, String> {
    let db = database_name();
    let admin = sqlx::MySqlPool::connect(&with_database(server, "mysql"))
        .await
        .map_err(|e| format!("MySQL at {server}: {e}"))?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(&admin)
        .await
        .map_err(|e| format!("CREATE DATABASE: {e}"))?;
    let url = with_database(server, &db);
    let result = async {
        let pool = sqlx::MySqlPool::connect(&url)
            .await
            .map_err(|e| format!("MySQL {db}: {e}"))?;
        let mut out = Vec::new();
        for &size in sizes {
            let table = format!("bpr_{size}");
            let store = idemkey::store::MySqlStore::builder(url.clone())
                .table(table.clone())
                .connect()
                .await
                .map_err(|e| format!("MySQL: {e}"))?;
            store.migrate().await.map_err(|e| format!("migrate: {e}"))?;
            let before = mysql_size(&pool, &db, &table).await?;
            fill(&app(Arc::new(store), size), records).await?;
            out.push(mysql_size(&pool, &db, &table).await?.saturating_sub(before));
        }
        pool.close().await;
        Ok(out)
    }
    .await;
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db}")))
        .execute(&admin)
        .await;
    result
}

// ---- Redis: a private server ---------------------------------------------------------

async fn used_memory(con: &mut redis::aio::MultiplexedConnection) -> Result<u64, String> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(con)
        .await
        .map_err(|e| format!("INFO memory: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".to_owned())
}

async fn measure_redis(sizes: &[usize], records: u64) -> Result<Vec<u64>, String> {
    let server = PrivateRedis::start()?;
    let client = redis::Client::open(server.url.as_str()).map_err(|e| format!("Redis: {e}"))?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("Redis: {e}"))?;
    let mut out = Vec::new();
    for &size in sizes {
        let store = idemkey::store::RedisStore::builder(server.url.clone())
            .prefix(format!("bpr{size}:"))
            .connect()
            .await
            .map_err(|e| format!("Redis: {e}"))?;
        let app = app(Arc::new(store), size);
        post_charge(&app, u64::MAX).await?; // the scripts loaded, the connection open
        let before = used_memory(&mut con).await?;
        fill(&app, records).await?;
        out.push(used_memory(&mut con).await?.saturating_sub(before));
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut con)
            .await
            .map_err(|e| format!("FLUSHALL: {e}"))?;
    }
    Ok(out)
}

// ---- DynamoDB: item sizes by DynamoDB's rules ----------------------------------------

use idemkey::store::aws_sdk_dynamodb::types::AttributeValue;

/// The size of a number by DynamoDB's rule: one byte per two significant digits (leading
/// and trailing zeroes trimmed), plus one.
fn number_size(n: &str) -> u64 {
    let digits: String = n.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    (significant.len() as u64).div_ceil(2) + 1
}

/// The size of an attribute value by DynamoDB's rules.
fn value_size(v: &AttributeValue) -> u64 {
    match v {
        AttributeValue::S(s) => s.len() as u64,
        AttributeValue::N(n) => number_size(n),
        AttributeValue::B(b) => b.as_ref().len() as u64,
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(v) => v.iter().map(|s| s.len() as u64).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len() as u64).sum(),
        // Lists and maps: 3 bytes, plus one per element, plus the elements.
        AttributeValue::L(v) => 3 + v.iter().map(|e| 1 + value_size(e)).sum::<u64>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, e)| 1 + k.len() as u64 + value_size(e))
                .sum::<u64>()
        }
        _ => 0,
    }
}

async fn measure_dynamodb(
    endpoint: &str,
    sizes: &[usize],
    records: u64,
) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for &size in sizes {
        let table = format!("idemkey_bpr_{}_{size}", std::process::id());
        let url = format!("dynamodb://bpr:bpr@{table}?region=us-east-1&endpoint={endpoint}");
        let store =
            idemkey::store::DynamoStore::from_url(&url).map_err(|e| format!("DynamoDB: {e}"))?;
        store
            .create_table()
            .await
            .map_err(|e| format!("DynamoDB create_table: {e}"))?;
        let client = store.client().clone();
        fill(&app(Arc::new(store), size), records).await?;
        let mut total = 0u64;
        let mut items = 0u64;
        let mut start = None;
        loop {
            let page = client
                .scan()
                .table_name(&table)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| format!("DynamoDB scan: {e:?}"))?;
            for item in page.items() {
                items += 1;
                total += item
                    .iter()
                    .map(|(name, v)| name.len() as u64 + value_size(v))
                    .sum::<u64>();
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        if items != records {
            return Err(format!("DynamoDB: {items} items for {records} records"));
        }
        let _ = client.delete_table().table_name(&table).send().await;
        out.push(total);
    }
    Ok(out)
}

// ---- the table -----------------------------------------------------------------------

/// Least squares: (intercept, slope) of `ys` over `xs`.
fn fit(xs: &[f64], ys: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - slope * mx, slope)
}

async fn run(args: Args) -> Result<(), String> {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let postgres = env(
        "IDEMKEY_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let mysql = env("IDEMKEY_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let mut rows: Vec<(String, u64, Vec<u64>, &str)> = Vec::new();
    for store in &args.stores {
        eprintln!("measuring {store}...");
        let (n, totals, method) = match store.as_str() {
            "memory" => {
                let n = args.memory_records;
                let totals = args
                    .sizes
                    .iter()
                    .map(|&s| measure_memory(s, n))
                    .collect::<Result<_, _>>()?;
                (n, totals, "resident set growth")
            }
            "sqlite" => {
                let mut totals = Vec::new();
                for &s in &args.sizes {
                    totals.push(measure_sqlite(s, args.records).await?);
                }
                (args.records, totals, "page_count * page_size")
            }
            "postgres" => (
                args.records,
                measure_postgres(&postgres, &args.sizes, args.records).await?,
                "pg_total_relation_size",
            ),
            "mysql" => (
                args.records,
                measure_mysql(&mysql, &args.sizes, args.records).await?,
                "DATA_LENGTH+INDEX_LENGTH",
            ),
            "redis" => (
                args.records,
                measure_redis(&args.sizes, args.records).await?,
                "used_memory",
            ),
            "dynamodb" => match &args.dynamodb_endpoint {
                Some(endpoint) => (
                    args.dynamodb_records,
                    measure_dynamodb(endpoint, &args.sizes, args.dynamodb_records).await?,
                    "item size (AWS rules)",
                ),
                None => {
                    eprintln!("dynamodb left out: give --dynamodb-endpoint URL (moto)");
                    continue;
                }
            },
            _ => continue,
        };
        rows.push((store.clone(), n, totals, method));
    }
    let xs: Vec<f64> = args.sizes.iter().map(|&s| s as f64).collect();
    let mut header = String::from("| store | records |");
    for s in &args.sizes {
        header.push_str(&format!(" {s} B body |"));
    }
    header.push_str(" fixed B/record | B per response byte | figure read |");
    #[allow(clippy::print_stdout, reason = "the table is the program's answer")]
    {
        println!("{header}");
        println!("|{}", "---|".repeat(args.sizes.len() + 5));
        for (store, n, totals, method) in rows {
            let per: Vec<f64> = totals.iter().map(|&t| t as f64 / n as f64).collect();
            let (fixed, slope) = fit(&xs, &per);
            let cells: String = per.iter().map(|p| format!(" {p:.0} |")).collect();
            println!("| {store} | {n} |{cells} {fixed:.0} | {slope:.2} | {method} |");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1).peekable();
    let child = argv.peek().is_some_and(|a| a == "--memory-child");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = if child {
        let rest: Vec<String> = argv.skip(1).collect();
        match (
            rest.first().and_then(|s| s.parse().ok()),
            rest.get(1).and_then(|s| s.parse().ok()),
        ) {
            (Some(size), Some(n)) => rt.block_on(memory_child(size, n)),
            _ => Err("--memory-child SIZE RECORDS".into()),
        }
    } else {
        match parse_args(argv) {
            Ok(args) => rt.block_on(run(args)),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
