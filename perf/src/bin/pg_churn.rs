//! What days of churn do to the PostgreSQL store's table: HOT updates, table and index
//! sizes, and storage per live record before and after many sweeps, for the store's
//! layout and the layout before it, in one run.
//!
//! ```sh
//! cargo run --release -p perf --bin pg_churn -- \
//!     [--batch 10000] [--generations 4] [--rounds 12] [--period 20s] [--payload 400] [--workers 16] \
//!     [--fillfactor N]
//! ```
//!
//! In a database of its own (`IDEMKEY_POSTGRES_URL`'s server, dropped at the end), two
//! tables live side by side: one made by `PostgresStore::migrate` and driven through
//! `PostgresStore`, and one of the layout before `sweep_at` (an index on `expires_at`
//! and one on in-progress rows), driven by that version's statements. Every `--period`
//! each table gets a generation of `--batch` fresh records, each claimed, renewed once
//! and completed with a `--payload`-byte response, and a retention that ends it a
//! quarter period before the start of the period `--generations` later: the table
//! holds `--generations` generations, and each period's sweep removes the oldest. The first `--generations` periods fill the tables;
//! then `--rounds` periods churn them (each replaces `1/--generations` of the records).
//!
//! `--fillfactor` sets the store's table's fill factor instead of the store's own (95),
//! to compare.
//!
//! Vacuum: the program does what autovacuum would, at the start of every period, with
//! each table's own settings (the store's per-table `autovacuum_*` storage parameters,
//! the server's defaults for the layout before): `VACUUM` when the dead rows exceed
//! `threshold + scale_factor * reltuples` (or the rows inserted since the last vacuum
//! exceed the insert threshold), `ANALYZE` likewise. It does so itself because the
//! shared server may run with `autovacuum = off`, which per-table settings do not
//! override, and so that both layouts are vacuumed by the same rules at the same
//! moments.
//!
//! Printed: for each layout, `n_tup_hot_upd` of `n_tup_upd` over the run, the
//! vacuums it needed, the sweep's time, the table (heap, TOAST, maps) and each index
//! after the fill and after the churn (each after a final `VACUUM`), storage per live
//! record and its ratio after/before, and the time of `list_in_progress(1000)`.

#[path = "../own_database.rs"]
mod own_database;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemkey::store::{Claim, ClaimRequest, FencingToken, PostgresStore, RecordId, Store};
use own_database::with_database;
use sqlx::{AssertSqlSafe, PgPool, Row};

const USAGE: &str = "usage: pg_churn [--batch N] [--generations N] [--rounds N] [--period 20s] [--payload BYTES] [--workers N] [--fillfactor N]";

/// The lease of every claim (each is renewed once, for as long).
const LEASE: Duration = Duration::from_secs(30);

struct Args {
    batch: u64,
    generations: u64,
    rounds: u64,
    period: Duration,
    payload: usize,
    workers: u64,
    fillfactor: Option<u64>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut out = Args {
        batch: 10_000,
        generations: 4,
        rounds: 12,
        period: Duration::from_secs(20),
        payload: 400,
        workers: 16,
        fillfactor: None,
    };
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{arg} needs a value; {USAGE}"))?;
        let positive = || {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{arg} {value}: use a positive integer"))
        };
        match arg.as_str() {
            "--batch" => out.batch = positive()?,
            "--generations" => out.generations = positive()?.max(2),
            "--rounds" => out.rounds = positive()?,
            "--workers" => out.workers = positive()?,
            "--fillfactor" => {
                out.fillfactor = Some(positive()?.clamp(10, 100));
            }
            "--payload" => {
                out.payload = usize::try_from(positive()?)
                    .ok()
                    .filter(|n| *n <= 1 << 20)
                    .ok_or_else(|| format!("--payload {value}: at most 1048576 bytes"))?;
            }
            "--period" => {
                out.period = value
                    .strip_suffix('s')
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|s| *s > 0)
                    .map(Duration::from_secs)
                    .ok_or_else(|| format!("--period {value}: use whole seconds, as 20s"))?;
            }
            _ => return Err(format!("unknown argument {arg}; {USAGE}")),
        }
    }
    Ok(out)
}

