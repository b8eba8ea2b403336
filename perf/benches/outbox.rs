//! Journaled against unjournaled calls to a loopback verifier: the price of the outbox.
//!
//! One verifier (the idempotency layer over the memory store, a trivial charge handler)
//! on 127.0.0.1, and the default client stack. Each measurement sends a fixed number of
//! `POST /v1/charges` from 1 or 64 concurrent callers:
//!
//! - `unjournaled`: `client.post(..).send()`, the body read (the baseline);
//! - `sqlite`: the same through an [`Outbox`] over a `SqliteJournal` (WAL,
//!   `synchronous = FULL`, group commit) in a temporary file;
//! - `sqlite-awaited`: the same journal with every outcome's commit awaited by the send
//!   (as before outcomes were deferred), to see what deferring buys in the same run;
//! - `postgres`: the same over a `PostgresJournal` (group commit, deferred outcomes) on
//!   the shared PostgreSQL (`IDEMKEY_POSTGRES_URL`, default
//!   `postgres://postgres@127.0.0.1:5432/test`), in a table of its own, dropped at the
//!   end;
//! - `postgres-awaited`: the same PostgreSQL journal with every outcome's commit awaited.
//!
//! A send returns once its outcome is queued, without waiting for the outcome's commit;
//! each measurement ends with `Outbox::flush` inside the timed span, so every outcome it
//! recorded is durable and its commits are counted in it.
//!
//! 150 calls from 1 caller; from 64 callers, 64 calls each (`IDEMKEY_BENCH_OUTBOX_PER_CALLER`
//! overrides it: at 16, a measurement lasts about 50 ms and the scheduling noise of a
//! shared machine dominates it). Every kind is measured three times, interleaved, and
//! the median kept; throughput is
//! given as a ratio to the unjournaled baseline of the same concurrency, with the
//! journal's commits per call (for SQLite, each commit is one WAL sync).
//!
//! Run: `cargo bench -p perf --bench outbox`.

#![allow(clippy::print_stdout, reason = "a benchmark prints its table")]

use std::time::Instant;

use axum::routing::post;
use idemkey::client::IdempotentClientBuilder;
use idemkey::client::outbox::{
    Enqueued, Journal, JournalError, Operation, Outbox, OutboxExt, Outcome, PostgresJournal,
    SqliteJournal,
};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use idemkey::testing::TestServer;
use reqwest_middleware::ClientWithMiddleware;

const ROUNDS: usize = 3;

/// A journal whose deferred outcomes are awaited: the trait's default
/// `complete_deferred` (which awaits `complete`), every other method delegated.
struct Awaited<J>(J);

#[async_trait::async_trait]
impl<J: Journal> Journal for Awaited<J> {
    async fn enqueue(&self, op: &Operation) -> Result<Enqueued, JournalError> {
        self.0.enqueue(op).await
    }
    async fn begin_attempt(&self, id: &str) -> Result<Option<u32>, JournalError> {
        self.0.begin_attempt(id).await
    }
    async fn complete(&self, id: &str, outcome: &Outcome) -> Result<bool, JournalError> {
        self.0.complete(id, outcome).await
    }
    async fn get(&self, id: &str) -> Result<Option<Operation>, JournalError> {
        self.0.get(id).await
    }
    async fn pending(&self, limit: usize) -> Result<Vec<Operation>, JournalError> {
        self.0.pending(limit).await
    }
}

#[derive(Clone)]
enum Kind {
    Unjournaled,
    Sqlite(SqliteJournal, Outbox),
    SqliteAwaited(SqliteJournal, Outbox),
    Postgres(PostgresJournal, Outbox),
    PostgresAwaited(PostgresJournal, Outbox),
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Unjournaled => "unjournaled",
            Kind::Sqlite(..) => "sqlite",
            Kind::SqliteAwaited(..) => "sqlite-awaited",
            Kind::Postgres(..) => "postgres",
            Kind::PostgresAwaited(..) => "postgres-awaited",
        }
    }

    fn commits(&self) -> u64 {
        match self {
            Kind::Unjournaled => 0,
            Kind::Sqlite(j, _) | Kind::SqliteAwaited(j, _) => j.commits(),
            Kind::Postgres(j, _) | Kind::PostgresAwaited(j, _) => j.commits(),
        }
    }

    /// Every recorded outcome durable.
    async fn flush(&self) {
        if let Kind::Sqlite(_, outbox)
        | Kind::SqliteAwaited(_, outbox)
        | Kind::Postgres(_, outbox)
        | Kind::PostgresAwaited(_, outbox) = self
        {
            outbox.flush().await.expect("flushed");
        }
    }

    async fn call(&self, client: &ClientWithMiddleware, url: &str, id: String) {
        let request = client
            .post(url)
            .header("content-type", "application/json")
            .body(format!("{{\"amount\":100,\"order\":\"{id}\"}}"));
        match self {
            Kind::Unjournaled => {
                let response = request.send().await.expect("the verifier answers");
                response.bytes().await.expect("the body");
            }
            Kind::Sqlite(_, outbox)
            | Kind::SqliteAwaited(_, outbox)
            | Kind::Postgres(_, outbox)
            | Kind::PostgresAwaited(_, outbox) => {
                let outcome = request.outbox(outbox, id).send().await.expect("sent");
                assert_eq!(outcome.status, 201);
            }
        }
    }
}

