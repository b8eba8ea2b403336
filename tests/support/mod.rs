//! The integration tests' support, one tree that each wing's test binary
//! (`tests/<wing>/main.rs`) and idemkey-cli's tests include as `mod support` (as
//! reqwest's `tests/support/` is): real servers on 127.0.0.1.
//!
//! - here: connection strings of the shared stores, unique names for isolation, and
//!   [`serve`], the one loopback server for an axum app;
//! - `servers`: private server processes that a test may kill, fill or count (by pid):
//!   Redis, a Redis Cluster, PostgreSQL, MariaDB;
//! - [`client`]: a client with millisecond backoff, idemkey's typed error out of a
//!   middleware error;
//! - [`gate`]: the gate a handler waits at;
//! - [`recorder`]: a server that records every request and answers from a script (the
//!   client tests);
//! - [`verifier`]: HTTP shortcuts against a verifier, [`verifier::Answer`], a store that
//!   fails on demand;
//! - [`apps`]: the examples' charge app over a given store;
//! - [`examples`]: the example programs run as processes;
//! - [`raw`]: HTTP/1.1 over a raw TCP socket (stalled heads, short bodies,
//!   `Expect: 100-continue`);
//! - [`webhook`]: the example webhook receiver and provider-shaped deliveries;
//! - [`telemetry`]: the spans and metrics the crate emits, captured (feature
//!   `metrics`);
//! - [`queues`]: the queue consumer examples' scenario: charges, seeded kills, the
//!   ledger's check;
//! - [`peers`]: verifiers and clients nobody here wrote (PyPI, npm), installed at pinned
//!   versions into a cache folder.
#![allow(
    dead_code,
    reason = "each test binary includes the whole tree and uses a part of it"
)]

pub(crate) mod apps;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod busy_store;
pub(crate) mod client;
pub(crate) mod examples;
pub(crate) mod gate;
pub(crate) mod moto;
pub(crate) mod peers;
#[cfg(feature = "postgres")]
pub(crate) mod queues;
pub(crate) mod raw;
pub(crate) mod recorder;
mod servers;
#[cfg(feature = "metrics")]
pub(crate) mod telemetry;
pub(crate) mod verifier;
pub(crate) mod webhook;

#[allow(unused_imports, reason = "each test binary uses a part of the tree")]
pub(crate) use servers::{
    MariaDbServer, PgServer, RedisCluster, RedisServer, TempDir, postgres_bin_dir, redis_cli,
};

use std::net::TcpListener;
use std::time::Duration;

