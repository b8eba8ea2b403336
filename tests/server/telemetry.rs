//! What the crate emits, asserted: the spans and fields of `idemkey::telemetry`
//! (captured by a `tracing` layer) and its counters and histograms (captured by
//! `metrics-util`'s debugging recorder), for the verifier, its store and the client.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idemkey::IdempotencyKey;
use idemkey::client::RetryBudget;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::{Claimed, Engine, IdempotencyLayer};
use idemkey::store::{MemoryStore, RecordId};
use support::apps::{ChargeApp, charge};
use support::telemetry::{Metrics, capture_spans, capture_spans_up_to};
use support::verifier::{http, post_json};
use tracing::Level;
use tracing::level_filters::LevelFilter;

const REQUESTS: &str = "idemkey_server_requests_total";

/// A verifier over `engine` serving the charge app.
async fn verifier(engine: Engine, app: &ChargeApp) -> idemkey::testing::TestServer {
    support::serve(app.router(IdempotencyLayer::new(engine))).await
}

#[tokio::test]
async fn a_replay_is_counted_and_its_span_names_the_record_never_the_key() {
    let (spans, _spans) = capture_spans();
    let metrics = Metrics::capture();
    let app = ChargeApp::new();
    let server = verifier(Engine::new(MemoryStore::new()), &app).await;
    let key = "telemetry-replay-key-7f3a";

    assert_eq!(charge(&http(), server.addr(), key).await.status, 200);
    let replay = charge(&http(), server.addr(), key).await;
    assert_eq!(
        (replay.status, app.executions().count()),
        (StatusCode::OK, 1)
    );

    let m = metrics.snapshot();
    assert_eq!(m.counter(REQUESTS, &[("decision", "fresh")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "replay")]), 1);
    assert_eq!(m.counter(REQUESTS, &[]), 2, "no other decision was counted");
    assert_eq!(
        m.counter(
            "idemkey_server_executions_total",
            &[("outcome", "recorded")]
        ),
        1
    );
    let stored = m.histogram("idemkey_server_stored_response_bytes", &[]);
    assert_eq!(stored.len(), 1, "one response stored");
    assert!(stored[0] > 0.0);
    assert_eq!(
        m.histogram("idemkey_server_handler_duration_seconds", &[])
            .len(),
        1
    );
    let claims = [("store", "memory"), ("operation", "claim")];
    assert_eq!(
        m.histogram("idemkey_store_operation_duration_seconds", &claims)
            .len(),
        2
    );
    let completes = [("store", "memory"), ("operation", "complete")];
    assert_eq!(
        m.histogram("idemkey_store_operation_duration_seconds", &completes)
            .len(),
        1
    );
    assert_eq!(m.counter("idemkey_store_errors_total", &[]), 0);

    let requests = spans.named("idemkey.request");
    assert_eq!(requests.len(), 2, "one span per request: {requests:?}");
    let id = RecordId::new("", key).to_hex();
    for (span, decision) in requests.iter().zip(["fresh", "replay"]) {
        assert_eq!(span.level, "DEBUG", "the default level, as tower-http's");
        assert_eq!(span.field("http.request.method"), "POST");
        assert_eq!(span.field("idemkey.decision"), decision);
        assert_eq!(span.field("idemkey.record_id"), id);
        assert_eq!(span.field("http.response.status_code"), "200");
    }
    let store_spans = spans.named("idemkey.store");
    let ops: Vec<_> = store_spans
        .iter()
        .map(|s| s.field("idemkey.store.operation"))
        .collect();
    assert_eq!(ops, ["claim", "complete", "claim"]);
    for span in &store_spans {
        assert_eq!(span.level, "TRACE", "below the request's span");
        assert_eq!(span.parent.as_deref(), Some("idemkey.request"), "{span:?}");
        assert_eq!(span.field("idemkey.store.kind"), "memory");
        assert!(
            span.field("idemkey.store.duration_ms")
                .parse::<f64>()
                .is_ok()
        );
        assert!(!span.fields.contains_key("error.type"), "{span:?}");
    }
    for span in spans.all() {
        for value in span.fields.values() {
            assert!(!value.contains(key), "the raw key leaked into {span:?}");
        }
    }
}

