//! Signed senders against real servers on 127.0.0.1: Didit and Adyen through the example
//! receiver (`examples/webhook_receiver.rs`), Persona, Onfido and Sumsub through routes
//! built the same way, with payloads and headers shaped from each provider's docs and
//! the vendors' own test vectors where they publish them. Every refused delivery is
//! checked to have left the store untouched (a store that counts what it is asked, `FlakyStore`).

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::routing::post;
use futures_util::future::join_all;
use http::{HeaderMap, StatusCode};
use idemkey::server::Engine;
use idemkey::server::webhook::{HmacVerifier, Preset};
use idemkey::store::Store;
use idemkey::testing::TestServer;
use support::serve;
use support::verifier::{Answer, FlakyStore};
use support::webhook::*;

const SIGNATURE_REJECTED: &str = "urn:idemkey:problem:signature-rejected";

async fn example(store: &FlakyStore, secret: &str) -> (TestServer, reqwest::Client) {
    let (router, _stats) = receiver::app(Arc::new(store.clone()), Some(secret));
    (serve(router).await, reqwest::Client::new())
}

fn refused(a: &Answer) -> bool {
    a.status == StatusCode::UNAUTHORIZED && !a.replayed() && a.problem_type() == SIGNATURE_REJECTED
}

/// The record a Didit delivery would be kept under, if it were ever claimed.
async fn didit_record(store: &FlakyStore, body: &str) -> Option<idemkey::store::RecordInfo> {
    let id = Preset::didit()
        .identify(&HeaderMap::new(), body.as_bytes())
        .expect("a Didit body is identified")
        .expect("it has an id");
    store.inspect(&id.record_id()).await.expect("inspect")
}

#[tokio::test]
async fn didit_duplicates_and_resends_are_processed_once() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, DIDIT_SECRET).await;
    let url = server.url("/webhooks/didit");
    let session = "11111111-2222-3333-4444-555555555555";
    let decision = || Some(didit_decision(session, "Approved"));
    let body = didit_event(
        Some("evt-approved"),
        session,
        "status.updated",
        "Approved",
        decision(),
        now(),
    );
    let first = deliver(&client, &url, &didit_headers(DIDIT_SECRET, &body), &body).await;
    assert_eq!((first.status, first.replayed()), (StatusCode::OK, false));
    let again = deliver(&client, &url, &didit_headers(DIDIT_SECRET, &body), &body).await;
    assert_eq!((again.status, again.replayed()), (StatusCode::OK, true));
    assert_eq!(again.body, first.body, "the first 2xx replayed");

    // A resend (Didit docs, "Resend webhook") keeps `event_id` and refreshes the
    // `timestamp` and the signatures: other bytes, the same fact.
    let resent = didit_event(
        Some("evt-approved"),
        session,
        "status.updated",
        "Approved",
        decision(),
        now() + 1,
    );
    assert_ne!(resent, body);
    let r = deliver(
        &client,
        &url,
        &didit_headers(DIDIT_SECRET, &resent),
        &resent,
    )
    .await;
    assert_eq!((r.status, r.replayed()), (StatusCode::OK, true));
    assert_eq!(processed(&client, &server).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn didit_concurrent_duplicates_are_processed_once() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, DIDIT_SECRET).await;
    let url = server.url("/webhooks/didit");
    let session = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
    let body = didit_event(
        Some("evt-concurrent"),
        session,
        "status.updated",
        "Approved",
        Some(didit_decision(session, "Approved")),
        now(),
    );
    let h = didit_headers(DIDIT_SECRET, &body);
    let answers = join_all((0..200).map(|_| deliver(&client, &url, &h, &body))).await;
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for a in &answers {
        *by_status.entry(a.status.as_u16()).or_default() += 1;
        assert!(
            matches!(a.status, StatusCode::OK | StatusCode::CONFLICT),
            "{a:?}"
        );
    }
    assert_eq!(processed(&client, &server).await, 1, "{by_status:?}");
    let late = deliver(&client, &url, &h, &body).await;
    assert_eq!((late.status, late.replayed()), (StatusCode::OK, true));
}

