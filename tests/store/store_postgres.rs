//! PostgreSQL-specific behaviour: the claim statement under concurrency from several
//! pools, concurrent migrations, the sweep, and errors.

use crate::support;

use std::time::Duration;

use idemkey::store::{Claim, ClaimRequest, FencingToken, PostgresStore, RecordId, Store};
use idemkey::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_several_pools_are_atomic_and_return_the_row() {
    let table = support::unique("idemkey_test");
    support::claims_over_four_instances(5, async || support::postgres_store(&table).await).await;
    support::drop_postgres_table(&table).await;
}

#[tokio::test]
async fn sweep_deletes_expired_rows_only() {
    let table = support::unique("idemkey_test");
    let store = support::postgres_store(&table).await;
    let short = Duration::from_millis(100);
    let long = Duration::from_secs(60);
    for (i, retention) in [short, short, long].into_iter().enumerate() {
        let id = RecordId::new("sweep", &i.to_string());
        let token = FencingToken::random();
        store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"fp",
                token,
                lease: long,
                retention: long,
            })
            .await
            .expect("claim");
        store
            .complete(&id, token, "p".into(), retention)
            .await
            .expect("complete");
    }
    // An in-progress record whose lease and retention ended is swept too; one whose
    // lease ended within its retention (an abandoned claim its owner may still complete)
    // is kept.
    for (key, retention) in [("lease", short), ("abandoned", long)] {
        store
            .claim(ClaimRequest {
                id: &RecordId::new("sweep", key),
                fingerprint: b"fp",
                token: FencingToken::random(),
                lease: short,
                retention,
            })
            .await
            .expect("claim");
    }

    let mut swept = 0;
    for _ in 0..200 {
        swept += store.sweep().await.expect("sweep");
        if swept >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        swept, 3,
        "two expired completed records and one expired lease past its retention"
    );
    let admin = support::postgres_admin(&support::postgres_url()).await;
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{table}\""
    )))
    .fetch_one(&admin)
    .await
    .expect("count");
    assert_eq!(left, 2, "the live record and the abandoned claim stay");
    admin.close().await;
    support::drop_postgres_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_and_the_schema_are_idempotent() {
    let table = support::unique("idemkey_test");
    let store = PostgresStore::builder(support::postgres_url())
        .table(&table)
        .connect()
        .await
        .expect("connect");
    let runs = (0..4).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.migrate().await })
    });
    for run in runs {
        run.await.expect("join").expect("concurrent migrate");
    }
    store.migrate().await.expect("migrate again");
    assert!(store.schema_sql().contains("CREATE TABLE IF NOT EXISTS"));
    support::drop_postgres_table(&table).await;
}

