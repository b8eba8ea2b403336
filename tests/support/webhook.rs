//! The webhook tests' part: the example receiver, and provider-shaped deliveries taken
//! from the providers' public documentation.

/// The receiver of `examples/webhook_receiver.rs`, compiled into the tests as is.
#[path = "../../examples/webhook_receiver.rs"]
pub(crate) mod receiver;

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use idemkey::testing::TestServer;
use sha2::Sha256;

use super::verifier::Answer;

/// POSTs `body` with `headers` to `url`.
pub(crate) async fn deliver(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    body: &str,
) -> Answer {
    let resp = client
        .post(url)
        .headers(headers.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    Answer::read(resp).await
}

/// `GET /stats` -> `processed`.
pub(crate) async fn processed(client: &reqwest::Client, server: &TestServer) -> u64 {
    let v: serde_json::Value = client
        .get(server.url("/stats"))
        .send()
        .await
        .expect("GET /stats")
        .json()
        .await
        .expect("/stats is JSON");
    v["processed"].as_u64().expect("/stats has `processed`")
}

pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).expect("valid header name"),
            HeaderValue::from_str(v).expect("valid header value"),
        );
    }
    h
}

pub(crate) fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_secs(),
    )
    .expect("seconds fit i64")
}

fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    for p in parts {
        m.update(p);
    }
    hex::encode(m.finalize().into_bytes())
}

/// A Stripe event shaped like the docs' example (Stripe docs: API reference, "The Event
/// object"); `pending_webhooks` changes between attempts, as it does on Stripe's retries.
pub(crate) fn stripe_event(id: &str, account: Option<&str>, pending_webhooks: u32) -> String {
    let mut v = serde_json::json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_686_089_970,
        "data": {
            "object": {
                "id": "ch_3NG8Ds2eZvKYlo2C0Z1Ny3vO",
                "object": "charge",
                "amount": 2000,
                "currency": "usd",
                "status": "succeeded"
            }
        },
        "livemode": false,
        "pending_webhooks": pending_webhooks,
        "request": { "id": "req_8HVQYy3Qz4Uq5q", "idempotency_key": "5f1c7b0e-2d4b-4a8e-9c55-1b2e3f4a5b6c" },
        "type": "charge.succeeded"
    });
    if let (Some(a), Some(o)) = (account, v.as_object_mut()) {
        o.insert("account".into(), a.into());
    }
    v.to_string()
}

/// `Stripe-Signature` for `body` at `t` (Stripe docs: Webhooks, "Verify webhook
/// signatures manually": `t=<unix>,v1=<hex HMAC-SHA256 of "{t}.{body}">`).
pub(crate) fn stripe_signature(secret: &str, t: i64, body: &str) -> HeaderMap {
    let sig = hmac_hex(
        secret.as_bytes(),
        &[t.to_string().as_bytes(), b".", body.as_bytes()],
    );
    headers(&[("stripe-signature", &format!("t={t},v1={sig}"))])
}

/// A GitHub `issues` delivery's body (GitHub docs: "Webhook events and payloads").
pub(crate) const GITHUB_ISSUES: &str = r#"{"action":"opened","issue":{"url":"https://api.github.com/repos/octocat/Hello-World/issues/1347","number":1347,"title":"Found a bug"},"repository":{"id":1296269,"full_name":"octocat/Hello-World","owner":{"login":"octocat","id":1}},"sender":{"login":"octocat","id":1}}"#;

/// GitHub's delivery headers (GitHub docs: "Webhook events and payloads", "Delivery
/// headers"), with `X-Hub-Signature-256` when a secret is given.
pub(crate) fn github_headers(
    delivery: &str,
    hook_id: &str,
    body: &str,
    secret: Option<&str>,
) -> HeaderMap {
    let mut h = headers(&[
        ("x-github-event", "issues"),
        ("x-github-delivery", delivery),
        ("x-github-hook-id", hook_id),
        ("x-github-hook-installation-target-id", "79929171"),
        ("x-github-hook-installation-target-type", "repository"),
        ("user-agent", "GitHub-Hookshot/044aadd"),
    ]);
    if let Some(s) = secret {
        let sig = hmac_hex(s.as_bytes(), &[body.as_bytes()]);
        h.insert(
            "x-hub-signature-256",
            HeaderValue::from_str(&format!("sha256={sig}")).expect("hex is a valid value"),
        );
    }
    h
}

/// A Standard Webhooks message (the specification's example payload).
pub(crate) const STANDARD_BODY: &str = r#"{"type":"contact.created","timestamp":"2022-11-03T20:26:10.344522Z","data":{"id":"1f81eb52-5198-4599-803e-771906343485","type":"contact"}}"#;

