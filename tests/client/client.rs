//! The client half against a real recording server on 127.0.0.1.

use crate::support;

use std::time::Duration;

use idemkey::IdempotencyKey;
use idemkey::client::{
    Attempt, Error, IdempotencyKeyMiddleware, IdempotentClientBuilder, RequestBuilderExt,
    ResponseExt, RetryMiddleware,
};
use idemkey::protocol::KeyHeader;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_retry::RetryTransientMiddleware;
use retry_policies::policies::ExponentialBackoff;
use support::client::{builder, fast};
use support::recorder::{Recorder, Reply};

fn client(retries: u32) -> ClientWithMiddleware {
    builder(retries).build()
}

fn charge() -> serde_json::Value {
    serde_json::json!({"amount": 1000, "currency": "eur"})
}

/// POSTs the charge to the recorder's `/charges`.
async fn post_charge(
    client: &ClientWithMiddleware,
    server: &Recorder,
) -> reqwest_middleware::Result<reqwest::Response> {
    client
        .post(server.url("/charges"))
        .json(&charge())
        .send()
        .await
}

fn ours(err: &reqwest_middleware::Error) -> &Error {
    Error::from_middleware(err).unwrap_or_else(|| panic!("expected idemkey's error, got {err:?}"))
}

fn single_key(server: &Recorder) -> String {
    let keys = server.keys();
    let first = keys[0].clone().expect("the request carried a key");
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(&*first)),
        "every attempt carries the same key: {keys:?}"
    );
    first
}

