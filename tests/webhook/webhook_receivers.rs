//! Webhook receivers against real servers on 127.0.0.1: the example receiver
//! (`examples/webhook_receiver.rs`) and routes built the same way, with deliveries shaped
//! like the providers' documented ones.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use futures_util::future::join_all;
use idemkey::server::Engine;
use idemkey::server::webhook::{BatchDeduper, Preset, StandardWebhooksVerifier};
use idemkey::store::{MemoryStore, Store};
use idemkey::testing::TestServer;
use support::gate::Gate;
use support::serve;
use support::webhook::*;

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

async fn example(secret: Option<&str>) -> (TestServer, reqwest::Client) {
    let (router, _stats) = receiver::app(memory(), secret);
    (serve(router).await, reqwest::Client::new())
}

#[tokio::test]
async fn stripe_retries_get_the_first_2xx_replayed() {
    let (server, client) = example(None).await;
    let url = server.url("/webhooks/stripe");
    let first = deliver(
        &client,
        &url,
        &headers(&[]),
        &stripe_event("evt_1NG8Du2eZvKYlo2CUI79vXWy", None, 2),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(!first.replayed());
    // Stripe's retries of one event carry a lower `pending_webhooks`: still a duplicate.
    for pending in [1, 0] {
        let retry = deliver(
            &client,
            &url,
            &headers(&[]),
            &stripe_event("evt_1NG8Du2eZvKYlo2CUI79vXWy", None, pending),
        )
        .await;
        assert_eq!(retry.status, StatusCode::OK);
        assert!(retry.replayed(), "a duplicate is replayed");
        assert_eq!(retry.body, first.body, "same body bytes");
    }
    assert_eq!(processed(&client, &server).await, 1);
}

#[tokio::test]
async fn stripe_connected_accounts_are_separate_scopes() {
    let (server, client) = example(None).await;
    let url = server.url("/webhooks/stripe");
    for account in [Some("acct_1A"), Some("acct_1B"), None] {
        let a = deliver(
            &client,
            &url,
            &headers(&[]),
            &stripe_event("evt_same", account, 1),
        )
        .await;
        assert_eq!(
            (a.status, a.replayed()),
            (StatusCode::OK, false),
            "{account:?}"
        );
    }
    let again = deliver(
        &client,
        &url,
        &headers(&[]),
        &stripe_event("evt_same", Some("acct_1A"), 0),
    )
    .await;
    assert!(again.replayed());
    assert_eq!(processed(&client, &server).await, 3);
}

#[tokio::test]
async fn github_one_delivery_guid_reaches_each_hook_once() {
    let (server, client) = example(None).await;
    let url = server.url("/webhooks/github");
    let guid = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    for hook in ["292430182", "292430183"] {
        let a = deliver(
            &client,
            &url,
            &github_headers(guid, hook, GITHUB_ISSUES, None),
            GITHUB_ISSUES,
        )
        .await;
        assert_eq!((a.status, a.replayed()), (StatusCode::OK, false));
        // "Redeliver" in GitHub's UI keeps the GUID.
        let b = deliver(
            &client,
            &url,
            &github_headers(guid, hook, GITHUB_ISSUES, None),
            GITHUB_ISSUES,
        )
        .await;
        assert_eq!((b.status, b.replayed()), (StatusCode::OK, true));
    }
    assert_eq!(processed(&client, &server).await, 2);
}

#[tokio::test]
async fn a_delivery_without_its_id_gets_a_clear_400() {
    let (server, client) = example(None).await;
    let no_id = deliver(
        &client,
        &server.url("/webhooks/stripe"),
        &headers(&[]),
        r#"{"object":"event","type":"charge.succeeded"}"#,
    )
    .await;
    assert_eq!(no_id.status, StatusCode::BAD_REQUEST);
    assert_eq!(no_id.problem_type(), "urn:idemkey:problem:missing-key");
    assert!(
        no_id.detail().contains("JSON field `/id`"),
        "{}",
        no_id.detail()
    );

    let mut h = github_headers("x", "1", GITHUB_ISSUES, None);
    h.remove("x-github-delivery");
    let no_guid = deliver(&client, &server.url("/webhooks/github"), &h, GITHUB_ISSUES).await;
    assert_eq!(no_guid.status, StatusCode::BAD_REQUEST);
    assert!(
        no_guid.detail().contains("x-github-delivery"),
        "{}",
        no_guid.detail()
    );

    let no_msg_id = deliver(
        &client,
        &server.url("/webhooks/standard"),
        &headers(&[]),
        STANDARD_BODY,
    )
    .await;
    assert_eq!(no_msg_id.problem_type(), "urn:idemkey:problem:missing-key");

    let not_json = deliver(
        &client,
        &server.url("/webhooks/stripe"),
        &headers(&[]),
        "id=evt_1",
    )
    .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.problem_type(), "urn:idemkey:problem:invalid-key");
    assert_eq!(processed(&client, &server).await, 0);
}