#[tokio::test]
async fn didit_the_same_session_with_a_new_status_is_a_new_fact() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, DIDIT_SECRET).await;
    let url = server.url("/webhooks/didit");
    let session = "33333333-2222-3333-4444-555555555555";
    let send = |body: String| {
        let (client, url) = (client.clone(), url.clone());
        async move { deliver(&client, &url, &didit_headers(DIDIT_SECRET, &body), &body).await }
    };
    // Current payloads: each status change is its own event.
    for (event, status, decision) in [
        ("evt-1", "In Progress", None),
        (
            "evt-2",
            "In Review",
            Some(didit_decision(session, "In Review")),
        ),
        (
            "evt-3",
            "Approved",
            Some(didit_decision(session, "Approved")),
        ),
    ] {
        let a = send(didit_event(
            Some(event),
            session,
            "status.updated",
            status,
            decision,
            now(),
        ))
        .await;
        assert_eq!(
            (a.status, a.replayed()),
            (StatusCode::OK, false),
            "{status}"
        );
    }
    assert_eq!(processed(&client, &server).await, 3);

    // Older payloads carry no `event_id`: the fact is session, type, status and decision.
    let legacy = "44444444-2222-3333-4444-555555555555";
    let approved = didit_decision(legacy, "Approved");
    let first = send(didit_event(
        None,
        legacy,
        "status.updated",
        "Approved",
        Some(approved.clone()),
        now(),
    ))
    .await;
    let dup = send(didit_event(
        None,
        legacy,
        "status.updated",
        "Approved",
        Some(approved.clone()),
        now() + 2,
    ))
    .await;
    assert_eq!((first.replayed(), dup.replayed()), (false, true));
    // A reviewer corrects the data: `data.updated`, same status, another decision.
    let mut corrected = approved;
    corrected["id_verifications"][0]["warnings"] = serde_json::json!(["NAME_CORRECTED"]);
    let update = send(didit_event(
        None,
        legacy,
        "data.updated",
        "Approved",
        Some(corrected.clone()),
        now(),
    ))
    .await;
    let update_dup = send(didit_event(
        None,
        legacy,
        "data.updated",
        "Approved",
        Some(corrected),
        now() + 3,
    ))
    .await;
    assert_eq!((update.replayed(), update_dup.replayed()), (false, true));
    let declined = send(didit_event(
        None,
        legacy,
        "status.updated",
        "Declined",
        Some(didit_decision(legacy, "Declined")),
        now(),
    ))
    .await;
    assert!(!declined.replayed());
    assert_eq!(processed(&client, &server).await, 6);
}