// ---- the two layouts -------------------------------------------------------------------

/// The layout before `sweep_at`, with that version's statements (its
/// `PostgresStore::schema_sql` and `Statements`), as the baseline.
struct Before {
    pool: PgPool,
    claim: String,
    renew: String,
    complete: String,
    sweep: String,
    list: String,
}

impl Before {
    fn schema(t: &str) -> String {
        format!(
            "CREATE TABLE {t} (
    id          bytea       PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       bytea,
    payload     bytea,
    taken_over  boolean     NOT NULL DEFAULT false,
    expires_at  timestamptz NOT NULL,
    created     timestamptz NOT NULL DEFAULT now(),
    retention   bigint      NOT NULL DEFAULT 0
);
CREATE INDEX {t}_expires_at ON {t} (expires_at);
CREATE INDEX {t}_in_progress ON {t} (created) WHERE payload IS NULL;"
        )
    }

    fn new(pool: PgPool, t: &str) -> Self {
        let expired = "r.expires_at <= now()";
        let sets = [
            ("taken_over", "r.payload IS NULL"),
            ("fingerprint", "excluded.fingerprint"),
            ("token", "excluded.token"),
            ("payload", "NULL"),
            ("expires_at", "excluded.expires_at"),
            ("created", "excluded.created"),
            ("retention", "excluded.retention"),
        ]
        .map(|(c, new)| format!("{c} = CASE WHEN {expired} THEN {new} ELSE r.{c} END"))
        .join(",\n  ");
        let remaining = "(extract(epoch FROM expires_at - now()) * 1000000)::bigint AS remaining";
        let held = "id = $1 AND token = $2 AND payload IS NULL \
            AND expires_at + retention * interval '1 microsecond' > now()";
        let expired = "expires_at <= now() AND (payload IS NOT NULL
  OR expires_at + retention * interval '1 microsecond' <= now())";
        Self {
            pool,
            claim: format!(
                "WITH live AS (
  SELECT false AS won, taken_over, fingerprint, payload, {remaining}
  FROM {t} WHERE id = $1::bytea AND expires_at > now()
), claimed AS (
  INSERT INTO {t} AS r (id, fingerprint, token, payload, taken_over, expires_at, created,
    retention)
  SELECT $1::bytea, $2::bytea, $3::bytea, NULL, false,
    now() + $4::bigint * interval '1 microsecond', now(), $5::bigint
  WHERE NOT EXISTS (SELECT 1 FROM live)
  ON CONFLICT (id) DO UPDATE SET
    {sets}
  RETURNING coalesce(token = $3::bytea, false) AS won, taken_over, fingerprint, payload,
    {remaining}
)
SELECT * FROM claimed UNION ALL SELECT * FROM live"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = now() + $3 * interval '1 microsecond' WHERE {held}"
            ),
            complete: format!(
                "UPDATE {t} SET payload = $3, token = NULL,
  expires_at = now() + $4 * interval '1 microsecond' WHERE {held}"
            ),
            sweep: format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE {expired}
  ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            list: format!(
                "SELECT id FROM {t} WHERE payload IS NULL
  AND expires_at + retention * interval '1 microsecond' > now()
ORDER BY created LIMIT $1"
            ),
        }
    }

    async fn run(&self, sql: &str, binds: &[&[u8]], micros: &[i64]) -> Result<u64, String> {
        let mut q = sqlx::query(AssertSqlSafe(sql.to_owned()));
        for b in binds {
            q = q.bind(*b);
        }
        for m in micros {
            q = q.bind(*m);
        }
        q.execute(&self.pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| format!("the previous layout's statement failed: {e}"))
    }
}

