//! The charge consumer the broker examples share (`rabbitmq_consumer`, `nats_consumer`):
//! each message charges account 1 its `amount`, in one of three modes, and the broker
//! example acks or requeues by the verdict. Included by path
//! (`#[path = "common/charges.rs"] mod charges;`).
//!
//! The effect is one PostgreSQL statement: a row in the ledger table
//! (`<accounts>_ledger`: message id, amount) and the balance, together, so a test can
//! tell from the ledger how often each message's effect ran.
//!
//! - `bare`: the effect, with no idempotency (the benchmark's baseline; a redelivery
//!   charges again).
//! - `once`: the effect inside [`Engine::once`] over a [`PostgresStore`]: a duplicate or
//!   a redelivery after the result was recorded is a replay. The effect and the record
//!   are two commits: a crash between them repeats the effect once the lease expired.
//! - `inbox`: the effect inside [`PostgresStore::once_in`], in the transaction that
//!   claims the message and records its result: all or nothing, so exactly once.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use idemkey::IdempotencyKey;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::{Engine, OnceError};
use idemkey::store::PostgresStore;
use sqlx::{Connection, PgConnection, PgPool};

/// The next delivery of `deliveries`, waiting at most `idle` for it (forever when
/// `None`); `None` when none came that long (the consumer's idle exit).
pub(crate) async fn next_unless_idle<S: Stream + Unpin>(
    deliveries: &mut S,
    idle: Option<Duration>,
) -> Option<Option<S::Item>> {
    match idle {
        Some(idle) => tokio::time::timeout(idle, deliveries.next()).await.ok(),
        None => Some(deliveries.next().await),
    }
}

/// How a message is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Bare,
    Once,
    Inbox,
}

impl Mode {
    pub(crate) const ALL: [Mode; 3] = [Mode::Bare, Mode::Once, Mode::Inbox];

    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match s {
            "bare" => Ok(Self::Bare),
            "once" => Ok(Self::Once),
            "inbox" => Ok(Self::Inbox),
            other => Err(format!("unknown mode {other:?}: use bare, once or inbox")),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::Once => "once",
            Self::Inbox => "inbox",
        }
    }
}

/// What to tell the broker about a message.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Done (applied, replayed, or refused for good): acknowledge.
    Ack,
    /// Not applied now (in progress elsewhere, the database is down): requeue it after
    /// this delay.
    Retry(Duration),
}

/// The options the consumers share.
pub(crate) struct Options {
    pub(crate) mode: Mode,
    pub(crate) postgres: String,
    pub(crate) table: String,
    pub(crate) accounts: String,
    /// Exit (0) after this long without a message; run forever when `None`.
    pub(crate) idle_exit: Option<Duration>,
    /// Benchmark: publish this many messages per mode and report messages per second.
    pub(crate) bench: Option<usize>,
}

/// Adds the shared options to a broker example's command line.
pub(crate) fn command(name: &'static str, broker_default: &'static str) -> clap::Command {
    let arg = |n: &'static str, help: &'static str| clap::Arg::new(n).long(n).help(help);
    clap::Command::new(name)
        .arg(arg("broker", "broker URL").default_value(broker_default))
        .arg(arg("queue", "queue (RabbitMQ) or stream (NATS) to consume").default_value("charges"))
        .arg(arg("mode", "bare, once or inbox").default_value("inbox"))
        .arg(
            arg("postgres", "PostgreSQL URL")
                .default_value("postgres://postgres@127.0.0.1:5432/test"),
        )
        .arg(arg("table", "idempotency records table").default_value("idemkey_records"))
        .arg(arg("accounts", "accounts table (created if missing)").default_value("accounts"))
        .arg(arg(
            "idle-exit-ms",
            "exit after this long without a message",
        ))
        .arg(arg(
            "bench",
            "publish N messages per mode to fresh queues and report rates",
        ))
}