#[tokio::test]
async fn bad_configuration_is_a_configuration_error_and_unreachable_is_unavailable() {
    use sqlx::ConnectOptions;
    use std::str::FromStr;
    let err = PostgresStore::builder(support::postgres_url())
        .table("x; DROP TABLE y")
        .connect()
        .await
        .expect_err("invalid table name");
    assert!(
        err.is_configuration() && err.to_string().contains("table name"),
        "{err}"
    );
    for n in [1, 262_144, u32::MAX] {
        let err = PostgresStore::builder(support::postgres_url())
            .max_connections(n)
            .connect()
            .await
            .expect_err("a budget PostgreSQL cannot serve");
        assert!(
            err.is_configuration() && err.to_string().contains("max_connections"),
            "{n}: {err}"
        );
    }

    // The server answers, and refuses what the URL asks for: fix the URL, not "retry".
    let shared = sqlx::postgres::PgConnectOptions::from_str(&support::postgres_url())
        .expect("the shared PostgreSQL's URL");
    let no_db = shared.clone().database(&support::unique("no_such_db"));
    let no_role = shared.clone().username(&support::unique("no_such_role"));
    for (options, says) in [(no_db, "does not exist"), (no_role, "no_such_role")] {
        let url = options.to_url_lossy().to_string();
        let err = PostgresStore::connect(url.clone())
            .await
            .expect_err("the server refuses");
        let text = err.to_string();
        assert!(
            err.is_configuration() && !err.is_unavailable(),
            "{url}: {text}"
        );
        assert!(
            text.contains(says) && !text.contains("retry later"),
            "{text}"
        );
        assert!(!text.contains(" at line "), "no driver internals: {text}");
        let opened = idemkey::store::open(&url).await.err().expect("refused");
        assert!(opened.is_configuration(), "{opened}");
    }

    let port = support::free_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let err = PostgresStore::connect(url)
        .await
        .expect_err("nothing listens there");
    assert!(err.is_unavailable() && !err.is_configuration(), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "names the address tried: {err}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_fails_connect_within_the_acquire_timeout() {
    support::busy_store::connect_to_a_silent_server(|at, timeout| {
        PostgresStore::builder(format!("postgres://postgres@{at}/test"))
            .acquire_timeout(timeout)
            .connect()
    })
    .await;
}

#[tokio::test]
async fn fresh_request_costs_two_statements_and_replay_one() {
    // A private server, so that pg_stat_statements counts this test's statements only.
    let server = support::PgServer::start_with(&["shared_preload_libraries=pg_stat_statements"]);
    let mut store = None;
    for _ in 0..100 {
        match PostgresStore::connect(server.url()).await {
            Ok(s) => {
                store = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let store = store.expect("connect to the private PostgreSQL");
    store.migrate().await.expect("migrate");
    // One connection, opened now: a connection opened later would count its set-up.
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .expect("connect to the private PostgreSQL");
    sqlx::raw_sql("CREATE EXTENSION pg_stat_statements")
        .execute(&admin)
        .await
        .expect("create pg_stat_statements");
    let statements = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
             WHERE query NOT ILIKE '%pg_stat_statements%'",
        )
        .fetch_one(&admin)
        .await
        .expect("read pg_stat_statements");
        n
    };
    let reset = || async {
        sqlx::raw_sql("SELECT pg_stat_statements_reset()")
            .execute(&admin)
            .await
            .expect("reset pg_stat_statements");
    };

    let (id, token, lease) = (
        RecordId::new("t", "k"),
        FencingToken::random(),
        Duration::from_secs(60),
    );
    // Starting another instance on a current schema reads the catalog and runs no DDL.
    reset().await;
    store.migrate().await.expect("migrate a current schema");
    assert_eq!(
        statements().await,
        1,
        "migrate on a current schema: one catalog read"
    );

    reset().await;
    let claim = store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease,
            retention: lease,
        })
        .await
        .expect("claim");
    assert_eq!(claim, Claim::Acquired { takeover: false });
    store
        .complete(&id, token, "reply".into(), lease)
        .await
        .expect("complete");
    let fresh = statements().await;
    assert_eq!(fresh, 2, "a fresh request: claim and complete");

    reset().await;
    let replay = store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease,
            retention: lease,
        })
        .await
        .expect("replay");
    assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    assert_eq!(statements().await, 1, "a replay: one claim");
}

#[tokio::test]
async fn replays_and_duplicates_neither_write_nor_lock() {
    let table = support::unique("idemkey_test");
    let store = support::postgres_store(&table).await;
    let (id, token, lease) = (
        RecordId::new("t", "k"),
        FencingToken::random(),
        Duration::from_secs(60),
    );
    let admin = support::postgres_admin(&support::postgres_url()).await;
    let version = || async {
        let v: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT xmin::text FROM \"{table}\""
        )))
        .fetch_one(&admin)
        .await
        .expect("row version");
        v
    };
    let other = || ClaimRequest {
        id: &id,
        fingerprint: b"x",
        token: FencingToken::random(),
        lease,
        retention: lease,
    };
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease,
            retention: lease,
        })
        .await
        .expect("claim");
    let claimed = version().await;
    assert!(matches!(
        store.claim(other()).await.expect("duplicate"),
        Claim::InProgress { .. }
    ));
    assert_eq!(
        version().await,
        claimed,
        "a duplicate of a running request writes nothing"
    );
    store
        .complete(&id, token, "reply".into(), lease)
        .await
        .expect("complete");
    let completed = version().await;
    for _ in 0..3 {
        assert!(matches!(
            store.claim(other()).await.expect("replay"),
            Claim::Completed { .. }
        ));
    }
    assert_eq!(version().await, completed, "a replay writes nothing");
    support::drop_postgres_table(&table).await;
}

/// The table and index of the schema before contract v2 (no `created`, no `retention`,
/// no in-progress index), as `PostgresStore::schema_sql` wrote them.
fn previous_schema(t: &str, index: &str) -> String {
    format!(
        "CREATE TABLE {t} (
    id          bytea       PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       bytea,
    payload     bytea,
    taken_over  boolean     NOT NULL DEFAULT false,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX {index} ON {t} (expires_at);"
    )
}