#[tokio::test]
async fn didit_tampered_stale_or_forged_deliveries_never_touch_the_store() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, DIDIT_SECRET).await;
    let url = server.url("/webhooks/didit");
    let session = "55555555-2222-3333-4444-555555555555";
    let body = didit_event(
        Some("evt-genuine"),
        session,
        "status.updated",
        "Declined",
        Some(didit_decision(session, "Declined")),
        now(),
    );
    let genuine = didit_headers(DIDIT_SECRET, &body);

    // Declined turned into Approved on the way; the signatures are the genuine ones.
    let tampered = body.replace("Declined", "Approved");
    let a = deliver(&client, &url, &genuine, &tampered).await;
    assert!(refused(&a), "{a:?}");
    // A genuine delivery captured an hour ago, replayed under a new event id.
    let old = didit_event(
        Some("evt-replayed"),
        session,
        "status.updated",
        "Declined",
        None,
        now() - 3600,
    );
    let a = deliver(&client, &url, &didit_headers(DIDIT_SECRET, &old), &old).await;
    assert!(refused(&a) && a.detail().contains("timestamp"), "{a:?}");
    // Signed with another secret, or not at all.
    let a = deliver(
        &client,
        &url,
        &didit_headers("not-the-secret", &body),
        &body,
    )
    .await;
    assert!(refused(&a), "{a:?}");
    let a = deliver(
        &client,
        &url,
        &headers(&[("x-timestamp", &now().to_string())]),
        &body,
    )
    .await;
    assert!(refused(&a), "{a:?}");
    // Only X-Signature-Simple: not accepted by default (it leaves the decision unsigned).
    let simple_only = headers(&[(
        "x-signature-simple",
        genuine["x-signature-simple"].to_str().expect("hex"),
    )]);
    let a = deliver(&client, &url, &simple_only, &tampered).await;
    assert!(refused(&a), "{a:?}");

    assert_eq!(store.calls(), 0, "no refused delivery reached the store");
    assert_eq!(didit_record(&store, &tampered).await, None);
    assert_eq!(processed(&client, &server).await, 0);

    let ok = deliver(&client, &url, &genuine, &body).await;
    assert_eq!((ok.status, ok.replayed()), (StatusCode::OK, false));
    assert!(store.calls() > 0);
    assert!(didit_record(&store, &body).await.is_some());
    assert_eq!(processed(&client, &server).await, 1);
}

fn adyen_items(range: std::ops::Range<u32>) -> Vec<serde_json::Value> {
    range
        .map(|i| {
            adyen_item(
                &format!("88{i:014}"),
                "AUTHORISATION",
                true,
                10_100 + u64::from(i),
                ADYEN_HMAC_KEY,
            )
        })
        .collect()
}

#[tokio::test]
async fn adyen_vendor_vector_is_accepted_once_with_the_accepted_answer() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, ADYEN_HMAC_KEY).await;
    let url = server.url("/webhooks/adyen");
    let body = format!(
        r#"{{"live":"false","notificationItems":[{{"NotificationRequestItem":{ADYEN_VECTOR_ITEM}}}]}}"#
    );
    for _ in 0..2 {
        let a = deliver(&client, &url, &headers(&[]), &body).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(
            &a.body[..],
            b"[accepted]",
            "Adyen expects `[accepted]`, duplicates included"
        );
    }
    assert_eq!(processed(&client, &server).await, 1);
}

#[tokio::test]
async fn adyen_a_batch_with_half_its_items_seen_before_processes_only_the_new_half() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, ADYEN_HMAC_KEY).await;
    let url = server.url("/webhooks/adyen");
    let a = deliver(
        &client,
        &url,
        &headers(&[]),
        &adyen_batch(adyen_items(0..5)),
    )
    .await;
    assert_eq!(
        (a.status, &a.body[..]),
        (StatusCode::OK, &b"[accepted]"[..])
    );
    assert_eq!(processed(&client, &server).await, 5);
    let a = deliver(
        &client,
        &url,
        &headers(&[]),
        &adyen_batch(adyen_items(0..10)),
    )
    .await;
    assert_eq!(
        (a.status, &a.body[..]),
        (StatusCode::OK, &b"[accepted]"[..])
    );
    assert_eq!(
        processed(&client, &server).await,
        10,
        "only items 5..10 ran"
    );
}