#[tokio::test]
async fn same_key_on_every_attempt() {
    let server = Recorder::start([Reply::status(503), Reply::status(500), Reply::ok()]).await;
    let response = post_charge(&client(3), &server)
        .await
        .expect("third attempt succeeds");
    assert_eq!(response.status(), 200);

    let records = server.records();
    assert_eq!(records.len(), 3);
    assert_eq!(
        records.iter().map(|r| r.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let key = single_key(&server);
    assert!(records.iter().all(|r| r.body == records[0].body));

    let info = response.idempotency().expect("a keyed response");
    assert_eq!(info.key().as_str(), key);
    assert_eq!(info.attempts(), 3);
    assert!(!info.replayed());
}

#[tokio::test]
async fn distinct_keys_for_distinct_logical_calls() {
    let server = Recorder::start([]).await;
    let client = client(0);
    let calls = (0..32).map(|_| {
        let client = client.clone();
        let url = server.url("/charges");
        async move { client.post(url).json(&charge()).send().await }
    });
    let responses = futures_util::future::join_all(calls).await;
    let mut sent: Vec<String> = responses
        .into_iter()
        .map(|r| {
            let r = r.expect("200");
            r.idempotency().expect("keyed").key().as_str().to_owned()
        })
        .collect();
    let mut seen: Vec<String> = server
        .keys()
        .into_iter()
        .map(|k| k.expect("keyed"))
        .collect();
    sent.sort();
    seen.sort();
    assert_eq!(
        sent, seen,
        "the server saw exactly the keys the caller was told"
    );
    seen.dedup();
    assert_eq!(seen.len(), 32, "32 logical calls, 32 keys");

    // GET is not keyed by default; PATCH is.
    client
        .get(server.url("/charges"))
        .send()
        .await
        .expect("GET");
    client
        .patch(server.url("/charges/1"))
        .send()
        .await
        .expect("PATCH");
    let records = server.records();
    assert_eq!(records[32].key, None);
    assert!(records[33].key.is_some());
}

#[tokio::test]
async fn caller_keys_are_never_replaced() {
    let server = Recorder::start([]).await;
    let client = client(0);

    // A header set by hand, in the sf-string form: sent untouched.
    let response = client
        .post(server.url("/a"))
        .header("idempotency-key", "\"order-42\"")
        .send()
        .await
        .expect("200");
    assert_eq!(
        response.idempotency().map(|i| i.key().as_str()),
        Some("order-42")
    );

    // The header wins over a per-call option.
    client
        .post(server.url("/b"))
        .header("idempotency-key", "from-header")
        .idempotency_key(IdempotencyKey::new("from-option").expect("valid"))
        .send()
        .await
        .expect("200");

    // A per-call key is sent whatever the method.
    client
        .get(server.url("/c"))
        .idempotency_key(IdempotencyKey::new("get-key").expect("valid"))
        .send()
        .await
        .expect("200");

    assert_eq!(
        server.keys(),
        [
            Some("\"order-42\"".to_owned()),
            Some("from-header".to_owned()),
            Some("get-key".to_owned())
        ]
    );
}

#[tokio::test]
async fn post_without_key_is_not_retried() {
    let server = Recorder::start([Reply::status(503)]).await;
    let response = client(3)
        .post(server.url("/charges"))
        .without_idempotency_key()
        .send()
        .await
        .expect("the 503 comes back as a response");
    assert_eq!(response.status(), 503);
    assert!(response.idempotency().is_none());
    assert_eq!(server.keys(), [None], "sent once, without a key");
}

#[tokio::test]
async fn get_without_key_is_retried() {
    let server = Recorder::start([Reply::status(503), Reply::ok()]).await;
    let response = client(3)
        .get(server.url("/charges/1"))
        .send()
        .await
        .expect("200");
    assert_eq!(response.status(), 200);
    assert_eq!(server.keys(), [None, None]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_is_honoured() {
    let server = Recorder::start([Reply::status(503).retry_after("20"), Reply::ok()]).await;
    let response = post_charge(&client(3), &server).await.expect("200");
    assert_eq!(response.idempotency().map(|i| i.attempts()), Some(2));
    let records = server.records();
    let gap = records[1].at - records[0].at;
    assert!(gap >= Duration::from_secs(20), "waited {gap:?}, asked 20 s");
    assert!(
        gap < Duration::from_secs(30),
        "the 5 ms backoff did not add up to {gap:?}"
    );
}

/// The wait between the first attempt, answered `status` with `Retry-After: value`, and
/// the second, through a client with a 1 to 5 ms backoff and `cap`.
async fn wait_asked_by(status: u16, value: impl Into<String>, cap: Duration) -> Duration {
    let server = Recorder::start([Reply::status(status).retry_after(value), Reply::ok()]).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(fast(3))
        .retry_after_cap(cap)
        .build();
    post_charge(&client, &server).await.expect("200");
    let records = server.records();
    records[1].at - records[0].at
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_is_honoured_and_capped() {
    let in_an_hour =
        httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3600));
    let gap = wait_asked_by(429, in_an_hour, Duration::from_secs(7)).await;
    assert!(
        gap >= Duration::from_secs(7),
        "waited {gap:?}, the cap is 7 s"
    );
    assert!(
        gap < Duration::from_secs(3600),
        "the cap bounds the wait: {gap:?}"
    );
}

/// A policy bounded by a total retry duration reads the call's start on tokio's clock,
/// the one the deadline is measured on: under a paused clock it stops once that clock
/// passes its total (reading the wall clock, it would see no time pass and retry until
/// the server gave in).
#[tokio::test(start_paused = true)]
async fn a_timed_policy_counts_on_tokios_clock() {
    let server = Recorder::start(std::iter::repeat_n(Reply::status(503), 50)).await;
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_secs(1), Duration::from_secs(1))
        .jitter(retry_policies::Jitter::None)
        .build_with_total_retry_duration(Duration::from_secs(5));
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(policy)
        .without_retry_budget()
        .build();
    let err = post_charge(&client, &server)
        .await
        .expect_err("503 until the policy's 5 s are over");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    let attempts = server.records().len();
    // A second between attempts: attempts start at 0, 1, .. 5 s of the paused clock, and
    // the retry after the one at 5 s (or 6 s) is past the total.
    assert!((6..=7).contains(&attempts), "{attempts} attempts");
    assert_eq!(err.attempts() as usize, attempts);
}

#[tokio::test(start_paused = true)]
async fn deadline_stops_the_retries() {
    let server = Recorder::start([Reply::status(503).retry_after("10")]).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(fast(5))
        .deadline(Duration::from_secs(5))
        .build();
    let err = post_charge(&client, &server)
        .await
        .expect_err("the wait would pass the deadline");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(server.records().len(), 1);
}

#[tokio::test]
async fn store_full_and_quota_exceeded_are_retried_with_the_same_key() {
    use idemkey::protocol::Problem;
    let server = Recorder::start([
        Reply::problem(503, Problem::StoreFull),
        Reply::problem(429, Problem::QuotaExceeded),
        Reply::ok(),
    ])
    .await;
    let response = post_charge(&client(3), &server)
        .await
        .expect("the third attempt is answered");
    let info = response.idempotency().expect("keyed");
    assert_eq!(info.attempts(), 3);
    assert_eq!(info.key().as_str(), single_key(&server));
}

#[tokio::test]
async fn store_full_and_quota_exceeded_that_outlast_the_retries_have_their_own_kinds() {
    use idemkey::protocol::Problem;
    for (status, problem, kind) in [
        (503, Problem::StoreFull, "store_full"),
        (429, Problem::QuotaExceeded, "quota_exceeded"),
    ] {
        let server =
            Recorder::start(std::iter::repeat_n(Reply::problem(status, problem), 10)).await;
        let err = post_charge(&client(2), &server)
            .await
            .expect_err("refused on every attempt");
        let err = ours(&err);
        assert_eq!(err.kind_str(), kind, "{err}");
        assert_eq!(err.is_store_full(), kind == "store_full");
        assert_eq!(err.is_quota_exceeded(), kind == "quota_exceeded");
        assert!(
            !err.is_outcome_unknown(),
            "nothing ran: the outcome is known"
        );
        assert_eq!(err.attempts(), 3);
        assert_eq!(err.status().map(|s| s.as_u16()), Some(status));
        assert_eq!(
            err.key().map(|k| k.as_str().to_owned()),
            Some(single_key(&server))
        );
    }
    // A plain 503 (no problem document) is still an unknown outcome.
    let server =
        Recorder::start(std::iter::repeat_n(Reply::status(503).retry_after("0"), 10)).await;
    let err = post_charge(&client(1), &server).await.expect_err("503");
    assert!(ours(&err).is_outcome_unknown(), "{}", ours(&err));
}

#[tokio::test]
async fn conflict_then_success_is_reported_as_replay() {
    let server = Recorder::start([Reply::in_progress(), Reply::ok().replayed()]).await;
    let response = post_charge(&client(3), &server)
        .await
        .expect("the retry gets the stored answer");
    let info = response.idempotency().expect("keyed");
    assert_eq!(info.attempts(), 2);
    assert!(info.replayed());
    assert_eq!(info.key().as_str(), single_key(&server));
}

#[tokio::test]
async fn conflict_that_outlasts_the_retries_is_typed() {
    let server = Recorder::start(std::iter::repeat_n(Reply::in_progress(), 10)).await;
    let err = post_charge(&client(2), &server)
        .await
        .expect_err("409 on every attempt");
    let err = ours(&err);
    assert!(err.is_in_progress(), "{err}");
    assert_eq!(err.kind_str(), "in_progress");
    assert_eq!(err.attempts(), 3);
    assert_eq!(
        err.key().map(|k| k.as_str().to_owned()),
        Some(single_key(&server))
    );
    let info = err
        .response()
        .and_then(|r| r.idempotency())
        .expect("the response is kept");
    assert_eq!(info.attempts(), 3);
}

#[tokio::test]
async fn unprocessable_is_key_reused_after_one_attempt() {
    let server = Recorder::start([Reply::status(422).body(r#"{"type":"key-reused"}"#)]).await;
    let err = post_charge(&client(3), &server).await.expect_err("422");
    let err = Error::try_from_middleware(err).expect("idemkey's error");
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.kind_str(), "key_reused");
    assert_eq!(err.attempts(), 1);
    assert_eq!(server.records().len(), 1, "never retried");
    let body = err
        .into_response()
        .expect("the response is kept")
        .text()
        .await
        .expect("body");
    assert!(body.contains("key-reused"));
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let server = Recorder::start([Reply::status(400)]).await;
    let response = post_charge(&client(3), &server)
        .await
        .expect("a 400 is an ordinary answer");
    assert_eq!(response.status(), 400);
    assert_eq!(server.records().len(), 1);
}

#[tokio::test]
async fn stripe_style_400_key_reused_is_typed() {
    let problem = |kind: &str| {
        Reply::status(400)
            .header("content-type", "application/problem+json")
            .body(&format!(
                r#"{{"type":"https://example.com/problems/{kind}"}}"#
            ))
    };
    let server = Recorder::start([problem("key-reused"), problem("missing-field")]).await;
    let err = post_charge(&client(3), &server)
        .await
        .expect_err("key reused");
    let err = Error::try_from_middleware(err).expect("idemkey's error");
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.attempts(), 1);
    let response = err.into_response().expect("kept");
    assert_eq!(response.url().as_str(), server.url("/charges"));
    assert!(response.idempotency().is_some());
    let body = response.text().await.expect("the body was kept");
    assert!(body.ends_with(r#"key-reused"}"#), "{body}");

    // Any other 400 problem is an ordinary answer, its body intact.
    let response = post_charge(&client(3), &server)
        .await
        .expect("a 400 answer");
    assert_eq!(response.status(), 400);
    assert!(
        response
            .text()
            .await
            .expect("body")
            .contains("missing-field")
    );
    assert_eq!(server.records().len(), 2);
}

#[tokio::test]
async fn outcome_unknown_carries_the_key() {
    let server = Recorder::start(std::iter::repeat_n(Reply::status(503), 10)).await;
    let err = post_charge(&client(1), &server)
        .await
        .expect_err("503 twice");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.kind_str(), "outcome_unknown");
    assert_eq!(err.attempts(), 2);
    assert_eq!(
        err.key().map(|k| k.as_str().to_owned()),
        Some(single_key(&server))
    );
}

/// Connection refused on every attempt: nothing was sent anywhere, so the call is
/// `never_sent` (safe to send again with any key), not `outcome_unknown`.
#[tokio::test]
async fn connection_refused_is_retried_then_never_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let err = client(2)
        .post(format!("http://{addr}/charges"))
        .idempotency_key(IdempotencyKey::new("refused-1").expect("valid"))
        .json(&charge())
        .send()
        .await
        .expect_err("nobody listens");
    let err = ours(&err);
    assert!(err.is_never_sent(), "{err}");
    assert!(!err.is_outcome_unknown(), "{err}");
    assert_eq!(err.kind_str(), "never_sent");
    assert!(err.to_string().contains("never sent"), "{err}");
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.key().map(IdempotencyKey::as_str), Some("refused-1"));
    assert!(
        std::error::Error::source(err).is_some(),
        "the transport error is kept"
    );
}

#[tokio::test]
async fn streaming_body_is_refused_before_sending() {
    let server = Recorder::start([]).await;
    let body = reqwest::Body::wrap(http_body_util::Full::new(axum::body::Bytes::from("{}")));
    let err = client(3)
        .post(server.url("/charges"))
        .body(body)
        .send()
        .await
        .expect_err("a stream cannot be replayed");
    let err = ours(&err);
    assert!(err.is_body_not_replayable(), "{err}");
    assert_eq!(err.kind_str(), "body_not_replayable");
    assert_eq!(err.attempts(), 0);
    assert!(err.key().is_some());
    assert!(err.to_string().contains("nothing was sent"), "{err}");
    assert!(server.records().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn invalid_keys_are_refused_before_sending() {
    let server = Recorder::start([]).await;
    let client = client(3);
    let err = client
        .post(server.url("/charges"))
        .header("idempotency-key", "has space")
        .send()
        .await
        .expect_err("invalid header key");
    assert!(ours(&err).is_invalid_key(), "{err}");
    assert_eq!(ours(&err).kind_str(), "invalid_key");
    assert!(ours(&err).key().is_none());

    let err = client
        .post(server.url("/charges"))
        .derive_idempotency_key("op", &f64::NAN)
        .send()
        .await
        .expect_err("a NaN payload has no canonical JSON");
    assert!(ours(&err).is_invalid_key(), "{err}");
    assert!(server.records().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn derived_keys_repeat_for_the_same_operation_and_payload() {
    let server = Recorder::start([]).await;
    let client = client(0);
    for payload in [
        serde_json::json!({"amount": 1000, "currency": "eur"}),
        serde_json::json!({"currency": "eur", "amount": 1000}),
        serde_json::json!({"currency": "eur", "amount": 1001}),
    ] {
        client
            .post(server.url("/charges"))
            .derive_idempotency_key("create_charge", &payload)
            .json(&payload)
            .send()
            .await
            .expect("200");
    }
    let keys = server.keys();
    assert_eq!(keys[0], keys[1], "field order does not change the key");
    assert_ne!(keys[0], keys[2]);
    assert_eq!(server.records()[1].attempt, 2, "the server saw a retry");
}

/// Child half of `v5_keys_identical_across_processes`: sends derived keys to the URL in
/// `IDEMKEY_CHILD_URL`. Does nothing when run normally.
#[tokio::test]
async fn child_sends_derived_keys() {
    let Ok(url) = std::env::var("IDEMKEY_CHILD_URL") else {
        return;
    };
    let client = client(0);
    for i in 0..3 {
        client
            .post(&url)
            .derive_idempotency_key("create_charge", &serde_json::json!({"order": i}))
            .send()
            .await
            .expect("200");
    }
}

#[tokio::test]
async fn v5_keys_identical_across_processes() {
    let server = Recorder::start([]).await;
    let exe = std::env::current_exe().expect("the test binary");
    for _ in 0..2 {
        let status = tokio::process::Command::new(&exe)
            .args([
                "--exact",
                &support::test_name(module_path!(), "child_sends_derived_keys"),
            ])
            .arg("--nocapture")
            .env("IDEMKEY_CHILD_URL", server.url("/charges"))
            .status()
            .await
            .expect("run the child process");
        assert!(status.success());
    }
    let keys = server.keys();
    assert_eq!(keys.len(), 6);
    assert_eq!(
        keys[..3],
        keys[3..],
        "the second process sent the first one's keys"
    );
    assert_ne!(keys[0], keys[1]);
    assert!(server.records()[3..].iter().all(|r| r.attempt == 2));
}

/// Our key middleware in a hand-made stack with reqwest-retry's middleware, either side.
async fn with_reqwest_retry(key_inside_retry: bool) {
    let server = Recorder::start([Reply::status(500), Reply::status(503), Reply::ok()]).await;
    let retry = RetryTransientMiddleware::new_with_policy(fast(3));
    let builder = reqwest_middleware::ClientBuilder::new(reqwest::Client::new());
    let client = if key_inside_retry {
        builder.with(retry).with(IdempotencyKeyMiddleware::new())
    } else {
        builder.with(IdempotencyKeyMiddleware::new()).with(retry)
    }
    .build();
    let response = post_charge(&client, &server)
        .await
        .expect("third attempt succeeds");
    assert_eq!(server.records().len(), 3);
    let key = single_key(&server);
    let info = response.idempotency().expect("keyed");
    assert_eq!(info.key().as_str(), key);
    if key_inside_retry {
        assert_eq!(info.attempts(), 3, "the key middleware counts its passes");
    } else {
        assert_eq!(
            info.attempts(),
            1,
            "as documented: reqwest-retry exposes no count"
        );
    }
}

#[tokio::test]
async fn key_middleware_inside_reqwest_retry_reuses_the_key() {
    with_reqwest_retry(true).await;
}

#[tokio::test]
async fn key_middleware_outside_reqwest_retry_reuses_the_key() {
    with_reqwest_retry(false).await;
}

#[tokio::test]
async fn header_presets() {
    let server = Recorder::with_header("paypal-request-id", []).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .key_header(KeyHeader::PayPal)
        .build();
    client
        .post(server.url("/v2/payments"))
        .send()
        .await
        .expect("200");
    assert!(
        server.keys()[0].is_some(),
        "the key went in PayPal-Request-Id"
    );
}

/// An inner middleware: checks that it sees the key on every attempt, and fails the
/// first one with an error of its own (not a transport error) when asked to.
struct SeesTheKey {
    fail_first: bool,
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for SeesTheKey {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        assert!(
            req.headers().contains_key("idempotency-key"),
            "inner middlewares see the key"
        );
        if self.fail_first && Attempt::get(ext).map(Attempt::number) == Some(1) {
            let own = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "my own error");
            return Err(reqwest_middleware::Error::middleware(own));
        }
        next.run(req, ext).await
    }
}

#[tokio::test]
async fn inner_middleware_runs_per_attempt() {
    let server = Recorder::start([]).await;
    // A genuine connection reset on the first attempt, from the fault injector.
    let reset_first = idemkey::testing::FaultInjector::new(|shot| {
        if shot.key_attempt == 0 {
            idemkey::testing::Fault::Reset
        } else {
            idemkey::testing::Fault::None
        }
    });
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(fast(3))
        .with_inner(SeesTheKey { fail_first: false })
        .with_inner(reset_first)
        .build();
    let response = post_charge(&client, &server)
        .await
        .expect("the second attempt gets through");
    assert_eq!(response.idempotency().map(|i| i.attempts()), Some(2));
    assert_eq!(server.records().len(), 1, "the first attempt never left");
}

#[tokio::test]
async fn an_inner_middlewares_own_error_is_not_retried() {
    // Only transport errors are transient; an inner middleware's own error (even one
    // wrapping an I/O error) is its verdict, as `reqwest_retry` classifies it.
    let server = Recorder::start([]).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(fast(3))
        .with_inner(SeesTheKey { fail_first: true })
        .build();
    let err = post_charge(&client, &server)
        .await
        .expect_err("the inner middleware failed the only attempt");
    let e = ours(&err);
    assert!(e.is_outcome_unknown(), "{e}");
    assert_eq!(e.attempts(), 1);
    assert!(e.key().is_some(), "the error carries the key");
    assert!(server.records().is_empty(), "nothing reached the server");
}

#[tokio::test]
async fn retry_middleware_alone_rejects_an_invalid_key_header_before_sending() {
    // One resolver for both middlewares: the retry middleware used to drop an invalid
    // header silently (and send the request once, unkeyed).
    let server = Recorder::start([]).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new().policy(fast(3)))
        .build();
    let err = client
        .post(server.url("/charges"))
        .header("idempotency-key", "has space")
        .json(&charge())
        .send()
        .await
        .expect_err("an invalid key is refused");
    let e = ours(&err);
    assert!(e.is_invalid_key(), "{e}");
    assert_eq!(e.attempts(), 0);
    assert!(server.records().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn retry_middleware_alone_attaches_keys_and_retries_with_them() {
    let server = Recorder::start([Reply::status(503).retry_after("0"), Reply::ok()]).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new().policy(fast(3)))
        .build();
    let response = post_charge(&client, &server).await.expect("second attempt");
    assert_eq!(response.idempotency().map(|i| i.attempts()), Some(2));
    single_key(&server);
}

#[tokio::test]
async fn concurrent_calls_each_keep_their_own_key_across_retries() {
    // Every key's first attempt gets 503, its second 200.
    let server = Recorder::per_key([Reply::status(503).retry_after("0")]).await;
    let client = client(3);
    let calls = (0..50).map(|_| post_charge(&client, &server));
    let responses = futures_util::future::join_all(calls).await;
    let mut told: Vec<String> = Vec::new();
    for response in responses {
        let response = response.expect("the second attempt succeeds");
        let info = response.idempotency().expect("keyed");
        assert_eq!(info.attempts(), 2);
        told.push(info.key().as_str().to_owned());
    }
    let records = server.records();
    assert_eq!(records.len(), 100, "exactly two attempts per logical call");
    let mut per_key = std::collections::HashMap::<String, Vec<u32>>::new();
    for r in records {
        per_key
            .entry(r.key.expect("keyed"))
            .or_default()
            .push(r.attempt);
    }
    assert_eq!(per_key.len(), 50);
    assert!(per_key.values().all(|a| a == &[1, 2]), "{per_key:?}");
    told.sort();
    let mut seen: Vec<String> = per_key.into_keys().collect();
    seen.sort();
    assert_eq!(told, seen);
}

/// An inner middleware whose attempts never finish (a hung connection).
struct Hang;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Hang {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut http::Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn deadline_ends_a_hung_attempt() {
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .deadline(Duration::from_secs(30))
        .with_inner(Hang)
        .build();
    let err = client
        .post("http://127.0.0.1:9/charges")
        .idempotency_key(IdempotencyKey::new("hung-1").expect("valid"))
        .send()
        .await
        .expect_err("the deadline passes");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.key().map(IdempotencyKey::as_str), Some("hung-1"));
    assert!(err.to_string().contains("deadline"), "{err}");
}

#[tokio::test]
async fn typed_errors_are_found_inside_reqwest_retry_errors() {
    let server = Recorder::start([]).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(fast(3)))
        .with(IdempotencyKeyMiddleware::new())
        .build();
    let err = client
        .post(server.url("/charges"))
        .header("idempotency-key", "not valid")
        .send()
        .await
        .expect_err("invalid key");
    assert!(ours(&err).is_invalid_key(), "{err}");
    assert!(server.records().is_empty(), "nothing was sent");
}

/// A configured deadline bounds every request, also one that is sent once because it
/// carries no key.
#[tokio::test(start_paused = true)]
async fn deadline_ends_a_hung_attempt_without_a_key() {
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .deadline(Duration::from_secs(30))
        .with_inner(Hang)
        .build();
    let sent = client
        .post("http://127.0.0.1:9/log")
        .without_idempotency_key()
        .send();
    let err = tokio::time::timeout(Duration::from_secs(3600), sent)
        .await
        .expect("the 30 s deadline ends the request, not this hour-long guard")
        .expect_err("the deadline passes");
    assert!(
        Error::from_middleware(&err).is_none(),
        "no key, no typed error"
    );
    assert!(err.to_string().contains("deadline"), "{err}");
}

/// `Duration::MAX` as the deadline means "no deadline", not a panic.
#[tokio::test]
async fn a_deadline_of_duration_max_does_not_panic() {
    let server = Recorder::start([]).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .deadline(Duration::MAX)
        .build();
    let response = post_charge(&client, &server).await.expect("200");
    assert_eq!(response.status(), 200);
}

/// A server asking for an absurd wait, to a client without a cap, within a deadline:
/// the wait passes the deadline, so the request stops (and does not panic).
#[tokio::test(start_paused = true)]
async fn an_absurd_retry_after_without_a_cap_stops_at_the_deadline() {
    let server = Recorder::start([
        Reply::status(503).retry_after(u64::MAX.to_string()),
        Reply::ok(),
    ])
    .await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(fast(3))
        .retry_after_cap(Duration::MAX)
        .deadline(Duration::from_secs(60))
        .build();
    let err = post_charge(&client, &server)
        .await
        .expect_err("the asked wait passes the deadline");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(server.records().len(), 1);
}

/// delta-seconds too large for a u64 still mean "wait long": the cap applies, the
/// backoff does not.
#[tokio::test(start_paused = true)]
async fn retry_after_beyond_u64_waits_the_cap() {
    let gap = wait_asked_by(503, "99999999999999999999999", Duration::from_secs(7)).await;
    assert!(
        gap >= Duration::from_secs(7),
        "waited {gap:?}, the cap is 7 s"
    );
}

/// Values that are neither delta-seconds (RFC 9110: digits only) nor an HTTP date are
/// ignored: the backoff decides.
#[tokio::test(start_paused = true)]
async fn malformed_retry_after_is_ignored() {
    for value in ["+20", "-20", "20.5", "20 s", ""] {
        let gap = wait_asked_by(503, value, Duration::from_secs(30)).await;
        assert!(
            gap < Duration::from_secs(1),
            "Retry-After {value:?} is not a wait; waited {gap:?}"
        );
    }
}

/// A server that answers every request with the raw bytes `answer`, then drops the
/// connection or (`stall`) keeps it open without sending anything more.
async fn raw_server(answer: &'static [u8], stall: bool) -> String {
    raw_server_counted(answer, stall).await.0
}

/// [`raw_server`], and the number of request heads it has read in full.
async fn raw_server_counted(
    answer: &'static [u8],
    stall: bool,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let heads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let heads = counted.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        heads.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                }
                let _ = conn.write_all(answer).await;
                if stall {
                    std::future::pending::<()>().await;
                }
            });
        }
    });
    (format!("http://{addr}/charges"), heads)
}

