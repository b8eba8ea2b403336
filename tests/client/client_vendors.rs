//! Each vendor profile against a local server on 127.0.0.1 that answers as the vendor's
//! documentation describes (status, headers, body; the sources are cited in the
//! profiles' rustdoc).

use crate::support;

use std::time::Duration;

use idemkey::IdempotencyKey;
use idemkey::client::{KeyPlacement, RequestBuilderExt, ResponseExt, VendorProfile};
use reqwest_middleware::ClientWithMiddleware;
use support::client::{builder, ours};
use support::recorder::{Recorder, Reply};

fn client(profile: VendorProfile) -> ClientWithMiddleware {
    builder(3).profile(profile).build()
}

async fn post(
    client: &ClientWithMiddleware,
    server: &Recorder,
) -> reqwest_middleware::Result<reqwest::Response> {
    client
        .post(server.url("/v1/payments"))
        .json(&serde_json::json!({"amount": 1000, "currency": "EUR"}))
        .send()
        .await
}

fn key_of(n: usize) -> IdempotencyKey {
    IdempotencyKey::new("k".repeat(n)).expect("visible ASCII")
}

/// A key longer than the vendor's limit is refused before sending; one at the limit goes.
async fn holds_the_length_limit(profile: VendorProfile, header: &'static str, limit: usize) {
    let server = Recorder::with_header(header, []).await;
    let client = client(profile);
    let err = client
        .post(server.url("/v1/payments"))
        .header(header, "k".repeat(limit + 1))
        .json(&serde_json::json!({"amount": 1}))
        .send()
        .await
        .expect_err("one byte too long");
    let err = ours(err);
    assert!(err.is_invalid_key(), "{err}");
    assert!(err.to_string().contains(&format!("{}", limit + 1)), "{err}");
    assert!(err.to_string().contains(&format!("{limit}")), "{err}");
    assert!(server.records().is_empty(), "nothing was sent");
    client
        .post(server.url("/v1/payments"))
        .idempotency_key(key_of(limit))
        .json(&serde_json::json!({"amount": 1}))
        .send()
        .await
        .expect("a key at the limit is sent");
    assert_eq!(server.keys(), [Some("k".repeat(limit))], "under {header}");
}

// ---------------------------------------------------------------------------------
// Stripe

/// Stripe's error envelope, `{"error": {"type", "code", "message", ...}}`.
fn stripe_error(status: u16, kind: &str, code: Option<&str>, message: &str) -> Reply {
    let mut error = serde_json::json!({"type": kind, "message": message, "request_id": "req_1"});
    if let Some(code) = code {
        error["code"] = code.into();
    }
    Reply::status(status).body(&serde_json::json!({ "error": error }).to_string())
}

#[tokio::test]
async fn stripe_idempotency_error_is_a_reused_key() {
    let server = Recorder::start([stripe_error(
        400,
        "idempotency_error",
        None,
        "Keys for idempotent requests can only be used with the same parameters they were \
         first used with. Try using a key other than 'k1' if you meant to execute a \
         different request.",
    )])
    .await;
    let err = ours(
        post(&client(VendorProfile::stripe()), &server)
            .await
            .expect_err("400"),
    );
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.attempts(), 1);

    // Any other 400 is an ordinary answer.
    let server = Recorder::start([stripe_error(
        400,
        "invalid_request_error",
        Some("parameter_missing"),
        "Missing required param: amount.",
    )])
    .await;
    let response = post(&client(VendorProfile::stripe()), &server)
        .await
        .expect("an ordinary 400");
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn stripe_in_use_is_retried_and_the_replay_seen() {
    let server = Recorder::start([
        stripe_error(
            409,
            "invalid_request_error",
            Some("idempotency_key_in_use"),
            "There is currently another in-progress request using this Idempotent Key.",
        ),
        Reply::ok().header("idempotent-replayed", "true"),
    ])
    .await;
    let response = post(&client(VendorProfile::stripe()), &server)
        .await
        .expect("replayed");
    let info = response.idempotency().expect("keyed");
    assert_eq!((info.attempts(), info.replayed()), (2, true));
}