/// The harness's name of the test `name` in the module `module` (`module_path!()`): the
/// module's path without the crate's name, then the test's, as `--exact` wants it when
/// a test runs its own binary again as a child process.
pub(crate) fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// The shared Redis (`IDEMKEY_REDIS_URL`, default `redis://127.0.0.1:6379`).
pub(crate) fn redis_url() -> String {
    std::env::var("IDEMKEY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The shared PostgreSQL (`IDEMKEY_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`).
pub(crate) fn postgres_url() -> String {
    std::env::var("IDEMKEY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The shared MySQL or MariaDB (`IDEMKEY_MYSQL_URL`, default
/// `mysql://root@127.0.0.1:3306/test`).
pub(crate) fn mysql_url() -> String {
    std::env::var("IDEMKEY_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The shared RabbitMQ (`IDEMKEY_RABBITMQ_URL`, default
/// `amqp://guest:guest@127.0.0.1:5672/%2f`).
pub(crate) fn rabbitmq_url() -> String {
    std::env::var("IDEMKEY_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The shared NATS with JetStream (`IDEMKEY_NATS_URL`, default `nats://127.0.0.1:4222`).
pub(crate) fn nats_url() -> String {
    std::env::var("IDEMKEY_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A name no other test (or run) uses: `<base>_<random hex>`.
pub(crate) fn unique(base: &str) -> String {
    format!(
        "{base}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    )
}

/// Races the conformance suite's claims ([`claim_is_atomic_across`]) `rounds` times over
/// four instances of one store, each made by `open` with connections of its own, as four
/// processes hold them: the claim must be atomic in the database, not in one client.
///
/// [`claim_is_atomic_across`]: idemkey::testing::conformance::claim_is_atomic_across
pub(crate) async fn claims_over_four_instances<S: idemkey::store::Store>(
    rounds: usize,
    mut open: impl AsyncFnMut() -> S,
) {
    assert!(rounds > 0, "a race of no rounds checks nothing");
    let mut stores: Vec<std::sync::Arc<dyn idemkey::store::Store>> = Vec::new();
    for _ in 0..4 {
        stores.push(std::sync::Arc::new(open().await));
    }
    for _ in 0..rounds {
        idemkey::testing::conformance::claim_is_atomic_across(&stores).await;
    }
}

/// The lowest and highest port [`free_port`] hands out: below the kernel's ephemeral range
/// (32768 and up on Linux), so that no outgoing connection of another test can take the
/// port between the moment it was found free and the moment a private server binds it,
/// and low enough that a Redis Cluster node's bus port (port + 10000) is below it too.
const PRIVATE_PORTS: std::ops::RangeInclusive<u16> = 10_000..=22_767;

/// A port of [`PRIVATE_PORTS`] that was free a moment ago on 127.0.0.1 (picked at
/// random, so that tests running in parallel rarely try the same one).
pub(crate) fn free_port() -> u16 {
    free_port_where(|_| true)
}

/// A free port, as [`free_port`], that also passes `also` (for example: its Redis
/// Cluster bus port is free too).
fn free_port_where(also: impl Fn(u16) -> bool) -> u16 {
    let span = u128::from(PRIVATE_PORTS.end() - PRIVATE_PORTS.start()) + 1;
    for _ in 0..1_000 {
        let offset = uuid::Uuid::new_v4().as_u128() % span;
        let port = PRIVATE_PORTS.start() + u16::try_from(offset).expect("offset < span");
        if port_is_free(port) && also(port) {
            return port;
        }
    }
    panic!("no free port in {PRIVATE_PORTS:?} on 127.0.0.1 after 1000 tries");
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Serves `router` on a free port of 127.0.0.1 until the returned server is dropped.
pub(crate) async fn serve(router: axum::Router) -> idemkey::testing::TestServer {
    idemkey::testing::TestServer::start(router)
        .await
        .expect("bind a free port on 127.0.0.1")
}

/// A PostgreSQL store on the shared server with its own table (created).
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_store(table: &str) -> idemkey::store::PostgresStore {
    let url = postgres_url();
    let store = idemkey::store::PostgresStore::builder(&url)
        .table(table)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"));
    store.migrate().await.expect("create the test table");
    store
}

/// A connection pool of its own to the shared PostgreSQL, for raw SQL in tests (the
/// store keeps its pool private).
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_admin(url: &str) -> sqlx::PgPool {
    sqlx::PgPool::connect(url)
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"))
}

/// Drops a test table made by [`postgres_store`].
#[cfg(feature = "postgres")]
pub(crate) async fn drop_postgres_table(table: &str) {
    let admin = postgres_admin(&postgres_url()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS \"{table}\""
    )))
    .execute(&admin)
    .await
    .expect("drop the test table");
    admin.close().await;
}

/// The rows a test wrote into a table of the previous schema before the store upgraded
/// it: `done` completed with fingerprint `fp` and payload `old payload`, `running` in
/// progress with fingerprint `fp`, held by `owner`, with an hour of lease left.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) struct PreviousRows {
    pub(crate) done: idemkey::store::RecordId,
    pub(crate) running: idemkey::store::RecordId,
    pub(crate) owner: idemkey::store::FencingToken,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl PreviousRows {
    pub(crate) fn new() -> Self {
        Self {
            done: idemkey::store::RecordId::new("old", "done"),
            running: idemkey::store::RecordId::new("old", "running"),
            owner: idemkey::store::FencingToken::random(),
        }
    }

    /// What a store upgraded at `upgrading` must show of them: the completed record is
    /// replayed, the running one is inspected (its `created` is the time of the upgrade)
    /// and listed, and its owner completes it.
    pub(crate) async fn expect_upgraded(
        &self,
        store: &dyn idemkey::store::Store,
        upgrading: std::time::SystemTime,
    ) {
        use idemkey::store::{Claim, ClaimRequest, FencingToken, RecordId};
        let claim = |id: RecordId| async move {
            store
                .claim(ClaimRequest {
                    id: &id,
                    fingerprint: b"new",
                    token: FencingToken::random(),
                    lease: Duration::from_secs(60),
                    retention: Duration::from_secs(60),
                })
                .await
                .expect("claim")
        };
        assert_eq!(
            claim(self.done).await,
            Claim::Completed {
                fingerprint: "fp".into(),
                payload: "old payload".into()
            },
            "a completed record of the previous version is replayed"
        );
        let info = store
            .inspect(&self.running)
            .await
            .expect("inspect")
            .expect("the running record of the previous version");
        let skew = Duration::from_secs(5);
        assert!(
            info.created + skew >= upgrading && info.created <= std::time::SystemTime::now() + skew,
            "a row of the previous version shows the time of the upgrade as created"
        );
        let listed = store.list_in_progress(10).await.expect("list_in_progress");
        assert_eq!(
            listed.iter().map(|r| r.id).collect::<Vec<_>>(),
            [self.running]
        );
        store
            .complete(
                &self.running,
                self.owner,
                "late".into(),
                Duration::from_secs(60),
            )
            .await
            .expect("the owner of a claim of the previous version completes it");
        assert_eq!(
            claim(self.running).await,
            Claim::Completed {
                fingerprint: "fp".into(),
                payload: "late".into()
            }
        );
    }
}

/// A MySQL store on the shared server with its own table (created).
#[cfg(feature = "mysql")]
pub(crate) async fn mysql_store(table: &str) -> idemkey::store::MySqlStore {
    let url = mysql_url();
    let store = idemkey::store::MySqlStore::builder(&url)
        .table(table)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the MySQL/MariaDB at {url} must be reachable: {e}"));
    store.migrate().await.expect("create the test table");
    store
}

/// A pool of its own on the MySQL/MariaDB at `url`, for what a test reads or changes
/// beside the store (the store keeps its pool to itself).
#[cfg(feature = "mysql")]
pub(crate) async fn mysql_admin(url: &str) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("the MySQL/MariaDB at {url} must be reachable: {e}"))
}

/// Drops a test table made by [`mysql_store`].
#[cfg(feature = "mysql")]
pub(crate) async fn drop_mysql_table(table: &str) {
    let admin = mysql_admin(&mysql_url()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS `{table}`"
    )))
    .execute(&admin)
    .await
    .expect("drop the test table");
    admin.close().await;
}

/// A DynamoDB store with a table of its own (created) on `moto`'s server.
#[cfg(feature = "dynamodb")]
pub(crate) async fn dynamo_store(
    moto: &moto::MotoServer,
    table: &str,
) -> idemkey::store::DynamoStore {
    let store = idemkey::store::DynamoStore::builder(dynamo_client(moto))
        .table(table)
        .build()
        .expect("a valid table name");
    store
        .create_table()
        .await
        .unwrap_or_else(|e| panic!("create table {table} on moto at {}: {e}", moto.url()));
    store
}

/// An SDK client for `moto`'s server (any credentials do).
#[cfg(feature = "dynamodb")]
pub(crate) fn dynamo_client(moto: &moto::MotoServer) -> idemkey::store::aws_sdk_dynamodb::Client {
    use idemkey::store::aws_sdk_dynamodb::{Client, config::Credentials};
    let config = idemkey::store::DynamoStore::sdk_config("us-east-1")
        .endpoint_url(moto.url())
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .build();
    Client::from_conf(config)
}
