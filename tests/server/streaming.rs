//! Responses that stream: the tee sends each frame to the caller as the handler makes
//! it and copies it to the record; trailers are kept and replayed.

use crate::support;

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full, StreamBody};
use idemkey::server::{Engine, IdempotencyLayer, body::RequestBody};
use idemkey::store::{MemoryStore, RecordState};
use idemkey::testing::Executions;
use support::verifier::http;
use tokio::sync::mpsc;
use tower::{Layer, ServiceExt};

/// A bound on each wait of a test, so that a layer that holds the stream back fails
/// the test instead of hanging it. Never a measure of speed.
const BOUND: Duration = Duration::from_secs(20);

fn event(seq: u32) -> Bytes {
    Bytes::from(format!("data: {{\"seq\": {seq}}}\n\n"))
}

/// An SSE route whose events (or a failure) the test sends through a channel, one
/// channel per execution, handed out in order.
struct Events {
    runs: Executions,
    feeds: mpsc::UnboundedReceiver<mpsc::UnboundedSender<Result<Bytes, std::io::Error>>>,
}

fn sse_app(layer: IdempotencyLayer) -> (Router, Events) {
    let runs = Executions::default();
    let (feed_tx, feeds) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/v1/events",
            post({
                let runs = runs.clone();
                move || {
                    runs.record();
                    let (tx, rx) = mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
                    let _ = feed_tx.send(tx);
                    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                        rx.recv().await.map(|item| (item, rx))
                    });
                    async move {
                        http::Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(Body::from_stream(stream))
                            .expect("response")
                    }
                }
            }),
        )
        .layer(layer);
    (app, Events { runs, feeds })
}

async fn bounded<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

async fn next_chunk(resp: &mut reqwest::Response) -> Option<Bytes> {
    bounded("the next chunk", resp.chunk())
        .await
        .expect("the stream goes on")
}

async fn send(client: &reqwest::Client, url: &str, key: &str) -> reqwest::Response {
    client
        .post(url)
        .header("idempotency-key", key)
        .send()
        .await
        .expect("the verifier answers")
}

#[tokio::test]
async fn events_reach_the_caller_as_they_are_made_and_the_replay_is_byte_identical() {
    let engine = Engine::new(MemoryStore::new());
    let (app, mut events) = sse_app(IdempotencyLayer::new(engine.clone()));
    let server = support::serve(app).await;
    let (client, url) = (http(), server.url("/v1/events"));

    let mut first = send(&client, &url, "sse-1").await;
    assert_eq!(first.status(), 200);
    let feed = bounded("the handler runs", events.feeds.recv())
        .await
        .expect("a feed");
    let mut got = Vec::new();
    for seq in 0..5 {
        feed.send(Ok(event(seq))).expect("the stream is read");
        // Event `seq` reaches the caller before the handler made event `seq + 1`: the
        // layer does not hold the stream back until it ends.
        let chunk = next_chunk(&mut first).await.expect("an event");
        assert_eq!(
            chunk,
            event(seq),
            "event {seq} arrives alone, as it was made"
        );
        got.extend_from_slice(&chunk);
    }
    drop(feed);
    assert_eq!(next_chunk(&mut first).await, None, "the stream ends");

    // The record was completed before the caller saw the end of the stream.
    let info = engine
        .inspect("", "sse-1")
        .await
        .expect("inspect")
        .expect("a record");
    assert_eq!(info.state, RecordState::Completed);
    let replay = send(&client, &url, "sse-1").await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["content-type"], "text/event-stream");
    let body = replay.bytes().await.expect("replay body");
    assert_eq!(body, got, "the replay is the stream, byte for byte");
    assert_eq!(events.runs.count(), 1);
}

#[tokio::test]
async fn a_stream_over_the_storage_limit_reaches_its_caller_whole_and_retries_get_not_stored() {
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new())).stored_response_limit(40);
    let (app, mut events) = sse_app(layer);
    let server = support::serve(app).await;
    let (client, url) = (http(), server.url("/v1/events"));

    let mut first = send(&client, &url, "sse-big").await;
    let feed = bounded("the handler runs", events.feeds.recv())
        .await
        .expect("a feed");
    let mut got = Vec::new();
    for seq in 0..10 {
        feed.send(Ok(event(seq))).expect("the stream is read");
        got.extend_from_slice(&next_chunk(&mut first).await.expect("an event"));
    }
    drop(feed);
    assert_eq!(next_chunk(&mut first).await, None);
    let whole: Vec<u8> = (0..10).flat_map(|s| event(s).to_vec()).collect();
    assert_eq!(got, whole, "the caller got every event past the limit");

    let retry = send(&client, &url, "sse-big").await;
    assert_eq!(retry.status(), 410);
    let doc: serde_json::Value = retry.json().await.expect("problem");
    assert_eq!(doc["type"], "urn:idemkey:problem:response-not-stored");
    assert!(
        doc["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&format!("over {} bytes", whole.len()))),
        "the size seen is told: {doc}"
    );
    assert_eq!(events.runs.count(), 1);
}

