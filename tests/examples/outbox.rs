//! A small payment app that survives a crash: every charge goes through a durable
//! outbox, so that a run killed in the middle is finished, exactly once, by the next.
//!
//! ```sh
//! cargo run --example charge_server -- --addr 127.0.0.1:3000 &
//! cargo run -p idemkey-integration --example outbox -- --url http://127.0.0.1:3000 --db shop.db --count 20 --crash-after 7
//! cargo run -p idemkey-integration --example outbox -- --url http://127.0.0.1:3000 --db shop.db --count 20
//! curl -s localhost:3000/stats    # {"executions":20,...}: the crash cost no second charge
//! ```
//!
//! Each run first resumes whatever is pending in the journal at `--db` (SQLite; or a
//! `postgres://` URL, with `--table` naming the journal's table), then, for the
//! operations `charge:1` .. `charge:N` not recorded yet, writes the order row and its
//! charge operation in **one transaction** (the transactional outbox), and delivers it
//! with the header `Authorization: Bearer sk_test_outbox_example` (never written to the
//! journal; re-applied on resume). With `--crash-after K` it kills itself (SIGKILL, no
//! clean-up) right after the K-th request of the run was answered and before its
//! outcome is recorded. It ends with one line:
//! `operations=N done=D pending=P expired=E`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::{HeaderValue, header};
use idemkey::client::IdempotentClientBuilder;
use idemkey::client::outbox::{
    Operation, Outbox, OutboxError, PostgresJournal, Resumed, SqliteJournal,
};
use reqwest_middleware::ClientWithMiddleware;
use retry_policies::policies::ExponentialBackoff;

const USAGE: &str = "usage: outbox --url URL --db PATH --count N [--crash-after K]
  --db      the SQLite file of orders and journal, or a postgres:// URL
  --table   the journal's table (default idemkey_outbox); orders go to <table>_orders";

const BEARER: &str = "Bearer sk_test_outbox_example";

struct Args {
    url: String,
    db: String,
    table: String,
    count: u32,
    crash_after: Option<u32>,
}

fn parse_args() -> Result<Args, String> {
    let (mut url, mut db, mut count, mut crash_after) = (None, None, None, None);
    let mut table = "idemkey_outbox".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value; {USAGE}"));
        let number = |v: String| {
            v.parse::<u32>()
                .map_err(|e| format!("{arg} {v}: {e}; give a whole number"))
        };
        match arg.as_str() {
            "--url" => url = Some(value()?),
            "--db" => db = Some(value()?),
            "--table" => table = value()?,
            "--count" => count = Some(number(value()?)?),
            "--crash-after" => crash_after = Some(number(value()?)?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    Ok(Args {
        url: url.ok_or(format!("--url is required; {USAGE}"))?,
        db: db.ok_or(format!("--db is required; {USAGE}"))?,
        count: count.ok_or(format!("--count is required; {USAGE}"))?,
        table,
        crash_after,
    })
}

/// The application's database: its orders table and the outbox journal, in one place,
/// so that one transaction covers both.
enum Db {
    Sqlite(sqlx::SqlitePool, SqliteJournal),
    Postgres(sqlx::PgPool, PostgresJournal),
}

impl Db {
    async fn open(db: &str, table: &str) -> Result<(Self, Outbox), String> {
        let orders = format!("{table}_orders");
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {orders} (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)"
        );
        if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            let journal = PostgresJournal::builder(db).table(table).connect().await;
            let journal = journal.map_err(|e| e.to_string())?;
            let pool = sqlx::PgPool::connect(db).await.map_err(|e| e.to_string())?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(create))
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
            Ok((Db::Postgres(pool, journal.clone()), outbox(journal)))
        } else {
            let journal = SqliteJournal::builder(db).table(table).open().await;
            let journal = journal.map_err(|e| e.to_string())?;
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(db)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sqlx::sqlite::SqliteSynchronous::Full);
            let pool = sqlx::SqlitePool::connect_with(options)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(create))
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
            Ok((Db::Sqlite(pool, journal.clone()), outbox(journal)))
        }
    }

    /// Writes the order row and its charge operation in one transaction.
    async fn order(&self, orders: &str, amount: i64, op: &Operation) -> Result<(), String> {
        let insert = format!("INSERT INTO {orders} (id, amount) VALUES ($1, $2)");
        let err = |e: &dyn std::fmt::Display| format!("writing order {}: {e}", op.id);
        match self {
            Db::Sqlite(pool, journal) => {
                let mut tx = pool.begin().await.map_err(|e| err(&e))?;
                sqlx::query(sqlx::AssertSqlSafe(insert))
                    .bind(&op.id)
                    .bind(amount)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| err(&e))?;
                journal.enqueue_in(&mut tx, op).await.map_err(|e| err(&e))?;
                tx.commit().await.map_err(|e| err(&e))
            }
            Db::Postgres(pool, journal) => {
                let mut tx = pool.begin().await.map_err(|e| err(&e))?;
                sqlx::query(sqlx::AssertSqlSafe(insert))
                    .bind(&op.id)
                    .bind(amount)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| err(&e))?;
                journal.enqueue_in(&mut tx, op).await.map_err(|e| err(&e))?;
                tx.commit().await.map_err(|e| err(&e))
            }
        }
    }
}