enum Layout {
    Before(Before),
    Store(PostgresStore),
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl Layout {
    fn name(&self) -> &'static str {
        match self {
            Self::Before(_) => "before sweep_at",
            Self::Store(_) => "PostgresStore",
        }
    }

    /// One record's life up to its completion: claim, one renewal, complete.
    async fn record(
        &self,
        id: &RecordId,
        payload: &[u8],
        retention: Duration,
    ) -> Result<(), String> {
        let token = FencingToken::random();
        let fingerprint = [7_u8; 32];
        match self {
            Self::Before(b) => {
                let (id, token) = (id.as_bytes().as_slice(), token.to_bytes());
                let (lease, keep) = (micros(LEASE), micros(retention));
                let won: bool = sqlx::query_scalar(AssertSqlSafe(b.claim.clone()))
                    .bind(id)
                    .bind(fingerprint.as_slice())
                    .bind(token.as_slice())
                    .bind(lease)
                    .bind(keep)
                    .fetch_one(&b.pool)
                    .await
                    .map_err(|e| format!("claim (previous layout): {e}"))?;
                let renewed = b.run(&b.renew, &[id, &token], &[lease]).await?;
                let completed = b.run(&b.complete, &[id, &token, payload], &[keep]).await?;
                if !won || renewed != 1 || completed != 1 {
                    return Err(format!(
                        "previous layout: claim won {won}, renewed {renewed}, completed {completed}"
                    ));
                }
            }
            Self::Store(store) => {
                let claim = store
                    .claim(ClaimRequest {
                        id,
                        fingerprint: &fingerprint,
                        token,
                        lease: LEASE,
                        retention,
                    })
                    .await
                    .map_err(|e| format!("claim: {e}"))?;
                if claim != (Claim::Acquired { takeover: false }) {
                    return Err(format!("a fresh key was answered {claim:?}"));
                }
                store
                    .renew(id, token, LEASE)
                    .await
                    .map_err(|e| format!("renew: {e}"))?;
                store
                    .complete(id, token, bytes::Bytes::copy_from_slice(payload), retention)
                    .await
                    .map_err(|e| format!("complete: {e}"))?;
            }
        }
        Ok(())
    }

    /// One whole sweep pass; the records removed.
    async fn sweep(&self) -> Result<u64, String> {
        match self {
            Self::Before(b) => {
                let mut removed = 0;
                loop {
                    let n = b.run(&b.sweep, &[], &[1000]).await?;
                    removed += n;
                    if n < 1000 {
                        return Ok(removed);
                    }
                }
            }
            Self::Store(store) => store.sweep().await.map_err(|e| format!("sweep: {e}")),
        }
    }

    /// `list_in_progress(1000)`, as an operator's `idemkey stuck` runs it.
    async fn list(&self) -> Result<usize, String> {
        match self {
            Self::Before(b) => sqlx::query(AssertSqlSafe(b.list.clone()))
                .bind(1000_i64)
                .fetch_all(&b.pool)
                .await
                .map(|rows| rows.len())
                .map_err(|e| format!("list (previous layout): {e}")),
            Self::Store(store) => store
                .list_in_progress(1000)
                .await
                .map(|rows| rows.len())
                .map_err(|e| format!("list_in_progress: {e}")),
        }
    }
}

// ---- the tables' figures ---------------------------------------------------------------

#[derive(Debug, Clone, Default)]
struct Sizes {
    /// Heap, TOAST and the maps (`pg_table_size`).
    table: i64,
    indexes: Vec<(String, i64)>,
    live: i64,
}

impl Sizes {
    fn total(&self) -> i64 {
        self.table + self.indexes.iter().map(|(_, n)| n).sum::<i64>()
    }

