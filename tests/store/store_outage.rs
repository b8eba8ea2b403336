//! Store outages: a private server started by the test is killed by its pid mid-run.
//! While it is down requests get 503 with Retry-After and no handler runs; once it is
//! back traffic resumes by itself, nothing completed before the outage runs again, and
//! an outcome the verifier held through the outage is recorded.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use idemkey::store::Store;
use support::apps::{self, ChargeApp};
use support::verifier::Answer;

const KEYS: usize = 20;

/// A store on the private Redis at `url`, answering within 1 s while it is down.
async fn redis_store(url: &str) -> Arc<dyn Store> {
    let store = idemkey::store::RedisStore::builder(url)
        .response_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect("connect to the private Redis");
    Arc::new(store)
}

/// Sends `key` until the reply is not a 503 (the store reconnecting), bounded.
async fn charge_when_back(client: &reqwest::Client, addr: SocketAddr, key: &str) -> Answer {
    for _ in 0..200 {
        let reply = apps::charge(client, addr, key).await;
        if reply.status != 503 {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the verifier still answered 503 long after the store came back");
}

/// Runs the outage scenario against two apps over `store`; `kill` and `restart` act on
/// the store's private server.
async fn outage_scenario(store: Arc<dyn Store>, mut kill: impl FnMut(), mut restart: impl FnMut()) {
    let app = ChargeApp::new();
    let apps = [
        apps::spawn_app(Arc::clone(&store), &app).await,
        apps::spawn_app(store, &app).await,
    ];
    let client = reqwest::Client::new();
    let before: Vec<String> = (0..KEYS)
        .map(|i| format!("before-{i}-{}", uuid::Uuid::new_v4()))
        .collect();
    let during: Vec<String> = (0..KEYS)
        .map(|i| format!("during-{i}-{}", uuid::Uuid::new_v4()))
        .collect();

    let mut completed = Vec::new();
    for (i, key) in before.iter().enumerate() {
        let reply = apps::charge(&client, apps[i % 2].addr(), key).await;
        assert_eq!(reply.status, 200, "before the outage: {reply:?}");
        completed.push(reply.body);
    }
    assert_eq!(app.executions().count(), KEYS as u64);

    kill();
    // Concurrently: each request may wait for the store's timeout before its 503.
    let mut refused = tokio::task::JoinSet::new();
    for (i, key) in before.iter().chain(&during).enumerate() {
        let (client, key, addr) = (client.clone(), key.clone(), apps[i % 2].addr());
        refused.spawn(async move { apps::charge(&client, addr, &key).await });
    }
    for reply in refused.join_all().await {
        assert_eq!(reply.status, 503, "while the store is down: {reply:?}");
        assert!(
            reply.retry_after().is_some(),
            "503 carries Retry-After: {reply:?}"
        );
    }
    assert_eq!(
        app.executions().count(),
        KEYS as u64,
        "no handler ran while the store was down"
    );

    restart();
    for (i, key) in before.iter().enumerate() {
        let reply = charge_when_back(&client, apps[i % 2].addr(), key).await;
        assert_eq!(reply.status, 200, "after the outage: {reply:?}");
        assert!(
            reply.replayed(),
            "a request completed before the outage is replayed"
        );
        assert_eq!(
            reply.body, completed[i],
            "the stored reply survived the outage"
        );
    }
    assert_eq!(
        app.executions().count(),
        KEYS as u64,
        "nothing completed before the outage ran again"
    );
    for (i, key) in during.iter().enumerate() {
        let reply = charge_when_back(&client, apps[i % 2].addr(), key).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(
            !reply.replayed(),
            "a request refused during the outage runs now"
        );
    }
    assert_eq!(
        app.executions().count(),
        2 * KEYS as u64,
        "each refused request ran once afterwards"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage() {
    // Durable (append-only file, fsync always): what a Redis holding idempotency
    // records must be, or a restart forgets completed requests.
    let server = std::sync::Mutex::new(support::RedisServer::start_durable());
    let url = server.lock().expect("server").url();
    outage_scenario(
        redis_store(&url).await,
        || server.lock().expect("server").kill(),
        || server.lock().expect("server").restart(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage() {
    let server = std::sync::Mutex::new(support::PgServer::start());
    let url = server.lock().expect("server").url();
    let mut store = None;
    for _ in 0..100 {
        // The server may still be starting up.
        match idemkey::store::PostgresStore::builder(&url)
            .acquire_timeout(Duration::from_millis(500))
            .connect()
            .await
        {
            Ok(s) => {
                store = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let store = store.expect("connect to the private PostgreSQL");
    store.migrate().await.expect("create the schema");
    outage_scenario(
        Arc::new(store),
        || server.lock().expect("server").kill(),
        || server.lock().expect("server").restart(),
    )
    .await;
}

/// Counts the 503 answers that reach the client stack's retry loop.
#[derive(Clone, Default)]
struct Count503(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Count503 {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let resp = next.run(req, extensions).await?;
        if resp.status() == 503 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(resp)
    }
}

/// The two halves together through a store outage: the client stack keeps each
/// operation's key across the verifier's 503s, honours their `Retry-After`, and once
/// the store is back every operation is charged exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_stack_rides_out_a_store_outage_and_charges_exactly_once() {
    use idemkey::client::{IdempotentClientBuilder, ResponseExt};

    let mut server = support::RedisServer::start_durable();
    let store = redis_store(&server.url()).await;
    let app = ChargeApp::new();
    let apps = [
        apps::spawn_app(Arc::clone(&store), &app).await,
        apps::spawn_app(store, &app).await,
    ];
    let refusals = Count503::default();
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .max_retries(30)
        .retry_after_cap(Duration::from_secs(1))
        .deadline(Duration::from_secs(60))
        .with_inner(refusals.clone())
        .build();

    server.kill();
    let mut operations = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let (client, addr) = (client.clone(), apps[i % 2].addr());
        operations.spawn(async move {
            let resp = client
                .post(format!("http://{addr}/v1/charges"))
                .header("content-type", "application/json")
                .body(format!(r#"{{"amount":{i},"currency":"eur"}}"#))
                .send()
                .await
                .expect("the operation succeeds once the store is back");
            let info = resp.idempotency().expect("a POST carries a key").clone();
            (
                i,
                addr,
                info,
                resp.status(),
                resp.bytes().await.expect("body"),
            )
        });
    }
    // Every operation has been refused at least once before the store comes back
    // (bounded wait: 60 s).
    for _ in 0..600 {
        if refusals.0.load(std::sync::atomic::Ordering::SeqCst) >= KEYS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refusals.0.load(std::sync::atomic::Ordering::SeqCst) >= KEYS);
    assert_eq!(
        app.executions().count(),
        0,
        "nothing ran while the store was down"
    );
    tokio::task::block_in_place(|| server.restart());

    let done = operations.join_all().await;
    assert_eq!(
        app.executions().count(),
        KEYS as u64,
        "each operation charged exactly once"
    );
    let plain = reqwest::Client::new();
    for (i, addr, info, status, body) in done {
        assert_eq!(status, 200);
        assert!(info.attempts() >= 2, "retried through the outage: {info:?}");
        // A later retry of the same operation is a replay of the same charge.
        let reply = plain
            .post(format!("http://{addr}/v1/charges"))
            .header("idempotency-key", info.key().as_str())
            .header("content-type", "application/json")
            .body(format!(r#"{{"amount":{i},"currency":"eur"}}"#))
            .send()
            .await
            .expect("answer");
        assert_eq!(reply.status(), 200);
        assert_eq!(reply.headers()["idempotent-replayed"], "true");
        assert_eq!(reply.bytes().await.expect("body"), body);
    }
    assert_eq!(app.executions().count(), KEYS as u64);
}

/// Redis dies (SIGKILL) while a charge runs, and comes back (same port, same
/// append-only file) only after the charge's lease would have expired. The charge's
/// client is answered at once; the verifier keeps the outcome and records it once Redis
/// is back (the owner of an expired claim nobody took over may still complete it), so
/// the retry gets the replay and the charge ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_running_when_redis_dies_is_recorded_once_redis_is_back() {
    use idemkey::server::{Engine, IdempotencyLayer};
    use idemkey::store::{RecordId, RecordState};

    const LEASE: Duration = Duration::from_secs(1);
    let mut server = support::RedisServer::start_durable();
    let store = redis_store(&server.url()).await;
    let engine = Engine::builder(Arc::clone(&store)).lease(LEASE).build();
    let gate = support::gate::Gate::default();
    let app = ChargeApp::gated(gate.clone());
    let verifier = support::serve(app.router(IdempotencyLayer::new(engine.clone()))).await;
    let key = format!("outage-{}", uuid::Uuid::new_v4());

    let client = reqwest::Client::new();
    let charge = tokio::spawn({
        let (client, addr, key) = (client.clone(), verifier.addr(), key.clone());
        async move { apps::charge(&client, addr, &key).await }
    });
    gate.wait_entered(1).await; // the charge is running
    tokio::task::block_in_place(|| server.kill());
    gate.open(1);
    let first = charge.await.expect("the charge's client");
    assert_eq!(
        first.status, 200,
        "answered although Redis is down: {first:?}"
    );
    assert_eq!(app.executions().count(), 1);

    // Redis comes back after the lease would have expired.
    tokio::time::sleep(2 * LEASE).await;
    let back = std::time::SystemTime::now();
    tokio::task::block_in_place(|| server.restart());

    // Bounded: the outcome is recorded within a pause (1 s) of Redis answering again.
    let id = RecordId::new("", &key);
    let mut recorded = None;
    for _ in 0..300 {
        if let Ok(Some(info)) = store.inspect(&id).await
            && info.state == RecordState::Completed
        {
            recorded = Some(info);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = recorded.expect("the held outcome is recorded once Redis is back");
    assert!(
        info.created + LEASE <= back,
        "the scenario: the lease had ended before Redis came back ({info:?})"
    );
    engine.wait_for_recordings().await;

    let retry = apps::charge(&client, verifier.addr(), &key).await;
    assert_eq!(retry.status, 200, "{retry:?}");
    assert!(retry.replayed(), "the retry gets the replay: {retry:?}");
    assert_eq!(retry.body, first.body, "the same charge");
    assert_eq!(app.executions().count(), 1, "the charge ran once");
}