/// A service logging at INFO sees no request span at the default level (DEBUG) while
/// the verifier still decides and counts; the level set on the layer is the one used,
/// and the decision is recorded on a span of any level the filter admits.
#[tokio::test]
async fn the_request_span_is_made_at_the_level_set_on_the_layer() {
    let metrics = Metrics::capture();
    let app = ChargeApp::new();
    let engine = Engine::new(MemoryStore::new());
    let at = |level| {
        let app = app.clone();
        let layer = IdempotencyLayer::new(engine.clone());
        async move {
            let layer = match level {
                Some(level) => layer.span_level(level),
                None => layer,
            };
            support::serve(app.router(layer)).await
        }
    };

    let (spans, guard) = capture_spans_up_to(LevelFilter::INFO);
    let default = at(None).await;
    assert_eq!(
        charge(&http(), default.addr(), "level-default")
            .await
            .status,
        200
    );
    assert_eq!(
        charge(&http(), default.addr(), "level-default")
            .await
            .status,
        200
    );
    assert!(
        spans.all().is_empty(),
        "an INFO filter sees no span at the default level: {:?}",
        spans.all()
    );
    let m = metrics.snapshot();
    assert_eq!(m.counter(REQUESTS, &[("decision", "fresh")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "replay")]), 1);

    let info = at(Some(Level::INFO)).await;
    assert_eq!(charge(&http(), info.addr(), "level-info").await.status, 200);
    let requests = spans.named("idemkey.request");
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].level, "INFO");
    assert_eq!(requests[0].field("idemkey.decision"), "fresh");
    assert_eq!(
        requests[0].field("idemkey.record_id"),
        RecordId::new("", "level-info").to_hex()
    );
    assert_eq!(requests[0].field("http.response.status_code"), "200");
    assert!(
        spans.named("idemkey.store").is_empty(),
        "the store spans stay at TRACE"
    );
    drop(guard);

    // A span at WARN under a WARN filter still gets its decision and record.
    let (spans, _guard) = capture_spans_up_to(LevelFilter::WARN);
    let warn = at(Some(Level::WARN)).await;
    assert_eq!(charge(&http(), warn.addr(), "level-warn").await.status, 200);
    assert_eq!(charge(&http(), warn.addr(), "level-warn").await.status, 200);
    let requests = spans.named("idemkey.request");
    assert_eq!(
        requests
            .iter()
            .map(|s| (s.level.as_str(), s.field("idemkey.decision")))
            .collect::<Vec<_>>(),
        [("WARN", "fresh"), ("WARN", "replay")]
    );
    assert_eq!(app.executions().count(), 3, "one run per key");
}

#[tokio::test]
async fn a_full_memory_store_is_counted_and_its_fill_reported() {
    let (spans, _spans) = capture_spans();
    let metrics = Metrics::capture();
    // Built after the recorder: its gauges are resolved in it.
    let store = MemoryStore::builder()
        .max_records(1)
        .max_bytes(1 << 20)
        .build()
        .expect("bounds");
    let app = ChargeApp::new();
    let server = verifier(Engine::new(store.clone()), &app).await;
    let url = server.url("/v1/charges");

    let first = post_json(&http(), &url, Some("fill-1"), r#"{"amount":1}"#).await;
    assert_eq!(first.status(), 200);
    let refused = post_json(&http(), &url, Some("fill-2"), r#"{"amount":1}"#).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(app.executions().count(), 1);

    let m = metrics.snapshot();
    assert_eq!(m.counter(REQUESTS, &[("decision", "fresh")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "store_full")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "store_unavailable")]), 0);
    let full = [
        ("store", "memory"),
        ("operation", "claim"),
        ("error", "full"),
    ];
    assert_eq!(m.counter("idemkey_store_errors_total", &full), 1);
    assert_eq!(m.gauge("idemkey_store_memory_records", &[]), Some(1.0));
    #[allow(clippy::cast_precision_loss, reason = "a few hundred bytes")]
    let bytes = store.stored_bytes() as f64;
    assert!(bytes > 0.0);
    assert_eq!(m.gauge("idemkey_store_memory_bytes", &[]), Some(bytes));
    assert_eq!(m.gauge("idemkey_store_memory_max_records", &[]), Some(1.0));
    assert_eq!(
        m.gauge("idemkey_store_memory_max_bytes", &[]),
        Some(f64::from(1_u32 << 20))
    );

    let decisions = spans.decisions();
    assert_eq!(
        decisions,
        [
            ("fresh".to_owned(), "200".to_owned()),
            ("store_full".to_owned(), "503".to_owned())
        ]
    );
    let errors: Vec<_> = spans
        .named("idemkey.store")
        .iter()
        .filter_map(|s| s.fields.get("error.type").cloned())
        .collect();
    assert_eq!(errors, ["full"]);
}

