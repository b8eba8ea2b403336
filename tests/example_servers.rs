//! The example servers as a hostile or unlucky client meets them, over raw sockets: they
//! close a connection stalled in the middle of its head, answer a body shorter than its
//! `Content-Length` with the verifier's `408` without claiming its key, and leave the key
//! of a request the router refused (`405`) to the request that follows.

mod support;

use support::examples::ExampleServer;
use support::raw::{Raw, status};
use support::webhook::{GITHUB_ISSUES, deliver, github_headers};

/// Short timeouts, so that the test does not wait for the defaults (10 s and 30 s).
const TIMEOUTS: [&str; 4] = [
    "--header-read-timeout-ms",
    "300",
    "--body-read-timeout-ms",
    "300",
];

fn charge_server() -> ExampleServer {
    ExampleServer::start("charge_server", &TIMEOUTS)
}

fn webhook_receiver(secret: Option<&str>) -> ExampleServer {
    let mut args = TIMEOUTS.to_vec();
    if let Some(s) = secret {
        args.extend(["--secret", s]);
    }
    ExampleServer::start("webhook_receiver", &args)
}

/// A client that sends half a request head and then nothing is disconnected by the
/// server (before, the connection stayed open for as long as the client liked).
async fn closes_a_stalled_head(server: &ExampleServer, path: &str) {
    let mut conn = Raw::connect(server.addr()).await;
    conn.send(format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: appl").as_bytes())
        .await;
    let sent = conn.until_closed().await;
    assert!(
        sent.is_empty() || status(&String::from_utf8_lossy(&sent)) == 408,
        "{server:?} closed the connection: {:?}",
        String::from_utf8_lossy(&sent)
    );
}

#[tokio::test]
async fn the_example_servers_close_a_connection_stalled_mid_head() {
    closes_a_stalled_head(&charge_server(), "/v1/charges").await;
    closes_a_stalled_head(&webhook_receiver(None), "/webhooks/github").await;
}

/// The head of a POST announcing 100 body bytes, of which `sent` follow.
fn short_body(path: &str, extra_headers: &str, sent: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n{extra_headers}\r\n{sent}"
    )
    .into_bytes()
}

/// What a short body is answered with: `408 body-timeout`, closing the connection.
async fn answered_408(server: &ExampleServer, request: &[u8]) {
    let mut conn = Raw::connect(server.addr()).await;
    conn.send(request).await;
    let (head, body) = conn.response().await;
    assert_eq!(status(&head), 408, "{server:?}: {head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    let problem: serde_json::Value = serde_json::from_slice(&body).expect("a problem");
    assert_eq!(
        problem["type"], "urn:idemkey:problem:body-timeout",
        "{problem}"
    );
}

#[tokio::test]
async fn a_body_shorter_than_its_length_gets_408_and_leaves_its_key_unclaimed() {
    let server = charge_server();
    let key = uuid::Uuid::new_v4().to_string();
    answered_408(
        &server,
        &short_body(
            "/v1/charges",
            &format!("idempotency-key: {key}\r\n"),
            r#"{"amount":"#,
        ),
    )
    .await;
    // The key was never claimed: the whole request runs now (not 409, not a replay).
    let client = support::verifier::http();
    let reply = support::apps::charge(&client, server.addr(), &key).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(!reply.replayed());

    for secret in [None, Some("whsec-test")] {
        let receiver = webhook_receiver(secret);
        let delivery = uuid::Uuid::new_v4().to_string();
        let h = github_headers(&delivery, "42", GITHUB_ISSUES, secret);
        let head: String = h
            .iter()
            .map(|(k, v)| format!("{k}: {}\r\n", v.to_str().expect("ASCII")))
            .collect();
        answered_408(
            &receiver,
            &short_body("/webhooks/github", &head, &GITHUB_ISSUES[..10]),
        )
        .await;
        let whole = deliver(
            &client,
            &receiver.url("/webhooks/github"),
            &h,
            GITHUB_ISSUES,
        )
        .await;
        assert_eq!(whole.status, 200, "{secret:?}: {whole:?}");
        assert!(
            !whole.replayed(),
            "{secret:?}: the delivery is processed now"
        );
    }
}

/// `PUT /v1/charges` gets the router's `405`; the key stays free for the `POST`.
#[tokio::test]
async fn a_put_to_the_charge_route_does_not_burn_its_key() {
    let server = charge_server();
    let client = support::verifier::http();
    let key = uuid::Uuid::new_v4().to_string();
    let put = client
        .put(server.url("/v1/charges"))
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(r#"{"amount":1000,"currency":"eur"}"#)
        .send()
        .await
        .expect("PUT");
    assert_eq!(put.status(), 405);
    let post = support::apps::charge(&client, server.addr(), &key).await;
    assert_eq!(post.status, 200, "the POST with that key runs: {post:?}");
    assert!(!post.replayed());
}

/// The value of the sample `series` (name and labels as Prometheus prints them) in the
/// page at `GET /metrics`; the page must be Prometheus text.
#[cfg(feature = "metrics")]
async fn sample(server: &ExampleServer, series: &str) -> Option<f64> {
    let resp = support::verifier::http()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .is_ok_and(|ct| ct.starts_with("text/plain; version=0.0.4")),
        "Prometheus text: {:?}",
        resp.headers()
    );
    let page = resp.text().await.expect("the page reads");
    assert!(
        page.contains("# TYPE idemkey_server_requests_total counter"),
        "{page}"
    );
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Both example servers answer `GET /metrics` with Prometheus text that counts the
/// requests they decided, by decision.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_example_servers_serve_prometheus_metrics_counting_decisions() {
    let charges = charge_server();
    let client = support::verifier::http();
    let key = uuid::Uuid::new_v4().to_string();
    for _ in 0..2 {
        assert_eq!(
            support::apps::charge(&client, charges.addr(), &key)
                .await
                .status,
            200
        );
    }
    let fresh = r#"idemkey_server_requests_total{decision="fresh"}"#;
    let replay = r#"idemkey_server_requests_total{decision="replay"}"#;
    assert_eq!(sample(&charges, fresh).await, Some(1.0));
    assert_eq!(sample(&charges, replay).await, Some(1.0));

    let hooks = webhook_receiver(None);
    let delivery = uuid::Uuid::new_v4().to_string();
    let headers = github_headers(&delivery, "hook-1", GITHUB_ISSUES, None);
    let first = deliver(
        &client,
        &hooks.url("/webhooks/github"),
        &headers,
        GITHUB_ISSUES,
    )
    .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(sample(&hooks, fresh).await, Some(1.0));
    assert_eq!(sample(&hooks, replay).await, None, "nothing replayed yet");
}
