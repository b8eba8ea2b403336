//! The example servers as a hostile or unlucky client meets them, over raw sockets: they
//! close a connection stalled in the middle of its head, answer a body shorter than its
//! `Content-Length` with the verifier's `408` without claiming its key, and leave the key
//! of a request the router refused (`405`) to the request that follows.

use crate::support;

use std::time::Duration;

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

/// `charge_server --store 'memory://?max_records=3'`: three keys are recorded, the
/// fourth is refused with `503 store-full` and `Retry-After`, and the three still
/// replay; nothing runs twice.
#[tokio::test]
async fn a_bounded_memory_store_refuses_new_keys_and_keeps_replaying() {
    let server = ExampleServer::start("charge_server", &["--store", "memory://?max_records=3"]);
    let client = support::verifier::http();
    let keys: Vec<String> = (0..4).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    for key in &keys[..3] {
        let first = support::apps::charge(&client, server.addr(), key).await;
        assert_eq!(first.status, 200, "{first:?}");
    }
    let full = support::apps::charge(&client, server.addr(), &keys[3]).await;
    assert_eq!(full.status, 503, "{full:?}");
    assert!(full.headers.contains_key("retry-after"), "{full:?}");
    let problem: serde_json::Value = serde_json::from_slice(&full.body).expect("a problem");
    assert_eq!(
        problem["type"], "urn:idemkey:problem:store-full",
        "{problem}"
    );
    for key in &keys[..3] {
        let again = support::apps::charge(&client, server.addr(), key).await;
        assert_eq!(again.status, 200, "{again:?}");
        assert!(again.replayed(), "a recorded key still replays: {again:?}");
    }
    let stats = server.stats().await;
    assert_eq!(stats["executions"], 3, "{stats}");
}

/// `charge_server --quota 4,2`: a client sending eight new charges at once under one
/// credential is held to 4 new keys a second (bursts of 2) with `429 quota-exceeded`
/// and `Retry-After`; idemkey's client retries each with its key after the wait, so
/// every call ends once, executed once; another credential is served at once meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_over_its_quota_finishes_every_call_once_as_the_bucket_refills() {
    use idemkey::client::{IdempotentClientBuilder, RequestBuilderExt, ResponseExt};
    let server = ExampleServer::start("charge_server", &["--quota", "4,2"]);
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .max_retries(30)
        .build();
    let url = server.url("/v1/charges");
    let flood = (0..8).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let charge = serde_json::json!({"amount": 1000 + i, "currency": "eur"});
            client
                .post(url)
                .header("authorization", "Bearer flooding")
                .derive_idempotency_key("charge", &charge)
                .header("content-type", "application/json")
                .body(charge.to_string())
                .send()
                .await
        }
    });
    let flood = tokio::spawn(futures_util::future::join_all(flood));
    let other = client
        .post(&url)
        .header("authorization", "Bearer quiet")
        .header("content-type", "application/json")
        .body(r#"{"amount":1,"currency":"eur"}"#)
        .send()
        .await
        .expect("the other credential is served");
    assert_eq!(other.status(), 200);
    assert_eq!(
        other.idempotency().map(|i| i.attempts()),
        Some(1),
        "not held back"
    );
    let answers = flood.await.expect("the flood's task");
    let mut attempts = 0;
    for answer in answers {
        let answer = answer.expect("every call ends with its answer");
        assert_eq!(answer.status(), 200);
        let info = answer.idempotency().expect("keyed");
        assert!(
            !info.replayed(),
            "each key ran once, on its first admitted attempt"
        );
        attempts += info.attempts();
    }
    assert!(
        attempts > 8,
        "the quota refused some attempts ({attempts} in all)"
    );
    let stats = server.stats().await;
    assert_eq!(
        stats["executions"], 9,
        "8 charges and the other credential's one: {stats}"
    );
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

/// `POST /v1/events` streams its events through the verifier as they are made (the
/// first arrives while the others are still to come: 60 s apart, a layer that held the
/// stream back would not answer within the test's bound), and a retry of the whole
/// stream is its byte-identical replay.
#[tokio::test]
async fn the_event_stream_reaches_the_caller_as_it_goes_and_is_replayed() {
    let server = charge_server();
    let client = support::verifier::http();
    let key = uuid::Uuid::new_v4().to_string();
    let mut slow = client
        .post(server.url("/v1/events?count=2&interval_ms=60000"))
        .header("idempotency-key", &key)
        .send()
        .await
        .expect("POST /v1/events");
    assert_eq!(slow.status(), 200);
    assert_eq!(slow.headers()["content-type"], "text/event-stream");
    let first = tokio::time::timeout(Duration::from_secs(20), slow.chunk())
        .await
        .expect("the first event comes before the second is made")
        .expect("a chunk");
    assert_eq!(first.as_deref(), Some(&b"data: {\"seq\": 0}\n\n"[..]));
    drop(slow);

    let key = uuid::Uuid::new_v4().to_string();
    let send = || {
        client
            .post(server.url("/v1/events?count=4&interval_ms=5"))
            .header("idempotency-key", &key)
            .send()
    };
    let first = send().await.expect("first");
    assert!(first.headers().get("idempotent-replayed").is_none());
    let body = first.bytes().await.expect("the stream");
    let expected: String = (0..4)
        .map(|i| format!("data: {{\"seq\": {i}}}\n\n"))
        .collect();
    assert_eq!(body, expected);
    let retry = send().await.expect("retry");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.bytes().await.expect("the replay"), body);
}

/// What a new user types first: `--help` prints the usage and exits 0, a host name is an
/// address, a malformed `whsec_` secret stops the receiver at start, and a store whose
/// feature is missing or whose setup is wrong says so and exits 2.
#[test]
fn the_examples_command_lines_say_what_to_do() {
    use std::process::Command;
    use support::examples::binary;
    for name in ["charge_server", "charge_client", "webhook_receiver"] {
        let out = Command::new(binary(name))
            .arg("--help")
            .output()
            .expect("run");
        let usage = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --help: {:?}", out.status);
        assert!(
            usage.contains("--"),
            "{name} --help prints its usage: {usage}"
        );
    }

    // `localhost:PORT` is accepted: the server listens on it.
    let port = support::free_port();
    let mut server = Command::new(binary("charge_server"))
        .args(["--addr", &format!("localhost:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start charge_server");
    let listening = (0..400).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(25));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let _ = server.kill();
    let _ = server.wait();
    assert!(listening, "charge_server --addr localhost:{port} listens");

    let out = Command::new(binary("webhook_receiver"))
        .args(["--addr", "127.0.0.1:0", "--secret", "whsec_not base64!"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--secret") && err.contains("whsec_"), "{err}");

    // Nothing listening: the client's line says so in words, and that nothing was sent.
    let out = Command::new(binary("charge_client"))
        .args([
            "--url",
            &format!("http://127.0.0.1:{}/v1/charges", support::free_port()),
        ])
        .output()
        .expect("run");
    let line = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{line}");
    let line: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    assert_eq!(line["error"], "never_sent", "{line}");
    let message = line["message"].as_str().unwrap_or_default();
    assert!(message.contains("Connection refused"), "{line}");

    // A Redis database out of range is a setup mistake, named as such.
    #[cfg(feature = "redis")]
    {
        let out = Command::new(binary("charge_server"))
            .args(["--addr", "127.0.0.1:0", "--store"])
            .arg(format!("{}/99", support::redis_url().trim_end_matches('/')))
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("misconfigured") && err.contains("database number"),
            "{err}"
        );
    }
}