#[tokio::test]
async fn a_reused_key_and_a_rejection_are_counted() {
    let (spans, _spans) = capture_spans();
    let metrics = Metrics::capture();
    let app = ChargeApp::new();
    let server = verifier(Engine::new(MemoryStore::new()), &app).await;
    let url = server.url("/v1/charges");

    let first = post_json(&http(), &url, Some("mismatch-1"), r#"{"amount":1}"#).await;
    assert_eq!(first.status(), 200);
    let other = post_json(&http(), &url, Some("mismatch-1"), r#"{"amount":2}"#).await;
    assert_eq!(other.status(), 422);
    let bad = post_json(&http(), &url, Some("bad key with spaces"), "{}").await;
    assert_eq!(bad.status(), 400);

    let m = metrics.snapshot();
    assert_eq!(m.counter(REQUESTS, &[("decision", "fresh")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "key_reused")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "rejected")]), 1);
    assert_eq!(app.executions().count(), 1);
    let decisions = spans.decisions();
    assert_eq!(
        decisions,
        [
            ("fresh".into(), "200".into()),
            ("key_reused".into(), "422".into()),
            ("rejected".into(), "400".into())
        ]
    );
}

/// The durations are seconds of real time whatever clock takes them: a handler that
/// sleeps 30 ms records at least that, and no more than the whole request took by the
/// test's own clock; each store operation of it fits in the request too.
#[tokio::test]
async fn durations_are_in_seconds_and_fit_in_the_request() {
    let metrics = Metrics::capture();
    let app = ChargeApp::new();
    let server = verifier(Engine::new(MemoryStore::new()), &app).await;
    let url = server.url("/v1/charges");

    let sent = std::time::Instant::now();
    let answer = post_json(
        &http(),
        &url,
        Some("slow-1"),
        r#"{"amount":1,"delay_ms":30}"#,
    )
    .await;
    assert_eq!(answer.status(), 200);
    let whole = sent.elapsed().as_secs_f64();

    let m = metrics.snapshot();
    let handler = m.histogram("idemkey_server_handler_duration_seconds", &[]);
    assert_eq!(handler.len(), 1);
    assert!(
        (0.030..=whole).contains(&handler[0]),
        "handler {} s, not within its 30 ms sleep and the request's {whole} s",
        handler[0]
    );
    let store = m.histogram("idemkey_store_operation_duration_seconds", &[]);
    assert_eq!(store.len(), 2, "a claim and a complete: {store:?}");
    for took in store {
        assert!(
            (0.0..=whole).contains(&took),
            "{took} s of a {whole} s request"
        );
    }
}

#[tokio::test]
async fn a_store_outage_is_counted_as_a_store_error() {
    let mut redis = support::RedisServer::start();
    let store = idemkey::store::RedisStore::builder(redis.url())
        .response_timeout(std::time::Duration::from_secs(1))
        .connect()
        .await
        .expect("connect to the private Redis");
    let (spans, _spans) = capture_spans();
    let metrics = Metrics::capture();
    let app = ChargeApp::new();
    let server = verifier(Engine::new(store), &app).await;
    assert_eq!(
        charge(&http(), server.addr(), "outage-before").await.status,
        200
    );
    redis.kill();

    let during = charge(&http(), server.addr(), "outage-during").await;
    assert_eq!(during.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        app.executions().count(),
        1,
        "nothing ran while the store was down"
    );

    let m = metrics.snapshot();
    let failed = [
        ("store", "redis"),
        ("operation", "claim"),
        ("error", "unavailable"),
    ];
    assert_eq!(m.counter("idemkey_store_errors_total", &failed), 1);
    assert_eq!(m.counter("idemkey_store_errors_total", &[]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "store_unavailable")]), 1);
    let last = spans.named("idemkey.store").pop().expect("store spans");
    assert_eq!(
        (
            last.field("idemkey.store.kind"),
            last.field("idemkey.store.operation"),
            last.field("error.type")
        ),
        ("redis", "claim", "unavailable")
    );
    let request = spans.named("idemkey.request").pop().expect("request spans");
    assert_eq!(request.field("idemkey.decision"), "store_unavailable");
    assert_eq!(request.field("http.response.status_code"), "503");
}