/// `migrate` upgrades a table of the previous schema in place: its rows stay readable
/// and writable, the store then passes the conformance suite, and a missing index is
/// found and made again.
async fn upgrades_in_place(schema: Option<&str>) {
    let base = support::unique("idemkey_test");
    let (name, quoted) = match schema {
        Some(s) => (format!("{s}.{base}"), format!("\"{s}\".\"{base}\"")),
        None => (base.clone(), format!("\"{base}\"")),
    };
    let admin = support::postgres_admin(&support::postgres_url()).await;
    if let Some(s) = schema {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{s}\"")))
            .execute(&admin)
            .await
            .expect("create the schema");
    }
    let index = format!("\"{base}_expires_at\"");
    sqlx::raw_sql(sqlx::AssertSqlSafe(previous_schema(&quoted, &index)))
        .execute(&admin)
        .await
        .expect("create a table of the previous schema");
    let rows = support::PreviousRows::new();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {quoted} (id, fingerprint, token, payload, expires_at) VALUES
  ($1, 'fp', NULL, 'old payload', now() + interval '1 hour'),
  ($2, 'fp', $3, NULL, now() + interval '1 hour')"
    )))
    .bind(rows.done.as_bytes().as_slice())
    .bind(rows.running.as_bytes().as_slice())
    .bind(rows.owner.to_bytes().as_slice())
    .execute(&admin)
    .await
    .expect("rows of the previous version");

    let store = PostgresStore::builder(support::postgres_url())
        .table(&name)
        .connect()
        .await
        .expect("connect");
    let upgrading = std::time::SystemTime::now();
    store.migrate().await.expect("migrate upgrades the table");
    rows.expect_upgraded(&store, upgrading).await;

    conformance::run(|| {
        let store = store.clone();
        async move { store }
    })
    .await;

    // A missing index is found and made again; then migrate has nothing to do.
    let sweep_index = match schema {
        Some(s) => format!("\"{s}\".\"{base}_sweep_at\""),
        None => format!("\"{base}_sweep_at\""),
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP INDEX {sweep_index}")))
        .execute(&admin)
        .await
        .expect("drop the sweep index");
    store.migrate().await.expect("migrate again");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&sweep_index)
        .fetch_one(&admin)
        .await
        .expect("look the index up");
    assert!(exists, "migrate makes a missing index again");
    store.migrate().await.expect("migrate a current schema");
    sqlx::raw_sql(sqlx::AssertSqlSafe(store.schema_sql()))
        .execute(&admin)
        .await
        .expect("schema_sql runs again on the upgraded table");

    let drop = match schema {
        Some(s) => format!("DROP SCHEMA \"{s}\" CASCADE"),
        None => format!("DROP TABLE {quoted}"),
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&admin)
        .await
        .expect("drop the test table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_upgrades_a_table_of_the_previous_schema() {
    upgrades_in_place(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_upgrades_a_schema_qualified_table_of_the_previous_schema() {
    upgrades_in_place(Some(&support::unique("idemkey_schema"))).await;
}

/// The table and indexes of the layout before `sweep_at` (indexes on `expires_at` and on
/// in-progress rows, default storage parameters), as `PostgresStore::schema_sql` wrote
/// them.
fn layout_before_sweep_at(table: &str) -> String {
    format!(
        "CREATE TABLE \"{table}\" (
    id          bytea       PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       bytea,
    payload     bytea,
    taken_over  boolean     NOT NULL DEFAULT false,
    expires_at  timestamptz NOT NULL,
    created     timestamptz NOT NULL DEFAULT now(),
    retention   bigint      NOT NULL DEFAULT 0
);
CREATE INDEX \"{table}_expires_at\" ON \"{table}\" (expires_at);
CREATE INDEX \"{table}_in_progress\" ON \"{table}\" (created) WHERE payload IS NULL;"
    )
}

/// `migrate` moves a table of the layout before `sweep_at` to the churn layout: the
/// old indexes are dropped, the sweep's index and the storage parameters are in place,
/// the old rows are replayed and completed as before, and the sweep dates them and
/// removes the expired ones (only those).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_moves_a_table_of_the_layout_before_sweep_at_to_the_churn_layout() {
    let table = support::unique("idemkey_test");
    let admin = support::postgres_admin(&support::postgres_url()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(layout_before_sweep_at(&table)))
        .execute(&admin)
        .await
        .expect("a table of the layout before sweep_at");
    let id = |key: &str| RecordId::new("old", key);
    let (running, abandoned) = (FencingToken::random(), FencingToken::random());
    // Live: completed, running, abandoned within its retention. Expired: completed, and
    // a claim past its lease and retention.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (id, fingerprint, token, payload, expires_at, created, retention)
VALUES ($1, 'fp', NULL, 'old payload', now() + interval '1 hour', now(), 0),
  ($2, 'fp', $3, NULL, now() + interval '1 hour', now(), 3600000000),
  ($4, 'fp', $5, NULL, now() - interval '1 second', now() - interval '1 minute', 3600000000),
  ($6, 'fp', NULL, 'gone', now() - interval '1 second', now() - interval '1 minute', 0),
  ($7, 'fp', $5, NULL, now() - interval '2 seconds', now() - interval '1 minute', 1000000)"
    )))
    .bind(id("done").as_bytes().as_slice())
    .bind(id("running").as_bytes().as_slice())
    .bind(running.to_bytes().as_slice())
    .bind(id("abandoned").as_bytes().as_slice())
    .bind(abandoned.to_bytes().as_slice())
    .bind(id("expired").as_bytes().as_slice())
    .bind(id("lapsed").as_bytes().as_slice())
    .execute(&admin)
    .await
    .expect("rows of the layout before sweep_at");

    let store = support::postgres_store(&table).await;
    let exists = |index: &'static str| {
        let (admin, name) = (&admin, format!("\"{table}_{index}\""));
        async move {
            let found: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                .bind(name)
                .fetch_one(admin)
                .await
                .expect("look the index up");
            found
        }
    };
    assert!(exists("sweep_at").await, "the sweep's index is made");
    assert!(!exists("expires_at").await, "the expiry index is dropped");
    assert!(
        !exists("in_progress").await,
        "the in-progress index is dropped"
    );
    let options: Vec<String> =
        sqlx::query_scalar("SELECT unnest(reloptions) FROM pg_class WHERE oid = to_regclass($1)")
            .bind(format!("\"{table}\""))
            .fetch_all(&admin)
            .await
            .expect("storage parameters");
    for option in ["fillfactor=95", "autovacuum_vacuum_scale_factor=0.01"] {
        assert!(
            options.iter().any(|o| o == option),
            "{option} in {options:?}"
        );
    }

    let claim = |key: &'static str| {
        let store = &store;
        async move {
            store
                .claim(ClaimRequest {
                    id: &id(key),
                    fingerprint: b"fp",
                    token: FencingToken::random(),
                    lease: Duration::from_secs(60),
                    retention: Duration::from_secs(60),
                })
                .await
                .expect("claim")
        }
    };
    assert_eq!(
        claim("done").await,
        Claim::Completed {
            fingerprint: "fp".into(),
            payload: "old payload".into()
        }
    );
    assert!(matches!(claim("running").await, Claim::InProgress { .. }));

    let pass = store
        .sweep_pass(&idemkey::store::SweepOptions::new())
        .await
        .expect("sweep");
    assert_eq!(
        pass.removed(),
        2,
        "the expired record and the claim past its retention"
    );
    let undated: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{table}\" WHERE sweep_at = '-infinity'"
    )))
    .fetch_one(&admin)
    .await
    .expect("count");
    assert_eq!(undated, 0, "the sweep dates every old row");
    for (key, owner) in [("running", running), ("abandoned", abandoned)] {
        store
            .complete(
                &id(key),
                owner,
                "new payload".into(),
                Duration::from_secs(60),
            )
            .await
            .expect("the owner of an old claim completes it");
        assert!(matches!(claim(key).await, Claim::Completed { .. }));
    }
    assert_eq!(store.sweep().await.expect("sweep"), 0, "live records stay");
    sqlx::raw_sql(sqlx::AssertSqlSafe(store.schema_sql()))
        .execute(&admin)
        .await
        .expect("schema_sql runs again on the moved table");
    admin.close().await;
    support::drop_postgres_table(&table).await;
}

