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
