//! Every row of the server semantics table, over HTTP against a real server on 127.0.0.1.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use idemkey::fingerprint::Fingerprinter;
use idemkey::server::{
    Engine, EngineBuilder, IdempotencyLayer, policy::KeyRequirement, policy::OutcomePolicy,
};
use idemkey::store::{ClaimRequest, FencingToken, MemoryStore, RecordId, Store};
use idemkey::testing::{Executions, TestServer};
use support::gate::Gate;
use support::verifier::{FlakyStore, http, json, post_json, problem};

#[derive(Clone, Default)]
struct Ctx {
    runs: Executions,
    gate: Gate,
}

/// `POST /echo?status=N&size=N`: counts, answers `status` with a JSON body naming the
/// execution, or `size` bytes; sets `x-custom` and `set-cookie`. `POST /gated` waits at
/// the gate first.
fn app(layer: IdempotencyLayer) -> (Router, Ctx) {
    let ctx = Ctx::default();
    let router = Router::new()
        .route("/echo", post(echo))
        .route("/gated", post(gated))
        .layer(layer)
        .with_state(ctx.clone());
    (router, ctx)
}

async fn echo(
    State(ctx): State<Ctx>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> impl IntoResponse {
    let n = ctx.runs.record();
    let status = q
        .get("status")
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut headers = HeaderMap::new();
    headers.insert("x-custom", "kept".parse().expect("header"));
    headers.insert("set-cookie", "session=secret".parse().expect("header"));
    let body = match q.get("size").and_then(|s| s.parse::<usize>().ok()) {
        Some(size) => vec![b'x'; size],
        None => serde_json::to_vec(&serde_json::json!({
            "execution": n,
            "request": String::from_utf8_lossy(&body),
        }))
        .expect("json"),
    };
    (status, headers, body)
}

async fn gated(State(ctx): State<Ctx>) -> impl IntoResponse {
    ctx.gate.pass().await;
    let n = ctx.runs.record();
    format!("gated execution {n}")
}

fn engine(store: impl Store) -> EngineBuilder {
    Engine::builder(store)
}

async fn start(layer: IdempotencyLayer) -> (TestServer, Ctx) {
    let (router, ctx) = app(layer);
    let server = TestServer::start(router).await.expect("server starts");
    (server, ctx)
}

async fn start_default() -> (TestServer, Ctx) {
    start(IdempotencyLayer::new(Engine::new(MemoryStore::new()))).await
}

#[tokio::test]
async fn missing_key_is_400_and_the_handler_does_not_run() {
    let (server, ctx) = start_default().await;
    let resp = post_json(&http(), &server.url("/echo"), None, "{}").await;
    let (status, case, body) = problem(resp).await;
    assert_eq!((status, case.as_str()), (400, "missing-key"));
    assert!(
        body["detail"]
            .as_str()
            .expect("detail")
            .contains("Idempotency-Key")
    );
    assert_eq!(ctx.runs.count(), 0);
}

#[tokio::test]
async fn malformed_keys_are_400_before_any_store_lookup() {
    // A failing store proves no look-up happens: a look-up would answer 503.
    let store = FlakyStore::default();
    store.failing.store(true, Ordering::SeqCst);
    let (server, ctx) = start(IdempotencyLayer::new(Engine::new(store))).await;
    let client = http();
    let long = "k".repeat(256);
    for bad in ["has space", long.as_str(), "\"unterminated", "\"\"", "é"] {
        let resp = client
            .post(server.url("/echo"))
            .header("idempotency-key", bad.as_bytes())
            .body("{}")
            .send()
            .await
            .expect("answer");
        let (status, case, _) = problem(resp).await;
        assert_eq!((status, case.as_str()), (400, "invalid-key"), "{bad:?}");
    }
    let resp = client
        .post(server.url("/echo"))
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("{}")
        .send()
        .await
        .expect("answer");
    let (status, case, _) = problem(resp).await;
    assert_eq!((status, case.as_str()), (400, "invalid-key"), "two keys");
    assert_eq!(ctx.runs.count(), 0);
}

/// A key judged from a header is answered before the body is read: a client that asks
/// `Expect: 100-continue` gets the `400` and never a `100 Continue`, so it never sends
/// the body (here a megabyte it announced and holds back). A valid key gets the
/// `100 Continue`, which shows the test can tell the two apart.
#[tokio::test]
async fn a_bad_key_is_answered_before_the_body_is_read() {
    use support::raw::{Raw, status};
    let (server, ctx) = start_default().await;
    let request = |key: Option<&str>| {
        let key = key
            .map(|k| format!("idempotency-key: {k}\r\n"))
            .unwrap_or_default();
        format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\nexpect: 100-continue\r\n{key}\r\n"
        )
    };
    for (key, problem) in [(Some("a b"), "invalid-key"), (None, "missing-key")] {
        let mut conn = Raw::connect(server.addr()).await;
        conn.send(request(key).as_bytes()).await;
        let (head, body) = conn.response().await;
        assert_eq!(status(&head), 400, "no 100 Continue first: {head}");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("a problem");
        assert!(
            v["type"].as_str().is_some_and(|t| t.ends_with(problem)),
            "{v}"
        );
    }

    let mut conn = Raw::connect(server.addr()).await;
    conn.send(request(Some("k-continue")).as_bytes()).await;
    let head = conn.head().await;
    assert_eq!(status(&head), 100, "{head}");
    conn.send(&vec![b' '; 1_000_000]).await;
    let (head, _) = conn.response().await;
    assert_eq!(status(&head), 201, "{head}");
    assert_eq!(ctx.runs.count(), 1, "only the request with a valid key ran");
}