/// The Standard Webhooks secret of the specification's examples.
pub(crate) const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Didit's webhook signing secret in the tests (a destination's `secret_shared_key` is
/// a 43-character URL-safe token: Management API, "Get webhook destination").
pub(crate) const DIDIT_SECRET: &str = "wh_9f2c4b8e1a7dQx3LmN0pR5sT8uV1wY4zA6bC2dE";

/// A Didit session webhook, shaped like the payloads of Didit's server (the fixtures of
/// didit-protocol/plugin-wordpress; Didit docs, "Webhooks": `webhook_type`,
/// `session_id`, `status`, and `decision` once the session is decided), written as
/// Didit writes it: keys sorted, no whitespace, ASCII. `event_id: None` is an older
/// payload, which carries none.
pub(crate) fn didit_event(
    event_id: Option<&str>,
    session: &str,
    webhook_type: &str,
    status: &str,
    decision: Option<serde_json::Value>,
    timestamp: i64,
) -> String {
    let mut v = serde_json::json!({
        "application_id": "11111111-2222-3333-4444-555555555555",
        "created_at": timestamp - 6,
        "environment": "live",
        "session_id": session,
        "status": status,
        "timestamp": timestamp,
        "vendor_data": "user-123",
        "webhook_type": webhook_type,
        "workflow_id": "22222222-3333-4444-5555-666666666666",
        "workflow_version": 4,
    });
    if let Some(o) = v.as_object_mut() {
        if let Some(id) = event_id {
            o.insert("event_id".into(), id.into());
        }
        if let Some(d) = decision {
            o.insert("decision".into(), d);
        }
    }
    // RFC 8785 writes ASCII text and integers exactly as Python's sorted, compact
    // `json.dumps` does.
    serde_json_canonicalizer::to_string(&v).expect("serialisable")
}

/// A Didit `decision` (Didit docs: present once a session is Approved, Declined, In
/// Review or Abandoned).
pub(crate) fn didit_decision(session: &str, status: &str) -> serde_json::Value {
    serde_json::json!({
        "session_id": session,
        "status": status,
        "id_verifications": [{"node_id": "id_verification_1", "status": status, "warnings": []}],
        "reviews": []
    })
}

/// Didit's headers for `body` (HMAC-SHA256, lowercase hex, with the secret's bytes):
/// `X-Signature` over the raw body, `X-Signature-V2` over the canonical form (which is
/// the body itself here: [`didit_event`] writes the canonical form), `X-Signature-Simple`
/// over `timestamp:session_id:status:webhook_type`, `X-Timestamp`, and Didit's
/// `User-Agent` (docs.didit.me/integration/webhooks).
pub(crate) fn didit_headers(secret: &str, body: &str) -> HeaderMap {
    let v: serde_json::Value = serde_json::from_str(body).expect("a Didit body is JSON");
    let field = |k: &str| match &v[k] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let simple = [
        field("timestamp"),
        field("session_id"),
        field("status"),
        field("webhook_type"),
    ]
    .join(":");
    let raw = hmac_hex(secret.as_bytes(), &[body.as_bytes()]);
    headers(&[
        ("x-signature", &raw),
        ("x-signature-v2", &raw),
        (
            "x-signature-simple",
            &hmac_hex(secret.as_bytes(), &[simple.as_bytes()]),
        ),
        ("x-timestamp", &field("timestamp")),
        ("user-agent", "DiditWebhook/2.0 +https://didit.me"),
    ])
}

/// The HMAC key of Adyen's own library tests (Adyen/adyen-node-api-library,
/// `src/__tests__/hmacValidator.spec.ts`), in hex as the Customer Area shows it.
pub(crate) const ADYEN_HMAC_KEY: &str =
    "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";

/// The item of Adyen's library test vector, with its published signature.
pub(crate) const ADYEN_VECTOR_ITEM: &str = r#"{"pspReference":"pspReference","originalReference":"originalReference","merchantAccountCode":"merchantAccount","merchantReference":"reference","amount":{"currency":"EUR","value":1000},"eventCode":"REPORT_AVAILABLE","eventDate":"2019-09-21T11:45:24.637Z","paymentMethod":"VISA","reason":"reason","success":"true","additionalData":{"hmacSignature":"ZNBPtI+oDyyRrLyD1XirkKnQgIAlFc07Vj27TeHsDRE="}}"#;

