//! The MySQL/MariaDB store against the shared MariaDB (`IDEMKEY_MYSQL_URL`): the
//! conformance suite, claims from several pools, the sweep, migrations, errors, and the
//! statements per request counted by a private server.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use idemkey::store::{Claim, ClaimRequest, FencingToken, MySqlStore, RecordId, Store};
use idemkey::testing::conformance;

const LONG: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_store_conforms() {
    let table = support::unique("idemkey_test");
    let store = support::mysql_store(&table).await;
    conformance::run(|| {
        let store = store.clone();
        async move { store }
    })
    .await;
    support::drop_mysql_table(&table).await;
}

fn request<'a>(id: &'a RecordId, fingerprint: &'a [u8], token: FencingToken) -> ClaimRequest<'a> {
    ClaimRequest {
        id,
        fingerprint,
        token,
        lease: LONG,
        retention: LONG,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_several_pools_are_atomic_and_return_the_row() {
    let table = support::unique("idemkey_test");
    support::claims_over_four_instances(5, async || support::mysql_store(&table).await).await;
    support::drop_mysql_table(&table).await;
}

#[tokio::test]
async fn sweep_deletes_rows_past_their_life_only() {
    let table = support::unique("idemkey_test");
    let store = support::mysql_store(&table).await;
    let short = Duration::from_millis(100);
    for (i, retention) in [short, short, LONG].into_iter().enumerate() {
        let id = RecordId::new("sweep", &i.to_string());
        let token = FencingToken::random();
        store
            .claim(request(&id, b"fp", token))
            .await
            .expect("claim");
        store
            .complete(&id, token, "p".into(), retention)
            .await
            .expect("complete");
    }
    // A claim whose lease ended is kept (an abandoned claim stays past its lease).
    let abandoned = RecordId::new("sweep", "lease");
    store
        .claim(ClaimRequest {
            lease: short,
            retention: LONG,
            ..request(&abandoned, b"fp", FencingToken::random())
        })
        .await
        .expect("claim");

    let mut swept = 0;
    for _ in 0..200 {
        swept += store.sweep().await.expect("sweep");
        if swept >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(swept, 2, "the two completed records past their retention");
    let admin = support::mysql_admin(&support::mysql_url()).await;
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM `{table}`"
    )))
    .fetch_one(&admin)
    .await
    .expect("count");
    assert_eq!(left, 2, "the live record and the abandoned claim stay");
    // The abandoned claim was made after the completions, so its lease may end a little
    // after their retention: wait for it by the store's own answer, bounded.
    let mut next = None;
    for _ in 0..200 {
        let claim = store
            .claim(request(&abandoned, b"next", FencingToken::random()))
            .await
            .expect("claim");
        if !matches!(claim, Claim::InProgress { .. }) {
            next = Some(claim);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        next,
        Some(Claim::Acquired { takeover: true }),
        "the abandoned claim is taken over once its lease ends, and says so"
    );
    support::drop_mysql_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_and_the_schema_are_idempotent() {
    let table = support::unique("idemkey_test");
    let store = MySqlStore::builder(support::mysql_url())
        .table(&table)
        .connect()
        .await
        .expect("connect");
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for run in runs {
        run.await.expect("join").expect("concurrent migrate");
    }
    store.migrate().await.expect("migrate again");
    assert!(store.schema_sql().contains("CREATE TABLE IF NOT EXISTS"));
    support::drop_mysql_table(&table).await;
}

#[tokio::test]
async fn a_server_that_never_answers_fails_connect_within_the_acquire_timeout() {
    support::busy_store::connect_to_a_silent_server(|at, timeout| {
        MySqlStore::builder(format!("mysql://root@{at}/test"))
            .acquire_timeout(timeout)
            .connect()
    })
    .await;
}

#[tokio::test]
async fn bad_configuration_is_a_configuration_error_and_unreachable_is_unavailable() {
    use sqlx::ConnectOptions;
    use std::str::FromStr;
    let err = MySqlStore::builder(support::mysql_url())
        .table("x; DROP TABLE y")
        .connect()
        .await
        .expect_err("invalid table name");
    assert!(
        err.is_configuration() && err.to_string().contains("table name"),
        "{err}"
    );
    let no_db = sqlx::mysql::MySqlConnectOptions::from_str(&support::mysql_url())
        .expect("the shared MariaDB's URL")
        .database(&support::unique("no_such_db"))
        .to_url_lossy()
        .to_string();
    let err = MySqlStore::connect(no_db)
        .await
        .expect_err("unknown database");
    assert!(err.is_configuration(), "{err}");
    assert!(err.to_string().contains("no_such_db"), "{err}");

    let port = support::free_port();
    let url = format!("mysql://root@127.0.0.1:{port}/test");
    let err = MySqlStore::connect(url)
        .await
        .expect_err("nothing listens there");
    assert!(err.is_unavailable(), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test]
async fn open_picks_the_mysql_store() {
    for url in [
        support::mysql_url(),
        support::mysql_url().replacen("mysql:", "mariadb:", 1),
    ] {
        let store = idemkey::store::open(&url)
            .await
            .unwrap_or_else(|e| panic!("open({url}): {e}"));
        let (id, token) = (
            RecordId::new("open", &support::unique("k")),
            FencingToken::random(),
        );
        assert_eq!(
            store
                .claim(request(&id, b"fp", token))
                .await
                .expect("claim"),
            Claim::Acquired { takeover: false }
        );
        store.release(&id, token).await.expect("release");
    }
}

#[tokio::test]
async fn large_payloads_and_binary_fingerprints_round_trip() {
    let table = support::unique("idemkey_test");
    let store = support::mysql_store(&table).await;
    let (id, token) = (RecordId::new("big", "k"), FencingToken::random());
    let fp: Vec<u8> = (0..=255u8).collect();
    store.claim(request(&id, &fp, token)).await.expect("claim");
    let payload: Bytes = (0..12 * 1024 * 1024)
        .map(|i: u32| (i % 253) as u8)
        .collect();
    store
        .complete(&id, token, payload.clone(), LONG)
        .await
        .expect("a 12 MiB payload");
    match store
        .claim(request(&id, b"x", FencingToken::random()))
        .await
        .expect("replay")
    {
        Claim::Completed {
            fingerprint,
            payload: got,
        } => {
            assert_eq!(fingerprint, fp.as_slice());
            assert!(got == payload, "12 MiB came back as {} bytes", got.len());
        }
        other => panic!("{other:?}"),
    }
    support::drop_mysql_table(&table).await;
}

/// The server's statement counters that a store's calls move.
const COUNTERS: [&str; 6] = [
    "Com_insert",
    "Com_select",
    "Com_update",
    "Com_delete",
    "Com_begin",
    "Com_commit",
];

async fn counters(admin: &sqlx::MySqlPool) -> Vec<i64> {
    let mut values = Vec::new();
    for name in COUNTERS {
        let (_, value): (String, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SHOW GLOBAL STATUS LIKE '{name}'"
        )))
        .fetch_one(admin)
        .await
        .expect("SHOW GLOBAL STATUS");
        values.push(value.parse().expect("a number"));
    }
    values
}

async fn statements_of<F: std::future::Future<Output = ()>>(
    admin: &sqlx::MySqlPool,
    f: F,
) -> String {
    let before = counters(admin).await;
    f.await;
    let after = counters(admin).await;
    COUNTERS
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| a != b)
        .map(|(name, (b, a))| format!("{name}={}", a - b))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn fresh_request_costs_two_statements_and_replay_one() {
    // A private server, so that its counters count this test's statements only.
    let server = support::MariaDbServer::start();
    // The least budget: one connection for requests, opened (and its set-up done)
    // at connect, one for the migration.
    let store = MySqlStore::builder(server.url())
        .table("idemkey_count")
        .max_connections(2)
        .connect()
        .await
        .expect("connect to the private MariaDB");
    store.migrate().await.expect("migrate");
    let admin = support::mysql_admin(&server.url()).await;
    let (id, token) = (RecordId::new("t", "k"), FencingToken::random());
    let fresh = statements_of(&admin, async {
        let claim = store
            .claim(request(&id, b"fp", token))
            .await
            .expect("claim");
        assert_eq!(claim, Claim::Acquired { takeover: false });
        store
            .complete(&id, token, "reply".into(), LONG)
            .await
            .expect("complete");
    })
    .await;
    assert_eq!(
        fresh, "Com_insert=1 Com_update=1",
        "a fresh request: claim and complete"
    );
    let replay = statements_of(&admin, async {
        let replay = store
            .claim(request(&id, b"fp", FencingToken::random()))
            .await
            .expect("replay");
        assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    })
    .await;
    assert_eq!(replay, "Com_insert=1", "a replay: one claim");
    let (other, owner) = (RecordId::new("t", "running"), FencingToken::random());
    store
        .claim(request(&other, b"fp", owner))
        .await
        .expect("claim");
    let duplicate = statements_of(&admin, async {
        let dup = store
            .claim(request(&other, b"fp", FencingToken::random()))
            .await
            .expect("duplicate");
        assert!(matches!(dup, Claim::InProgress { .. }), "{dup:?}");
    })
    .await;
    assert_eq!(
        duplicate, "Com_insert=1",
        "a duplicate of a running request: one claim"
    );
    // SHOW STATUS counts itself as Com_show_status, not among these counters.
}

/// A private MariaDB whose database `store` holds only the store's sessions (the
/// test's own connections use `mysql`), a store on it, and a pool beside it for the
/// test (2 connections: one to hold a lock, one to look).
async fn private_store(
    server: &support::MariaDbServer,
    configure: impl FnOnce(idemkey::store::MySqlStoreBuilder) -> idemkey::store::MySqlStoreBuilder,
) -> (MySqlStore, sqlx::MySqlPool) {
    let admin = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .expect("connect to the private MariaDB");
    sqlx::raw_sql("CREATE DATABASE store")
        .execute(&admin)
        .await
        .expect("create the store's database");
    let url = server.url().replace("/mysql", "/store");
    let store = configure(MySqlStore::builder(url).table("idemkey_records"))
        .connect()
        .await
        .expect("connect to the private MariaDB");
    store.migrate().await.expect("migrate");
    (store, admin)
}

/// The store's sessions whose statement (`INFO` starting with `statement`) waits for
/// the table's lock, once there are `n` of them.
async fn lock_waiters(admin: &sqlx::MySqlPool, statement: &str, n: usize) -> Vec<i64> {
    loop {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = 'store'
             AND STATE LIKE '%lock%' AND INFO LIKE CONCAT(?, '%')",
        )
        .bind(statement)
        .fetch_all(admin)
        .await
        .expect("read the process list");
        if ids.len() >= n {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The ids of the store's sessions.
async fn store_sessions(admin: &sqlx::MySqlPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = 'store'")
        .fetch_all(admin)
        .await
        .expect("read the process list")
}

/// Takes the store's table from every other session until the connection is dropped
/// (closed) or unlocks.
async fn lock_table(admin: &sqlx::MySqlPool) -> sqlx::pool::PoolConnection<sqlx::MySql> {
    let mut lock = admin.acquire().await.expect("a connection");
    sqlx::raw_sql("LOCK TABLES store.idemkey_records WRITE")
        .execute(&mut *lock)
        .await
        .expect("lock the table");
    lock
}

async fn unlock(mut lock: sqlx::pool::PoolConnection<sqlx::MySql>) {
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut *lock)
        .await
        .expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cancelled_mid_statement_closes_its_connection_and_the_next_is_served() {
    let server = support::MariaDbServer::start();
    // 3 connections: 1 for requests, so the next request would reuse the cancelled one.
    let (store, admin) = private_store(&server, |b| b.max_connections(3)).await;
    let lock = lock_table(&admin).await;
    let claiming = tokio::spawn({
        let store = store.clone();
        async move {
            let id = RecordId::new("t", "cancelled");
            store
                .claim(request(&id, b"fp", FencingToken::random()))
                .await
        }
    });
    // The claim's statement is on the server, waiting for the lock: drop the request.
    lock_waiters(&admin, "INSERT", 1).await;
    // The cancelled claim's session and the one that made the table.
    let before = store_sessions(&admin).await;
    claiming.abort();
    assert!(claiming.await.expect_err("aborted").is_cancelled());
    unlock(lock).await;

    let (id, token) = (RecordId::new("t", "next"), FencingToken::random());
    assert_eq!(
        store
            .claim(request(&id, b"fp", token))
            .await
            .expect("claim"),
        Claim::Acquired { takeover: false }
    );
    store
        .complete(&id, token, "reply".into(), LONG)
        .await
        .expect("complete");
    assert_eq!(
        store
            .claim(request(&id, b"fp", FencingToken::random()))
            .await
            .expect("replay"),
        Claim::Completed {
            fingerprint: Bytes::from_static(b"fp"),
            payload: Bytes::from_static(b"reply")
        }
    );
    // A new session served them: the cancelled one was not handed out again.
    let sessions = store_sessions(&admin).await;
    assert!(
        sessions.iter().any(|id| !before.contains(id)),
        "the store's sessions {sessions:?}, before the next request {before:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_budget_holds_and_a_request_waits_at_most_acquire_timeout() {
    let server = support::MariaDbServer::start();
    // 5 connections: 3 for requests, 2 for the rest (a sweep pass takes both).
    let (store, admin) = private_store(&server, |b| {
        b.max_connections(5)
            .acquire_timeout(Duration::from_millis(200))
    })
    .await;
    let lock = lock_table(&admin).await;
    let mut crowd = support::busy_store::Crowd::start(std::sync::Arc::new(store), 8);
    // Every connection is busy: the 3 request connections and the sweep's batch wait
    // for the lock (the sweep's lock connection beside it). The 5 other claims, and a
    // second sweep, wait for a connection and give up after the timeout.
    lock_waiters(&admin, "INSERT", 3).await;
    lock_waiters(&admin, "DELETE", 1).await;
    crowd.expect_refused(3, 5).await;
    assert_eq!(
        store_sessions(&admin).await.len(),
        5,
        "the store holds its budget, no more"
    );
    unlock(lock).await;
    crowd.expect_served().await;
}