#[tokio::test]
async fn a_stream_that_fails_midway_releases_the_key() {
    let (app, mut events) = sse_app(IdempotencyLayer::new(Engine::new(MemoryStore::new())));
    let server = support::serve(app).await;
    let (client, url) = (http(), server.url("/v1/events"));

    let mut first = send(&client, &url, "sse-fail").await;
    let feed = bounded("the handler runs", events.feeds.recv())
        .await
        .expect("a feed");
    feed.send(Ok(event(0))).expect("read");
    assert_eq!(next_chunk(&mut first).await, Some(event(0)));
    feed.send(Err(std::io::Error::other("upstream model went away")))
        .expect("read");
    assert!(
        bounded("the broken stream", first.chunk()).await.is_err(),
        "the caller sees the stream break, not a clean end"
    );

    // The key was released: the retry runs the handler again.
    let mut retry = send(&client, &url, "sse-fail").await;
    assert_eq!(retry.status(), 200);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    let feed = bounded("the handler runs again", events.feeds.recv())
        .await
        .expect("a feed");
    feed.send(Ok(event(7))).expect("read");
    drop(feed);
    assert_eq!(next_chunk(&mut retry).await, Some(event(7)));
    assert_eq!(events.runs.count(), 2);
}

#[tokio::test]
async fn a_caller_that_leaves_mid_stream_does_not_lose_the_outcome() {
    let engine = Engine::new(MemoryStore::new());
    let (app, mut events) = sse_app(IdempotencyLayer::new(engine.clone()));
    let server = support::serve(app).await;
    let (client, url) = (http(), server.url("/v1/events"));

    let mut first = send(&client, &url, "sse-gone").await;
    let feed = bounded("the handler runs", events.feeds.recv())
        .await
        .expect("a feed");
    feed.send(Ok(event(0))).expect("read");
    assert_eq!(next_chunk(&mut first).await, Some(event(0)));
    drop(first); // the caller disconnects
    // The rest is still read (the feed stays open until the layer drops the stream).
    for seq in 1..4 {
        feed.send(Ok(event(seq))).expect("the rest is still read");
    }
    drop(feed);

    let mut completed = false;
    for _ in 0..400 {
        let info = engine.inspect("", "sse-gone").await.expect("inspect");
        if info.is_some_and(|i| i.state == RecordState::Completed) {
            completed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(completed, "the rest of the stream was read and recorded");
    let replay = send(&client, &url, "sse-gone").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let body = replay.bytes().await.expect("body");
    let whole: Vec<u8> = (0..4).flat_map(|s| event(s).to_vec()).collect();
    assert_eq!(body, whole);
    assert_eq!(events.runs.count(), 1);
}

type Req = http::Request<RequestBody<Full<Bytes>>>;
type Frames = StreamBody<
    futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>,
>;

fn trailers(status: &'static str) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", status.parse().expect("value"));
    t.insert("x-checksum", "abc123".parse().expect("value"));
    t
}

/// A body of `data`, then trailers; `wait` makes the layer wait for it (a stream).
fn with_trailers(data: &'static [u8], wait: bool) -> Frames {
    let frames = vec![
        Ok(http_body::Frame::data(Bytes::from_static(data))),
        Ok(http_body::Frame::trailers(trailers("0"))),
    ];
    let stream = futures_util::stream::iter(frames);
    if wait {
        use futures_util::StreamExt;
        StreamBody::new(
            futures_util::stream::once(tokio::task::yield_now())
                .filter_map(|()| async { None })
                .chain(stream)
                .boxed(),
        )
    } else {
        use futures_util::StreamExt;
        StreamBody::new(stream.boxed())
    }
}

#[tokio::test]
async fn trailers_pass_through_and_are_replayed() {
    for wait in [false, true] {
        let runs = Executions::default();
        let inner = tower::service_fn({
            let runs = runs.clone();
            move |_: Req| {
                runs.record();
                async move { Ok::<_, Infallible>(http::Response::new(with_trailers(b"payload", wait))) }
            }
        });
        let svc = IdempotencyLayer::new(Engine::new(MemoryStore::new())).layer(inner);
        let request = || {
            http::Request::post("/v1/report")
                .header("idempotency-key", "t-1")
                .body(Full::new(Bytes::new()))
                .expect("request")
        };
        for attempt in ["first", "replay"] {
            let resp = svc.clone().oneshot(request()).await.expect("infallible");
            assert_eq!(resp.status(), 200);
            assert_eq!(
                resp.headers().contains_key("idempotent-replayed"),
                attempt == "replay"
            );
            let collected = resp.into_body().collect().await.expect("body");
            let got = collected.trailers().cloned();
            assert_eq!(got, Some(trailers("0")), "{attempt} (streamed: {wait})");
            assert_eq!(collected.to_bytes(), "payload");
        }
        assert_eq!(runs.count(), 1);
    }
}
