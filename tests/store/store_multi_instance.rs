//! Several verifier instances sharing one store: 400 concurrent same-key requests spread
//! over 4 apps run the handler exactly once, and every caller gets the same completed
//! reply; with waiting duplicates, 200 duplicates over 2 instances wait for the first
//! answer and get its replay, woken by the store's notifications.

use crate::support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idemkey::server::{Engine, IdempotencyLayer, policy::InProgressPolicy};
use idemkey::store::{ClaimRequest, FencingToken, RecordId, Store};
use idemkey::testing::TestServer;
use support::apps::{self, ChargeApp};
use support::gate::Gate;
use support::verifier::{Answer, CountedWatches};

const INSTANCES: usize = 4;
const REQUESTS: usize = 400;

async fn four_instances_run_the_handler_once<F, Fut>(mut make_store: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    let gate = Gate::default();
    let app = ChargeApp::gated(gate.clone());
    let mut servers: Vec<TestServer> = Vec::new();
    for _ in 0..INSTANCES {
        servers.push(apps::spawn_app(make_store().await, &app).await);
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(REQUESTS)
        .build()
        .expect("HTTP client");
    let key = uuid::Uuid::new_v4().to_string();

    // Phase 1: the handler is held at its gate, so exactly one request runs it and the
    // 399 others must all be told "in progress".
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Answer>();
    for i in 0..REQUESTS {
        let (client, key, tx, addr) = (
            client.clone(),
            key.clone(),
            tx.clone(),
            servers[i % INSTANCES].addr(),
        );
        tokio::spawn(async move {
            let _ = tx.send(apps::charge(&client, addr, &key).await);
        });
    }
    drop(tx);
    let mut conflicts = 0;
    while conflicts < REQUESTS - 1 {
        let reply = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("every duplicate is answered while the first runs")
            .expect("a reply");
        assert_eq!(
            reply.status, 409,
            "a duplicate of a running request: {reply:?}"
        );
        assert!(reply.retry_after().is_some(), "409 carries Retry-After");
        conflicts += 1;
    }
    assert_eq!(
        app.executions().count(),
        1,
        "exactly one request reached the handler"
    );
    gate.open(1);
    let first = rx.recv().await.expect("the first request's reply");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(!first.replayed());

    // Phase 2: 400 concurrent retries over the 4 instances all get the stored reply.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..REQUESTS {
        let (client, key, addr) = (client.clone(), key.clone(), servers[i % INSTANCES].addr());
        tasks.spawn(async move { apps::charge(&client, addr, &key).await });
    }
    for reply in tasks.join_all().await {
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(reply.replayed(), "a retry is a replay");
        assert_eq!(
            reply.body, first.body,
            "every caller gets the same completed reply"
        );
    }
    assert_eq!(
        app.executions().count(),
        1,
        "no retry ran the handler again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_instances_on_one_redis() {
    let url = support::redis_url();
    let prefix = format!("{}:", support::unique("idemkey-test"));
    four_instances_run_the_handler_once(|| {
        let (url, prefix) = (url.clone(), prefix.clone());
        async move {
            let store = idemkey::store::RedisStore::builder(&url)
                .prefix(prefix)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"));
            Arc::new(store) as Arc<dyn Store>
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_instances_on_one_postgres() {
    let table = support::unique("idemkey_test");
    four_instances_run_the_handler_once(|| {
        let table = table.clone();
        async move { Arc::new(support::postgres_store(&table).await) as Arc<dyn Store> }
    })
    .await;
    support::drop_postgres_table(&table).await;
}

const WAITERS: usize = 200;

/// Two verifier instances over `store` (each its own engine and 127.0.0.1 server) whose
/// duplicates wait up to `up_to`.
async fn waiting_instances(
    store: &CountedWatches,
    app: &ChargeApp,
    up_to: Duration,
) -> Vec<TestServer> {
    let mut servers = Vec::new();
    for _ in 0..2 {
        let layer = IdempotencyLayer::new(Engine::new(store.clone()))
            .in_progress(InProgressPolicy::Wait(up_to));
        servers.push(support::serve(app.router(layer)).await);
    }
    servers
}

/// 200 duplicates of a request held in its handler, over two instances, wait for its
/// answer: one execution, 200 replays, no 409. A duplicate with another body is refused
/// at once meanwhile. Then, with a short wait, duplicates past it get 409.
async fn duplicates_wait_for_the_first_answer(store: Arc<dyn Store>) {
    let store = CountedWatches::new(store);
    let gate = Gate::default();
    let app = ChargeApp::gated(gate.clone());
    let servers = waiting_instances(&store, &app, Duration::from_secs(120)).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(WAITERS)
        .build()
        .expect("HTTP client");
    let key = uuid::Uuid::new_v4().to_string();

    let first = tokio::spawn({
        let (client, key, addr) = (client.clone(), key.clone(), servers[0].addr());
        async move { apps::charge(&client, addr, &key).await }
    });
    gate.wait_entered(1).await;
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..WAITERS {
        let (client, key, addr) = (client.clone(), key.clone(), servers[i % 2].addr());
        waiters.spawn(async move { apps::charge(&client, addr, &key).await });
    }
    // Every duplicate found the request running and waits on the store's watch.
    tokio::time::timeout(Duration::from_secs(60), store.wait_watches(WAITERS as u32))
        .await
        .expect("every duplicate starts waiting");

    // Another request with the key is not made to wait: refused at once while the
    // first one is still held.
    let other = client
        .post(format!("http://{}/v1/charges", servers[1].addr()))
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(r#"{"amount":1,"currency":"eur"}"#)
        .send()
        .await
        .expect("answered");
    assert_eq!(
        other.status(),
        422,
        "a different request with the key is refused at once"
    );
    assert_eq!(app.executions().count(), 1, "the handler is still held");

    gate.open(1);
    let first = first.await.expect("the first request");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(!first.replayed());
    let replies = tokio::time::timeout(Duration::from_secs(60), waiters.join_all())
        .await
        .expect("every waiter is answered once the first request completed");
    for reply in &replies {
        assert_eq!(
            reply.status, 200,
            "a waiting duplicate gets the replay: {reply:?}"
        );
        assert!(reply.replayed(), "{reply:?}");
        assert_eq!(reply.body, first.body);
    }
    assert_eq!(replies.len(), WAITERS);
    assert_eq!(app.executions().count(), 1, "exactly one execution");

    // Past the wait: 409 with Retry-After, while the handler is still held.
    let short = waiting_instances(&store, &app, Duration::from_millis(200)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let held = tokio::spawn({
        let (client, key, addr) = (client.clone(), key.clone(), short[0].addr());
        async move { apps::charge(&client, addr, &key).await }
    });
    gate.wait_entered(1).await;
    let mut late = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (client, key, addr) = (client.clone(), key.clone(), short[i % 2].addr());
        late.spawn(async move { apps::charge(&client, addr, &key).await });
    }
    for reply in late.join_all().await {
        assert_eq!(reply.status, 409, "past the wait: {reply:?}");
        assert!(reply.retry_after().is_some(), "409 carries Retry-After");
    }
    gate.open(1);
    assert_eq!(held.await.expect("held").status, 200);
    assert_eq!(app.executions().count(), 2);
}

/// A watch made on one store instance is woken when another instance (another
/// connection) completes the record: by notification, since the watch is asked to
/// wait an hour.
async fn a_watch_is_woken_across_instances(watching: Arc<dyn Store>, completing: Arc<dyn Store>) {
    let id = RecordId::new("watch", &uuid::Uuid::new_v4().to_string());
    let token = FencingToken::random();
    let lease = Duration::from_secs(60);
    let req = ClaimRequest {
        id: &id,
        fingerprint: b"fp",
        token,
        lease,
        retention: lease,
    };
    completing.claim(req).await.expect("claim");
    let mut watch = watching.watch(&id).await.expect("watch");
    completing
        .complete(&id, token, "done".into(), lease)
        .await
        .expect("complete");
    tokio::time::timeout(
        Duration::from_secs(30),
        watch.settled(Duration::from_secs(3600)),
    )
    .await
    .expect("the completion on the other instance wakes the watch");
}

async fn redis_store(prefix: &str) -> Arc<dyn Store> {
    let url = support::redis_url();
    let store = idemkey::store::RedisStore::builder(&url)
        .prefix(prefix)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"));
    Arc::new(store)
}

async fn notifying_postgres_store(table: &str) -> Arc<dyn Store> {
    let url = support::postgres_url();
    let store = idemkey::store::PostgresStore::builder(&url)
        .table(table)
        .notify(true)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"));
    store.migrate().await.expect("create the test table");
    Arc::new(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_on_one_redis() {
    let prefix = format!("{}:", support::unique("idemkey-wait"));
    duplicates_wait_for_the_first_answer(redis_store(&prefix).await).await;
    a_watch_is_woken_across_instances(redis_store(&prefix).await, redis_store(&prefix).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_on_one_postgres() {
    let table = support::unique("idemkey_wait");
    duplicates_wait_for_the_first_answer(notifying_postgres_store(&table).await).await;
    a_watch_is_woken_across_instances(
        notifying_postgres_store(&table).await,
        notifying_postgres_store(&table).await,
    )
    .await;
    support::drop_postgres_table(&table).await;
}

#[tokio::test]
async fn waiting_duplicates_in_memory() {
    let store: Arc<dyn Store> = Arc::new(idemkey::store::MemoryStore::new());
    a_watch_is_woken_across_instances(store.clone(), store.clone()).await;
    duplicates_wait_for_the_first_answer(store).await;
}
