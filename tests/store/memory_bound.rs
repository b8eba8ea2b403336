//! The bounded memory store (issue 27): a flood of unique keys fills it; new keys get
//! `503 store-full` with `Retry-After`, while every record already there (other
//! scopes', and every request that ran) is kept and replayed; room comes back when
//! expired records are swept. Over HTTP on 127.0.0.1, through the layer, the function
//! API and a webhook batch receiver.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use idemkey::IdempotencyKey;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::extract::HeaderScope;
use idemkey::server::webhook::BatchDeduper;
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::{MemoryStore, Store};
use idemkey::testing::{Executions, TestServer};
use support::verifier::{http, problem};

const RETENTION: Duration = Duration::from_secs(3600);

/// `POST /charge`, behind the layer over `store`, scoped by the `x-tenant` header;
/// answers `201` naming the execution.
async fn charge_server(store: MemoryStore, fail_open: bool) -> (TestServer, Executions) {
    let runs = Executions::default();
    let engine = Engine::builder(store)
        .retention(RETENTION)
        .fail_open(fail_open)
        .build();
    let layer = IdempotencyLayer::new(engine)
        .scope(HeaderScope::new(http::HeaderName::from_static("x-tenant")));
    let router = Router::new()
        .route(
            "/charge",
            post(|State(runs): State<Executions>, body: Bytes| async move {
                let n = runs.record();
                (
                    http::StatusCode::CREATED,
                    format!("charge {n} of {} bytes", body.len()),
                )
            }),
        )
        .layer(layer)
        .with_state(runs.clone());
    let server = TestServer::start(router).await.expect("server starts");
    (server, runs)
}

