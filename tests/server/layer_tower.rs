//! The layer without axum: as a plain tower service, and served by hyper directly.

use crate::support;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use idemkey::server::{Engine, IdempotencyLayer, body::RequestBody};
use idemkey::store::MemoryStore;
use idemkey::testing::Executions;
use support::gate::Gate;
use support::verifier::{http, post_json};
use tower::{Layer, ServiceExt};

type Req = http::Request<RequestBody<Full<Bytes>>>;

fn request(key: &str) -> http::Request<Full<Bytes>> {
    http::Request::post("/jobs")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request")
}

#[tokio::test]
async fn dropping_the_response_future_mid_handler_still_records_the_outcome() {
    let (gate, runs) = (Gate::default(), Executions::default());
    let inner = tower::service_fn({
        let (gate, runs) = (gate.clone(), runs.clone());
        move |req: Req| {
            let (gate, runs) = (gate.clone(), runs.clone());
            async move {
                let body = req.into_body().collect().await.expect("body").to_bytes();
                gate.pass().await;
                let n = runs.record();
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(format!(
                    "job {n} got {} bytes",
                    body.len()
                )))))
            }
        }
    });
    let svc = IdempotencyLayer::new(Engine::new(MemoryStore::new())).layer(inner);

    // What hyper does when the client disconnects: drop the response future.
    let fut = svc.clone().oneshot(request("job-1"));
    let caller = tokio::spawn(fut);
    gate.wait_entered(1).await;
    caller.abort();
    assert!(caller.await.expect_err("aborted").is_cancelled());

    gate.open(1);
    let mut attempts = 0;
    let replay = loop {
        attempts += 1;
        let resp = svc
            .clone()
            .oneshot(request("job-1"))
            .await
            .expect("infallible");
        if resp.status() == 200 {
            break resp;
        }
        assert_eq!(resp.status(), 409, "in progress until the handler finishes");
        assert!(attempts < 200, "the handler finishes once the gate opens");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let body = replay.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body, "job 1 got 2 bytes");
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn served_by_plain_hyper() {
    let runs = Executions::default();
    let inner = tower::service_fn({
        let runs = runs.clone();
        move |_req: http::Request<RequestBody<hyper::body::Incoming>>| {
            let n = runs.record();
            async move {
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(format!(
                    "run {n}"
                )))))
            }
        }
    });
    let svc = IdempotencyLayer::new(Engine::new(MemoryStore::new())).layer(inner);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            tokio::spawn(async move {
                let hyper_svc = hyper::service::service_fn(move |req| svc.clone().oneshot(req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_svc)
                    .await;
            });
        }
    });

    let client = http();
    let url = format!("http://{addr}/jobs");
    let first = post_json(&client, &url, Some("h-1"), "{}").await;
    assert_eq!(first.text().await.expect("body"), "run 1");
    let again = post_json(&client, &url, Some("h-1"), "{}").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.expect("body"), "run 1");
    let get = client.get(&url).send().await.expect("get");
    assert_eq!(
        get.text().await.expect("body"),
        "run 2",
        "safe methods pass through"
    );
    assert_eq!(runs.count(), 2);
    server.abort();
}

#[tokio::test]
async fn a_panicking_handler_releases_its_key_and_panics_only_once() {
    use futures_util::FutureExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // Count every panic in this process (nextest runs each test in its own process).
    let panics = Arc::new(AtomicUsize::new(0));
    let previous = std::panic::take_hook();
    std::panic::set_hook({
        let panics = panics.clone();
        Box::new(move |info| {
            panics.fetch_add(1, Ordering::SeqCst);
            previous(info);
        })
    });

    let runs = Executions::default();
    let inner = tower::service_fn({
        let runs = runs.clone();
        move |_: Req| {
            let runs = runs.clone();
            async move {
                tokio::task::yield_now().await; // the handler waits once, then fails
                assert!(runs.record() > 1, "the first execution panics");
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }
    });
    let svc = IdempotencyLayer::new(Engine::new(MemoryStore::new())).layer(inner);

    // What a catch-panic middleware (tower-http's CatchPanic) does around the layer.
    let caught = std::panic::AssertUnwindSafe(svc.clone().oneshot(request("job-panic")))
        .catch_unwind()
        .await;
    assert!(caught.is_err(), "the handler's panic reaches the caller");

    // Bounded: the release of the abandoned claim runs on a spawned task.
    let mut attempts = 0;
    let resp = loop {
        attempts += 1;
        tokio::task::yield_now().await;
        let resp = svc
            .clone()
            .oneshot(request("job-panic"))
            .await
            .expect("infallible");
        if resp.status() != 409 {
            break resp;
        }
        assert!(attempts < 200, "the panicked claim is released");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(resp.status(), 200, "the retry executes again");
    assert_eq!(runs.count(), 2);
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        panics.load(Ordering::SeqCst),
        1,
        "only the handler panicked: the poisoned execution must not be polled again"
    );
}

/// The store dies while the handler runs: the caller still gets the handler's answer at
/// once, the outcome is recorded in the background once the store is back, long after
/// the lease (1 s) and the engine's default retention (2 s) ended, and the retry gets
/// the replay. It only can because the claim asked the store for the layer's own
/// retention (1 h): with the engine's, the abandoned claim would be gone by then.
#[tokio::test(start_paused = true)]
async fn an_outcome_held_through_a_store_outage_is_recorded_when_the_store_is_back() {
    use idemkey::store::{RecordId, RecordState, Store};
    use std::sync::atomic::Ordering;
    use support::verifier::FlakyStore;

    let store = FlakyStore::default();
    let engine = Engine::builder(store.clone())
        .lease(Duration::from_secs(1))
        .retention(Duration::from_secs(2))
        .build();
    let runs = Executions::default();
    let inner = tower::service_fn({
        let (runs, store) = (runs.clone(), store.clone());
        move |_: Req| {
            let (runs, store) = (runs.clone(), store.clone());
            async move {
                let n = runs.record();
                store.failing.store(true, Ordering::SeqCst); // the store dies meanwhile
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(format!(
                    "charge {n}"
                )))))
            }
        }
    });
    let layer = IdempotencyLayer::new(engine.clone()).retention(Duration::from_secs(3600));
    let svc = layer.layer(inner);

    let first = svc
        .clone()
        .oneshot(request("k-outage"))
        .await
        .expect("infallible");
    assert_eq!(
        first.status(),
        200,
        "the caller is answered, store or no store"
    );
    assert_eq!(
        engine.pending_recordings(),
        1,
        "the outcome waits in the background"
    );

    tokio::time::sleep(Duration::from_secs(10)).await; // lease and engine retention over
    let during = svc
        .clone()
        .oneshot(request("k-outage"))
        .await
        .expect("infallible");
    assert_eq!(
        during.status(),
        503,
        "a retry during the outage runs nothing"
    );

    store.failing.store(false, Ordering::SeqCst);
    engine.wait_for_recordings().await;
    let info = store
        .inspect(&RecordId::new("", "k-outage"))
        .await
        .expect("inspect")
        .expect("the record");
    assert_eq!(info.state, RecordState::Completed);

    let retry = svc
        .clone()
        .oneshot(request("k-outage"))
        .await
        .expect("infallible");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = retry.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body, "charge 1");
    assert_eq!(runs.count(), 1, "the handler ran once");
}