/// An Adyen `NotificationRequestItem` shaped like the library's
/// `authorisationTrue.json` mock, signed with `key_hex` as Adyen signs items
/// (`psp:original:merchant:reference:value:currency:eventCode:success`, HMAC-SHA256
/// with the hex-decoded key, base64, in `additionalData.hmacSignature`).
pub(crate) fn adyen_item(
    psp: &str,
    event_code: &str,
    success: bool,
    value: u64,
    key_hex: &str,
) -> serde_json::Value {
    let success = if success { "true" } else { "false" };
    let signed =
        format!("{psp}::MagentoMerchantTest2:8313842560770001:{value}:EUR:{event_code}:{success}");
    let key = hex::decode(key_hex).expect("hex key");
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("any key length");
    m.update(signed.as_bytes());
    let signature = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(m.finalize().into_bytes())
    };
    serde_json::json!({
        "additionalData": {
            "authCode": "1234",
            "cardSummary": "7777",
            "hmacSignature": signature,
        },
        "amount": {"currency": "EUR", "value": value},
        "eventCode": event_code,
        "eventDate": "2017-01-19T16:42:03+01:00",
        "merchantAccountCode": "MagentoMerchantTest2",
        "merchantReference": "8313842560770001",
        "operations": ["CANCEL", "CAPTURE", "REFUND"],
        "paymentMethod": "visa",
        "pspReference": psp,
        "reason": "1234:7777:12/2012",
        "success": success
    })
}

/// An Adyen standard-webhook delivery: `{"live": "false", "notificationItems":
/// [{"NotificationRequestItem": ...}, ...]}` (Adyen docs, "Webhook types").
pub(crate) fn adyen_batch(items: impl IntoIterator<Item = serde_json::Value>) -> String {
    let items: Vec<serde_json::Value> = items
        .into_iter()
        .map(|i| serde_json::json!({ "NotificationRequestItem": i }))
        .collect();
    serde_json::json!({"live": "false", "notificationItems": items}).to_string()
}

/// A Persona event (Persona docs, "Webhooks": a JSON:API document whose `data` is the
/// event) about inquiry `inquiry` reaching `status`.
pub(crate) fn persona_event(event_id: &str, inquiry: &str, status: &str) -> String {
    serde_json::json!({
        "data": {
            "type": "event",
            "id": event_id,
            "attributes": {
                "name": format!("inquiry.{status}"),
                "payload": {"data": {"type": "inquiry", "id": inquiry, "attributes": {"status": status, "reference-id": null}}},
                "created-at": "2019-09-09T22:46:23.000Z"
            }
        }
    })
    .to_string()
}

/// `Persona-Signature: t=<t>,v1=<hex HMAC-SHA256 of "{t}.{body}">` (Persona docs,
/// "Webhook best practices").
pub(crate) fn persona_signature(secret: &str, t: i64, body: &str) -> HeaderMap {
    let sig = hmac_hex(
        secret.as_bytes(),
        &[t.to_string().as_bytes(), b".", body.as_bytes()],
    );
    headers(&[("persona-signature", &format!("t={t},v1={sig}"))])
}

/// An Onfido event (onfido-node `WebhookEvent`: `payload.resource_type`, `action`,
/// `object {id, status, completed_at_iso8601, href}`).
pub(crate) fn onfido_event(check: &str, action: &str, status: &str) -> String {
    serde_json::json!({
        "payload": {
            "resource_type": "check",
            "action": action,
            "object": {
                "id": check,
                "status": status,
                "completed_at_iso8601": "2020-01-01T00:00:00Z",
                "href": format!("https://api.onfido.com/v3/checks/{check}")
            }
        }
    })
    .to_string()
}

/// `X-SHA2-Signature: <hex HMAC-SHA256 of the raw body>` keyed with the webhook token
/// (Onfido docs, "Manual webhook signature verification").
pub(crate) fn onfido_signature(token: &str, body: &str) -> HeaderMap {
    headers(&[(
        "x-sha2-signature",
        &hmac_hex(token.as_bytes(), &[body.as_bytes()]),
    )])
}

/// A Sumsub `applicantReviewed` webhook (Sumsub docs, "User verification webhooks").
pub(crate) fn sumsub_event(correlation: &str, applicant: &str, answer: &str) -> String {
    serde_json::json!({
        "applicantId": applicant,
        "inspectionId": "5cb56e8e0a975a35f333cb84",
        "correlationId": correlation,
        "externalUserId": "user-123",
        "levelName": "basic-kyc-level",
        "type": "applicantReviewed",
        "reviewResult": {"reviewAnswer": answer},
        "reviewStatus": "completed",
        "createdAtMs": "2026-01-01 10:00:00.000",
        "sandboxMode": true
    })
    .to_string()
}

/// `x-payload-digest: <hex HMAC-SHA256 of the raw body>` with
/// `x-payload-digest-alg: HMAC_SHA256_HEX` (Sumsub docs, "Webhooks").
pub(crate) fn sumsub_signature(secret: &str, body: &str) -> HeaderMap {
    headers(&[
        (
            "x-payload-digest",
            &hmac_hex(secret.as_bytes(), &[body.as_bytes()]),
        ),
        ("x-payload-digest-alg", "HMAC_SHA256_HEX"),
    ])
}