#[tokio::test]
async fn stripe_should_retry_false_keeps_a_stored_500() {
    // Stripe replays a stored 500 and says so: retrying would only replay it again.
    let server = Recorder::start(
        [stripe_error(500, "api_error", None, "Something went wrong")
            .header("stripe-should-retry", "false")],
    )
    .await;
    let err = ours(
        post(&client(VendorProfile::stripe()), &server)
            .await
            .expect_err("500"),
    );
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.attempts(), 1);
}

#[tokio::test]
async fn stripe_keys_are_up_to_255_characters() {
    holds_the_length_limit(VendorProfile::stripe(), "idempotency-key", 255).await;
}

// ---------------------------------------------------------------------------------
// Adyen

fn adyen_704(status: u16, transient: &str) -> Reply {
    Reply::status(status)
        .header("transient-error", transient)
        .header("idempotency-key", "echoed")
        .body(&format!(
            r#"{{"status":{status},"errorCode":"704","message":"request already processed or in progress","errorType":"validation"}}"#
        ))
}

#[tokio::test]
async fn adyen_704_in_progress_is_retried_while_transient() {
    for status in [422, 409] {
        let server = Recorder::start([adyen_704(status, "true"), Reply::ok()]).await;
        let response = post(&client(VendorProfile::adyen()), &server)
            .await
            .expect("the retry succeeds");
        assert_eq!(
            response.idempotency().map(|i| i.attempts()),
            Some(2),
            "{status}"
        );
    }
}

#[tokio::test]
async fn adyen_704_not_transient_is_a_conflict_at_once() {
    let server = Recorder::start([adyen_704(409, "false")]).await;
    let err = ours(
        post(&client(VendorProfile::adyen()), &server)
            .await
            .expect_err("409"),
    );
    assert!(err.is_in_progress(), "{err}");
    assert_eq!(err.attempts(), 1);
}

#[tokio::test]
async fn adyen_other_422s_are_ordinary_answers() {
    let server = Recorder::start([Reply::status(422).body(
        r#"{"status":422,"errorCode":"14_030","message":"Return URL is missing.","errorType":"validation"}"#,
    )])
    .await;
    let response = post(&client(VendorProfile::adyen()), &server)
        .await
        .expect("a validation error");
    assert_eq!(response.status(), 422);
    assert_eq!(server.records().len(), 1);
}

#[tokio::test]
async fn adyen_keys_are_up_to_64_characters() {
    holds_the_length_limit(VendorProfile::adyen(), "idempotency-key", 64).await;
}

// ---------------------------------------------------------------------------------
// PayPal

#[tokio::test]
async fn paypal_request_ids_are_1_to_108_characters() {
    holds_the_length_limit(VendorProfile::paypal(), "paypal-request-id", 108).await;
}

#[tokio::test]
async fn paypal_replays_a_create_as_200() {
    // Orders v2: the first create answers 201, a repeat with the same id 200.
    let server = Recorder::with_header(
        "paypal-request-id",
        [
            Reply::status(201).body(r#"{"id":"5O190127TN364715T","status":"CREATED"}"#),
            Reply::status(200).body(r#"{"id":"5O190127TN364715T","status":"CREATED"}"#),
        ],
    )
    .await;
    let client = client(VendorProfile::paypal());
    let key = IdempotencyKey::new("order-7").expect("valid");
    for status in [201, 200] {
        let response = client
            .post(server.url("/v2/checkout/orders"))
            .idempotency_key(key.clone())
            .json(&serde_json::json!({"intent": "CAPTURE"}))
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), status);
    }
    assert_eq!(
        server.keys(),
        [Some("order-7".into()), Some("order-7".into())]
    );
}

// ---------------------------------------------------------------------------------
// Square: the key in the JSON body

fn body_key(body: &[u8]) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_slice(body).expect("a JSON body");
    doc.get("idempotency_key")?.as_str().map(str::to_owned)
}