/// A body shorter than its `Content-Length` is answered `408 body-timeout` once the
/// layer's body-read timeout passes, and its key is not claimed.
#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408_and_claims_nothing() {
    use support::raw::{Raw, status};
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(Engine::new(store.clone()))
        .body_read_timeout(Duration::from_millis(200));
    let (server, ctx) = start(layer).await;
    let mut conn = Raw::connect(server.addr()).await;
    conn.send(b"POST /echo HTTP/1.1\r\nhost: x\r\nidempotency-key: k-slow\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{\"n\":")
        .await;
    let (head, body) = conn.response().await;
    assert_eq!(status(&head), 408, "{head}");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("a problem");
    assert_eq!(v["type"], "urn:idemkey:problem:body-timeout");
    assert_eq!(
        store
            .inspect(&RecordId::new("", "k-slow"))
            .await
            .expect("inspect"),
        None,
        "the key was not claimed"
    );
    assert_eq!(ctx.runs.count(), 0);
    let whole = post_json(&http(), &server.url("/echo"), Some("k-slow"), "{}").await;
    assert_eq!(whole.status(), 201, "the request runs with that key");
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let (server, ctx) =
        start(IdempotencyLayer::new(Engine::new(MemoryStore::new())).body_limit(1024)).await;
    let client = http();
    // Declared length over the limit.
    let resp = post_json(
        &client,
        &server.url("/echo"),
        Some("k-413"),
        &"x".repeat(1025),
    )
    .await;
    assert_eq!(problem(resp).await.1, "body-too-large");
    // Chunked, no declared length: written by hand on a raw connection.
    let mut conn = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let mut raw = b"POST /echo HTTP/1.1\r\nhost: t\r\nidempotency-key: k-413b\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
    for _ in 0..4 {
        raw.extend_from_slice(b"200\r\n");
        raw.extend_from_slice(&[b'x'; 512]);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut conn, &raw)
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut answer)
        .await
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("urn:idemkey:problem:body-too-large"),
        "{answer}"
    );
    // At the limit: fine.
    let resp = post_json(
        &client,
        &server.url("/echo"),
        Some("k-413c"),
        &"x".repeat(1024),
    )
    .await;
    assert_eq!(resp.status(), 201);
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn first_request_runs_once_and_retries_get_a_byte_exact_replay() {
    let (server, ctx) = start_default().await;
    let client = http();
    let first = post_json(
        &client,
        &server.url("/echo"),
        Some("k-replay"),
        r#"{"amount":1}"#,
    )
    .await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        first.headers()["set-cookie"],
        "session=secret",
        "the original keeps its cookie"
    );
    let first_body = first.bytes().await.expect("body");

    // The bare and the sf-string form name the same key.
    for key in ["k-replay", "\"k-replay\""] {
        let again = post_json(&client, &server.url("/echo"), Some(key), r#"{"amount":1}"#).await;
        assert_eq!(again.status(), 201);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()["x-custom"], "kept");
        assert_eq!(again.headers()["content-type"], "application/octet-stream");
        assert!(
            again.headers().get("set-cookie").is_none(),
            "Set-Cookie is on the deny-list"
        );
        assert_eq!(again.bytes().await.expect("body"), first_body);
    }
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn same_key_different_request_is_422_or_400_in_stripe_mode() {
    for (layer, expected) in [
        (IdempotencyLayer::new(Engine::new(MemoryStore::new())), 422),
        (
            IdempotencyLayer::new(Engine::new(MemoryStore::new())).stripe_compatible(),
            400,
        ),
    ] {
        let (server, ctx) = start(layer).await;
        let client = http();
        let url = server.url("/echo");
        assert_eq!(
            post_json(&client, &url, Some("k-reuse"), r#"{"amount":1}"#)
                .await
                .status(),
            201
        );
        let other_body = post_json(&client, &url, Some("k-reuse"), r#"{"amount":2}"#).await;
        let (status, case, _) = problem(other_body).await;
        assert_eq!((status, case.as_str()), (expected, "key-reused"));
        let other_path = post_json(
            &client,
            &format!("{url}?x=1"),
            Some("k-reuse"),
            r#"{"amount":1}"#,
        )
        .await;
        assert_eq!(problem(other_path).await.1, "key-reused");
        assert_eq!(ctx.runs.count(), 1);
    }
}

#[tokio::test]
async fn canonical_json_fingerprint_ignores_key_order_when_enabled() {
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
        .fingerprinter(Fingerprinter::new().canonical_json());
    let (server, ctx) = start(layer).await;
    let client = http();
    let url = server.url("/echo");
    assert_eq!(
        post_json(&client, &url, Some("k-c"), r#"{"a":1,"b":2}"#)
            .await
            .status(),
        201
    );
    let again = post_json(&client, &url, Some("k-c"), r#"{ "b": 2, "a": 1 }"#).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn concurrent_duplicate_is_409_with_retry_after_then_replayed() {
    let (server, ctx) = start_default().await;
    let client = http();
    let url = server.url("/gated");
    let first = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { post_json(&client, &url, Some("k-409"), "{}").await }
    });
    ctx.gate.wait_entered(1).await;

    let dup = post_json(&client, &url, Some("k-409"), "{}").await;
    let retry_after: u64 = dup.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("delta-seconds");
    assert!(
        (1..=10).contains(&retry_after),
        "Retry-After {retry_after} comes from the lease"
    );
    let (status, case, _) = problem(dup).await;
    assert_eq!((status, case.as_str()), (409, "in-progress"));

    // A different request under the same key while it runs: still a reuse.
    let other = post_json(&client, &url, Some("k-409"), r#"{"x":1}"#).await;
    assert_eq!(problem(other).await.1, "key-reused");

    ctx.gate.open(1);
    let first = first.await.expect("first request");
    assert_eq!(first.status(), 200);
    let first_body = first.bytes().await.expect("body");
    let replay = post_json(&client, &url, Some("k-409"), "{}").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body"), first_body);
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn store_outage_is_503_with_retry_after_and_nothing_runs() {
    let store = FlakyStore::default();
    let (server, ctx) = start(IdempotencyLayer::new(Engine::new(store.clone()))).await;
    let client = http();
    let url = server.url("/echo");
    store.failing.store(true, Ordering::SeqCst);
    let resp = post_json(&client, &url, Some("k-503"), "{}").await;
    assert_eq!(resp.headers()["retry-after"], "2");
    let (status, case, _) = problem(resp).await;
    assert_eq!((status, case.as_str()), (503, "store-unavailable"));
    assert_eq!(ctx.runs.count(), 0);

    store.failing.store(false, Ordering::SeqCst);
    assert_eq!(
        post_json(&client, &url, Some("k-503"), "{}").await.status(),
        201
    );
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn a_store_blip_while_completing_does_not_lose_the_outcome() {
    // The handler ran; the store fails the first two attempts to record its response.
    // Losing the outcome would leave the key in progress (409) until the lease ends and
    // then run the handler a second time.
    // The caller is answered at once; the outcome is recorded in the background.
    let store = FlakyStore::default();
    store.failing_completes.store(2, Ordering::SeqCst);
    let engine = Engine::new(store.clone());
    let (server, ctx) = start(IdempotencyLayer::new(engine.clone())).await;
    let client = http();
    let url = server.url("/echo");
    let first = post_json(&client, &url, Some("k-blip"), r#"{"n":1}"#).await;
    assert_eq!(first.status(), 201);
    let first_body = first.bytes().await.expect("body");
    engine.wait_for_recordings().await;
    assert_eq!(
        store.failing_completes.load(Ordering::SeqCst),
        0,
        "both blips hit"
    );

    let retry = post_json(&client, &url, Some("k-blip"), r#"{"n":1}"#).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.bytes().await.expect("body"), first_body);
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn fail_open_runs_the_handler_unguarded_only_when_configured() {
    let store = FlakyStore::default();
    store.failing.store(true, Ordering::SeqCst);
    let engine = engine(store).fail_open(true).build();
    let (server, ctx) = start(IdempotencyLayer::new(engine)).await;
    let client = http();
    let url = server.url("/echo");
    for _ in 0..2 {
        assert_eq!(
            post_json(&client, &url, Some("k-open"), "{}")
                .await
                .status(),
            201
        );
    }
    assert_eq!(
        ctx.runs.count(),
        2,
        "fail-open trades duplicates for availability"
    );
}

#[tokio::test]
async fn outcome_policy_releases_5xx_408_429_and_answers_refused_as_sent_and_stores_the_rest() {
    let (server, ctx) = start_default().await;
    let client = http();
    let base = server.url("/echo");
    for (status, stored) in [
        (500, false),
        (503, false),
        (408, false),
        (429, false),
        // Refused as sent: nothing began executing, so the key is not burnt.
        (400, false),
        (401, false),
        (403, false),
        (404, false),
        (405, false),
        (415, false),
        // A handler's judgement against the state it found: kept.
        (402, true),
        (409, true),
        (410, true),
        (422, true),
        (200, true),
        (302, true),
    ] {
        let url = format!("{base}?status={status}");
        let key = format!("k-policy-{status}");
        let before = ctx.runs.count();
        assert_eq!(
            post_json(&client, &url, Some(&key), "{}").await.status(),
            status
        );
        let again = post_json(&client, &url, Some(&key), "{}").await;
        assert_eq!(again.status(), status);
        assert_eq!(
            again.headers().get("idempotent-replayed").is_some(),
            stored,
            "{status}"
        );
        assert_eq!(
            ctx.runs.count() - before,
            if stored { 1 } else { 2 },
            "{status}"
        );
    }

    let (server, ctx) = start(
        IdempotencyLayer::new(Engine::new(MemoryStore::new())).policy(OutcomePolicy::store_all()),
    )
    .await;
    let url = server.url("/echo?status=500");
    post_json(&client, &url, Some("k-all"), "{}").await;
    let again = post_json(&client, &url, Some("k-all"), "{}").await;
    assert_eq!(
        (
            again.status().as_u16(),
            &again.headers()["idempotent-replayed"]
        ),
        (
            500,
            &"true".parse::<reqwest::header::HeaderValue>().expect("hv")
        )
    );
    assert_eq!(ctx.runs.count(), 1);

    // Stripe's rule: every answer once execution began, but not those refused as sent.
    let (server, ctx) = start(
        IdempotencyLayer::new(Engine::new(MemoryStore::new()))
            .policy(OutcomePolicy::began_executing()),
    )
    .await;
    for (status, stored) in [(500, true), (404, false), (401, false), (409, true)] {
        let url = server.url(&format!("/echo?status={status}"));
        let key = format!("k-began-{status}");
        let before = ctx.runs.count();
        post_json(&client, &url, Some(&key), "{}").await;
        let again = post_json(&client, &url, Some(&key), "{}").await;
        assert_eq!(
            again.headers().get("idempotent-replayed").is_some(),
            stored,
            "{status}"
        );
        assert_eq!(ctx.runs.count() - before, if stored { 1 } else { 2 });
    }
}

/// A request the router refuses before any handler runs (`PUT` to a `POST`-only route:
/// `405`) does not burn its key: the `POST` sent next with that key runs, instead of
/// being answered `422 key-reused` for the retention period.
#[tokio::test]
async fn a_method_the_route_does_not_serve_leaves_the_key_for_the_right_method() {
    let store = MemoryStore::new();
    let (server, ctx) = start(IdempotencyLayer::new(Engine::new(store.clone()))).await;
    let client = http();
    let url = server.url("/echo");
    let wrong = client
        .put(&url)
        .header("idempotency-key", "k-405")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("the router answers");
    assert_eq!(wrong.status(), 405);
    assert_eq!(ctx.runs.count(), 0);
    assert_eq!(
        store
            .inspect(&RecordId::new("", "k-405"))
            .await
            .expect("inspect"),
        None,
        "the 405 released the key"
    );
    let right = post_json(&client, &url, Some("k-405"), "{}").await;
    assert_eq!(right.status(), 201, "the POST with the same key runs");
    assert!(right.headers().get("idempotent-replayed").is_none());
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn deny_list_is_configurable() {
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
        .deny_headers([])
        .deny_header(http::HeaderName::from_static("x-custom"));
    let (server, _ctx) = start(layer).await;
    let client = http();
    let url = server.url("/echo");
    post_json(&client, &url, Some("k-deny"), "{}").await;
    let again = post_json(&client, &url, Some("k-deny"), "{}").await;
    assert_eq!(again.headers()["set-cookie"], "session=secret");
    assert!(again.headers().get("x-custom").is_none());
}

#[tokio::test]
async fn response_too_large_to_store_is_sent_once_then_410_without_a_second_execution() {
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new())).stored_response_limit(1000);
    let (server, ctx) = start(layer).await;
    let client = http();
    let url = server.url("/echo?size=5000");
    let first = post_json(&client, &url, Some("k-big"), "{}").await;
    assert_eq!(first.status(), 201);
    assert_eq!(
        first.bytes().await.expect("body").len(),
        5000,
        "the caller gets it all"
    );
    let again = post_json(&client, &url, Some("k-big"), "{}").await;
    let (status, case, _) = problem(again).await;
    assert_eq!((status, case.as_str()), (410, "response-not-stored"));
    assert_eq!(ctx.runs.count(), 1);

    let small = server.url("/echo?size=1000");
    post_json(&client, &small, Some("k-fits"), "{}").await;
    let again = post_json(&client, &small, Some("k-fits"), "{}").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.expect("body").len(), 1000);
}

#[tokio::test]
async fn scopes_are_isolated() {
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new())).scope(
        idemkey::server::extract::HeaderScope::new(http::header::AUTHORIZATION),
    );
    let (server, ctx) = start(layer).await;
    let client = http();
    let url = server.url("/echo");
    let send = |auth: Option<&'static str>| {
        let mut req = client
            .post(&url)
            .header("idempotency-key", "shared-key")
            .body("{}");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        req.send()
    };
    let a = json(send(Some("Bearer tenant-a")).await.expect("a")).await;
    let b = json(send(Some("Bearer tenant-b")).await.expect("b")).await;
    let none = json(send(None).await.expect("none")).await;
    assert_ne!(a["execution"], b["execution"]);
    assert_ne!(a["execution"], none["execution"]);
    let a_again = send(Some("Bearer tenant-a")).await.expect("a again");
    assert_eq!(a_again.headers()["idempotent-replayed"], "true");
    assert_eq!(json(a_again).await, a);
    assert_eq!(ctx.runs.count(), 3);
}

#[tokio::test]
async fn key_requirement_per_route() {
    let optional =
        IdempotencyLayer::new(Engine::new(MemoryStore::new())).require(KeyRequirement::Optional);
    let (server, ctx) = start(optional).await;
    let client = http();
    let url = server.url("/echo");
    for _ in 0..2 {
        assert_eq!(post_json(&client, &url, None, "{}").await.status(), 201);
    }
    assert_eq!(ctx.runs.count(), 2, "optional: no key, no protection");

    let off = IdempotencyLayer::new(Engine::new(MemoryStore::new())).require(KeyRequirement::Off);
    let (server, ctx) = start(off).await;
    let url = server.url("/echo");
    for _ in 0..2 {
        assert_eq!(
            post_json(&client, &url, Some("ignored"), "{}")
                .await
                .status(),
            201
        );
    }
    assert_eq!(ctx.runs.count(), 2, "off: the layer steps aside");
}

#[tokio::test]
async fn lease_takeover_after_a_crashed_owner_and_its_completion_is_fenced() {
    // A short lease: the crashed owner blocks its key briefly.
    let store = MemoryStore::new();
    let engine = engine(store.clone())
        .lease(Duration::from_millis(200))
        .build();
    let (server, ctx) = start(IdempotencyLayer::new(engine)).await;
    let client = http();
    let url = server.url("/echo");

    // The crashed owner: claimed with the same request's fingerprint, then died.
    let parts = http::Request::post(url.parse::<http::Uri>().expect("uri").path())
        .header("content-type", "application/json")
        .body(())
        .expect("request")
        .into_parts()
        .0;
    let fp = Fingerprinter::new().fingerprint_parts(&parts, b"{}");
    let id = RecordId::new("", "k-crash");
    let dead = FencingToken::random();
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: fp.as_bytes(),
            token: dead,
            lease: Duration::from_millis(200),
            retention: Duration::ZERO,
        })
        .await
        .expect("claim");

    let blocked = post_json(&client, &url, Some("k-crash"), "{}").await;
    assert_eq!(problem(blocked).await.1, "in-progress");
    assert_eq!(ctx.runs.count(), 0);

    // Bounded: the lease is 200 ms; each round waits 50 ms.
    let mut taken_over = None;
    for _ in 0..200 {
        let resp = post_json(&client, &url, Some("k-crash"), "{}").await;
        if resp.status() == 201 {
            taken_over = Some(resp.bytes().await.expect("body"));
            break;
        }
        assert_eq!(resp.status(), 409);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let taken_over = taken_over.expect("the key is taken over once the dead lease expires");
    assert_eq!(ctx.runs.count(), 1);

    let stale = store
        .complete(
            &id,
            dead,
            Bytes::from_static(b"stale"),
            Duration::from_secs(60),
        )
        .await;
    assert!(stale.expect_err("the stale owner is fenced").is_fenced());
    let replay = post_json(&client, &url, Some("k-crash"), "{}").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body"), taken_over);
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn client_disconnect_mid_handler_still_records_the_outcome() {
    let (server, ctx) = start_default().await;
    let url = server.url("/gated");
    let client = http();
    let first = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { post_json(&client, &url, Some("k-cancel"), "{}").await }
    });
    ctx.gate.wait_entered(1).await;
    first.abort(); // the client goes away mid-handler
    let _ = first.await;

    ctx.gate.open(1);
    // Bounded: the handler finishes once the gate opens; until then 409.
    let mut replay = None;
    for _ in 0..200 {
        let resp = post_json(&client, &url, Some("k-cancel"), "{}").await;
        if resp.status() == 200 {
            replay = Some(resp);
            break;
        }
        assert_eq!(resp.status(), 409);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let replay = replay.expect("the outcome was recorded");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.expect("body"), "gated execution 1");
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_duplicates_across_four_verifiers_execute_once() {
    let store = MemoryStore::new();
    let ctx = Ctx::default();
    let mut servers = Vec::new();
    for _ in 0..4 {
        let router = Router::new()
            .route("/gated", post(gated))
            .layer(IdempotencyLayer::new(Engine::new(store.clone())))
            .with_state(ctx.clone());
        servers.push(TestServer::start(router).await.expect("server"));
    }
    let client = reqwest::Client::new();
    let urls: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.url("/gated")).collect());

    // Phase 1: 500 at once. One executes and waits at the gate; the 499 others get
    // 409 while it waits; then the gate opens and the one answers 200.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..500 {
        let (client, urls, tx) = (client.clone(), urls.clone(), tx.clone());
        tokio::spawn(async move {
            let resp = post_json(&client, &urls[i % 4], Some("k-storm"), "{}").await;
            let status = resp.status().as_u16();
            let replayed = resp.headers().contains_key("idempotent-replayed");
            let body = resp.bytes().await.expect("body");
            tx.send((status, replayed, body)).expect("receiver alive");
        });
    }
    for _ in 0..499 {
        let (status, _, _) = rx.recv().await.expect("answer");
        assert_eq!(status, 409, "duplicates of a running request get 409");
    }
    assert_eq!(
        ctx.runs.count(),
        0,
        "the one execution is still at the gate"
    );
    ctx.gate.open(1);
    let (status, replayed, winner) = rx.recv().await.expect("the executing request answers");
    assert_eq!((status, replayed), (200, false));

    // Phase 2: the 499 retry and all get the identical replay.
    let mut retries = Vec::new();
    for i in 0..499 {
        let (client, urls) = (client.clone(), urls.clone());
        retries.push(tokio::spawn(async move {
            let resp = post_json(&client, &urls[i % 4], Some("k-storm"), "{}").await;
            assert_eq!(resp.headers()["idempotent-replayed"], "true");
            resp.bytes().await.expect("body")
        }));
    }
    for r in retries {
        assert_eq!(r.await.expect("retry"), winner);
    }
    assert_eq!(ctx.runs.count(), 1);
}

