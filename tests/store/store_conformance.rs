//! The store conformance suite (`idemkey::testing::conformance`) against every store:
//! memory here, and each real store against its real server.

use crate::support;

use idemkey::store::MemoryStore;
use idemkey::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_conforms() {
    conformance::run(|| async { MemoryStore::new() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_store_conforms() {
    use idemkey::store::RedisStore;
    let url = support::redis_url();
    let prefix = format!("{}:", support::unique("idemkey-test"));
    conformance::run(|| {
        let (url, prefix) = (url.clone(), prefix.clone());
        async move {
            RedisStore::builder(&url)
                .prefix(prefix)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_conforms() {
    let table = support::unique("idemkey_test");
    let store = support::postgres_store(&table).await;
    conformance::run(|| {
        let store = store.clone();
        async move { store }
    })
    .await;
    support::drop_postgres_table(&table).await;
}

/// With `notify(true)` complete and release are other statements (they `NOTIFY` in
/// the same statement): the contract holds for them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notifying_postgres_store_conforms() {
    let table = support::unique("idemkey_test");
    let url = support::postgres_url();
    let store = idemkey::store::PostgresStore::builder(&url)
        .table(&table)
        .notify(true)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"));
    store.migrate().await.expect("create the test table");
    conformance::run(|| {
        let store = store.clone();
        async move { store }
    })
    .await;
    support::drop_postgres_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_store_conforms() {
    use idemkey::store::SqliteStore;
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("records.db");
    let store = SqliteStore::open(&path)
        .await
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    conformance::run(|| {
        let store = store.clone();
        async move { store }
    })
    .await;
    store.close().await;
}

#[tokio::test]
async fn open_picks_the_store_by_url() {
    use idemkey::store::{Claim, ClaimRequest, FencingToken, RecordId};
    use std::time::Duration;
    let dir = support::TempDir::new("idemkey-open");
    let sqlite = format!("sqlite://{}", dir.path().join("open.db").display());
    for url in [
        "memory".to_owned(),
        support::redis_url(),
        support::postgres_url(),
        sqlite,
    ] {
        let store = idemkey::store::open(&url)
            .await
            .unwrap_or_else(|e| panic!("open({url}) must work: {e}"));
        let id = RecordId::new("open", &support::unique("k"));
        let token = FencingToken::random();
        let lease = Duration::from_secs(60);
        let claim = store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"fp",
                token,
                lease,
                retention: lease,
            })
            .await
            .unwrap_or_else(|e| panic!("claim on {url}: {e}"));
        assert_eq!(claim, Claim::Acquired { takeover: false }, "{url}");
        store
            .release(&id, token)
            .await
            .unwrap_or_else(|e| panic!("release on {url}: {e}"));
    }
    let err = idemkey::store::open("sqlite://")
        .await
        .err()
        .expect("no path");
    assert!(err.is_unsupported(), "{err}");
    let err = idemkey::store::open(&format!("redis://127.0.0.1:{}", support::free_port()))
        .await
        .err()
        .expect("nothing listens there");
    assert!(err.is_unavailable(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_store_conforms() {
    use idemkey::store::RedisStore;
    let cluster = support::RedisCluster::start();
    let urls = cluster.urls();
    conformance::run(|| {
        let urls = urls.clone();
        async move {
            RedisStore::cluster(urls)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("the private Redis Cluster must be reachable: {e}"))
        }
    })
    .await;
}