#[tokio::test]
async fn square_takes_the_key_in_the_body_and_keeps_it_across_retries() {
    let server = Recorder::start([Reply::status(503), Reply::ok()]).await;
    let client = client(VendorProfile::square());
    let response = client
        .post(server.url("/v2/payments"))
        .json(&serde_json::json!({"source_id": "cnon:card-nonce-ok", "amount_money": {"amount": 100, "currency": "USD"}}))
        .send()
        .await
        .expect("the retry succeeds");
    let info = response.idempotency().expect("keyed");
    assert_eq!(info.attempts(), 2);
    let records = server.records();
    assert_eq!(records.len(), 2);
    for record in &records {
        assert_eq!(record.key, None, "no key header: Square reads the body");
        assert_eq!(body_key(&record.body).as_deref(), Some(info.key().as_str()));
        let doc: serde_json::Value = serde_json::from_slice(&record.body).expect("JSON");
        assert_eq!(
            doc["amount_money"]["amount"], 100,
            "the rest of the body is intact"
        );
    }
    assert_eq!(records[0].body, records[1].body);
}

#[tokio::test]
async fn square_keeps_the_callers_body_key_and_its_bytes() {
    let server = Recorder::start([]).await;
    let client = client(VendorProfile::square());
    let body =
        r#"{"idempotency_key":"sq-order-42","amount_money":{"amount":100,"currency":"USD"}}"#;
    let response = client
        .post(server.url("/v2/payments"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("200");
    assert_eq!(
        response.idempotency().map(|i| i.key().as_str()),
        Some("sq-order-42")
    );
    assert_eq!(server.records()[0].body, body.as_bytes());
}

#[tokio::test]
async fn square_refuses_what_cannot_carry_a_key_before_sending() {
    let server = Recorder::start([]).await;
    let client = client(VendorProfile::square());
    let too_long = format!(r#"{{"idempotency_key":"{}"}}"#, "k".repeat(46));
    let cases: [(&str, Option<&str>); 4] = [
        ("a body over the 45-byte limit", Some(&too_long)),
        ("a JSON array", Some("[1,2]")),
        ("not JSON", Some("amount=100")),
        ("no body", None),
    ];
    for (what, body) in cases {
        let mut request = client.post(server.url("/v2/payments"));
        if let Some(body) = body {
            request = request.body(body.to_owned());
        }
        let err = ours(request.send().await.expect_err(what));
        assert!(err.is_invalid_key(), "{what}: {err}");
        assert_eq!(err.attempts(), 0);
    }
    let err = ours(
        client
            .post(server.url("/v2/payments"))
            .json(&serde_json::json!({"idempotency_key": 42}))
            .send()
            .await
            .expect_err("a number is no key"),
    );
    assert!(err.to_string().contains("not a string key"), "{err}");
    assert!(server.records().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn square_idempotency_key_reused_is_a_reused_key() {
    let server = Recorder::start([Reply::status(400).body(
        r#"{"errors":[{"category":"INVALID_REQUEST_ERROR","code":"IDEMPOTENCY_KEY_REUSED","detail":"The idempotency key can only be retried with the same request data.","field":"idempotency_key"}]}"#,
    )])
    .await;
    let err = ours(
        post(&client(VendorProfile::square()), &server)
            .await
            .expect_err("400"),
    );
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.attempts(), 1);
}

// ---------------------------------------------------------------------------------
// Checkout.com, GoCardless, Stainless-style

#[tokio::test]
async fn checkout_sends_cko_idempotency_key_and_retries_its_409() {
    let server = Recorder::with_header(
        "cko-idempotency-key",
        [
            Reply::status(409),
            Reply::status(202).body(r#"{"id":"pay_1","status":"Authorized"}"#),
        ],
    )
    .await;
    let response = post(&client(VendorProfile::checkout()), &server)
        .await
        .expect("the same payment response");
    assert_eq!(response.status(), 202);
    let keys = server.keys();
    assert_eq!(keys.len(), 2);
    assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
}

#[tokio::test]
async fn gocardless_creation_conflict_is_already_executed() {
    let fixture = r#"{"error":{"message":"A resource has already been created with this idempotency key","errors":[{"reason":"idempotent_creation_conflict","message":"A resource has already been created with this idempotency key","links":{"conflicting_resource_id":"PM1234"}}],"documentation_url":"https://developer.gocardless.com/api-reference#idempotent_creation_conflict","type":"invalid_state","request_id":"HARDCODED_REQUEST_ID","code":409}}"#;
    let server = Recorder::start([Reply::status(409).body(fixture)]).await;
    let err = ours(
        post(&client(VendorProfile::gocardless()), &server)
            .await
            .expect_err("409"),
    );
    assert!(err.is_already_executed(), "{err}");
    assert_eq!(err.kind_str(), "already_executed");
    assert_eq!(err.attempts(), 1, "not retried as in progress");
    let body = err
        .into_response()
        .expect("kept")
        .text()
        .await
        .expect("body");
    assert!(body.contains(r#""conflicting_resource_id":"PM1234""#));

    // Under the standard profile the same answer is an in-progress 409, retried.
    let server = Recorder::start(std::iter::repeat_n(Reply::status(409).body(fixture), 4)).await;
    let err = ours(
        post(&client(VendorProfile::standard()), &server)
            .await
            .expect_err("409"),
    );
    assert!(err.is_in_progress(), "{err}");
    assert_eq!(err.attempts(), 4);
}

#[tokio::test]
async fn stainless_style_apis_steer_retries_with_their_headers() {
    let orb_409 = || {
        Reply::status(409)
            .header("content-type", "application/problem+json")
            .body(r#"{"type":"https://docs.withorb.com/reference/error-responses#409-resource-conflict","status":409,"title":"Resource conflict"}"#)
    };
    let server =
        Recorder::start([orb_409(), Reply::ok().header("idempotent-replayed", "true")]).await;
    let response = post(&client(VendorProfile::stainless()), &server)
        .await
        .expect("replayed");
    let info = response.idempotency().expect("keyed");
    assert_eq!((info.attempts(), info.replayed()), (2, true));

    let server = Recorder::start([Reply::status(500).header("x-should-retry", "false")]).await;
    let err = ours(
        post(&client(VendorProfile::stainless()), &server)
            .await
            .expect_err("500"),
    );
    assert_eq!(err.attempts(), 1);
}

#[tokio::test]
async fn orb_keys_are_up_to_64_characters() {
    holds_the_length_limit(VendorProfile::stainless(), "idempotency-key", 64).await;
}

#[test]
fn profiles_carry_their_documented_facts() {
    let day = Duration::from_secs(24 * 3600);
    let header = |p: &VendorProfile| match p.key_placement() {
        KeyPlacement::Header(h) => h.as_str().to_owned(),
        KeyPlacement::JsonBodyField(f) => format!("body:{f}"),
    };
    let table = [
        (
            VendorProfile::standard(),
            "idempotency-key",
            255,
            day,
            false,
        ),
        (VendorProfile::stripe(), "idempotency-key", 255, day, true),
        (
            VendorProfile::adyen(),
            "idempotency-key",
            64,
            31 * day,
            true,
        ),
        (
            VendorProfile::paypal(),
            "paypal-request-id",
            108,
            Duration::from_secs(6 * 3600),
            true,
        ),
        (
            VendorProfile::square(),
            "body:idempotency_key",
            45,
            day,
            false,
        ),
        (
            VendorProfile::checkout(),
            "cko-idempotency-key",
            255,
            day,
            true,
        ),
        (
            VendorProfile::gocardless(),
            "idempotency-key",
            255,
            day,
            false,
        ),
        (VendorProfile::stainless(), "idempotency-key", 64, day, true),
    ];
    for (profile, key, max, retention, documented) in table {
        let name = profile.name().to_owned();
        assert_eq!(header(&profile), key, "{name}");
        assert_eq!(profile.max_key_len(), max, "{name}");
        assert_eq!(profile.retention(), retention, "{name}");
        assert_eq!(profile.is_retention_documented(), documented, "{name}");
    }
}