/// Sends `per_caller` calls from each of `callers` concurrent callers: calls per second
/// and commits per call.
async fn measure(
    kind: &Kind,
    client: &ClientWithMiddleware,
    url: &str,
    callers: usize,
    per_caller: usize,
    run: &str,
) -> (f64, f64) {
    let before = kind.commits();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..callers {
        let (kind, client, url, run) =
            (kind.clone(), client.clone(), url.to_owned(), run.to_owned());
        tasks.spawn(async move {
            for i in 0..per_caller {
                kind.call(&client, &url, format!("{run}:{c}:{i}")).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("caller");
    }
    kind.flush().await;
    let elapsed = started.elapsed().as_secs_f64();
    let calls = (callers * per_caller) as f64;
    (calls / elapsed, (kind.commits() - before) as f64 / calls)
}

fn median(mut v: Vec<(f64, f64)>) -> (f64, f64) {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let app = axum::Router::new().route(
        "/v1/charges",
        post(|| async { (http::StatusCode::CREATED, "{\"id\":\"ch_1\"}") }),
    );
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()));
    let server = TestServer::start_verified(app, layer)
        .await
        .expect("verifier");
    let url = server.url("/v1/charges");
    let client = IdempotentClientBuilder::new(reqwest::Client::new()).build();

    let dir = std::env::temp_dir().join(format!("idemkey-bench-outbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sqlite = SqliteJournal::open(dir.join("outbox.db"))
        .await
        .expect("SQLite journal");
    let pg_url = std::env::var("IDEMKEY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let table = format!("idemkey_bench_outbox_{}", std::process::id());
    let postgres = PostgresJournal::builder(&pg_url)
        .table(&table)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {pg_url} must be reachable: {e}"));
    let kinds = [
        Kind::Unjournaled,
        Kind::Sqlite(sqlite.clone(), Outbox::new(sqlite.clone())),
        Kind::SqliteAwaited(sqlite.clone(), Outbox::new(Awaited(sqlite))),
        Kind::Postgres(postgres.clone(), Outbox::new(postgres.clone())),
        Kind::PostgresAwaited(postgres.clone(), Outbox::new(Awaited(postgres))),
    ];

    println!("| callers | kind | calls/s | / unjournaled | commits per call |");
    println!("|---|---|---|---|---|");
    let per_caller_64 = std::env::var("IDEMKEY_BENCH_OUTBOX_PER_CALLER")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    for (callers, per_caller) in [(1, 150), (64, per_caller_64)] {
        // Warm-up: connections, prepared statements.
        for kind in &kinds {
            measure(
                kind,
                &client,
                &url,
                callers,
                2,
                &format!("{}-warm-{callers}", kind.name()),
            )
            .await;
        }
        let mut results: Vec<Vec<(f64, f64)>> = vec![Vec::new(); kinds.len()];
        for round in 0..ROUNDS {
            for (k, kind) in kinds.iter().enumerate() {
                // Ids of their own per kind: the kinds of one database share a journal.
                let run = format!("{}-c{callers}-r{round}", kind.name());
                results[k].push(measure(kind, &client, &url, callers, per_caller, &run).await);
            }
        }
        let medians: Vec<(f64, f64)> = results.into_iter().map(median).collect();
        let baseline = medians[0].0;
        for (kind, (rate, commits)) in kinds.iter().zip(medians) {
            println!(
                "| {callers} | {} | {rate:.0} | {:.3} | {commits:.3} |",
                kind.name(),
                rate / baseline
            );
        }
    }

    let admin = sqlx::PgPool::connect(&pg_url).await.expect("PostgreSQL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS \"{table}\""
    )))
    .execute(&admin)
    .await
    .expect("drop the bench table");
    std::fs::remove_dir_all(&dir).ok();
}
