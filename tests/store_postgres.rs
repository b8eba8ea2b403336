//! PostgreSQL-specific behaviour: the claim statement under concurrency from several
//! pools, concurrent migrations, the sweep, and errors.

mod support;

use std::time::Duration;

use idemkey::store::{Claim, ClaimRequest, FencingToken, PostgresStore, RecordId, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_several_pools_are_atomic_and_return_the_row() {
    let table = support::unique("idemkey_test");
    let first = support::postgres_store(&table).await;
    let mut stores = vec![first.clone()];
    for _ in 0..3 {
        stores.push(support::postgres_store(&table).await);
    }
    // Several rounds: each a fresh record raced by 200 claims over 4 pools; then the
    // same record raced again after the winner completed.
    for round in 0..5 {
        let id = RecordId::new("race", &format!("{table}-{round}"));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200 {
            let store = stores[i % stores.len()].clone();
            tasks.spawn(async move {
                let token = FencingToken::random();
                let fp = format!("fp{i}").into_bytes();
                let lease = Duration::from_secs(60);
                let claim = store
                    .claim(ClaimRequest {
                        id: &id,
                        fingerprint: &fp,
                        token,
                        lease,
                    })
                    .await
                    .expect("claim");
                (token, fp, claim)
            });
        }
        let results = tasks.join_all().await;
        let winners: Vec<_> = results
            .iter()
            .filter(|(_, _, c)| matches!(c, Claim::Acquired { .. }))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one claim wins");
        let (token, fp, _) = winners[0];
        for (_, _, c) in &results {
            match c {
                Claim::Acquired { takeover } => assert!(!takeover),
                Claim::InProgress { fingerprint, .. } => assert_eq!(fingerprint, fp.as_slice()),
                Claim::Completed { .. } => panic!("nothing was completed yet"),
            }
        }
        first
            .complete(&id, *token, "done".into(), Duration::from_secs(60))
            .await
            .expect("complete");
        let again = stores[1]
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"x",
                token: FencingToken::random(),
                lease: Duration::from_secs(60),
            })
            .await
            .expect("claim");
        assert_eq!(
            again,
            Claim::Completed {
                fingerprint: fp.clone().into(),
                payload: "done".into()
            }
        );
    }
    support::drop_postgres_table(&first, &table).await;
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
            })
            .await
            .expect("claim");
        store
            .complete(&id, token, "p".into(), retention)
            .await
            .expect("complete");
    }
    // An in-progress record whose lease ended is swept too.
    let id = RecordId::new("sweep", "lease");
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: short,
        })
        .await
        .expect("claim");

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
        "two expired completed records and one expired lease"
    );
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{table}\""
    )))
    .fetch_one(store.pool())
    .await
    .expect("count");
    assert_eq!(left, 1, "the live record stays");
    support::drop_postgres_table(&store, &table).await;
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
    support::drop_postgres_table(&store, &table).await;
}

#[tokio::test]
async fn bad_configuration_and_unreachable_database_are_unavailable() {
    let err = PostgresStore::builder(support::postgres_url())
        .table("x; DROP TABLE y")
        .connect()
        .await
        .expect_err("invalid table name");
    assert!(
        err.is_unavailable() && err.to_string().contains("table name"),
        "{err}"
    );
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/test",
        support::free_port()
    );
    let err = PostgresStore::connect(url)
        .await
        .expect_err("nothing listens there");
    assert!(err.is_unavailable(), "{err}");
}