#[tokio::test]
async fn force_release_of_a_stuck_key_lets_the_next_request_run_and_fences_the_old_owner() {
    let metrics = Metrics::capture();
    let engine = Engine::new(MemoryStore::new());
    let app = ChargeApp::new();
    let server = verifier(engine.clone(), &app).await;
    let key = IdempotencyKey::new("stuck-1").expect("valid key");
    // An owner that claimed the key and hangs (in another process, say).
    let Ok(Claimed::Execute(stuck)) = engine.claim("", &key, &Fingerprint::of_bytes(b"x")).await
    else {
        panic!("the first claim executes");
    };
    // The stuck owner holds the key (with another request's fingerprint): refused.
    assert_eq!(
        charge(&http(), server.addr(), "stuck-1").await.status,
        422,
        "held"
    );

    assert!(
        engine
            .force_release("", "stuck-1")
            .await
            .expect("force_release")
    );
    assert_eq!(charge(&http(), server.addr(), "stuck-1").await.status, 200);
    assert_eq!(app.executions().count(), 1, "the next request ran");
    let late = stuck.complete("late".into()).await;
    assert!(
        late.is_err_and(|e| e.is_fenced()),
        "the old owner's late complete is fenced"
    );
    assert_eq!(charge(&http(), server.addr(), "stuck-1").await.status, 200);
    assert_eq!(
        app.executions().count(),
        1,
        "and the replay is the new owner's"
    );

    let m = metrics.snapshot();
    assert_eq!(
        m.counter(
            "idemkey_server_fenced_writes_total",
            &[("operation", "complete")]
        ),
        1
    );
    assert_eq!(
        m.counter("idemkey_server_executions_total", &[("outcome", "fenced")]),
        1
    );
    assert_eq!(
        m.counter(
            "idemkey_server_executions_total",
            &[("outcome", "recorded")]
        ),
        1
    );
    let releases = [("store", "memory"), ("operation", "force_release")];
    assert_eq!(
        m.histogram("idemkey_store_operation_duration_seconds", &releases)
            .len(),
        1
    );
    assert_eq!(m.counter(REQUESTS, &[("decision", "key_reused")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "fresh")]), 2);
    assert_eq!(m.counter(REQUESTS, &[("decision", "replay")]), 1);
}

/// A server whose first `fail` answers are 503 with `Retry-After: 0`, then 200.
async fn flaky(fail: u32) -> (idemkey::testing::TestServer, Arc<AtomicU32>) {
    let seen = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&seen);
    let router = Router::new().route(
        "/pay",
        post(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < fail {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "0")],
                        "busy",
                    )
                } else {
                    (StatusCode::OK, [("x-ok", "1")], "paid")
                }
            }
        }),
    );
    (support::serve(router).await, seen)
}

#[tokio::test]
async fn a_client_call_has_a_span_with_one_child_per_attempt_and_is_counted() {
    let (spans, _spans) = capture_spans();
    let metrics = Metrics::capture();
    let (server, seen) = flaky(1).await;
    let client = support::client::builder(3).build();
    let url = format!("{}?token=secret#frag", server.url("/pay"));
    let resp = client
        .post(&url)
        .header("idempotency-key", "client-key-1")
        .send()
        .await
        .expect("the second attempt succeeds");
    assert_eq!(
        (resp.status(), seen.load(Ordering::SeqCst)),
        (StatusCode::OK, 2)
    );

    let calls = spans.named("idemkey.call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(call.level, "DEBUG", "the default level, as tower-http's");
    assert_eq!(call.field("http.request.method"), "POST");
    assert_eq!(
        call.field("url.full"),
        server.url("/pay"),
        "no query, no fragment"
    );
    assert_eq!(call.field("idemkey.key"), "client-key-1");
    assert_eq!(call.field("idemkey.attempts"), "2");
    assert_eq!(call.field("idemkey.outcome"), "response");
    assert_eq!(call.field("idemkey.replayed"), "false");
    assert_eq!(call.field("http.response.status_code"), "200");
    let attempts = spans.named("idemkey.attempt");
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].field("http.request.resend_count"), "0");
    assert_eq!(attempts[0].field("http.response.status_code"), "503");
    assert!(!attempts[0].fields.contains_key("idemkey.wait_reason"));
    assert_eq!(attempts[1].field("http.request.resend_count"), "1");
    assert_eq!(attempts[1].field("idemkey.wait_reason"), "retry_after");
    assert_eq!(attempts[1].field("idemkey.wait_ms"), "0");
    assert!(
        attempts
            .iter()
            .all(|a| a.parent.as_deref() == Some("idemkey.call") && a.level == "TRACE")
    );

    let m = metrics.snapshot();
    let ok = [("outcome", "response"), ("replayed", "false")];
    assert_eq!(m.counter("idemkey_client_calls_total", &ok), 1);
    assert_eq!(m.histogram("idemkey_client_attempts", &[]), [2.0]);
    assert_eq!(
        m.histogram(
            "idemkey_client_retry_wait_seconds",
            &[("reason", "retry_after")]
        ),
        [0.0]
    );
}

