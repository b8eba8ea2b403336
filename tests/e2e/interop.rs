//! The interop matrix: idemkey against peers nobody here wrote, installed at pinned
//! versions from PyPI and npm by the harness (`tests/support/peers.rs`), over real HTTP
//! on 127.0.0.1, through `idemkey::testing::FaultProxy` where responses get lost.
//!
//! - idemkey's client against idemkit 1.0.2 (default and stripe mode) and
//!   fastapi-idempotency 0.1.1: one execution per logical call although the first
//!   answer of each is lost, replays recognised, mismatches typed, in-progress answers.
//! - stripe-node 23.1.0 and orb-billing 6.11.0 (Stainless) against idemkey's verifier
//!   (the examples' charge app): one execution per call through a lossy proxy, and the
//!   peer sees the replay.
//!
//! The client's docs ("Against other verifiers", idemkey-client/src/guide.md) have the
//! table of what each case shows.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemkey::IdempotencyKey;
use idemkey::client::{AnswerMatch, Error, RequestBuilderExt, ResponseExt, VendorProfile};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use idemkey::testing::{Fault, FaultProxy};
use reqwest_middleware::ClientWithMiddleware;
use support::apps::ChargeApp;
use support::client::{builder, ours};
use support::peers::{PythonVerifier, node_client};

/// Loses the answer to the first attempt of every key, after the upstream processed it.
fn lose_first_answers() -> impl Fn(idemkey::testing::Shot) -> Fault + Send + Sync + 'static {
    |shot| {
        if shot.key_attempt == 0 {
            Fault::LoseResponse
        } else {
            Fault::None
        }
    }
}

async fn charge(
    client: &ClientWithMiddleware,
    url: &str,
    key: &str,
    body: serde_json::Value,
) -> reqwest_middleware::Result<reqwest::Response> {
    client
        .post(url)
        .idempotency_key(IdempotencyKey::new(key).expect("valid"))
        .json(&body)
        .send()
        .await
}

/// Ten logical calls through a proxy that loses the first answer of each: every call
/// gets its answer on the retry, replayed, and the peer executed each once.
async fn lost_answers_execute_once(peer: &PythonVerifier, replay_header: &str) {
    let proxy = FaultProxy::start(peer.addr(), lose_first_answers())
        .await
        .expect("proxy");
    let client = builder(3).build();
    let before = peer.executions().await;
    for i in 0..10 {
        let key = format!("lost-{i}-{}", uuid::Uuid::new_v4());
        let response = charge(
            &client,
            &proxy.url("/v1/charges"),
            &key,
            serde_json::json!({"amount": 100 + i}),
        )
        .await
        .expect("the retry gets the stored answer");
        assert_eq!(
            response.headers().get(replay_header).map(|v| v.as_bytes()),
            Some(&b"true"[..]),
            "the peer marks replays with {replay_header}"
        );
        let info = response.idempotency().expect("keyed").clone();
        assert_eq!((info.attempts(), info.replayed()), (2, true), "call {i}");
        let body: serde_json::Value = response.json().await.expect("JSON");
        assert_eq!(body["amount"], 100 + i);
    }
    assert_eq!(
        peer.executions().await - before,
        10,
        "one execution per call"
    );
    assert_eq!(proxy.stats().lost_responses, 10);
}

/// The same key with another payload.
async fn mismatch(
    peer: &PythonVerifier,
    client: &ClientWithMiddleware,
) -> reqwest_middleware::Result<reqwest::Response> {
    let key = format!("mismatch-{}", uuid::Uuid::new_v4());
    let url = peer.url("/v1/charges");
    charge(client, &url, &key, serde_json::json!({"amount": 1}))
        .await
        .expect("the first executes");
    charge(client, &url, &key, serde_json::json!({"amount": 2})).await
}