pub(crate) fn options(m: &clap::ArgMatches) -> Result<Options, String> {
    let s = |n: &str| m.get_one::<String>(n).cloned().unwrap_or_default();
    let num = |n: &str| -> Result<Option<u64>, String> {
        m.get_one::<String>(n)
            .map(|v| v.parse().map_err(|e| format!("--{n} {v:?}: {e}")))
            .transpose()
    };
    Ok(Options {
        mode: Mode::parse(&s("mode"))?,
        postgres: s("postgres"),
        table: s("table"),
        accounts: s("accounts"),
        idle_exit: num("idle-exit-ms")?.map(Duration::from_millis),
        bench: num("bench")?.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    })
}

/// A charge message's payload: `{"id": "...", "amount": N}`.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Charge {
    pub(crate) id: String,
    pub(crate) amount: i64,
}

/// Applies charges to account 1 in one mode.
pub(crate) struct Charges {
    mode: Mode,
    pool: PgPool,
    store: PostgresStore,
    engine: Engine,
    effect: String,
    tables: [String; 3],
}

impl Charges {
    /// Connects, and creates the records, accounts and ledger tables if missing.
    pub(crate) async fn connect(
        mode: Mode,
        url: &str,
        table: &str,
        accounts: &str,
    ) -> Result<Self, String> {
        let unreachable = |e: &dyn std::fmt::Display| format!("PostgreSQL at {url}: {e}");
        let store = PostgresStore::builder(url)
            .table(table)
            .connect()
            .await
            .map_err(|e| unreachable(&e))?;
        store.migrate().await.map_err(|e| unreachable(&e))?;
        let pool = PgPool::connect(url).await.map_err(|e| unreachable(&e))?;
        let ident = idemkey_ident(accounts)?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS \"{ident}\" (id int PRIMARY KEY, balance bigint NOT NULL);
             INSERT INTO \"{ident}\" VALUES (1, 0) ON CONFLICT DO NOTHING;
             CREATE TABLE IF NOT EXISTS \"{ident}_ledger\" (msg text NOT NULL, amount bigint NOT NULL)"
        )))
        .execute(&pool)
        .await
        .map_err(|e| unreachable(&e))?;
        // A short lease: a consumer killed inside `once` holds its messages this long.
        let engine = Engine::builder(store.clone())
            .lease(Duration::from_secs(2))
            .build();
        Ok(Self {
            mode,
            pool,
            store,
            engine,
            effect: format!(
                "WITH l AS (INSERT INTO \"{ident}_ledger\" (msg, amount) VALUES ($1, $2))
                 UPDATE \"{ident}\" SET balance = balance + $2 WHERE id = 1 RETURNING balance"
            ),
            tables: [
                table.to_owned(),
                ident.to_owned(),
                format!("{ident}_ledger"),
            ],
        })
    }

    /// Drops the records, accounts and ledger tables (the benchmark's, after its run).
    pub(crate) async fn drop_tables(&self) -> Result<(), String> {
        for t in &self.tables {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{t}\"")))
                .execute(&self.pool)
                .await
                .map_err(|e| format!("dropping {t}: {e}"))?;
        }
        Ok(())
    }

    /// The effect: the ledger row and the balance, in one statement.
    async fn charge(&self, conn: &mut PgConnection, c: &Charge) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(self.effect.as_str()))
            .bind(&c.id)
            .bind(c.amount)
            .fetch_one(conn)
            .await
    }

    /// Applies the message whose broker id is `key` (`None`: the payload's id).
    pub(crate) async fn apply(&self, key: Option<&str>, payload: &[u8]) -> Verdict {
        let Ok(charge) = serde_json::from_slice::<Charge>(payload) else {
            eprintln!("dropping a message that is not a charge");
            return Verdict::Ack;
        };
        let Ok(key) = IdempotencyKey::new(key.unwrap_or(&charge.id)) else {
            eprintln!("dropping a message whose id is not a valid key");
            return Verdict::Ack;
        };
        let fp = Fingerprint::of_bytes(payload);
        let outcome = match self.mode {
            Mode::Bare => match self.pool.acquire().await {
                Ok(mut conn) => self.charge(&mut conn, &charge).await.map(drop),
                Err(e) => Err(e),
            }
            .map_err(|e| format!("{e}")),
            Mode::Once => {
                let done = self
                    .engine
                    .once("charges", &key, &fp, || async {
                        let mut conn = self.pool.acquire().await?;
                        self.charge(&mut conn, &charge).await
                    })
                    .await;
                return verdict(done.map(drop));
            }
            Mode::Inbox => {
                let mut conn = match self.pool.acquire().await {
                    Ok(c) => c,
                    Err(e) => return retry(&e),
                };
                let mut tx = match conn.begin().await {
                    Ok(tx) => tx,
                    Err(e) => return retry(&e),
                };
                let done = self
                    .store
                    .once_in(&mut tx, "charges", &key, &fp, async |c| {
                        self.charge(c, &charge).await
                    })
                    .await;
                if let Err(e) = done {
                    return verdict::<()>(Err(e));
                }
                // Commit first, then ack: a crash in between redelivers a message
                // whose charge is committed, and the redelivery replays it.
                tx.commit().await.map_err(|e| format!("{e}"))
            }
        };
        match outcome {
            Ok(()) => Verdict::Ack,
            Err(e) => retry(&e),
        }
    }
}