async fn charge(
    client: &reqwest::Client,
    server: &TestServer,
    tenant: &str,
    key: &str,
) -> reqwest::Response {
    client
        .post(server.url("/charge"))
        .header("x-tenant", tenant)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(format!(r#"{{"key":"{key}"}}"#))
        .send()
        .await
        .expect("the verifier answers")
}

#[tokio::test]
async fn a_flood_of_new_keys_fills_the_memory_store_without_losing_or_evicting_a_record() {
    const BOUND: u64 = 20;
    let store = MemoryStore::builder()
        .max_records(BOUND)
        .build()
        .expect("bounds");
    let (server, runs) = charge_server(store.clone(), false).await;
    let client = http();

    // Tenant "acme" has records before the flood.
    let mut acme = Vec::new();
    for i in 0..5 {
        let key = format!("acme-{i}");
        let resp = charge(&client, &server, "acme", &key).await;
        assert_eq!(resp.status(), 201);
        acme.push((key, resp.bytes().await.expect("body")));
    }

    // One client floods unique keys, 10 at a time.
    let mut executed = Vec::new();
    let mut refused = 0;
    for batch in 0..10 {
        let answers = futures_util::future::join_all((0..10).map(|i| {
            let key = format!("flood-{batch}-{i}");
            let (client, server) = (&client, &server);
            async move { (key.clone(), charge(client, server, "flood", &key).await) }
        }))
        .await;
        for (key, resp) in answers {
            match resp.status().as_u16() {
                201 => executed.push((key, resp.bytes().await.expect("body"))),
                503 => {
                    let retry_after = resp.headers()["retry-after"]
                        .to_str()
                        .expect("ascii")
                        .to_owned();
                    assert!(retry_after.parse::<u64>().expect("seconds") >= 1);
                    let (_, case, body) = problem(resp).await;
                    assert_eq!(case, "store-full", "{body}");
                    refused += 1;
                }
                other => panic!("{key}: unexpected {other}"),
            }
        }
    }
    assert_eq!(
        executed.len() as u64,
        BOUND - 5,
        "the flood filled the rest"
    );
    assert_eq!(refused, 100 - executed.len());
    assert_eq!(runs.count(), BOUND, "only what was recorded ran");
    assert_eq!(store.len() as u64, BOUND);

    // Nothing was evicted or lost: every record that ran is replayed, byte for byte,
    // the other tenant's and the flood's alike, without running again.
    for (tenant, records) in [("acme", &acme), ("flood", &executed)] {
        for (key, body) in records {
            let resp = charge(&client, &server, tenant, key).await;
            assert_eq!(resp.status(), 201, "{tenant}/{key}");
            assert_eq!(resp.headers()["idempotent-replayed"], "true");
            assert_eq!(&resp.bytes().await.expect("body"), body);
        }
    }
    assert_eq!(runs.count(), BOUND);

    // A new key of another tenant is refused too: the bound is the store's.
    let resp = charge(&client, &server, "acme", "acme-new").await;
    assert_eq!(problem(resp).await.1, "store-full");

    // Once the records expire and a sweep runs, new keys are accepted again.
    tokio::time::pause();
    tokio::time::advance(RETENTION + Duration::from_secs(1)).await;
    tokio::time::resume();
    // (A sweep that a refused claim started may have removed some of them already.)
    assert!(store.sweep().await.expect("sweep") <= BOUND);
    assert!(store.is_empty());
    assert_eq!(store.stored_bytes(), 0);
    let resp = charge(&client, &server, "acme", "acme-new").await;
    assert_eq!(resp.status(), 201);
    assert_eq!(runs.count(), BOUND + 1);
}

#[tokio::test]
async fn fail_open_does_not_run_new_keys_on_a_full_store() {
    let store = MemoryStore::builder()
        .max_records(1)
        .build()
        .expect("bounds");
    let (server, runs) = charge_server(store, true).await;
    let client = http();
    assert_eq!(charge(&client, &server, "t", "k1").await.status(), 201);
    let resp = charge(&client, &server, "t", "k2").await;
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(problem(resp).await.1, "store-full");
    assert_eq!(
        runs.count(),
        1,
        "a full store is not an outage: nothing ran unguarded"
    );
}

#[tokio::test]
async fn the_byte_budget_bounds_large_responses_and_completions_still_land() {
    // Room for a few claims; every completion lands even past the budget.
    let budget = 3 * (MemoryStore::RECORD_OVERHEAD + 64);
    let store = MemoryStore::builder()
        .max_bytes(budget)
        .build()
        .expect("bounds");
    let (server, runs) = charge_server(store.clone(), false).await;
    let client = http();
    let mut ok = 0_u64;
    for i in 0..10 {
        let resp = charge(&client, &server, "t", &format!("big-{i}")).await;
        match resp.status().as_u16() {
            201 => ok += 1,
            503 => assert_eq!(problem(resp).await.1, "store-full"),
            other => panic!("unexpected {other}"),
        }
    }
    assert!((1..10).contains(&ok), "{ok} accepted");
    assert_eq!(runs.count(), ok);
    for i in 0..ok {
        let resp = charge(&client, &server, "t", &format!("big-{i}")).await;
        assert_eq!(resp.headers()["idempotent-replayed"], "true", "big-{i}");
    }
}

#[tokio::test]
async fn the_function_api_reports_a_full_store() {
    let store = MemoryStore::builder()
        .max_records(2)
        .build()
        .expect("bounds");
    let engine = Engine::new(store.clone());
    let fp = Fingerprint::of_bytes(b"ship");
    let key = |k: &str| IdempotencyKey::new(k).expect("key");
    let runs = Executions::default();
    let job = || {
        let runs = runs.clone();
        move || async move { Ok::<_, std::io::Error>(runs.record()) }
    };
    for k in ["m1", "m2"] {
        engine
            .once("queue", &key(k), &fp, job())
            .await
            .expect("room");
    }
    let err = engine
        .once("queue", &key("m3"), &fp, job())
        .await
        .expect_err("full");
    assert!(err.is_store_full() && !err.is_store_unavailable(), "{err}");
    assert!(
        err.retry_after()
            .is_some_and(|d| d >= Duration::from_secs(1))
    );
    assert!(err.to_string().contains("full"), "{err}");
    assert_eq!(runs.count(), 2);
    // Recorded values are still replayed.
    let again = engine
        .once("queue", &key("m1"), &fp, job())
        .await
        .expect("replay");
    assert!(again.is_replayed());
    // The engine's own claim error says the same.
    let claim = engine
        .claim("queue", &key("m4"), &fp)
        .await
        .expect_err("full");
    assert!(
        claim.is_store_full() && claim.store_error().is_full(),
        "{claim}"
    );
}

#[tokio::test]
async fn a_webhook_batch_receiver_answers_a_full_store_with_503_store_full() {
    let store = MemoryStore::builder()
        .max_records(2)
        .build()
        .expect("bounds");
    let dedup = Arc::new(BatchDeduper::sendgrid(store));
    let runs = Executions::default();
    let router = Router::new()
        .route(
            "/sendgrid",
            post(
                |State((dedup, runs)): State<(Arc<BatchDeduper>, Executions)>, body: Bytes| async move {
                    let result = dedup
                        .process(&body, |_| {
                            runs.record();
                            async { Ok::<_, std::io::Error>(()) }
                        })
                        .await;
                    if let Err(e) = &result {
                        assert!(e.is_store_full() && !e.is_store_unavailable(), "{e}");
                        assert_eq!(e.outcome().processed(), 2);
                    }
                    dedup.respond(result)
                },
            ),
        )
        .with_state((dedup, runs.clone()));
    let server = TestServer::start(router).await.expect("server starts");
    let body = r#"[{"sg_event_id":"e1"},{"sg_event_id":"e2"},{"sg_event_id":"e3"}]"#;
    let resp = http()
        .post(server.url("/sendgrid"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("answers");
    assert!(resp.headers().contains_key("retry-after"));
    let (status, case, _) = problem(resp).await;
    assert_eq!((status, case.as_str()), (503, "store-full"));
    assert_eq!(runs.count(), 2, "the items that fit ran and are recorded");
}

#[tokio::test]
async fn memory_urls_open_bounded_stores_or_name_the_bad_setting() {
    for url in [
        "memory",
        "memory://",
        "memory://?max_records=100000&max_bytes=256MiB",
        "memory://?max_bytes=64KB",
        "memory://?max_bytes=1gib&max_records=10",
    ] {
        let store = idemkey::store::open(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(store.kind(), "memory", "{url}");
    }

    // The bound set by the URL is the one the verifier meets.
    let engine = Engine::new(
        idemkey::store::open("memory://?max_records=1")
            .await
            .expect("opens"),
    );
    let fp = Fingerprint::of_bytes(b"x");
    let key = |k: &str| IdempotencyKey::new(k).expect("key");
    assert!(engine.claim("", &key("k1"), &fp).await.is_ok());
    let err = engine.claim("", &key("k2"), &fp).await.expect_err("full");
    assert!(err.is_store_full(), "{err}");

    for (url, says) in [
        ("memory://?max_records=0", "max_records"),
        ("memory://?max_records=-3", "positive integer"),
        ("memory://?max_records=1e6", "max_records"),
        ("memory://?max_bytes=0", "max_bytes"),
        ("memory://?max_bytes=-1MiB", "max_bytes"),
        ("memory://?max_bytes=256MB_", "KiB, MiB, GiB"),
        ("memory://?max_bytes=256 MiB", "max_bytes"),
        ("memory://?max_bytes=16", "max_bytes"),
        ("memory://?max_bytes=1&max_bytes=2", "twice"),
        ("memory://?size=1", "max_records and max_bytes"),
        ("memory://somewhere", "no host"),
    ] {
        let err = idemkey::store::open(url).await.err().expect(url);
        assert!(
            err.is_configuration() && !err.is_unsupported(),
            "{url}: {err}"
        );
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}