/// A duplicate of a held charge, sent by another client with no retries: the peer waits
/// 0.3 s, then answers "in progress". Returns that error; the held charge then lands and
/// the duplicate, sent again, gets its replay.
async fn in_progress(peer: &PythonVerifier) -> Error {
    let key = format!("held-{}", uuid::Uuid::new_v4());
    let url = peer.url("/v1/charges");
    let before = peer.executions().await;
    let body = serde_json::json!({"amount": 7, "hold": true});
    let held = tokio::spawn({
        let (url, key, body) = (url.clone(), key.clone(), body.clone());
        async move { charge(&builder(0).build(), &url, &key, body).await }
    });
    // Bounded: until the held charge is inside the handler.
    for _ in 0..500 {
        if peer.executions().await > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        peer.executions().await,
        before + 1,
        "the held charge is running"
    );
    let duplicate = builder(0).build();
    let err = ours(
        charge(&duplicate, &url, &key, body.clone())
            .await
            .expect_err("in progress"),
    );
    peer.release().await;
    let first = held.await.expect("task").expect("the held charge answers");
    assert_eq!(first.status(), 200);
    let again = charge(&duplicate, &url, &key, body)
        .await
        .expect("the replay");
    assert!(again.idempotency().expect("keyed").replayed());
    assert_eq!(peer.executions().await, before + 1, "executed once");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idemkit_default_mode() {
    let peer = PythonVerifier::start(&["idemkit", "default"]).await;
    lost_answers_execute_once(&peer, "idempotency-replayed").await;

    let err = ours(
        mismatch(&peer, &builder(3).build())
            .await
            .expect_err("mismatch"),
    );
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(422));
    assert_eq!(err.attempts(), 1);

    let err = in_progress(&peer).await;
    assert!(err.is_in_progress(), "{err}");
    let response = err.response().expect("kept");
    assert_eq!(response.status(), 423, "idemkit's default mode: 423 Locked");
    assert!(response.headers().contains_key("retry-after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idemkit_default_mode_423_is_retried_after_its_retry_after() {
    let peer = PythonVerifier::start(&["idemkit", "default"]).await;
    let key = format!("locked-{}", uuid::Uuid::new_v4());
    let url = peer.url("/v1/charges");
    let body = serde_json::json!({"amount": 9, "hold": true});
    let held = tokio::spawn({
        let (url, key, body) = (url.clone(), key.clone(), body.clone());
        async move { charge(&builder(0).build(), &url, &key, body).await }
    });
    for _ in 0..500 {
        if peer.executions().await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The duplicate's first attempt gets 423 with Retry-After (the 5 s lease); once it
    // has, the held charge lands, and the retry after Retry-After gets the replay.
    let answered = Arc::new(AtomicU32::new(0));
    let released = {
        let answered = Arc::clone(&answered);
        let url = peer.url("/release");
        move || {
            let (answered, url) = (Arc::clone(&answered), url.clone());
            async move {
                if answered.fetch_add(1, Ordering::SeqCst) == 0 {
                    reqwest::get(url).await.expect("GET /release");
                }
            }
        }
    };
    let duplicate = builder(3).with_inner(AfterAnswer::new(released)).build();
    let response = charge(&duplicate, &url, &key, body)
        .await
        .expect("the retry gets the replay");
    let info = response.idempotency().expect("keyed").clone();
    assert_eq!((info.attempts(), info.replayed()), (2, true));
    assert_eq!(held.await.expect("task").expect("answered").status(), 200);
    assert_eq!(peer.executions().await, 1);
}

/// An inner middleware that runs an async action after each attempt is answered.
struct AfterAnswer(
    Box<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>,
);

impl AfterAnswer {
    fn new<F, Fut>(f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self(Box::new(move || Box::pin(f())))
    }
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for AfterAnswer {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let result = next.run(req, ext).await;
        (self.0)().await;
        result
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idemkit_stripe_mode() {
    let peer = PythonVerifier::start(&["idemkit", "stripe"]).await;
    lost_answers_execute_once(&peer, "idempotent-replayed").await;

    // Stripe mode answers a mismatch with 409 (not Stripe's 400); its problem type tells
    // it from an in-progress 409.
    let err = ours(
        mismatch(&peer, &builder(3).build())
            .await
            .expect_err("mismatch"),
    );
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(409));
    assert_eq!(err.attempts(), 1, "not retried as in progress");

    let err = in_progress(&peer).await;
    assert!(err.is_in_progress(), "{err}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(409));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastapi_idempotency() {
    let peer = PythonVerifier::start(&["fastapi-idempotency"]).await;
    lost_answers_execute_once(&peer, "idempotent-replayed").await;

    // Its mismatch is 422 {"detail": "..."}, not a problem document: the standard
    // profile returns it as an ordinary answer...
    let response = mismatch(&peer, &builder(3).build())
        .await
        .expect("an ordinary 422 under the standard profile");
    assert_eq!(response.status(), 422);
    let detail = response.text().await.expect("body");
    assert!(
        detail.contains("already used for a different request"),
        "{detail}"
    );
    // ...and a profile rule for its body types it.
    let profile = VendorProfile::standard().with_key_reused(
        AnswerMatch::status(422).json_contains("/detail", "already used for a different request"),
    );
    let err = ours(
        mismatch(&peer, &builder(3).profile(profile).build())
            .await
            .expect_err("typed with the rule"),
    );
    assert!(err.is_key_reused(), "{err}");

    let err = in_progress(&peer).await;
    assert!(err.is_in_progress(), "{err}");
    let response = err.response().expect("kept");
    assert_eq!(response.status(), 409);
    assert!(
        !response.headers().contains_key("retry-after"),
        "fastapi-idempotency sends no Retry-After: the client's backoff decides"
    );
}

/// idemkey's verifier (the examples' charge app over the memory store) behind a proxy
/// that loses the first answer of every key; `peer` makes 5 charges through it.
async fn peer_client_through_a_lossy_proxy(peer: &str) {
    let app = ChargeApp::new();
    let server =
        support::serve(app.router(IdempotencyLayer::new(Engine::new(MemoryStore::new())))).await;
    let proxy = FaultProxy::start(server.addr(), lose_first_answers())
        .await
        .expect("proxy");
    let lines = node_client(peer, &proxy.url(""), 5).await;
    assert_eq!(lines.len(), 5, "{lines:?}");
    let mut ids = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["amount"], 1000 + i, "{line}");
        assert_eq!(line["replayed"], true, "{peer} sees the replay: {line}");
        ids.push(line["id"].as_str().expect("an id").to_owned());
    }
    ids.dedup();
    assert_eq!(ids.len(), 5, "five charges: {ids:?}");
    assert_eq!(app.executions().count(), 5, "one execution per call");
    assert_eq!(proxy.stats().lost_responses, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_node_against_the_verifier() {
    peer_client_through_a_lossy_proxy("stripe").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orb_billing_against_the_verifier() {
    peer_client_through_a_lossy_proxy("orb").await;
}