fn retry(e: &dyn std::fmt::Display) -> Verdict {
    eprintln!("requeueing a message: {e}");
    Verdict::Retry(Duration::from_millis(200))
}

fn verdict<T>(done: Result<T, OnceError<sqlx::Error>>) -> Verdict {
    match done {
        Ok(_) => Verdict::Ack,
        // Another consumer holds it (or a crashed one, until its lease ends).
        Err(e) if e.is_in_progress() => Verdict::Retry(
            e.retry_after()
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_millis(250)),
        ),
        Err(e) if e.is_key_reused() => {
            eprintln!("dropping a message whose id was used by another message: {e}");
            Verdict::Ack
        }
        Err(e) => retry(&e),
    }
}

/// An identifier for the example's own tables: letters, digits and `_`.
fn idemkey_ident(name: &str) -> Result<&str, String> {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Ok(name)
    } else {
        Err(format!(
            "invalid table name {name:?}: use letters, digits and '_'"
        ))
    }
}

/// The benchmark's charges: `n` distinct messages.
pub(crate) fn bench_charges(n: usize) -> Vec<Charge> {
    (0..n)
        .map(|i| Charge {
            id: format!("bench-{i}"),
            amount: 1,
        })
        .collect()
}

/// One mode's throughput in the benchmark.
pub(crate) struct Rate {
    pub(crate) mode: Mode,
    pub(crate) per_second: f64,
}

impl Rate {
    pub(crate) fn new(mode: Mode, n: usize, elapsed: Duration) -> Self {
        #[allow(clippy::cast_precision_loss)]
        let per_second = n as f64 / elapsed.as_secs_f64().max(1e-9);
        Self { mode, per_second }
    }
}

/// How many times the benchmark runs each mode (interleaved: bare, once, inbox, bare,
/// ...), so that a burst of load on the machine does not land on one mode alone.
pub(crate) const BENCH_ROUNDS: usize = 3;

/// Prints each mode's median rate and its ratio to the bare consumer's.
pub(crate) fn report(broker: &str, n: usize, rates: &[Rate]) {
    let median = |mode: Mode| {
        let mut r: Vec<f64> = rates
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| r.per_second)
            .collect();
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let bare = median(Mode::Bare);
    eprintln!(
        "{broker}: {n} messages per mode and round, {BENCH_ROUNDS} rounds, one consumer (medians)"
    );
    for mode in Mode::ALL {
        let m = median(mode);
        eprintln!(
            "  {:<6} {:>8.0} msg/s  {:.2} x bare",
            mode.name(),
            m,
            m / bare
        );
    }
}