#[tokio::test]
async fn adyen_success_false_then_true_is_a_new_fact() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, ADYEN_HMAC_KEY).await;
    let url = server.url("/webhooks/adyen");
    let item = |success| {
        adyen_item(
            "7914073381342284",
            "AUTHORISATION",
            success,
            1130,
            ADYEN_HMAC_KEY,
        )
    };
    for (success, total) in [(false, 1), (false, 1), (true, 2), (true, 2)] {
        let a = deliver(&client, &url, &headers(&[]), &adyen_batch([item(success)])).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(
            processed(&client, &server).await,
            total,
            "success={success}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adyen_concurrent_overlapping_batches_process_each_item_once() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, ADYEN_HMAC_KEY).await;
    let url = server.url("/webhooks/adyen");
    let (a, b) = (
        adyen_batch(adyen_items(0..12)),
        adyen_batch(adyen_items(6..18)),
    );
    let sends = (0..60).map(|i| {
        let body = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (client, url) = (client.clone(), url.clone());
        async move { deliver(&client, &url, &headers(&[]), &body).await }
    });
    for ans in join_all(sends).await {
        match ans.status {
            StatusCode::OK => assert_eq!(&ans.body[..], b"[accepted]"),
            StatusCode::CONFLICT => assert!(ans.retry_after().is_some(), "{ans:?}"),
            other => panic!("unexpected {other}: {ans:?}"),
        }
    }
    assert_eq!(
        processed(&client, &server).await,
        18,
        "each item exactly once"
    );
    // Adyen retries a 409'd batch: settled now.
    let retry = deliver(&client, &url, &headers(&[]), &b).await;
    assert_eq!(
        (retry.status, &retry.body[..]),
        (StatusCode::OK, &b"[accepted]"[..])
    );
    assert_eq!(processed(&client, &server).await, 18);
}

#[tokio::test]
async fn adyen_one_bad_item_refuses_the_batch_before_any_record_is_touched() {
    let store = FlakyStore::default();
    let (server, client) = example(&store, ADYEN_HMAC_KEY).await;
    let url = server.url("/webhooks/adyen");
    let mut tampered = adyen_items(0..4);
    tampered[3]["amount"]["value"] = serde_json::json!(1);
    let mut unsigned = adyen_items(0..4);
    unsigned[2]["additionalData"] = serde_json::json!({});
    let other_key = adyen_item(
        "8800000000000001",
        "AUTHORISATION",
        true,
        10_101,
        "11223344D785FBAE710E7F943F307971BB61B21281C98C9129B3D4018A57B2EB",
    );
    let mut forged = adyen_items(0..4);
    forged[1] = other_key;
    for (what, batch) in [
        ("tampered", tampered),
        ("unsigned", unsigned),
        ("other key", forged),
    ] {
        let a = deliver(&client, &url, &headers(&[]), &adyen_batch(batch)).await;
        assert!(refused(&a), "{what}: {a:?}");
        assert!(a.detail().contains("batch item"), "{what}: {}", a.detail());
    }
    assert_eq!(store.calls(), 0, "no item was claimed");
    assert_eq!(processed(&client, &server).await, 0);
    let ok = deliver(
        &client,
        &url,
        &headers(&[]),
        &adyen_batch(adyen_items(0..4)),
    )
    .await;
    assert_eq!(
        (ok.status, &ok.body[..]),
        (StatusCode::OK, &b"[accepted]"[..])
    );
    assert_eq!(processed(&client, &server).await, 4);
}

/// One signed sender's route, built like the example's: the preset (with its verifier)
/// on the route, a handler that counts its runs, a counting store.
struct Route {
    server: TestServer,
    runs: Arc<AtomicU64>,
    store: FlakyStore,
}

async fn route(preset: Preset) -> Route {
    let store = FlakyStore::default();
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let router = Router::new()
        .route(
            "/hook",
            post(move || {
                let runs = counter.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    "processed"
                }
            }),
        )
        .route_layer(preset.layer(Engine::new(store.clone())));
    Route {
        server: serve(router).await,
        runs,
        store,
    }
}

/// One sender's deliveries: a fact, the same fact again, a new fact about the same
/// subject, and a forgery of the first.
struct Script {
    preset: Preset,
    first: (HeaderMap, String),
    new_fact: (HeaderMap, String),
    tampered: (HeaderMap, String),
    stale: Option<(HeaderMap, String)>,
}