/// Renewals and completions change no indexed column, so PostgreSQL makes every one of
/// them a heap-only (HOT) update: no new index entries, old versions pruned on the page.
#[tokio::test]
async fn renewals_and_completions_are_heap_only_updates() {
    let table = support::unique("idemkey_test");
    let store = support::postgres_store(&table).await;
    let lease = Duration::from_secs(60);
    for key in ["a", "b", "c"] {
        let (id, token) = (RecordId::new("hot", key), FencingToken::random());
        store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"fp",
                token,
                lease,
                retention: lease,
            })
            .await
            .expect("claim");
        store.renew(&id, token, lease).await.expect("renew");
        store
            .complete(&id, token, "reply".into(), lease)
            .await
            .expect("complete");
    }
    // A session reports its counters when it ends.
    drop(store);
    let admin = support::postgres_admin(&support::postgres_url()).await;
    // Counters arrive within seconds of the sessions' end; ten minutes is a hang.
    let mut counted = (0, 0);
    for _ in 0..6000 {
        counted = sqlx::query_as(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
        )
        .bind(format!("\"{table}\""))
        .fetch_one(&admin)
        .await
        .expect("pg_stat_user_tables");
        if counted.0 >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (updates, hot): (i64, i64) = counted;
    assert_eq!(
        (updates, hot),
        (6, 6),
        "three renewals and three completions, all HOT"
    );
    admin.close().await;
    support::drop_postgres_table(&table).await;
}