#[tokio::test]
async fn a_required_scope_rejects_requests_without_it_and_optional_keys_still_guard() {
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
        .require(KeyRequirement::Optional)
        .scope(idemkey::server::extract::HeaderScope::new(http::header::AUTHORIZATION).required());
    let (server, ctx) = start(layer).await;
    let client = http();
    let url = server.url("/echo");
    let (status, case, _) = problem(post_json(&client, &url, Some("k-s"), "{}").await).await;
    assert_eq!((status, case.as_str()), (401, "scope-rejected"));
    for _ in 0..2 {
        let resp = client
            .post(&url)
            .header("authorization", "Bearer t")
            .header("idempotency-key", "k-s")
            .body("{}")
            .send()
            .await
            .expect("answer");
        assert_eq!(resp.status(), 201);
    }
    assert_eq!(
        ctx.runs.count(),
        1,
        "an optional key that is present still guards"
    );
}

/// The one rule for key and scope headers (the `server::extract` docs), over HTTP: a key
/// or scope header sent twice or empty is malformed and nothing runs; a scope of opaque
/// bytes is a scope of its own.
#[tokio::test]
async fn empty_and_repeated_headers_are_malformed_and_opaque_scopes_are_scopes() {
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new())).scope(
        idemkey::server::extract::HeaderScope::new(http::header::AUTHORIZATION),
    );
    let (server, ctx) = start(layer).await;
    let client = http();
    let url = server.url("/echo");
    let send = |keys: &[&'static [u8]], auths: &[&'static [u8]]| {
        let mut req = client.post(&url).body("{}");
        for k in keys {
            req = req.header("idempotency-key", *k);
        }
        for a in auths {
            req = req.header("authorization", *a);
        }
        req.send()
    };
    for (keys, auths, want) in [
        (&[&b""[..]][..], &[&b"Bearer t"[..]][..], "invalid-key"),
        (&[b"  "], &[b"Bearer t"], "invalid-key"),
        (&[b"k-1"], &[b""], "invalid-scope"),
        (&[b"k-1"], &[b"Bearer a", b"Bearer b"], "invalid-scope"),
    ] {
        let (status, case, _) = problem(send(keys, auths).await.expect("answer")).await;
        assert_eq!((status, case.as_str()), (400, want), "{keys:?} {auths:?}");
    }
    assert_eq!(ctx.runs.count(), 0);

    let e_acute = json(send(&[b"k-2"], &[b"Bearer caf\xc3\xa9"]).await.expect("a")).await;
    let e_grave = json(send(&[b"k-2"], &[b"Bearer caf\xc3\xa8"]).await.expect("b")).await;
    assert_ne!(e_acute["execution"], e_grave["execution"], "two tenants");
    let again = send(&[b"k-2"], &[b"Bearer caf\xc3\xa9"])
        .await
        .expect("again");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json(again).await, e_acute);
    assert_eq!(ctx.runs.count(), 2);
}