#[tokio::test]
async fn hundreds_of_concurrent_duplicates_are_processed_once() {
    let (server, client) = example(None).await;
    let url = server.url("/webhooks/standard");
    let h = headers(&[
        ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
        ("webhook-timestamp", "1674087231"),
    ]);
    let answers = join_all((0..300).map(|_| deliver(&client, &url, &h, STANDARD_BODY))).await;
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for a in &answers {
        *by_status.entry(a.status.as_u16()).or_default() += 1;
        match a.status {
            StatusCode::OK => {}
            StatusCode::CONFLICT => {
                assert!(
                    a.headers.contains_key("retry-after"),
                    "409 carries Retry-After"
                );
                assert_eq!(a.problem_type(), "urn:idemkey:problem:in-progress");
            }
            other => panic!("unexpected {other}: {:?}", a.body),
        }
    }
    assert_eq!(
        processed(&client, &server).await,
        1,
        "answers: {by_status:?}"
    );
    let fresh = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK && !a.replayed())
        .count();
    assert_eq!(
        fresh, 1,
        "exactly one delivery ran the handler: {by_status:?}"
    );
    let late = deliver(&client, &url, &h, STANDARD_BODY).await;
    assert_eq!((late.status, late.replayed()), (StatusCode::OK, true));
}

/// Unknown paths are 404 with and without signatures: the presets' layers wrap the
/// example's routes only (`route_layer`), not the router's fallback, so a request to a
/// path nobody routed is never answered by a preset (`400 missing-key`,
/// `401 signature-rejected`) and never reaches the store.
#[tokio::test]
async fn unknown_paths_are_404_and_never_reach_a_preset() {
    for secret in [None, Some(STANDARD_SECRET)] {
        let store = support::verifier::FlakyStore::default();
        let (router, _stats) = receiver::app(Arc::new(store.clone()), secret);
        let server = serve(router).await;
        let client = reqwest::Client::new();
        for path in [
            "/nonexistent",
            "/webhooks/nonexistent",
            "/webhooks/stripe/extra",
            "/webhooks",
        ] {
            // Bare, and with the headers a preset would accept as an id.
            for h in [
                headers(&[]),
                headers(&[("webhook-id", "msg_1"), ("x-github-delivery", "d-1")]),
            ] {
                let a = deliver(&client, &server.url(path), &h, STANDARD_BODY).await;
                assert_eq!(
                    a.status,
                    StatusCode::NOT_FOUND,
                    "POST {path} ({secret:?}): {a:?}"
                );
            }
        }
        assert_eq!(store.calls(), 0, "{secret:?}");
        // A route's other methods stay the router's answer too.
        let get = client
            .get(server.url("/webhooks/didit"))
            .send()
            .await
            .expect("answer");
        assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(store.calls(), 0, "{secret:?}");
        assert_eq!(processed(&client, &server).await, 0);
    }
}