/// A store on the shared PostgreSQL whose sessions carry `app` as their
/// `application_name` (so that `pg_stat_activity` tells them apart from every other
/// test's), with its own table (created), and a pool beside it for the test.
async fn store_named(
    app: &str,
    table: &str,
    configure: impl FnOnce(idemkey::store::PostgresStoreBuilder) -> idemkey::store::PostgresStoreBuilder,
) -> (PostgresStore, sqlx::PgPool) {
    let base = support::postgres_url();
    let joint = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{joint}application_name={app}");
    let store = configure(PostgresStore::builder(url).table(table))
        .connect()
        .await
        .expect("connect to the shared PostgreSQL");
    store.migrate().await.expect("create the test table");
    (
        store,
        support::postgres_admin(&support::postgres_url()).await,
    )
}

/// The sessions of `app` whose statement waits for a lock, once there are `n` of them.
async fn lock_waiters(admin: &sqlx::PgPool, app: &str, n: usize) -> Vec<i32> {
    loop {
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1
             AND wait_event_type = 'Lock'",
        )
        .bind(app)
        .fetch_all(admin)
        .await
        .expect("read pg_stat_activity");
        if pids.len() >= n {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes `table` from every other session until the transaction ends.
async fn lock_table(
    admin: &sqlx::PgPool,
    table: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut lock = admin.begin().await.expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE \"{table}\" IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *lock)
    .await
    .expect("lock the table");
    lock
}

/// The backends of `app` whose last statement was the claim.
async fn claiming_sessions(admin: &sqlx::PgPool, app: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1
         AND query LIKE 'WITH live AS%'",
    )
    .bind(app)
    .fetch_all(admin)
    .await
    .expect("read pg_stat_activity")
}

/// A fresh key's claim and completion, then its replay, all served.
async fn serve_a_key(store: &PostgresStore, key: &str) {
    let (id, token) = (RecordId::new("t", key), FencingToken::random());
    let claim = |token| ClaimRequest {
        id: &id,
        fingerprint: b"fp",
        token,
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(60),
    };
    assert_eq!(
        store.claim(claim(token)).await.expect("claim"),
        Claim::Acquired { takeover: false }
    );
    store
        .complete(&id, token, "reply".into(), Duration::from_secs(60))
        .await
        .expect("complete");
    assert_eq!(
        store
            .claim(claim(FencingToken::random()))
            .await
            .expect("replay"),
        Claim::Completed {
            fingerprint: "fp".into(),
            payload: "reply".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cancelled_mid_statement_leaves_its_session_serving_the_others() {
    let (table, app) = (
        support::unique("idemkey_cancel"),
        support::unique("idemkey_cancel"),
    );
    // 3 connections: 1 for requests, so every statement goes to the same session.
    let (store, admin) = store_named(&app, &table, |b| b.max_connections(3)).await;
    let lock = lock_table(&admin, &table).await;
    let claiming = tokio::spawn({
        let store = store.clone();
        async move { support::busy_store::claim_new(&store, "cancelled").await }
    });
    // The claim's statement is on the server, waiting for the lock: drop the request.
    let blocked = lock_waiters(&admin, &app, 1).await;
    claiming.abort();
    assert!(claiming.await.expect_err("aborted").is_cancelled());
    lock.rollback().await.expect("unlock");

    serve_a_key(&store, "next").await;
    // The same session served them: the cancelled statement's answer was read and
    // dropped, and the session was neither closed nor left out of step.
    assert_eq!(claiming_sessions(&admin, &app).await, blocked);
    support::drop_postgres_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_at_a_time_holds_one_session_and_a_crowd_opens_more() {
    let (table, app) = (
        support::unique("idemkey_quiet"),
        support::unique("idemkey_quiet"),
    );
    // 16 connections: 14 for requests, opened only as the requests need them.
    let (store, admin) = store_named(&app, &table, |b| b).await;
    for i in 0..20 {
        serve_a_key(&store, &format!("quiet-{i}")).await;
    }
    assert_eq!(
        claiming_sessions(&admin, &app).await.len(),
        1,
        "sequential requests share the one open session"
    );
    // Requests in flight together open new sessions, up to the budget: with the table
    // locked, each session's first statement waits, and the next request opens another.
    let lock = lock_table(&admin, &table).await;
    let crowd: Vec<_> = (0..40)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                support::busy_store::claim_new(&store, &format!("crowd-{i}")).await
            })
        })
        .collect();
    lock_waiters(&admin, &app, 14).await;
    lock.rollback().await.expect("unlock");
    for claim in crowd {
        let claim = claim.await.expect("claim task").expect("claim");
        assert_eq!(claim, Claim::Acquired { takeover: false });
    }
    let sessions = claiming_sessions(&admin, &app).await.len();
    assert_eq!(sessions, 14, "40 claims in flight fill the budget, no more");
    support::drop_postgres_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_server_ends_is_replaced() {
    let (table, app) = (
        support::unique("idemkey_ended"),
        support::unique("idemkey_ended"),
    );
    let (store, admin) = store_named(&app, &table, |b| b.max_connections(3)).await;
    serve_a_key(&store, "before").await;
    let ended = claiming_sessions(&admin, &app).await;
    assert_eq!(ended.len(), 1, "one request session: {ended:?}");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(ended[0])
        .fetch_one(&admin)
        .await
        .expect("pg_terminate_backend");
    assert!(terminated);
    // A statement sent before the client learnt of the end fails unavailable (503);
    // the next is served on a new session.
    let mut served = false;
    for attempt in 0..50 {
        let claim = support::busy_store::claim_new(&store, &format!("after-{attempt}")).await;
        match claim {
            Ok(claim) => {
                assert_eq!(claim, Claim::Acquired { takeover: false });
                served = true;
                break;
            }
            Err(e) => assert!(e.is_unavailable(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "no claim was served after the session ended");
    let now = claiming_sessions(&admin, &app).await;
    assert!(
        now.len() == 1 && now[0] != ended[0],
        "served on {now:?}, the ended session was {ended:?}"
    );
    support::drop_postgres_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_budget_holds_and_a_request_waits_at_most_acquire_timeout() {
    let (table, app) = (
        support::unique("idemkey_budget"),
        support::unique("idemkey_budget"),
    );
    // 5 connections: 3 for requests, 2 for the rest (a sweep pass takes both).
    let (store, admin) = store_named(&app, &table, |b| {
        b.max_connections(5)
            .acquire_timeout(Duration::from_millis(200))
    })
    .await;
    let lock = lock_table(&admin, &table).await;
    // Each request session carries 4 statements at most (the store's pipeline depth).
    let mut crowd = support::busy_store::Crowd::start(std::sync::Arc::new(store), 3 * 4 + 5);
    // Every connection is busy: the 3 request sessions, with 12 claims between them,
    // and the sweep's batch wait for the lock (the sweep's lock connection beside it).
    // The 5 other claims, and a second sweep, wait for room and give up after the
    // timeout.
    lock_waiters(&admin, &app, 4).await;
    crowd.expect_refused(3, 5).await;
    let sessions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&admin)
            .await
            .expect("read pg_stat_activity");
    assert_eq!(sessions, 5, "the store holds its budget, no more");
    lock.rollback().await.expect("unlock");
    crowd.expect_served().await;
    support::drop_postgres_table(&table).await;
}