/// A server that reads each request and answers nothing, ever: the default client
/// still ends the call, at its per-attempt timeouts and then its overall deadline.
#[tokio::test(start_paused = true)]
async fn the_default_client_never_hangs_on_a_hung_server() {
    use idemkey::client::{DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_DEADLINE};
    let (url, heads) = raw_server_counted(b"", true).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new()).build();
    let started = tokio::time::Instant::now();
    let err = client
        .post(url)
        .json(&charge())
        .send()
        .await
        .expect_err("nothing ever answers");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    // 80 s per attempt: three attempts time out, the fourth (begun at about 240 s) is
    // ended by the 5-minute deadline.
    assert_eq!(err.attempts(), 4, "{err}");
    assert!(err.to_string().contains("deadline"), "{err}");
    assert_eq!(heads.load(std::sync::atomic::Ordering::SeqCst), 4);
    let waited = started.elapsed();
    assert!(
        waited >= DEFAULT_DEADLINE && waited < DEFAULT_DEADLINE + DEFAULT_ATTEMPT_TIMEOUT,
        "the paused clock moved {waited:?}"
    );
}

/// An attempt that passes its timeout is retried with the same key; both limits are
/// the caller's to change.
#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_is_retried_with_the_same_key() {
    let (url, heads) = raw_server_counted(b"", true).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .retry_policy(fast(2))
        .attempt_timeout(Duration::from_secs(10))
        .deadline(Duration::MAX)
        .build();
    let err = client
        .post(url)
        .idempotency_key(IdempotencyKey::new("slow-1").expect("valid"))
        .json(&charge())
        .send()
        .await
        .expect_err("nothing ever answers");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.key().map(IdempotencyKey::as_str), Some("slow-1"));
    assert!(
        err.to_string().contains("per-attempt timeout of 10s"),
        "{err}"
    );
    assert_eq!(heads.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// A server that reads the request and then closes the connection without a word: the
/// request reached it, so the outcome is unknown, not "never sent".
#[tokio::test]
async fn a_connection_dropped_after_the_request_is_outcome_unknown() {
    let (url, heads) = raw_server_counted(b"", false).await;
    let err = client(1)
        .post(url)
        .json(&charge())
        .send()
        .await
        .expect_err("the server hangs up");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert!(!err.is_never_sent(), "{err}");
    assert_eq!(err.attempts(), 2);
    assert_eq!(heads.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A 400 problem whose 200-byte body stops after 13 bytes.
const CUT_PROBLEM: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\n\
    content-length: 200\r\n\r\n{\"type\":\"key-";

/// A server that answers a 400 problem and, inside its body, cuts the connection or
/// (`stall`) keeps it open without sending the rest.
async fn truncated_problem_server(stall: bool) -> String {
    raw_server(CUT_PROBLEM, stall).await
}

/// Header values that are not UTF-8 (obs-text) are ignored, never a panic.
#[tokio::test]
async fn non_utf8_answer_headers_are_ignored() {
    let url = raw_server(
        b"HTTP/1.1 503 Service Unavailable\r\nretry-after: \xff\xfe\r\n\
          idempotent-replayed: \xfftrue\r\ncontent-type: application/problem+json\xff\r\n\
          content-length: 0\r\nconnection: close\r\n\r\n",
        false,
    )
    .await;
    let err = client(1)
        .post(url)
        .json(&charge())
        .send()
        .await
        .expect_err("503 twice");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.attempts(), 2, "retried after the backoff");
    let info = err.response().and_then(|r| r.idempotency()).expect("kept");
    assert!(!info.replayed());
}

#[tokio::test]
async fn a_problem_body_cut_short_is_an_error_not_an_empty_body() {
    let url = truncated_problem_server(false).await;
    let result = client(0).post(url).json(&charge()).send().await;
    match result {
        Err(err) => {
            let err = ours(&err);
            assert!(err.is_outcome_unknown(), "{err}");
            assert!(err.key().is_some());
            assert!(
                std::error::Error::source(err).is_some(),
                "the read error is kept"
            );
        }
        Ok(response) => {
            let status = response.status();
            let body = response.text().await;
            assert!(
                body.is_err(),
                "HTTP {status}: the body was cut, yet it reads as {body:?}"
            );
        }
    }
}

/// The deadline covers reading a 400 problem body to classify it, too.
#[tokio::test(start_paused = true)]
async fn deadline_covers_a_stalled_problem_body() {
    let url = truncated_problem_server(true).await;
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .deadline(Duration::from_secs(30))
        .build();
    let sent = client.post(url).json(&charge()).send();
    let err = tokio::time::timeout(Duration::from_secs(3600), sent)
        .await
        .expect("the 30 s deadline ends the request, not this hour-long guard")
        .expect_err("the deadline passes");
    let err = ours(&err);
    assert!(err.is_outcome_unknown(), "{err}");
    assert!(err.to_string().contains("deadline"), "{err}");
}