async fn run_script(s: Script) {
    let name = s.preset.name().to_owned();
    let r = route(s.preset).await;
    let client = reqwest::Client::new();
    let url = r.server.url("/hook");

    let (h, body) = &s.tampered;
    let a = deliver(&client, &url, h, body).await;
    assert!(refused(&a), "{name}: tampered: {a:?}");
    if let Some((h, body)) = &s.stale {
        let a = deliver(&client, &url, h, body).await;
        assert!(refused(&a), "{name}: stale: {a:?}");
    }
    assert_eq!(r.store.calls(), 0, "{name}: refused before the store");

    let (h, body) = &s.first;
    let answers = join_all((0..50).map(|_| deliver(&client, &url, h, body))).await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a.status, StatusCode::OK | StatusCode::CONFLICT)),
        "{name}: {answers:?}"
    );
    assert_eq!(
        r.runs.load(Ordering::SeqCst),
        1,
        "{name}: concurrent duplicates"
    );
    let again = deliver(&client, &url, h, body).await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::OK, true),
        "{name}"
    );

    let (h, body) = &s.new_fact;
    let a = deliver(&client, &url, h, body).await;
    assert_eq!(
        (a.status, a.replayed()),
        (StatusCode::OK, false),
        "{name}: new fact"
    );
    assert_eq!(r.runs.load(Ordering::SeqCst), 2, "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn persona_events_once_signatures_first() {
    let secret = "wbhsec_8b3f1c0e2d4a6b8c0e2f4a6c";
    let approved = persona_event(
        "evt_XGuYWp7WuDzNxie5z16s7sGJ",
        "inq_2CVZ4HyVg7qaboXz2PUHknAn",
        "approved",
    );
    let declined = persona_event(
        "evt_5ZkJ7m9bT2nQ4rV6xY8aC1dE",
        "inq_2CVZ4HyVg7qaboXz2PUHknAn",
        "declined",
    );
    run_script(Script {
        preset: Preset::persona().verifier(HmacVerifier::persona(secret)),
        first: (
            persona_signature(secret, now(), &approved),
            approved.clone(),
        ),
        new_fact: (persona_signature(secret, now(), &declined), declined),
        tampered: (
            persona_signature(secret, now(), &approved),
            approved.replace("approved", "completed"),
        ),
        stale: Some((persona_signature(secret, now() - 3600, &approved), approved)),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn onfido_events_once_signatures_first() {
    let token = "_ABC123abc123ABC123abc123ABC123_";
    let started = onfido_event("check-123", "check.started", "in_progress");
    let completed = onfido_event("check-123", "check.completed", "complete");
    run_script(Script {
        preset: Preset::onfido().verifier(HmacVerifier::onfido(token)),
        first: (onfido_signature(token, &started), started.clone()),
        new_fact: (onfido_signature(token, &completed), completed),
        tampered: (
            onfido_signature(token, &started),
            started.replace("check-123", "check-999"),
        ),
        stale: None, // Onfido's scheme has no timestamp
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sumsub_events_once_signatures_first() {
    let secret = "sumsub_webhook_secret";
    let green = sumsub_event(
        "req-a260b669-4f14-4bb5-a4c5-ac0218acb9a4",
        "5cb56e8e0a975a35f333cb83",
        "GREEN",
    );
    // Sumsub docs: an approved applicant later found to be a fraudster gets a second,
    // RED `applicantReviewed`.
    let red = sumsub_event(
        "req-7c1e2a90-1b3d-4e5f-8a9b-0c1d2e3f4a5b",
        "5cb56e8e0a975a35f333cb83",
        "RED",
    );
    run_script(Script {
        preset: Preset::sumsub().verifier(HmacVerifier::sumsub(secret)),
        first: (sumsub_signature(secret, &green), green.clone()),
        new_fact: (sumsub_signature(secret, &red), red),
        tampered: (
            sumsub_signature(secret, &green),
            green.replace("GREEN", "RED"),
        ),
        stale: None, // Sumsub's scheme has no timestamp
    })
    .await;
}
