//! The client against servers that speak other dialects, over real HTTP on 127.0.0.1:
//! both replay spellings, 423 in progress, the retry hints, the retry budget, and single
//! flight per key.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemkey::IdempotencyKey;
use idemkey::client::{AnswerMatch, RequestBuilderExt, ResponseExt, RetryBudget, VendorProfile};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use reqwest_middleware::ClientWithMiddleware;
use support::apps::ChargeApp;
use support::client::{builder, ours};
use support::gate::Gate;
use support::recorder::{Recorder, Reply};

fn client(retries: u32) -> ClientWithMiddleware {
    builder(retries).build()
}

async fn post(
    client: &ClientWithMiddleware,
    server: &Recorder,
) -> reqwest_middleware::Result<reqwest::Response> {
    client
        .post(server.url("/charges"))
        .json(&serde_json::json!({"amount": 1000}))
        .send()
        .await
}

fn gap(server: &Recorder) -> Duration {
    let records = server.records();
    records[1].at - records[0].at
}

// ---------------------------------------------------------------------------------
// Replay spellings, 423, plain 422

#[tokio::test]
async fn both_replay_spellings_are_recognised() {
    for name in ["idempotent-replayed", "idempotency-replayed"] {
        let server = Recorder::start([Reply::ok().header(name, "true")]).await;
        let response = post(&client(0), &server).await.expect("200");
        let info = response.idempotency().expect("keyed");
        assert!(info.replayed(), "{name}: true is a replay");
    }
    let server = Recorder::start([Reply::ok().header("idempotency-replayed", "false")]).await;
    let response = post(&client(0), &server).await.expect("200");
    assert!(!response.idempotency().expect("keyed").replayed());
}

