//! Several verifier instances sharing one store: 400 concurrent same-key requests spread
//! over 4 apps run the handler exactly once, and every caller gets the same completed
//! reply.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idemkey::store::Store;
use idemkey::testing::TestServer;
use support::apps::{self, ChargeApp};
use support::gate::Gate;
use support::verifier::Answer;

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
