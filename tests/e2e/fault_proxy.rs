//! `testing::FaultProxy`: faults at the network level between a client and a verifier.

use std::time::Duration;

use axum::routing::post;
use idemkey::client::{IdempotentClientBuilder, ResponseExt};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use idemkey::testing::{Executions, Fault, FaultProxy, FaultRates, TestServer};
use retry_policies::policies::ExponentialBackoff;

async fn verified_counter() -> (TestServer, Executions) {
    let executions = Executions::default();
    let seen = executions.clone();
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let seen = seen.clone();
                async move { format!("{{\"charge\":{}}}", seen.record()) }
            }),
        )
        .layer(IdempotencyLayer::new(Engine::new(MemoryStore::new())));
    let server = TestServer::start(app).await.expect("server starts");
    (server, executions)
}

fn client() -> reqwest_middleware::ClientWithMiddleware {
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(5))
        .build_with_max_retries(8);
    IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(policy)
        .build()
}

#[tokio::test]
async fn lost_responses_are_recovered_by_the_retry_with_one_execution_each() {
    let (server, executions) = verified_counter().await;
    // Lose the first two answers of every key, after the verifier processed them.
    let proxy = FaultProxy::start(server.addr(), |shot| {
        if shot.key_attempt < 2 {
            Fault::LoseResponse
        } else {
            Fault::None
        }
    })
    .await
    .expect("proxy starts");
    let client = client();
    for _ in 0..20 {
        let response = client
            .post(proxy.url("/v1/charges"))
            .body("{}")
            .send()
            .await
            .expect("the third attempt gets the replay");
        let info = response.idempotency().expect("keyed").clone();
        assert_eq!((info.attempts(), info.replayed()), (3, true));
    }
    assert_eq!(executions.count(), 20, "one execution per logical call");
    let stats = proxy.stats();
    assert_eq!((stats.attempts, stats.lost_responses), (60, 40));
}

#[tokio::test]
async fn a_reset_reaches_nothing_upstream() {
    let (server, executions) = verified_counter().await;
    let proxy = FaultProxy::start(server.addr(), |_| Fault::Reset)
        .await
        .expect("proxy starts");
    let sent = reqwest::Client::new()
        .post(proxy.url("/v1/charges"))
        .header("idempotency-key", "k-1")
        .send()
        .await;
    assert!(sent.is_err(), "the connection was closed without an answer");
    assert_eq!(executions.count(), 0, "nothing was forwarded");
    assert_eq!(proxy.stats().resets, 1);
}

#[tokio::test]
async fn seeded_faults_keep_exactly_once_under_concurrency() {
    let (server, executions) = verified_counter().await;
    let rates = FaultRates {
        lose: 0.3,
        reset: 0.1,
        ..FaultRates::default()
    };
    let seeded = Fault::seeded(42, rates);
    // Seeded faults on each key's first three attempts; the fourth always gets through,
    // so every call is answered within its retries whatever the interleaving.
    let plan = move |shot: idemkey::testing::Shot| {
        if shot.key_attempt < 3 {
            seeded(shot)
        } else {
            Fault::None
        }
    };
    let proxy = FaultProxy::start(server.addr(), plan)
        .await
        .expect("proxy starts");
    let client = client();
    let calls = (0..100).map(|_| {
        let client = client.clone();
        let url = proxy.url("/v1/charges");
        async move { client.post(url).body("{}").send().await }
    });
    let results = futures_util::future::join_all(calls).await;
    let answered = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(answered, 100, "every call is answered within its retries");
    assert_eq!(
        executions.count(),
        100,
        "faults never caused a second execution"
    );
    let stats = proxy.stats();
    assert!(stats.lost_responses > 0 && stats.resets > 0, "{stats:?}");
}