#[tokio::test]
async fn the_verifier_marks_replays_in_either_spelling_and_the_client_reads_both() {
    use idemkey::protocol::ReplayHeader;
    use idemkey::testing::{Fault, FaultInjector};
    for (spelling, other) in [
        (None, "idempotency-replayed"),
        (
            Some(ReplayHeader::IdempotencyReplayed),
            "idempotent-replayed",
        ),
    ] {
        let mut layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()));
        if let Some(spelling) = spelling {
            layer = layer.replay_header(spelling);
        }
        let name = spelling.unwrap_or_default().name();
        let app = ChargeApp::new();
        let server = support::serve(app.router(layer)).await;
        let lose_first = FaultInjector::new(|shot| {
            if shot.key_attempt == 0 {
                Fault::LoseResponse
            } else {
                Fault::None
            }
        });
        let client = builder(3).with_inner(lose_first).build();
        let response = client
            .post(server.url("/v1/charges"))
            .json(&serde_json::json!({"amount": 5}))
            .send()
            .await
            .expect("the replay");
        assert_eq!(response.headers()[&name], "true", "{name}");
        assert!(!response.headers().contains_key(other), "only {name}");
        let info = response.idempotency().expect("keyed");
        assert_eq!((info.attempts(), info.replayed()), (2, true));
        assert_eq!(app.executions().count(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn locked_is_in_progress_with_its_retry_after() {
    let locked = || {
        Reply::status(423)
            .retry_after("20")
            .header("content-type", "application/problem+json")
            .body(r#"{"type":"urn:idemkit:in-progress","status":423}"#)
    };
    let server =
        Recorder::start([locked(), Reply::ok().header("idempotency-replayed", "true")]).await;
    let response = post(&client(3), &server)
        .await
        .expect("the retry is replayed");
    let info = response.idempotency().expect("keyed");
    assert_eq!((info.attempts(), info.replayed()), (2, true));
    assert!(
        gap(&server) >= Duration::from_secs(20),
        "waited {:?}",
        gap(&server)
    );

    let server = Recorder::start(std::iter::repeat_n(locked(), 5)).await;
    let err = ours(post(&client(2), &server).await.expect_err("423 every time"));
    assert!(err.is_in_progress(), "{err}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(423));
    assert_eq!(err.attempts(), 3);
}

#[tokio::test]
async fn a_plain_422_is_an_ordinary_answer_not_a_reused_key() {
    let server =
        Recorder::start([Reply::status(422).body(r#"{"errors":{"amount":["must be positive"]}}"#)])
            .await;
    let response = post(&client(3), &server)
        .await
        .expect("a validation 422 comes back as a response");
    assert_eq!(response.status(), 422);
    assert_eq!(server.records().len(), 1, "never retried");
    let body = response.text().await.expect("the body is intact");
    assert!(body.contains("must be positive"));
}

#[tokio::test]
async fn a_409_naming_a_reused_key_is_not_retried() {
    // idemkit's stripe mode answers a reused key with 409, in-progress with 409 too.
    let server = Recorder::start([Reply::status(409)
        .header("content-type", "application/problem+json")
        .body(r#"{"type":"urn:idemkit:payload-mismatch","status":409}"#)])
    .await;
    let err = ours(post(&client(3), &server).await.expect_err("mismatch"));
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(server.records().len(), 1);
}

// ---------------------------------------------------------------------------------
// Retry hints

#[tokio::test]
async fn should_retry_false_stops_what_the_status_would_retry() {
    for (status, hint) in [
        (503, "x-should-retry"),
        (409, "stripe-should-retry"),
        (429, "x-should-retry"),
    ] {
        let server = Recorder::start([Reply::status(status).header(hint, "false")]).await;
        let err = ours(post(&client(3), &server).await.expect_err("not retried"));
        assert_eq!(err.attempts(), 1, "{status} with {hint}: false");
        assert_eq!(server.records().len(), 1);
    }
}

#[tokio::test]
async fn should_retry_true_retries_what_the_status_would_not() {
    let server = Recorder::start([Reply::status(404).header("x-should-retry", "true")]).await;
    let response = post(&client(3), &server).await.expect("the retry gets 200");
    assert_eq!(response.idempotency().map(|i| i.attempts()), Some(2));
}

#[tokio::test]
async fn no_hint_makes_a_400_or_422_retryable() {
    for (status, hint) in [
        (400, "x-should-retry"),
        (422, "stripe-should-retry"),
        (400, "stripe-should-retry"),
        (422, "x-should-retry"),
    ] {
        let server = Recorder::start([Reply::status(status).header(hint, "true")]).await;
        let response = post(&client(3), &server).await.expect("an ordinary answer");
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(server.records().len(), 1, "{status} with {hint}: true");
    }
}

#[tokio::test]
async fn when_hints_disagree_false_wins() {
    let server = Recorder::start([Reply::status(503)
        .header("x-should-retry", "true")
        .header("stripe-should-retry", "false")])
    .await;
    let err = ours(post(&client(3), &server).await.expect_err("503"));
    assert_eq!(err.attempts(), 1);
}

#[tokio::test]
async fn a_profile_honours_only_its_own_hint_headers() {
    // Stripe's SDKs read Stripe-Should-Retry only; the Stainless ones x-should-retry only.
    let server = Recorder::start([Reply::status(503).header("x-should-retry", "false")]).await;
    let stripe = builder(3).profile(VendorProfile::stripe()).build();
    let response = post(&stripe, &server).await.expect("retried to 200");
    assert_eq!(response.idempotency().map(|i| i.attempts()), Some(2));

    let server = Recorder::start([Reply::status(503).header("stripe-should-retry", "false")]).await;
    let stainless = builder(3).profile(VendorProfile::stainless()).build();
    let response = post(&stainless, &server).await.expect("retried to 200");
    assert_eq!(response.idempotency().map(|i| i.attempts()), Some(2));
}

#[tokio::test(start_paused = true)]
async fn retry_after_ms_wins_over_retry_after() {
    let server = Recorder::start([Reply::status(503)
        .header("retry-after-ms", "1500")
        .retry_after("20")])
    .await;
    post(&client(3), &server).await.expect("200");
    let waited = gap(&server);
    assert!(waited >= Duration::from_millis(1500), "waited {waited:?}");
    assert!(
        waited < Duration::from_secs(20),
        "Retry-After lost: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_asked_wait_never_exceeds_the_cap() {
    let server = Recorder::start([Reply::status(503).header("retry-after-ms", "3600000")]).await;
    let client = builder(3).retry_after_cap(Duration::from_secs(5)).build();
    post(&client, &server).await.expect("200");
    let waited = gap(&server);
    assert!(waited >= Duration::from_secs(5), "waited {waited:?}");
    assert!(
        waited < Duration::from_secs(3600),
        "the cap bounds it: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_asked_wait_never_passes_the_deadline() {
    let server = Recorder::start([Reply::status(503).header("retry-after-ms", "60000")]).await;
    let client = builder(3)
        .retry_after_cap(Duration::MAX)
        .deadline(Duration::from_secs(10))
        .build();
    let err = ours(
        post(&client, &server)
            .await
            .expect_err("the wait passes the deadline"),
    );
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(server.records().len(), 1);
}

// ---------------------------------------------------------------------------------
// Retry budget

/// Counts the attempts that pass it (an inner middleware: once per attempt).
#[derive(Clone, Default)]
struct CountAttempts(Arc<AtomicU64>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for CountAttempts {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, ext).await
    }
}

/// A port nothing listens on.
fn dead_upstream() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}/charges")
}

#[tokio::test]
async fn with_a_dead_upstream_1000_calls_make_far_fewer_than_4000_attempts() {
    let url = dead_upstream();
    let attempts = CountAttempts::default();
    let budget = RetryBudget::standard();
    let client = builder(3)
        .retry_budget(budget.clone())
        .with_inner(attempts.clone())
        .build();
    let (mut unknown, mut exhausted) = (0, 0);
    for i in 0..1000 {
        let err = client
            .post(&url)
            .idempotency_key(IdempotencyKey::new(format!("call-{i}")).expect("valid"))
            .send()
            .await
            .expect_err("nobody listens");
        let err = ours(err);
        assert_eq!(
            err.key().map(|k| k.as_str().to_owned()),
            Some(format!("call-{i}"))
        );
        if err.is_retry_budget_exhausted() {
            assert_eq!(err.kind_str(), "retry_budget_exhausted");
            assert!(err.to_string().contains("retry budget"), "{err}");
            exhausted += 1;
        } else {
            assert!(err.is_never_sent(), "{err}");
            unknown += 1;
        }
    }
    // 500 tokens at 5 a retry: 100 retries in all. The first 33 calls retry 3 times
    // (99 retries), the 34th once more before the bucket is empty; every later call is
    // sent once.
    assert_eq!(attempts.0.load(Ordering::SeqCst), 1100);
    assert_eq!((unknown, exhausted), (33, 967));
    assert_eq!(budget.available(), 0);

    // Without a budget, each call makes its 4 attempts.
    let attempts = CountAttempts::default();
    let client = builder(3)
        .without_retry_budget()
        .with_inner(attempts.clone())
        .build();
    for _ in 0..50 {
        let err = client.post(&url).send().await.expect_err("nobody listens");
        assert!(ours(err).is_never_sent());
    }
    assert_eq!(attempts.0.load(Ordering::SeqCst), 200);
}

#[tokio::test]
async fn successes_give_the_tokens_back() {
    // Every key's first attempt gets 503, its second 200: each call spends one retry
    // and its success returns it, so a bucket good for two retries serves ten calls.
    let server = Recorder::per_key([Reply::status(503).retry_after("0")]).await;
    let budget = RetryBudget::new(10);
    let client = builder(3).retry_budget(budget.clone()).build();
    for _ in 0..10 {
        let response = post(&client, &server).await.expect("the retry succeeds");
        assert_eq!(response.idempotency().map(|i| i.attempts()), Some(2));
    }
    assert_eq!(budget.available(), 10);
}

#[tokio::test]
async fn a_budget_is_shared_by_clones_and_by_clients_given_it() {
    let url = dead_upstream();
    let budget = RetryBudget::new(10);
    let a = builder(3).retry_budget(budget.clone()).build();
    let b = builder(3).retry_budget(budget.clone()).build();
    let a2 = a.clone();
    for client in [&a, &a2, &b] {
        let _ = client.post(&url).send().await;
    }
    assert_eq!(budget.available(), 0, "10 tokens: two retries in all");
    let err = ours(b.post(&url).send().await.expect_err("dead"));
    assert!(err.is_retry_budget_exhausted(), "{err}");
    assert_eq!(err.attempts(), 1);
}

// ---------------------------------------------------------------------------------
// Single flight

const SHARED_KEY: &str = "order-42-capture";

/// `n` calls with one key and one payload, polled together (the test's runtime has one
/// thread, so every call has joined before the server can answer the first).
async fn same_call_n_times(
    client: &ClientWithMiddleware,
    url: &str,
    n: usize,
) -> Vec<reqwest_middleware::Result<reqwest::Response>> {
    let calls = (0..n).map(|_| {
        client
            .post(url)
            .idempotency_key(IdempotencyKey::new(SHARED_KEY).expect("valid"))
            .json(&serde_json::json!({"amount": 1000}))
            .send()
    });
    futures_util::future::join_all(calls).await
}

#[tokio::test]
async fn concurrent_calls_with_one_key_share_one_request() {
    let server = Recorder::start([Reply::ok().body(r#"{"id":"ch_1","n":1}"#)]).await;
    let client = client(3);
    let results = same_call_n_times(&client, &server.url("/charges"), 10).await;
    assert_eq!(server.records().len(), 1, "one request for ten calls");
    let mut shared = 0;
    for result in results {
        let response = result.expect("everyone gets the answer");
        let info = response.idempotency().expect("keyed").clone();
        assert_eq!(info.key().as_str(), SHARED_KEY);
        assert_eq!(info.attempts(), 1);
        shared += usize::from(info.shared());
        assert_eq!(response.status(), 200);
        let body = response.text().await.expect("each copy has the whole body");
        assert_eq!(body, r#"{"id":"ch_1","n":1}"#);
    }
    assert_eq!(shared, 9, "nine followers, one leader");
}

#[tokio::test]
async fn followers_get_the_leaders_typed_error_with_the_response() {
    let server = Recorder::start([Reply::status(422)
        .header("content-type", "application/problem+json")
        .body(r#"{"type":"urn:idemkey:problem:key-reused","title":"reused"}"#)])
    .await;
    let client = client(3);
    let results = same_call_n_times(&client, &server.url("/charges"), 5).await;
    assert_eq!(server.records().len(), 1);
    for result in results {
        let err = ours(result.expect_err("key reused"));
        assert!(err.is_key_reused(), "{err}");
        assert_eq!(err.key().map(IdempotencyKey::as_str), Some(SHARED_KEY));
        let body = err
            .into_response()
            .expect("kept")
            .text()
            .await
            .expect("body");
        assert!(body.contains("key-reused"), "{body}");
    }
}

#[tokio::test]
async fn followers_share_a_never_sent_with_its_cause() {
    let url = dead_upstream();
    let client = client(1);
    let results = same_call_n_times(&client, &url, 4).await;
    for result in results {
        let err = ours(result.expect_err("dead upstream"));
        assert!(err.is_never_sent(), "{err}");
        assert_eq!(err.attempts(), 2, "the shared flight's attempts");
        assert!(
            std::error::Error::source(&err).is_some(),
            "the cause is kept"
        );
    }
}

#[tokio::test]
async fn a_different_request_with_the_same_key_waits_and_gets_the_servers_verdict() {
    // Against the real verifier: the second payload is judged after the first completed,
    // so it is a reused key, never a race into 409.
    let app = ChargeApp::new();
    let server =
        support::serve(app.router(IdempotencyLayer::new(Engine::new(MemoryStore::new())))).await;
    let client = client(3);
    let url = server.url("/v1/charges");
    let call = |amount: u64| {
        client
            .post(&url)
            .idempotency_key(IdempotencyKey::new(SHARED_KEY).expect("valid"))
            .json(&serde_json::json!({"amount": amount}))
            .send()
    };
    let (first, second) = tokio::join!(call(100), call(200));
    assert_eq!(first.expect("the first executes").status(), 200);
    let err = ours(second.expect_err("another payload, same key"));
    assert!(err.is_key_reused(), "{err}");
    assert_eq!(err.attempts(), 1, "sent once, after the first landed");
    assert_eq!(app.executions().count(), 1);
}

#[tokio::test]
async fn random_keys_and_single_flight_off_send_every_call() {
    let server = Recorder::start([]).await;
    let client = client(0);
    let calls = (0..3).map(|_| post(&client, &server));
    futures_util::future::join_all(calls).await;
    assert_eq!(server.records().len(), 3, "random keys never share");

    let server = Recorder::start([]).await;
    let off = builder(0).single_flight(false).build();
    for result in same_call_n_times(&off, &server.url("/charges"), 3).await {
        assert!(!result.expect("200").idempotency().expect("keyed").shared());
    }
    assert_eq!(server.records().len(), 3, "single flight off");
}

/// A server whose first request waits at `gate`; later ones answer at once. Counts them.
async fn first_request_held(gate: &Gate) -> (idemkey::testing::TestServer, Arc<AtomicU64>) {
    let seen = Arc::new(AtomicU64::new(0));
    let app = {
        let (gate, seen) = (gate.clone(), Arc::clone(&seen));
        axum::Router::new().fallback(move || {
            let (gate, seen) = (gate.clone(), Arc::clone(&seen));
            async move {
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    gate.pass().await;
                }
                r#"{"id":"ch_1"}"#
            }
        })
    };
    (support::serve(app).await, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_fly_themselves_when_the_leader_is_dropped() {
    let gate = Gate::default();
    let (server, seen) = first_request_held(&gate).await;
    // Counts the calls that reached the retry middleware (and so joined or led a flight).
    let entered = CountAttempts::default();
    let client = builder(0).with(entered.clone()).build();
    let url = server.url("/charges");
    let call = move |client: ClientWithMiddleware| {
        let url = url.clone();
        async move {
            client
                .post(&url)
                .idempotency_key(IdempotencyKey::new(SHARED_KEY).expect("valid"))
                .body("{}")
                .send()
                .await
        }
    };
    let leader = tokio::spawn(call.clone()(client.clone()));
    gate.wait_entered(1).await;
    let follower = tokio::spawn(call(client.clone()));
    while entered.0.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    // The follower joined the flight; its leader goes away before landing.
    leader.abort();
    let response = follower
        .await
        .expect("the follower task")
        .expect("the follower sends its own request");
    assert!(!response.idempotency().expect("keyed").shared());
    assert_eq!(seen.load(Ordering::SeqCst), 2, "the follower flew itself");
    gate.open(1);
}

#[tokio::test(start_paused = true)]
async fn a_shared_flight_ends_at_the_deadline_for_everyone() {
    let gate = Gate::default();
    let (server, _) = first_request_held(&gate).await;
    let client = builder(0).deadline(Duration::from_secs(5)).build();
    let results = same_call_n_times(&client, &server.url("/charges"), 3).await;
    for result in results {
        let err = ours(result.expect_err("the deadline passes"));
        assert!(err.is_outcome_unknown(), "{err}");
        assert!(err.to_string().contains("deadline"), "{err}");
    }
    gate.open(1);
}

#[tokio::test]
async fn a_custom_profile_types_another_verifiers_reused_key() {
    // fastapi-idempotency 0.1.1 answers a reused key with 422 {"detail": "..."}.
    let server = Recorder::start([Reply::status(422)
        .body(r#"{"detail":"Idempotency-Key 'k1' was already used for a different request."}"#)])
    .await;
    let profile = VendorProfile::standard().with_key_reused(
        AnswerMatch::status(422).json_contains("/detail", "already used for a different request"),
    );
    let client = builder(3).profile(profile).build();
    let err = ours(post(&client, &server).await.expect_err("typed"));
    assert!(err.is_key_reused(), "{err}");
}
