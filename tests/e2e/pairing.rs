//! The client half paired with the verifier over loopback, through the fault injector:
//! exactly-once effects although responses are lost.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use idemkey::IdempotencyKey;
use idemkey::client::{Error, IdempotentClientBuilder, RequestBuilderExt, ResponseExt};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use idemkey::testing::{Executions, Fault, FaultInjector, TestServer};
use support::apps::ChargeApp;
use support::gate::Gate;
use tokio::sync::Semaphore;

async fn charge_app() -> (ChargeApp, TestServer) {
    let app = ChargeApp::new();
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()));
    let server = support::serve(app.router(layer)).await;
    (app, server)
}

fn client(faults: &FaultInjector) -> reqwest_middleware::ClientWithMiddleware {
    IdempotentClientBuilder::new(reqwest::Client::new())
        .with_inner(faults.clone())
        .build()
}

async fn charge(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    amount: u64,
) -> (String, u32, bool) {
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(format!(r#"{{"amount":{amount}}}"#))
        .send()
        .await
        .expect("the charge succeeds despite the faults");
    assert_eq!(resp.status(), 200);
    let info = resp.idempotency().expect("keyed").clone();
    let body: serde_json::Value =
        serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(body["amount"], amount);
    (
        body["id"].as_str().expect("id").to_owned(),
        info.attempts(),
        info.replayed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_first_response_lost_still_charges_exactly_once() {
    let (app, server) = charge_app().await;
    let faults = FaultInjector::new(|s| {
        if s.key_attempt == 0 {
            Fault::LoseResponse
        } else {
            Fault::None
        }
    });
    let client = client(&faults);
    let url = server.url("/v1/charges");
    let results = join_all((0..100).map(|i| charge(&client, &url, 1000 + i))).await;

    let ids: HashSet<_> = results.iter().map(|(id, _, _)| id.clone()).collect();
    assert_eq!(ids.len(), 100, "one distinct charge per operation");
    for (id, attempts, replayed) in &results {
        assert_eq!(
            (*attempts, *replayed),
            (2, true),
            "{id}: lost, retried, replayed"
        );
    }
    assert_eq!(faults.stats().lost_responses, 100);
    assert_eq!(app.executions().count(), 100, "no charge ran twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_faults_lose_delay_and_reset_still_give_exactly_once() {
    let (app, server) = charge_app().await;
    let faults = FaultInjector::new(|s| match (s.key_attempt, s.key_index % 6) {
        (0, 0) => Fault::LoseResponse,
        (1, 0) => Fault::LoseResponse,
        (0, 1) => Fault::Reset,
        (1, 1) => Fault::LoseResponse,
        (0, 2) => Fault::Delay(Duration::from_millis(20)),
        _ => Fault::None,
    });
    let client = client(&faults);
    let url = server.url("/v1/charges");
    let results = join_all((0..60).map(|i| charge(&client, &url, i))).await;

    let ids: HashSet<_> = results.iter().map(|(id, _, _)| id.clone()).collect();
    assert_eq!(ids.len(), 60);
    let stats = faults.stats();
    assert_eq!(
        (stats.lost_responses, stats.resets, stats.delays),
        (30, 10, 10)
    );
    let replayed = results.iter().filter(|(_, _, r)| *r).count();
    assert_eq!(replayed, 20, "every charge whose last response was lost");
    let attempts: u32 = results.iter().map(|(_, a, _)| a).sum();
    assert_eq!(
        attempts,
        60 + 2 * 10 + 2 * 10,
        "two extra attempts for classes 0 and 1"
    );
    assert_eq!(app.executions().count(), 60);
}

/// Signals every 409 an attempt receives.
struct ConflictSeen(Arc<Semaphore>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for ConflictSeen {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let resp = next.run(req, ext).await?;
        if resp.status() == 409 {
            self.0.add_permits(1);
        }
        Ok(resp)
    }
}

#[tokio::test]
async fn a_duplicate_in_flight_gets_409_retries_and_receives_the_replay() {
    let (gate, runs) = (Gate::default(), Executions::default());
    let handler = {
        let (gate, runs) = (gate.clone(), runs.clone());
        move || async move {
            gate.pass().await;
            format!("order shipped, run {}", runs.record())
        }
    };
    let router = axum::Router::new().route("/v1/orders", axum::routing::post(handler));
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()));
    let server = TestServer::start_verified(router, layer)
        .await
        .expect("server");
    let conflicts = Arc::new(Semaphore::new(0));
    // The duplicate stands for another process: within one client, single flight would
    // have it share the first call's flight and never meet the server's 409.
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .single_flight(false)
        .with_inner(ConflictSeen(conflicts.clone()))
        .build();
    let url = server.url("/v1/orders");
    let key = IdempotencyKey::new("order-7").expect("key");
    let send = |client: reqwest_middleware::ClientWithMiddleware| {
        let (url, key) = (url.clone(), key.clone());
        async move {
            client
                .post(url)
                .idempotency_key(key)
                .body("ship")
                .send()
                .await
        }
    };

    let first = tokio::spawn(send(client.clone()));
    gate.wait_entered(1).await;
    let second = tokio::spawn(send(client.clone()));
    conflicts.acquire().await.expect("a 409").forget();
    gate.open(1);

    let (a, b) = (
        first.await.expect("task").expect("first"),
        second.await.expect("task").expect("second"),
    );
    let (ia, ib) = (
        a.idempotency().expect("keyed").clone(),
        b.idempotency().expect("keyed").clone(),
    );
    assert_eq!((ia.attempts(), ia.replayed()), (1, false));
    assert!(ib.attempts() >= 2, "the 409 in-progress was retried");
    assert!(ib.replayed());
    assert_eq!(
        a.bytes().await.expect("body"),
        b.bytes().await.expect("body")
    );
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn a_reused_key_surfaces_as_the_typed_error_after_one_attempt() {
    let (app, server) = charge_app().await;
    let faults = FaultInjector::new(|_| Fault::None);
    let client = client(&faults);
    let url = server.url("/v1/charges");
    let key = IdempotencyKey::new("order-8").expect("key");
    for amount in [800, 801] {
        let result = client
            .post(&url)
            .idempotency_key(key.clone())
            .header("content-type", "application/json")
            .body(format!(r#"{{"amount":{amount}}}"#))
            .send()
            .await;
        if amount == 800 {
            assert_eq!(result.expect("first").status(), 200);
        } else {
            let err = result.expect_err("another payload under the same key");
            let err = Error::from_middleware(&err).expect("an idemkey error");
            assert!(err.is_key_reused(), "{err}");
            assert_eq!(err.attempts(), 1);
        }
    }
    assert_eq!(faults.stats().attempts, 2);
    assert_eq!(app.executions().count(), 1);
}

#[tokio::test]
async fn a_failing_handler_releases_the_key_and_nothing_is_charged() {
    let (app, server) = charge_app().await;
    let faults = FaultInjector::new(|_| Fault::None);
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .with_inner(faults.clone())
        .max_retries(2)
        .build();
    let err = client
        .post(server.url("/v1/charges"))
        .header("content-type", "application/json")
        .body(r#"{"amount":900,"fail":true}"#)
        .send()
        .await
        .expect_err("500 on every attempt");
    let err = Error::from_middleware(&err).expect("an idemkey error");
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(
        err.attempts(),
        3,
        "each 500 released the key: every retry executed"
    );
    assert!(err.key().is_some());
    assert_eq!(app.executions().count(), 0);
}