/// Sends so far in this run, for `--crash-after`.
static SENT: AtomicU32 = AtomicU32::new(0);
/// `--crash-after`, 0 for none.
static CRASH_AFTER: AtomicU32 = AtomicU32::new(0);

fn outbox(journal: impl idemkey::client::outbox::Journal) -> Outbox {
    Outbox::builder(journal)
        // The journal never holds the API key: put it back on every resend.
        .credentials(|_op, headers| {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_static(BEARER));
        })
        .before_record(|_op| {
            let sent = SENT.fetch_add(1, Ordering::SeqCst) + 1;
            if sent == CRASH_AFTER.load(Ordering::SeqCst) {
                // The worst moment: the server executed the charge, and nobody wrote
                // down the answer. No clean-up, no flush: SIGKILL.
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
            }
        })
        .build()
}

fn client() -> ClientWithMiddleware {
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(20), Duration::from_secs(1))
        .build_with_max_retries(5);
    IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(policy)
        .without_retry_budget()
        .build()
}

async fn run(args: Args) -> Result<(), String> {
    CRASH_AFTER.store(args.crash_after.unwrap_or(0), Ordering::SeqCst);
    let (db, outbox) = Db::open(&args.db, &args.table).await?;
    let client = client();
    let orders = format!("{}_orders", args.table);

    // 1. Whatever the last run left pending: same key, same body, credentials re-applied.
    let report = outbox.resume(&client).await.map_err(|e| e.to_string())?;
    for (id, resumed) in &report.operations {
        match resumed {
            Resumed::Done(o) => eprintln!("resumed {id}: {} (replayed: {})", o.status, o.replayed),
            Resumed::Expired => eprintln!("resumed {id}: expired, not sent: decide by hand"),
            Resumed::Pending(e) => eprintln!("resumed {id}: still pending ({e})"),
        }
    }

    // 2. The charges not recorded yet: order and operation in one transaction, then send.
    for i in 1..=args.count {
        let id = format!("charge:{i}");
        if outbox
            .operation(&id)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            continue;
        }
        let amount = 100 + i64::from(i);
        let charge = client
            .post(format!("{}/v1/charges", args.url.trim_end_matches('/')))
            .header(header::AUTHORIZATION, BEARER)
            .json(&serde_json::json!({"amount": amount, "order": id}))
            .build()
            .map_err(|e| format!("building {id}: {e}"))?;
        let op = outbox.prepare(&id, charge).map_err(|e| e.to_string())?;
        db.order(&orders, amount, &op).await?;
        match outbox.deliver(&client, &id).await {
            Ok(outcome) => eprintln!("{id}: {} (replayed: {})", outcome.status, outcome.replayed),
            Err(e) if e.is_outcome_unknown() => eprintln!("{id}: pending ({e})"),
            Err(e) => return Err(e.to_string()),
        }
    }

    // 3. Every recorded outcome durable before the tally and the exit (sends do not
    //    wait for their outcome's commit; a crash before it would only mean a replay).
    outbox.flush().await.map_err(|e| e.to_string())?;

    // 4. The tally.
    let (mut done, mut pending, mut expired) = (0, 0, 0);
    for i in 1..=args.count {
        match outbox.operation(&format!("charge:{i}")).await {
            Ok(Some(op)) if !op.is_pending() => done += 1,
            Ok(Some(op)) if outbox.is_expired(&op) => expired += 1,
            Ok(_) => pending += 1,
            Err(e) => return Err(OutboxError::to_string(&e)),
        }
    }
    #[allow(clippy::print_stdout, reason = "the one line of output drivers read")]
    {
        println!(
            "operations={} done={done} pending={pending} expired={expired}",
            args.count
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