    fn per_record(&self) -> f64 {
        self.total() as f64 / self.live.max(1) as f64
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    updates: i64,
    hot: i64,
    dead: i64,
    inserted_since_vacuum: i64,
    modified_since_analyze: i64,
}

/// What autovacuum decides by, for one table: its storage parameters over the server's.
struct AutovacuumRules {
    threshold: f64,
    scale: f64,
    insert_threshold: f64,
    insert_scale: f64,
    analyze_threshold: f64,
    analyze_scale: f64,
}

struct Table {
    name: String,
    rules: AutovacuumRules,
    vacuums: u32,
    swept: u64,
    sweeping: Duration,
}

async fn sizes(pool: &PgPool, table: &str) -> Result<Sizes, String> {
    let err = |e: sqlx::Error| format!("sizes of {table}: {e}");
    let vacuum = format!("VACUUM ANALYZE {table}");
    sqlx::query(AssertSqlSafe(vacuum))
        .execute(pool)
        .await
        .map_err(err)?;
    let table_size: i64 = sqlx::query_scalar("SELECT pg_table_size($1::regclass)")
        .bind(table)
        .fetch_one(pool)
        .await
        .map_err(err)?;
    let indexes = sqlx::query(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index
         WHERE indrelid = $1::regclass ORDER BY 1",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .map_err(err)?
    .iter()
    .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1)))
    .collect();
    let count = format!("SELECT count(*) FROM {table}");
    let live: i64 = sqlx::query_scalar(AssertSqlSafe(count))
        .fetch_one(pool)
        .await
        .map_err(err)?;
    Ok(Sizes {
        table: table_size,
        indexes,
        live,
    })
}

async fn counters(pool: &PgPool, table: &str) -> Result<Counters, String> {
    let row = sqlx::query(
        "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_ins_since_vacuum, n_mod_since_analyze
         FROM pg_stat_user_tables WHERE relid = $1::regclass",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .map_err(|e| format!("pg_stat_user_tables of {table}: {e}"))?;
    Ok(Counters {
        updates: row.get(0),
        hot: row.get(1),
        dead: row.get(2),
        inserted_since_vacuum: row.get(3),
        modified_since_analyze: row.get(4),
    })
}

async fn rules(pool: &PgPool, table: &str) -> Result<AutovacuumRules, String> {
    let setting = |name: &'static str| async move {
        let v: String = sqlx::query_scalar(
            "SELECT coalesce(
               (SELECT split_part(o, '=', 2) FROM pg_class, unnest(reloptions) o
                WHERE oid = $1::regclass AND split_part(o, '=', 1) = $2),
               current_setting($2))",
        )
        .bind(table)
        .bind(name)
        .fetch_one(pool)
        .await
        .map_err(|e| format!("{name} of {table}: {e}"))?;
        v.parse::<f64>()
            .map_err(|e| format!("{name} of {table} is {v:?}: {e}"))
    };
    Ok(AutovacuumRules {
        threshold: setting("autovacuum_vacuum_threshold").await?,
        scale: setting("autovacuum_vacuum_scale_factor").await?,
        insert_threshold: setting("autovacuum_vacuum_insert_threshold").await?,
        insert_scale: setting("autovacuum_vacuum_insert_scale_factor").await?,
        analyze_threshold: setting("autovacuum_analyze_threshold").await?,
        analyze_scale: setting("autovacuum_analyze_scale_factor").await?,
    })
}

/// What autovacuum would do to `table` now: `VACUUM`, `ANALYZE`, both or nothing.
async fn autovacuum(pool: &PgPool, table: &mut Table) -> Result<(), String> {
    let c = counters(pool, &table.name).await?;
    let reltuples: f64 = sqlx::query_scalar(
        "SELECT greatest(reltuples, 0)::float8 FROM pg_class WHERE oid = $1::regclass",
    )
    .bind(&table.name)
    .fetch_one(pool)
    .await
    .map_err(|e| format!("reltuples of {}: {e}", table.name))?;
    let r = &table.rules;
    let vacuum = c.dead as f64 > r.threshold + r.scale * reltuples
        || c.inserted_since_vacuum as f64 > r.insert_threshold + r.insert_scale * reltuples;
    let analyze =
        c.modified_since_analyze as f64 > r.analyze_threshold + r.analyze_scale * reltuples;
    let what = match (vacuum, analyze) {
        (true, true) => "VACUUM ANALYZE",
        (true, false) => "VACUUM",
        (false, true) => "ANALYZE",
        (false, false) => return Ok(()),
    };
    if vacuum {
        table.vacuums += 1;
    }
    sqlx::query(AssertSqlSafe(format!("{what} {}", table.name)))
        .execute(pool)
        .await
        .map_err(|e| format!("{what} {}: {e}", table.name))?;
    Ok(())
}

