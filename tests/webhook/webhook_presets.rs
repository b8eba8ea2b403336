//! Every preset against deliveries shaped like the provider's documented ones, and the
//! retention floors against the real layer and store with a paused clock.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use idemkey::server::Engine;
use idemkey::server::webhook::{DEFAULT_WEBHOOK_RETENTION, Preset};
use idemkey::store::MemoryStore;
use support::webhook::headers;
use tower::ServiceExt;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// (key, scope) of a delivery, which the preset must identify.
fn id(preset: &Preset, h: &HeaderMap, body: &str) -> (String, String) {
    let d = preset
        .identify(h, body.as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", preset.name()))
        .unwrap_or_else(|| panic!("{}: the delivery has an id", preset.name()));
    (d.key().as_str().to_owned(), d.scope().to_owned())
}

#[test]
fn standard_webhooks_and_svix() {
    // Standard Webhooks specification, "Webhook headers"; Svix docs, "Verifying Webhooks".
    let h = headers(&[
        ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
        ("webhook-timestamp", "1674087231"),
        (
            "webhook-signature",
            "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        ),
    ]);
    let body = r#"{"type":"contact.created","timestamp":"2022-11-03T20:26:10.344522Z","data":{"id":"1f81eb52-5198-4599-803e-771906343485","type":"contact"}}"#;
    assert_eq!(
        id(&Preset::standard_webhooks(), &h, body),
        (
            "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W".into(),
            "webhook:standard-webhooks".into()
        )
    );
    let svix = headers(&[
        ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("svix-timestamp", "1614265330"),
    ]);
    assert_eq!(
        id(&Preset::svix(), &svix, body).0,
        "msg_p5jXN8AQM9LWM0D4loKWxJek"
    );
    let missing = Preset::svix()
        .identify(&h, body.as_bytes())
        .expect_err("no svix-id");
    assert_eq!(missing.problem_type(), "missing-key");
    assert!(
        missing.detail().contains("svix deliveries") && missing.detail().contains("svix-id"),
        "speaks to the webhook's sender: {}",
        missing.detail()
    );
}

#[test]
fn stripe_scopes_connected_accounts() {
    let platform = r#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"charge.succeeded","pending_webhooks":1,"data":{"object":{"id":"ch_1"}}}"#;
    let connect = r#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","account":"acct_1032D82eZvKYlo2C","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}"#;
    let p = Preset::stripe();
    assert_eq!(id(&p, &HeaderMap::new(), platform).1, "webhook:stripe");
    assert_eq!(
        id(&p, &HeaderMap::new(), connect).1,
        "webhook:stripe/acct_1032D82eZvKYlo2C"
    );
    assert_eq!(
        id(&p, &HeaderMap::new(), platform).0,
        id(&p, &HeaderMap::new(), connect).0
    );
}

#[test]
fn github_scopes_by_hook() {
    let h = headers(&[
        ("x-github-event", "push"),
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("x-github-hook-id", "292430182"),
        ("user-agent", "GitHub-Hookshot/044aadd"),
    ]);
    assert_eq!(
        id(&Preset::github(), &h, "{}"),
        (
            "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
            "webhook:github/292430182".into()
        )
    );
}

#[test]
fn shopify_per_subscription_or_per_event() {
    // Shopify docs, "About webhooks", headers of two subscriptions reached by one event.
    let sub = |webhook_id: &str| {
        headers(&[
            ("x-shopify-topic", "orders/create"),
            (
                "x-shopify-hmac-sha256",
                "XWmrwMey6OsLMeiZKwP4FppHH3cmAiiJJAweH5Jo4bM=",
            ),
            ("x-shopify-shop-domain", "johns-apparel.myshopify.com"),
            ("x-shopify-api-version", "2024-07"),
            ("x-shopify-webhook-id", webhook_id),
            ("x-shopify-event-id", "98880550-7158-44d4-b7cd-2c97c8a091b5"),
            ("x-shopify-triggered-at", "2023-03-29T18:00:27.877041743Z"),
        ])
    };
    let (a, b) = (
        sub("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
        sub("0a3d8c0e-7f4b-4c55-9a41-2f1d0e9b7c11"),
    );
    let body = r#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let per_sub = Preset::shopify();
    assert_ne!(id(&per_sub, &a, body).0, id(&per_sub, &b, body).0);
    assert_eq!(
        id(&per_sub, &a, body).1,
        "webhook:shopify/johns-apparel.myshopify.com"
    );
    let per_event = Preset::shopify_events();
    assert_eq!(
        id(&per_event, &a, body),
        id(&per_event, &b, body),
        "subscriptions collapse"
    );
}

#[test]
fn slack_uses_event_id_and_lets_handshakes_through() {
    let event = r#"{"token":"XXYYZZ","team_id":"T123ABC456","api_app_id":"A123ABC456","event":{"type":"app_mention"},"type":"event_callback","event_id":"Ev123ABC456","event_time":1515449522}"#;
    let retry = headers(&[
        ("x-slack-retry-num", "2"),
        ("x-slack-retry-reason", "http_timeout"),
    ]);
    assert_eq!(id(&Preset::slack(), &retry, event).0, "Ev123ABC456");
    let challenge = r#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    assert_eq!(
        Preset::slack()
            .identify(&HeaderMap::new(), challenge.as_bytes())
            .expect("ok"),
        None
    );
    assert!(!Preset::slack().is_key_required());
}

#[test]
fn gitlab_jira_and_the_ietf_header() {
    // GitLab docs, Webhooks, "Delivery headers".
    let gl = headers(&[
        ("x-gitlab-event", "Push Hook"),
        ("x-gitlab-instance", "https://gitlab.com"),
        (
            "x-gitlab-webhook-uuid",
            "16f36e20-1bd6-4d3a-a0f6-9e2bbd6b4d47",
        ),
        (
            "x-gitlab-event-uuid",
            "13792a34-cac6-4fda-95a8-c58e00a3954e",
        ),
        ("idempotency-key", "f5e5f430-f57b-4e6e-9fac-d9128cd7232f"),
    ]);
    assert_eq!(
        id(&Preset::gitlab(), &gl, r#"{"object_kind":"push"}"#),
        (
            "f5e5f430-f57b-4e6e-9fac-d9128cd7232f".into(),
            "webhook:gitlab/https://gitlab.com".into()
        )
    );
    // Atlassian docs, Jira Cloud webhooks.
    let jira = headers(&[
        (
            "x-atlassian-webhook-identifier",
            "7c4a5e5b-2d8f-4b51-9a3e-6a1c2f0d9b88",
        ),
        ("x-atlassian-webhook-retry", "1"),
    ]);
    assert_eq!(
        id(
            &Preset::jira(),
            &jira,
            r#"{"webhookEvent":"jira:issue_updated"}"#
        )
        .0,
        "7c4a5e5b-2d8f-4b51-9a3e-6a1c2f0d9b88"
    );
    // IETF draft: sf-string and bare forms name the same key.
    let quoted = headers(&[(
        "idempotency-key",
        "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
    )]);
    assert_eq!(
        id(&Preset::idempotency_key(), &quoted, "").0,
        "8e03978e-40d5-43e8-bc93-6894a57f9324"
    );
}

#[test]
fn body_id_presets() {
    let cases = [
        // Paddle docs, "Handle webhook delivery" / notification payload.
        (
            Preset::paddle(),
            r#"{"event_id":"evt_01h8bzakzx3hm2fmen703n5q45","event_type":"transaction.updated","occurred_at":"2023-08-22T14:52:10.470219Z","notification_id":"ntf_01h8bzam1z32agrxjwhjgqk8w6","data":{"id":"txn_01h8bz"}}"#,
            "evt_01h8bzakzx3hm2fmen703n5q45",
        ),
        // Square docs, Webhooks, "Event notification" payload.
        (
            Preset::square(),
            r#"{"merchant_id":"6SSW7HV8K2ST5","type":"payment.created","event_id":"13b867cf-db3d-4b1c-90b6-2f32a9d78124","created_at":"2020-02-06T21:27:30.792Z","data":{"type":"payment","id":"KkAkhdMsgzn59SM8A89WgKwekxLZY"}}"#,
            "13b867cf-db3d-4b1c-90b6-2f32a9d78124",
        ),
        // PayPal docs, Webhooks event payload.
        (
            Preset::paypal(),
            r#"{"id":"WH-2WR32451HC0233532-67976317FL4543714","event_version":"1.0","create_time":"2014-10-23T17:23:52Z","resource_type":"sale","event_type":"PAYMENT.SALE.COMPLETED","resource":{"id":"80021663DE681814L"}}"#,
            "WH-2WR32451HC0233532-67976317FL4543714",
        ),
        // Mailgun docs, Webhooks payload.
        (
            Preset::mailgun(),
            r#"{"signature":{"timestamp":"1529006854","token":"a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0","signature":"d2271d12299f6592d9d44cd9d250f0704e4674c30d79d07c47a66f95ce71cf55"},"event-data":{"event":"opened","timestamp":1529006854.329574,"id":"DACSsAdVSeGpLid7TN03WA"}}"#,
            "DACSsAdVSeGpLid7TN03WA",
        ),
    ];
    for (preset, body, want) in cases {
        assert_eq!(
            id(&preset, &HeaderMap::new(), body).0,
            want,
            "{}",
            preset.name()
        );
        let e = preset
            .identify(&HeaderMap::new(), b"{}")
            .expect_err("no id");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }
}

#[test]
fn didit_event_id_else_the_fact_scoped_by_application() {
    let p = Preset::didit();
    let h = HeaderMap::new();
    // A payload of Didit's server (didit-protocol/plugin-wordpress fixtures).
    let current = r#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Declined","timestamp":1774970000,"webhook_type":"status.updated"}"#;
    assert_eq!(
        id(&p, &h, current),
        (
            "9c0c8b8a-1111-4222-9333-444444444444".into(),
            "webhook:didit/11111111-2222-3333-4444-555555555555".into()
        )
    );
    // A resend refreshes `timestamp` (and the signatures): same id.
    let resent = current.replace("1774970000", "1774979999");
    assert_eq!(id(&p, &h, &resent), id(&p, &h, current));
    // An older payload without `event_id` or `application_id`: the fact, in the base scope.
    let legacy = |status: &str, decision: &str| {
        format!(
            r#"{{"session_id":"s-1","status":"{status}","webhook_type":"status.updated","timestamp":1627680000,"vendor_data":"user-123"{decision}}}"#
        )
    };
    let approved = legacy(
        "Approved",
        r#","decision":{"status":"Approved","kyc":{"first_name":"Jose"}}"#,
    );
    let (key, scope) = id(&p, &h, &approved);
    assert!(key.starts_with("composite:"), "{key}");
    assert_eq!(scope, "webhook:didit");
    // The decision's digest ignores key order and spacing...
    let reordered = legacy(
        "Approved",
        r#", "decision": {"kyc": {"first_name": "Jose"}, "status": "Approved"}"#,
    );
    assert_eq!(id(&p, &h, &reordered).0, key);
    // ...but not its content, its status or the event type.
    let corrected = legacy(
        "Approved",
        r#","decision":{"status":"Approved","kyc":{"first_name":"José"}}"#,
    );
    let in_progress = legacy("In Progress", "");
    let data_updated = approved.replace("status.updated", "data.updated");
    let keys: HashSet<String> = [&approved, &corrected, &in_progress, &data_updated]
        .into_iter()
        .map(|b| id(&p, &h, b).0)
        .collect();
    assert_eq!(keys.len(), 4, "four facts");
    assert_eq!(p.min_retention(), 2 * DAY);
    let e = p
        .identify(&h, br#"{"status":"Approved"}"#)
        .expect_err("no id, no fact");
    assert_eq!(e.problem_type(), "missing-key");
}

#[test]
fn persona_onfido_sumsub_ids() {
    let h = HeaderMap::new();
    // Persona docs, "Webhooks": the example event.
    let persona = r#"{"data":{"type":"event","id":"evt_XGuYWp7WuDzNxie5z16s7sGJ","attributes":{"name":"inquiry.approved","payload":{"data":{"type":"inquiry","id":"inq_2CVZ4HyVg7qaboXz2PUHknAn","attributes":{"status":"approved"}}},"created-at":"2019-09-09T22:46:23.000Z"}}}"#;
    assert_eq!(
        id(&Preset::persona(), &h, persona),
        (
            "evt_XGuYWp7WuDzNxie5z16s7sGJ".into(),
            "webhook:persona".into()
        )
    );
    // onfido-node's test events: no event id; a new action or status is a new fact.
    let onfido = |action: &str, status: &str| {
        format!(
            r#"{{"payload":{{"resource_type":"check","action":"{action}","object":{{"id":"check-123","status":"{status}","completed_at_iso8601":"2020-01-01T00:00:00Z","href":"https://api.onfido.com/v3/checks/check-123"}}}}}}"#
        )
    };
    let o = Preset::onfido();
    let completed = id(&o, &h, &onfido("check.completed", "complete"));
    assert_eq!(
        completed,
        id(&o, &h, &onfido("check.completed", "complete"))
    );
    assert_ne!(
        completed,
        id(&o, &h, &onfido("check.started", "in_progress"))
    );
    assert_ne!(
        completed,
        id(&o, &h, &onfido("check.completed", "withdrawn"))
    );
    let no_status = r#"{"payload":{"resource_type":"workflow_run","action":"workflow_run.completed","object":{"id":"wr-1","href":"x"}}}"#;
    assert_eq!(id(&o, &h, no_status).1, "webhook:onfido");
    // Sumsub docs, "User verification webhooks".
    let sumsub = |correlation: Option<&str>, answer: &str| {
        let c = correlation
            .map(|c| format!(r#""correlationId":"{c}","#))
            .unwrap_or_default();
        format!(
            r#"{{"applicantId":"5cb56e8e0a975a35f333cb83",{c}"type":"applicantReviewed","reviewResult":{{"reviewAnswer":"{answer}"}},"createdAtMs":"2026-01-01 10:00:00.000","sandboxMode":true}}"#
        )
    };
    let s = Preset::sumsub();
    let green = id(&s, &h, &sumsub(Some("req-1"), "GREEN"));
    assert_ne!(green, id(&s, &h, &sumsub(Some("req-2"), "RED")));
    let fallback = id(&s, &h, &sumsub(None, "GREEN"));
    assert_ne!(fallback, green);
    assert_eq!(fallback, id(&s, &h, &sumsub(None, "GREEN")));
    assert_eq!(Preset::persona().min_retention(), DAY);
    assert_eq!(Preset::sumsub().min_retention(), 2 * DAY);
    assert_eq!(Preset::onfido().min_retention(), Duration::ZERO);
}

#[test]
fn a_signed_preset_checks_the_signature_before_reading_the_id() {
    use idemkey::server::webhook::HmacVerifier;
    let token = "_ABC123abc123ABC123abc123ABC123_";
    let signed = Preset::onfido().verifier(HmacVerifier::onfido(token));
    assert!(signed.is_signed() && !Preset::onfido().is_signed());
    assert!(
        !format!("{signed:?}").contains(token),
        "Debug hides the secret"
    );
    // onfido-node's vector.
    let body = r#"{"payload":{"resource_type":"check","action":"check.completed","object":{"id":"check-123","status":"complete","completed_at_iso8601":"2020-01-01T00:00:00Z","href":"https://api.onfido.com/v3/checks/check-123"}}}"#;
    let good = headers(&[(
        "x-sha2-signature",
        "a0082d7481f9f0a2907583dbe1f344d6d4c0d9989df2fd804f98479f60cd760e",
    )]);
    assert_eq!(
        id(&signed, &good, body),
        id(&Preset::onfido(), &HeaderMap::new(), body)
    );
    // A body without any id, unsigned: the signature is what is refused, not the id.
    for h in [HeaderMap::new(), good] {
        let e = signed.identify(&h, b"{}").expect_err("refused");
        assert_eq!(
            (e.status(), e.problem_type()),
            (StatusCode::UNAUTHORIZED, "signature-rejected")
        );
    }
}

#[test]
fn retention_defaults_and_floors() {
    let all = Preset::all();
    let names: HashSet<&str> = all.iter().map(Preset::name).collect();
    assert_eq!(names.len(), all.len(), "preset names are unique scopes");
    for p in &all {
        assert_eq!(
            p.effective_retention(),
            DEFAULT_WEBHOOK_RETENTION.max(p.min_retention()),
            "{}",
            p.name()
        );
        assert_eq!(
            p.clone().retention(Duration::ZERO).effective_retention(),
            p.min_retention(),
            "{}",
            p.name()
        );
        assert!(!p.name().contains('/'), "{}", p.name());
    }
    assert_eq!(DEFAULT_WEBHOOK_RETENTION, 7 * DAY);
    assert_eq!(Preset::stripe().min_retention(), 3 * DAY);
    assert_eq!(Preset::paypal().min_retention(), 3 * DAY);
    assert_eq!(Preset::paddle().min_retention(), 3 * DAY);
    assert_eq!(Preset::github().min_retention(), 3 * DAY);
    assert_eq!(
        Preset::stripe().retention(30 * DAY).effective_retention(),
        30 * DAY,
        "longer is kept"
    );
}

/// Delivers `body` through the layer of `preset` (real layer, real memory store; the
/// clock is tokio's, paused by the test).
async fn deliver(app: &Router, body: &str, h: &HeaderMap) -> (StatusCode, bool) {
    let mut req = Request::post("/hook")
        .body(Body::from(body.to_owned()))
        .expect("valid request");
    *req.headers_mut() = h.clone();
    let resp = app.clone().oneshot(req).await.expect("infallible router");
    let replayed = resp.headers().contains_key("idempotent-replayed");
    (resp.status(), replayed)
}

fn app(preset: Preset, runs: Arc<AtomicU64>) -> Router {
    Router::new()
        .route(
            "/hook",
            post(move || {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }
            }),
        )
        .route_layer(preset.layer(Engine::new(MemoryStore::new())))
}

#[tokio::test(start_paused = true)]
async fn a_shorter_retention_is_raised_to_the_senders_retry_window() {
    let runs = Arc::new(AtomicU64::new(0));
    // Configured for one hour; Stripe retries for three days.
    let app = app(
        Preset::stripe().retention(Duration::from_secs(3600)),
        runs.clone(),
    );
    let evt = r#"{"id":"evt_floor","object":"event"}"#;
    assert_eq!(
        deliver(&app, evt, &HeaderMap::new()).await,
        (StatusCode::OK, false)
    );
    tokio::time::advance(2 * DAY).await;
    assert_eq!(
        deliver(&app, evt, &HeaderMap::new()).await,
        (StatusCode::OK, true),
        "still within the floor"
    );
    tokio::time::advance(DAY + Duration::from_secs(1)).await;
    assert_eq!(
        deliver(&app, evt, &HeaderMap::new()).await,
        (StatusCode::OK, false),
        "forgotten after the floor"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn webhook_records_are_kept_seven_days_by_default() {
    let runs = Arc::new(AtomicU64::new(0));
    let app = app(Preset::github(), runs.clone());
    let h = headers(&[
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("x-github-hook-id", "1"),
    ]);
    assert_eq!(deliver(&app, "{}", &h).await, (StatusCode::OK, false));
    tokio::time::advance(6 * DAY).await;
    assert_eq!(
        deliver(&app, "{}", &h).await,
        (StatusCode::OK, true),
        "a late redelivery is recognised"
    );
    tokio::time::advance(DAY + Duration::from_secs(1)).await;
    assert_eq!(deliver(&app, "{}", &h).await, (StatusCode::OK, false));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

mod no_panics {
    use super::*;
    use proptest::prelude::*;

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            ".{0,300}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::vec(
                    (
                        prop_oneof![
                            Just("id".to_owned()),
                            Just("event_id".to_owned()),
                            Just("account".to_owned()),
                            Just("event-data".to_owned()),
                            ".{0,8}".prop_map(|s| s)
                        ],
                        inner
                    ),
                    0..5
                )
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any body, JSON or not, and any header bytes: every preset answers with an id,
        /// nothing, or a 400, and never panics.
        #[test]
        fn presets_never_panic(
            doc in arb_json(),
            raw in prop::collection::vec(any::<u8>(), 0..200),
            header in prop::collection::vec(any::<u8>(), 0..300),
            use_raw in any::<bool>(),
        ) {
            let body = if use_raw { raw } else { serde_json::to_vec(&doc).expect("serialisable") };
            let mut h = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_bytes(&header) {
                for name in ["webhook-id", "svix-id", "x-github-delivery", "x-github-hook-id", "x-shopify-webhook-id", "x-shopify-event-id", "x-shopify-shop-domain", "idempotency-key", "x-gitlab-instance", "x-atlassian-webhook-identifier"] {
                    h.insert(name, v.clone());
                }
            }
            for p in Preset::all() {
                match p.identify(&h, &body) {
                    Ok(Some(id)) => prop_assert!(!id.key().as_str().is_empty() && id.scope().starts_with("webhook:")),
                    Ok(None) => prop_assert!(!p.is_key_required()),
                    Err(e) => prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST),
                }
            }
        }
    }
}

/// A webhook sender redelivers every answer that is not 2xx, expecting the event to be
/// processed then. A handler's 404 (the order it refers to is not synced yet) or 401
/// must therefore not be replayed for the retention period: only 2xx acknowledges.
#[tokio::test(start_paused = true)]
async fn only_a_2xx_acknowledges_a_delivery() {
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/hook",
            post(move || {
                let runs = counter.clone();
                async move {
                    // Not found on the first delivery, processed on the redelivery.
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        (StatusCode::NOT_FOUND, "order not synced yet")
                    } else {
                        (StatusCode::OK, "ok")
                    }
                }
            }),
        )
        .route_layer(Preset::stripe().layer(Engine::new(MemoryStore::new())));
    let evt = r#"{"id":"evt_404_then_ok","object":"event"}"#;
    let h = HeaderMap::new();
    assert_eq!(deliver(&app, evt, &h).await, (StatusCode::NOT_FOUND, false));
    assert_eq!(
        deliver(&app, evt, &h).await,
        (StatusCode::OK, false),
        "the redelivery after a 404 is processed, not answered with the stored 404"
    );
    assert_eq!(
        deliver(&app, evt, &h).await,
        (StatusCode::OK, true),
        "the 2xx is replayed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A delivery that carries its id header twice (two `X-GitHub-Delivery` headers, say) is
/// malformed for every preset that reads the id from a header, as a doubled
/// `Idempotency-Key` is for the plain layer: the sender's id is ambiguous, so neither
/// value is trusted, even two equal ones.
#[tokio::test]
async fn a_repeated_id_header_is_invalid_key_for_every_header_preset() {
    let header_presets = [
        (Preset::github(), "x-github-delivery"),
        (Preset::standard_webhooks(), "webhook-id"),
        (Preset::svix(), "svix-id"),
        (Preset::shopify(), "x-shopify-webhook-id"),
        (Preset::shopify_events(), "x-shopify-event-id"),
        (Preset::gitlab(), "idempotency-key"),
        (Preset::jira(), "x-atlassian-webhook-identifier"),
        (Preset::idempotency_key(), "idempotency-key"),
    ];
    for (preset, name) in &header_presets {
        for second in ["id-2", "id-1"] {
            let h = headers(&[(name, "id-1"), (name, second)]);
            let e = preset
                .identify(&h, b"{}")
                .expect_err("an id header sent twice is malformed");
            assert_eq!(
                (e.status(), e.problem_type()),
                (StatusCode::BAD_REQUEST, "invalid-key"),
                "{}",
                preset.name()
            );
        }
    }

    let runs = Arc::new(AtomicU64::new(0));
    let app = app(Preset::github(), runs.clone());
    let twice = headers(&[
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("x-github-hook-id", "1"),
    ]);
    assert_eq!(
        deliver(&app, "{}", &twice).await,
        (StatusCode::BAD_REQUEST, false)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
}

/// An event whose body id is not a usable key (a space in it) is keyed by its hash,
/// `sha256:<hex>`. A second event whose literal id is that very string is another
/// event, and is processed, for every preset that reads its id from the body.
#[tokio::test]
async fn a_hashed_body_id_never_collides_with_a_literal_one() {
    use idemkey::server::extract::ExtractKey;
    use sha2::{Digest, Sha256};
    // Every preset that reads its id from the body, with the JSON path of its id.
    let body_presets = [
        (Preset::stripe(), &["id"][..]),
        (Preset::slack(), &["event_id"][..]),
        (Preset::paddle(), &["event_id"][..]),
        (Preset::square(), &["event_id"][..]),
        (Preset::paypal(), &["id"][..]),
        (Preset::mailgun(), &["event-data", "id"][..]),
        (Preset::didit(), &["event_id"][..]),
        (Preset::persona(), &["data", "id"][..]),
    ];
    // Presets whose id is only ever a composite of body fields: always derived, so never
    // a literal a sender could pose as.
    let composite_only = ["onfido", "sumsub"];
    let names: HashSet<String> = body_presets
        .iter()
        .map(|(p, _)| p.name().to_owned())
        .chain(composite_only.map(str::to_owned))
        .collect();
    for p in Preset::all() {
        assert_eq!(
            ExtractKey::needs_body(&p),
            names.contains(p.name()),
            "{}: the lists above name every preset that reads its id from the body",
            p.name()
        );
    }
    let unusable = "evt 1";
    let hashed = format!("sha256:{}", hex::encode(Sha256::digest(unusable)));
    for (preset, path) in body_presets {
        let event = |id: &str| {
            let mut v = serde_json::json!(id);
            for field in path.iter().rev() {
                v = serde_json::json!({ *field: v });
            }
            v.to_string()
        };
        let runs = Arc::new(AtomicU64::new(0));
        let app = app(preset.clone(), runs.clone());
        let h = HeaderMap::new();
        assert_eq!(
            deliver(&app, &event(unusable), &h).await,
            (StatusCode::OK, false)
        );
        assert_eq!(
            deliver(&app, &event(&hashed), &h).await,
            (StatusCode::OK, false),
            "{}: the event whose literal id is the other's hash is processed",
            preset.name()
        );
        for id in [unusable, &hashed] {
            assert_eq!(
                deliver(&app, &event(id), &h).await,
                (StatusCode::OK, true),
                "{}: each is still deduplicated",
                preset.name()
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{}", preset.name());
    }
}