/// What the presets' docs tell users: `route_layer` leaves unknown paths to the router
/// (404), `Router::layer` wraps the fallback too, so the preset answers them (here
/// `400 missing-key`, naming the preset's id header).
#[tokio::test]
async fn route_layer_keeps_unknown_paths_404_and_router_layer_does_not() {
    let app = |route_only: bool| {
        let r = Router::new().route("/webhooks/standard", post(|| async { "processed" }));
        let layer = Preset::standard_webhooks().layer(Engine::new(MemoryStore::new()));
        if route_only {
            r.route_layer(layer)
        } else {
            r.layer(layer)
        }
    };
    let client = reqwest::Client::new();
    let route_only = serve(app(true)).await;
    let a = deliver(
        &client,
        &route_only.url("/nonexistent"),
        &headers(&[]),
        STANDARD_BODY,
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let wrapped = serve(app(false)).await;
    let a = deliver(
        &client,
        &wrapped.url("/nonexistent"),
        &headers(&[]),
        STANDARD_BODY,
    )
    .await;
    assert_eq!(
        (a.status, a.problem_type().as_str()),
        (StatusCode::BAD_REQUEST, "urn:idemkey:problem:missing-key"),
        "axum's `Router::layer` wraps the fallback: {a:?}"
    );
    assert!(a.detail().contains("webhook-id"), "{}", a.detail());
    // It speaks to a webhook sender, not to an API client choosing keys.
    assert!(
        a.detail().contains("standard-webhooks deliveries") && !a.detail().contains("UUID"),
        "{}",
        a.detail()
    );
}

/// A route like the example's, whose handler waits at the test's gate (when `gated`) and
/// fails with 500 while `fail` is set.
struct Gated {
    server: TestServer,
    gate: Gate,
    runs: Arc<AtomicU64>,
    fail: Arc<AtomicU64>,
}

#[derive(Clone)]
struct GateState {
    gate: Gate,
    runs: Arc<AtomicU64>,
    fail: Arc<AtomicU64>,
    gated: bool,
}

async fn gated_handler(State(s): State<GateState>, _body: Bytes) -> (StatusCode, &'static str) {
    s.runs.fetch_add(1, Ordering::SeqCst);
    if s.gated {
        s.gate.pass().await;
    }
    if s.fail.load(Ordering::SeqCst) > 0 {
        s.fail.fetch_sub(1, Ordering::SeqCst);
        return (StatusCode::INTERNAL_SERVER_ERROR, "database down");
    }
    (StatusCode::OK, "processed")
}

async fn gated(preset: Preset, gated: bool, fail: u64) -> Gated {
    let state = GateState {
        gate: Gate::default(),
        runs: Arc::new(AtomicU64::new(0)),
        fail: Arc::new(AtomicU64::new(fail)),
        gated,
    };
    let (gate, runs, fail) = (state.gate.clone(), state.runs.clone(), state.fail.clone());
    let router = Router::new()
        .route("/webhooks/github", post(gated_handler))
        .route_layer(preset.layer(Engine::new(MemoryStore::new())))
        .with_state(state);
    Gated {
        server: serve(router).await,
        gate,
        runs,
        fail,
    }
}

#[tokio::test]
async fn a_duplicate_during_processing_gets_409_with_retry_after() {
    let g = gated(Preset::github(), true, 0).await;
    let client = reqwest::Client::new();
    let url = g.server.url("/webhooks/github");
    let h = github_headers("d-1", "7", GITHUB_ISSUES, None);
    let first = tokio::spawn({
        let (client, url, h) = (client.clone(), url.clone(), h.clone());
        async move { deliver(&client, &url, &h, GITHUB_ISSUES).await }
    });
    g.gate.wait_entered(1).await; // the first delivery reached the handler
    let dup = deliver(&client, &url, &h, GITHUB_ISSUES).await;
    assert_eq!(
        dup.status,
        StatusCode::CONFLICT,
        "nothing is acknowledged unprocessed"
    );
    assert_eq!(dup.problem_type(), "urn:idemkey:problem:in-progress");
    let retry_after: u64 = dup.headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(retry_after >= 1);
    g.gate.open(1);
    let first = first.await.expect("first delivery task");
    assert_eq!((first.status, first.replayed()), (StatusCode::OK, false));
    let after = deliver(&client, &url, &h, GITHUB_ISSUES).await;
    assert_eq!((after.status, after.replayed()), (StatusCode::OK, true));
    assert_eq!(g.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_first_delivery_releases_the_id() {
    let g = gated(Preset::github(), false, 1).await;
    let client = reqwest::Client::new();
    let url = g.server.url("/webhooks/github");
    let h = github_headers("d-2", "7", GITHUB_ISSUES, None);
    let failed = deliver(&client, &url, &h, GITHUB_ISSUES).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let redelivery = deliver(&client, &url, &h, GITHUB_ISSUES).await;
    assert_eq!(
        (redelivery.status, redelivery.replayed()),
        (StatusCode::OK, false),
        "processed again"
    );
    let dup = deliver(&client, &url, &h, GITHUB_ISSUES).await;
    assert_eq!((dup.status, dup.replayed()), (StatusCode::OK, true));
    assert_eq!(g.runs.load(Ordering::SeqCst), 2);
    assert_eq!(g.fail.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn slack_handshakes_without_event_id_pass_and_retry_headers_are_ignored() {
    let g = gated(Preset::slack(), false, 0).await;
    let client = reqwest::Client::new();
    let url = g.server.url("/webhooks/github"); // the route's path is irrelevant
    // Slack docs, Events API, "url_verification": no event_id.
    let challenge = r#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    for _ in 0..2 {
        let a = deliver(&client, &url, &headers(&[]), challenge).await;
        assert_eq!((a.status, a.replayed()), (StatusCode::OK, false));
    }
    // Slack docs, Events API, "Callback field overview".
    let event = r#"{"token":"XXYYZZ","team_id":"T123ABC456","api_app_id":"A123ABC456","event":{"type":"app_mention","user":"U123ABC456","text":"hi","ts":"1515449522.000016","channel":"C123ABC456"},"type":"event_callback","event_id":"Ev123ABC456","event_time":1515449522}"#;
    let first = deliver(&client, &url, &headers(&[]), event).await;
    let retry = deliver(
        &client,
        &url,
        &headers(&[
            ("x-slack-retry-num", "1"),
            ("x-slack-retry-reason", "http_timeout"),
        ]),
        event,
    )
    .await;
    assert!(!first.replayed() && retry.replayed());
    assert_eq!(
        g.runs.load(Ordering::SeqCst),
        3,
        "two handshakes and one event"
    );
}

#[tokio::test]
async fn a_forged_duplicate_never_gets_a_replay() {
    let (server, client) = example(Some(STANDARD_SECRET)).await;
    let url = server.url("/webhooks/standard");
    let signer = StandardWebhooksVerifier::new(STANDARD_SECRET).expect("valid secret");
    let genuine = signer
        .sign_headers("msg_genuine", now(), STANDARD_BODY.as_bytes())
        .expect("signs");
    let ok = deliver(&client, &url, &genuine, STANDARD_BODY).await;
    assert_eq!((ok.status, ok.replayed()), (StatusCode::OK, false));

    // Same id, another key: refused before the store is asked.
    let forger =
        StandardWebhooksVerifier::new("whsec_Zm9yZ2VyJ3Mgb3duIHNlY3JldA==").expect("valid secret");
    let forged = forger
        .sign_headers("msg_genuine", now(), STANDARD_BODY.as_bytes())
        .expect("signs");
    let refused = deliver(&client, &url, &forged, STANDARD_BODY).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert!(!refused.replayed());
    assert_eq!(
        refused.problem_type(),
        "urn:idemkey:problem:signature-rejected"
    );

    // A captured genuine delivery replayed an hour later: stale.
    let old = signer
        .sign_headers("msg_old", now() - 3600, STANDARD_BODY.as_bytes())
        .expect("signs");
    assert_eq!(
        deliver(&client, &url, &old, STANDARD_BODY).await.status,
        StatusCode::UNAUTHORIZED
    );
    // An unsigned delivery.
    let unsigned = headers(&[("webhook-id", "msg_genuine")]);
    assert_eq!(
        deliver(&client, &url, &unsigned, STANDARD_BODY)
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );

    let dup = deliver(&client, &url, &genuine, STANDARD_BODY).await;
    assert_eq!((dup.status, dup.replayed()), (StatusCode::OK, true));
    assert_eq!(processed(&client, &server).await, 1);
}

#[tokio::test]
async fn stripe_and_github_signatures_are_checked_when_a_secret_is_given() {
    let secret = "whsec_test_secret";
    let (server, client) = example(Some(secret)).await;
    let stripe = server.url("/webhooks/stripe");
    let body = stripe_event("evt_signed", None, 1);
    let ok = deliver(
        &client,
        &stripe,
        &stripe_signature(secret, now(), &body),
        &body,
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    let tampered = stripe_event("evt_signed", None, 0);
    let bad = deliver(
        &client,
        &stripe,
        &stripe_signature(secret, now(), &body),
        &tampered,
    )
    .await;
    assert_eq!(
        (bad.status, bad.replayed()),
        (StatusCode::UNAUTHORIZED, false)
    );
    let stale = deliver(
        &client,
        &stripe,
        &stripe_signature(secret, now() - 3600, &body),
        &body,
    )
    .await;
    assert_eq!(stale.status, StatusCode::UNAUTHORIZED);
    let retry = deliver(
        &client,
        &stripe,
        &stripe_signature(secret, now(), &tampered),
        &tampered,
    )
    .await;
    assert_eq!(
        (retry.status, retry.replayed()),
        (StatusCode::OK, true),
        "a signed retry is a duplicate"
    );

    let github = server.url("/webhooks/github");
    let good = github_headers("g-1", "9", GITHUB_ISSUES, Some(secret));
    assert_eq!(
        deliver(&client, &github, &good, GITHUB_ISSUES).await.status,
        StatusCode::OK
    );
    let wrong = github_headers("g-1", "9", GITHUB_ISSUES, Some("not the secret"));
    let refused = deliver(&client, &github, &wrong, GITHUB_ISSUES).await;
    assert_eq!(
        (refused.status, refused.replayed()),
        (StatusCode::UNAUTHORIZED, false)
    );
    assert_eq!(processed(&client, &server).await, 2);
}

/// A SendGrid Event Webhook route: the batch deduper behind an axum handler.
async fn sendgrid(
    fail_on: Option<&'static str>,
) -> (TestServer, Arc<std::sync::Mutex<HashMap<String, u32>>>) {
    #[derive(Clone)]
    struct S {
        dedup: BatchDeduper,
        seen: Arc<std::sync::Mutex<HashMap<String, u32>>>,
        fail_on: Arc<std::sync::Mutex<Option<&'static str>>>,
    }
    async fn handle(State(s): State<S>, body: Bytes) -> (StatusCode, String) {
        let result = s
            .dedup
            .process(&body, |item| {
                let s = s.clone();
                async move {
                    let id = item
                        .key()
                        .map(|k| k.as_str().to_owned())
                        .unwrap_or_default();
                    let fail = {
                        let mut f = s.fail_on.lock().expect("not poisoned");
                        if f.as_deref() == Some(id.as_str()) {
                            f.take().is_some()
                        } else {
                            false
                        }
                    };
                    if fail {
                        return Err("mail database unavailable");
                    }
                    tokio::task::yield_now().await;
                    *s.seen.lock().expect("not poisoned").entry(id).or_default() += 1;
                    Ok(())
                }
            })
            .await;
        match result {
            Ok(o) if o.is_settled() => (StatusCode::OK, format!("{o:?}")),
            Ok(o) => (StatusCode::CONFLICT, format!("{o:?}")),
            Err(e) => (e.status(), e.to_string()),
        }
    }
    let seen = Arc::new(std::sync::Mutex::new(HashMap::new()));
    let state = S {
        dedup: BatchDeduper::sendgrid(MemoryStore::new()),
        seen: seen.clone(),
        fail_on: Arc::new(std::sync::Mutex::new(fail_on)),
    };
    let router = Router::new()
        .route("/webhooks/sendgrid", post(handle))
        .with_state(state);
    (serve(router).await, seen)
}

/// A SendGrid event array (Twilio SendGrid docs: "Event Webhook Reference").
fn sendgrid_batch(ids: impl IntoIterator<Item = u32>) -> String {
    let events: Vec<serde_json::Value> = ids
        .into_iter()
        .map(|i| {
            serde_json::json!({
                "email": "example@test.com",
                "timestamp": 1_513_299_569 + i,
                "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
                "event": if i % 2 == 0 { "processed" } else { "delivered" },
                "category": "cat facts",
                "sg_event_id": format!("sg_event_id_{i:04}"),
                "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0"
            })
        })
        .collect();
    serde_json::to_string(&events).expect("serialisable")
}

#[tokio::test]
async fn concurrent_overlapping_batches_process_each_event_once() {
    let (server, seen) = sendgrid(None).await;
    let client = reqwest::Client::new();
    let url = server.url("/webhooks/sendgrid");
    let a = sendgrid_batch(0..20);
    let b = sendgrid_batch(10..30);
    let sends = (0..100).map(|i| {
        let body = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (client, url) = (client.clone(), url.clone());
        async move { deliver(&client, &url, &headers(&[]), &body).await }
    });
    for ans in join_all(sends).await {
        assert!(
            matches!(ans.status, StatusCode::OK | StatusCode::CONFLICT),
            "{ans:?}"
        );
    }
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(seen.len(), 30);
    assert!(
        seen.values().all(|&n| n == 1),
        "each event exactly once: {seen:?}"
    );
    // SendGrid retries a 409'd batch: now settled.
    assert_eq!(
        deliver(&client, &url, &headers(&[]), &a).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_failed_batch_keeps_its_completed_items_and_retries_the_rest() {
    let (server, seen) = sendgrid(Some("sg_event_id_0005")).await;
    let client = reqwest::Client::new();
    let url = server.url("/webhooks/sendgrid");
    let batch = sendgrid_batch(0..10);
    let failed = deliver(&client, &url, &headers(&[]), &batch).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        seen.lock().expect("not poisoned").len(),
        5,
        "items 0-4 done before the failure"
    );
    let retry = deliver(&client, &url, &headers(&[]), &batch).await;
    assert_eq!(retry.status, StatusCode::OK);
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(seen.len(), 10);
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    let bad = deliver(&client, &url, &headers(&[]), r#"{"not":"an array"}"#).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_oversized_signed_delivery_gets_413_naming_the_size_not_the_signature() {
    let (server, client) = example(Some("whsec_test_secret")).await;
    let resp = client
        .post(server.url("/webhooks/stripe"))
        .header("content-type", "application/json")
        .body(vec![b' '; 3 * 1024 * 1024])
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let problem: serde_json::Value = resp.json().await.expect("problem+json");
    assert!(
        problem["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("body-too-large")),
        "{problem}"
    );
    assert_eq!(problem["title"], "Request body too large");
}