// ---- the run -----------------------------------------------------------------------------

/// A payload of `size` pseudo-random letters: what a stored response costs, uncompressed.
fn payload(size: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b'a' + (state % 26) as u8
        })
        .collect()
}

/// Generation `generation` of `args.batch` records, `args.workers` at a time, each
/// claimed and completed with the retention that ends it at `ends` (as the engine does,
/// one retention for the claim and the completion).
async fn generation(
    layout: &Arc<Layout>,
    generation: u64,
    args: &Args,
    payload: &Arc<Vec<u8>>,
    ends: Instant,
) -> Result<(), String> {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..args.workers {
        let (layout, payload) = (Arc::clone(layout), Arc::clone(payload));
        let (batch, workers) = (args.batch, args.workers);
        tasks.spawn(async move {
            let mut n = worker;
            while n < batch {
                let id = RecordId::new("churn", &format!("{generation}:{n}"));
                let retention = ends.saturating_duration_since(Instant::now());
                if retention.is_zero() {
                    return Err(format!(
                        "generation {generation} was still being written when it was due to \
                         end: raise --period or lower --batch"
                    ));
                }
                layout.record(&id, &payload, retention).await?;
                n += workers;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("a writer failed: {e}"))??;
    }
    Ok(())
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep(at.saturating_duration_since(Instant::now())).await;
}

async fn churn(args: &Args, url: &str, pool: &PgPool) -> Result<(), String> {
    let previous = "churn_before";
    sqlx::raw_sql(AssertSqlSafe(Before::schema(previous)))
        .execute(pool)
        .await
        .map_err(|e| format!("the previous layout's table: {e}"))?;
    let store = PostgresStore::builder(url)
        .table("churn_store")
        .max_connections(u32::try_from(args.workers).unwrap_or(16) + 2)
        .connect()
        .await
        .map_err(|e| format!("PostgreSQL: {e}"))?;
    store.migrate().await.map_err(|e| format!("migrate: {e}"))?;
    if let Some(ff) = args.fillfactor {
        sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE churn_store SET (fillfactor = {ff})"
        )))
        .execute(pool)
        .await
        .map_err(|e| format!("fillfactor: {e}"))?;
    }
    let before_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(args.workers).unwrap_or(16) + 2)
        .connect(url)
        .await
        .map_err(|e| format!("PostgreSQL: {e}"))?;
    let (mut tables, mut layouts) = (Vec::new(), Vec::new());
    for (name, layout) in [
        (previous, Layout::Before(Before::new(before_pool, previous))),
        ("\"churn_store\"", Layout::Store(store)),
    ] {
        tables.push(Table {
            name: name.to_owned(),
            rules: rules(pool, name).await?,
            vacuums: 0,
            swept: 0,
            sweeping: Duration::ZERO,
        });
        layouts.push(Arc::new(layout));
    }

    let payload = Arc::new(payload(args.payload));
    // Generation g ends a quarter period before the start of period g + generations:
    // the sweep at the start of period r removes generations up to r - generations and
    // keeps the generations after, however long each period's work takes.
    let start = Instant::now();
    let period_start = |round: u64| start + args.period * u32::try_from(round).unwrap_or(u32::MAX);
    let total = args.generations + args.rounds;
    let mut before = Vec::new();
    for round in 0..total {
        sleep_until(period_start(round)).await;
        let began = Instant::now();
        for (table, layout) in tables.iter_mut().zip(&layouts) {
            let t = Instant::now();
            table.swept += layout.sweep().await?;
            table.sweeping += t.elapsed();
            autovacuum(pool, table).await?;
        }
        let ends = period_start(round + args.generations) - args.period / 4;
        for layout in &layouts {
            generation(layout, round, args, &payload, ends).await?;
        }
        let took = began.elapsed();
        eprintln!(
            "period {}/{total}: sweeps, vacuums and {} records per layout in {:.1} s",
            round + 1,
            args.batch,
            took.as_secs_f64()
        );
        if round + 1 == args.generations {
            for table in &tables {
                before.push(sizes(pool, &table.name).await?);
            }
        }
    }
    let mut after = Vec::new();
    for table in &tables {
        after.push(sizes(pool, &table.name).await?);
    }
    let mut listing = Vec::new();
    for layout in &layouts {
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            layout.list().await?;
            times.push(t.elapsed());
        }
        times.sort();
        listing.push(times[2]);
    }
    let names: Vec<&str> = layouts.iter().map(|l| l.name()).collect();
    drop(layouts);
    // Sessions report their counters when they end, or after 10 s idle.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let mut updated = Vec::new();
    for table in &tables {
        let c = counters(pool, &table.name).await?;
        updated.push((c.updates, c.hot));
    }

    #[allow(clippy::print_stdout, reason = "the table is the program's answer")]
    {
        println!(
            "{} periods of {} s: {} to fill ({} records live), {} of churn; {} B responses, \
             {} workers; VACUUM/ANALYZE as autovacuum would decide at each period's start",
            total,
            args.period.as_secs(),
            args.generations,
            args.generations * args.batch,
            args.rounds,
            args.payload,
            args.workers
        );
        println!();
        println!(
            "| layout | HOT updates | vacuums | swept | sweeping | table before → after | indexes before → after | B per live record before → after | ratio | list_in_progress(1000) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for (i, table) in tables.iter().enumerate() {
            let (b, a) = (&before[i], &after[i]);
            let (upd, hot) = updated[i];
            let idx = |s: &Sizes| {
                s.indexes
                    .iter()
                    .map(|(n, size)| format!("{} {}", n.trim_matches('"'), kib(*size)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "| {} | {hot} of {upd} ({:.1} %) | {} | {} | {:.2} s | {} → {} | {} → {} | {:.0} → {:.0} | {:.2}x | {:.1} ms |",
                names[i],
                100.0 * hot as f64 / upd.max(1) as f64,
                table.vacuums,
                table.swept,
                table.sweeping.as_secs_f64(),
                kib(b.table),
                kib(a.table),
                idx(b),
                idx(a),
                b.per_record(),
                a.per_record(),
                a.per_record() / b.per_record(),
                listing[i].as_secs_f64() * 1000.0,
            );
        }
    }
    Ok(())
}

fn kib(bytes: i64) -> String {
    format!("{:.0} KiB", bytes as f64 / 1024.0)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
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
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let server = std::env::var("IDEMKEY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let db = format!("idemkey_bench_pg_churn_{}", std::process::id());
    let admin = PgPool::connect(&with_database(&server, "postgres"))
        .await
        .map_err(|e| format!("PostgreSQL at {server}: {e}"))?;
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(&admin)
        .await
        .map_err(|e| format!("CREATE DATABASE {db}: {e}"))?;
    // Commits without waiting for the WAL flush: what is measured is the tables, not
    // the disk, and this database is dropped at the end.
    let _ = sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE {db} SET synchronous_commit = off"
    )))
    .execute(&admin)
    .await;
    let url = with_database(&server, &db);
    let result = async {
        let pool = PgPool::connect(&url)
            .await
            .map_err(|e| format!("PostgreSQL {db}: {e}"))?;
        let result = churn(&args, &url, &pool).await;
        pool.close().await;
        result
    }
    .await;
    let _ = sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(&admin)
    .await;
    result
}