/// A program logging at INFO sees no client span at the default level; with the call
/// span set to INFO it sees the call, recorded, and not its attempts (one level below).
#[tokio::test]
async fn the_call_span_is_made_at_the_level_set_on_the_client() {
    let (spans, _guard) = capture_spans_up_to(LevelFilter::INFO);
    let (server, seen) = flaky(1).await;
    let send = async |client: reqwest_middleware::ClientWithMiddleware, key: &str| {
        let resp = client
            .post(server.url("/pay"))
            .header("idempotency-key", key)
            .send()
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
    };
    send(support::client::builder(3).build(), "client-level-default").await;
    assert!(spans.all().is_empty(), "{:?}", spans.all());

    let info = support::client::builder(3).span_level(Level::INFO).build();
    send(info, "client-level-info").await;
    let calls = spans.named("idemkey.call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].level, "INFO");
    assert_eq!(calls[0].field("idemkey.attempts"), "1");
    assert_eq!(calls[0].field("idemkey.outcome"), "response");
    assert_eq!(calls[0].field("http.response.status_code"), "200");
    assert!(
        spans.named("idemkey.attempt").is_empty(),
        "attempts at DEBUG"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 3, "a retry, then one attempt");
}

/// A client's handles are per label value: a replayed answer is counted apart from a
/// fresh one, each call in its own series.
#[tokio::test]
async fn a_replayed_client_call_is_counted_as_replayed() {
    let metrics = Metrics::capture();
    let app = ChargeApp::new();
    let server = verifier(Engine::new(MemoryStore::new()), &app).await;
    let client = support::client::builder(0).build();
    for _ in 0..3 {
        let resp = client
            .post(server.url("/v1/charges"))
            .header("idempotency-key", "client-replay-1")
            .header("content-type", "application/json")
            .body(r#"{"amount":1}"#)
            .send()
            .await
            .expect("answered");
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(app.executions().count(), 1);

    let m = metrics.snapshot();
    let calls = "idemkey_client_calls_total";
    let fresh = [("outcome", "response"), ("replayed", "false")];
    let replayed = [("outcome", "response"), ("replayed", "true")];
    assert_eq!(m.counter(calls, &fresh), 1);
    assert_eq!(m.counter(calls, &replayed), 2);
    assert_eq!(m.histogram("idemkey_client_attempts", &[]), [1.0; 3]);
}

#[tokio::test]
async fn an_exhausted_retry_budget_is_counted() {
    let metrics = Metrics::capture();
    let (server, seen) = flaky(u32::MAX).await;
    let client = support::client::builder(3)
        .retry_budget(RetryBudget::new(0))
        .build();
    let err = client
        .post(server.url("/pay"))
        .send()
        .await
        .expect_err("the budget refuses the retry");
    assert!(support::client::ours(err).is_retry_budget_exhausted());
    assert_eq!(seen.load(Ordering::SeqCst), 1, "one attempt, no retry");

    let m = metrics.snapshot();
    assert_eq!(
        m.counter("idemkey_client_retry_budget_exhausted_total", &[]),
        1
    );
    let exhausted = [("outcome", "retry_budget_exhausted")];
    assert_eq!(m.counter("idemkey_client_calls_total", &exhausted), 1);
    assert_eq!(m.histogram("idemkey_client_attempts", &[]), [1.0]);
}

#[tokio::test]
async fn a_new_key_over_its_quota_is_the_decision_quota_exceeded_in_the_span_and_the_counter() {
    let (spans, _spans) = capture_spans();
    let metrics = Metrics::capture();
    let app = ChargeApp::new();
    let quota = idemkey::server::policy::Quota::per_minute(1).expect("a valid quota");
    let server = verifier(
        Engine::builder(MemoryStore::new()).quota(quota).build(),
        &app,
    )
    .await;

    assert_eq!(
        charge(&http(), server.addr(), "quota-first").await.status,
        200
    );
    let refused = charge(&http(), server.addr(), "quota-second").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        charge(&http(), server.addr(), "quota-first")
            .await
            .replayed()
    );

    let m = metrics.snapshot();
    assert_eq!(m.counter(REQUESTS, &[("decision", "quota_exceeded")]), 1);
    assert_eq!(m.counter(REQUESTS, &[("decision", "replay")]), 1);
    let request = spans
        .named("idemkey.request")
        .into_iter()
        .find(|s| s.field("http.response.status_code") == "429")
        .expect("the refused request's span");
    assert_eq!(request.field("idemkey.decision"), "quota_exceeded");
}
