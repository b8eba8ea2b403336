//! The verifier's cost: fingerprinting, and the layer against the same handler without
//! it, in-process (a tower `oneshot`) and over loopback (reqwest to axum on 127.0.0.1),
//! for fresh keys and for replays; and a 1 MiB streamed response through the layer
//! against the bare handler over loopback (time to first byte, and to the last).
//!
//! ```sh
//! cargo bench -p perf --bench server -- --warm-up-time 1 --measurement-time 3
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Method, Uri, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use idemkey::fingerprint::Fingerprinter;
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use idemkey::testing::TestServer;
use sha2::{Digest, Sha256};
use tower::{Layer, ServiceExt};

const BODY: &str =
    r#"{"amount":1000,"currency":"eur","customer":"cus_123","description":"order 42"}"#;
const ANSWER: &str = r#"{"id":"ch_1","object":"charge","amount":1000,"currency":"eur"}"#;

fn fingerprint(c: &mut Criterion) {
    let mut g = c.benchmark_group("fingerprint");
    let uri = Uri::from_static("/v1/charges");
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    let fp = Fingerprinter::new();
    for (name, size) in [("1KiB", 1024usize), ("1MiB", 1024 * 1024)] {
        let body = vec![0xa5u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(format!("sha256_baseline/{name}"), |b| {
            b.iter(|| Sha256::digest(std::hint::black_box(&body)))
        });
        g.bench_function(format!("request/{name}"), |b| {
            b.iter(|| fp.fingerprint(&Method::POST, &uri, &headers, std::hint::black_box(&body)))
        });
    }
    g.finish();
}

fn request(key: Option<String>) -> http::Request<Full<Bytes>> {
    let mut b = http::Request::post("/v1/charges").header(CONTENT_TYPE, "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap_or_default()
}

fn in_process(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("runtime: {e}"));
    let bare = tower::service_fn(|req: http::Request<Full<Bytes>>| async move {
        let _ = req.into_body().collect().await;
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
            ANSWER.as_bytes(),
        ))))
    });
    let guarded_inner = tower::service_fn(
        |req: http::Request<idemkey::server::body::RequestBody<Full<Bytes>>>| async move {
            let _ = req.into_body().collect().await;
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                ANSWER.as_bytes(),
            ))))
        },
    );
    let guarded = IdempotencyLayer::new(Engine::new(MemoryStore::new())).layer(guarded_inner);
    let n = AtomicU64::new(0);

    let mut g = c.benchmark_group("layer_in_process");
    g.bench_function("bare_handler", |b| {
        b.to_async(&rt).iter(|| async {
            let resp = bare.oneshot(request(None)).await;
            let _ = resp.map(|r| r.into_body());
        })
    });
    g.bench_function("fresh_key", |b| {
        b.to_async(&rt).iter(|| async {
            let key = format!("fresh-{}", n.fetch_add(1, Ordering::Relaxed));
            let resp = guarded.clone().oneshot(request(Some(key))).await;
            let _ = resp.map(|r| r.into_body());
        })
    });
    rt.block_on(guarded.clone().oneshot(request(Some("replayed".into()))))
        .unwrap_or_else(|e| match e {});
    g.bench_function("replay", |b| {
        b.to_async(&rt).iter(|| async {
            let resp = guarded
                .clone()
                .oneshot(request(Some("replayed".into())))
                .await;
            let _ = resp.map(|r| r.into_body());
        })
    });
    g.finish();
}

fn loopback(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("runtime: {e}"));
    let handler = || async { ([(CONTENT_TYPE, "application/json")], ANSWER) };
    let (bare, guarded) = rt.block_on(async {
        let bare = axum::Router::new().route("/v1/charges", axum::routing::post(handler));
        let guarded = axum::Router::new()
            .route("/v1/charges", axum::routing::post(handler))
            .layer(IdempotencyLayer::new(Engine::new(MemoryStore::new())));
        (
            TestServer::start(bare)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            TestServer::start(guarded)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        )
    });
    let client = reqwest::Client::new();
    let n = AtomicU64::new(0);
    let post = |url: String, key: Option<String>| {
        let mut req = client
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(BODY);
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        async move {
            let resp = req.send().await.unwrap_or_else(|e| panic!("{e}"));
            let _ = resp.bytes().await;
        }
    };

    let mut g = c.benchmark_group("layer_loopback");
    g.bench_function("bare_handler", |b| {
        b.to_async(&rt).iter(|| post(bare.url("/v1/charges"), None))
    });
    g.bench_function("fresh_key", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!("fresh-{}", n.fetch_add(1, Ordering::Relaxed));
            post(guarded.url("/v1/charges"), Some(key))
        })
    });
    rt.block_on(post(guarded.url("/v1/charges"), Some("replayed".into())));
    g.bench_function("replay", |b| {
        b.to_async(&rt)
            .iter(|| post(guarded.url("/v1/charges"), Some("replayed".into())))
    });
    g.finish();
}

/// The streamed response: 16 chunks of 64 KiB, the handler yielding to the runtime
/// before each (so the layer must stream it, not read it at once).
const CHUNKS: usize = 16;
const CHUNK: usize = 64 * 1024;

fn streamed() -> axum::response::Response {
    let stream = futures_util::stream::unfold(0, |i| async move {
        if i == CHUNKS {
            return None;
        }
        tokio::task::yield_now().await;
        Some((Ok::<_, Infallible>(Bytes::from(vec![b'x'; CHUNK])), i + 1))
    });
    axum::response::IntoResponse::into_response((
        [(CONTENT_TYPE, "application/octet-stream")],
        axum::body::Body::from_stream(stream),
    ))
}

fn streaming(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("runtime: {e}"));
    // A short retention: the memory store sweeps the 1 MiB records as the bench goes.
    let engine = Engine::builder(MemoryStore::new())
        .retention(Duration::from_secs(1))
        .build();
    let (bare, guarded) = rt.block_on(async {
        let route = || axum::routing::post(|| async { streamed() });
        let bare = axum::Router::new().route("/v1/report", route());
        let guarded = axum::Router::new()
            .route("/v1/report", route())
            .layer(IdempotencyLayer::new(engine));
        (
            TestServer::start(bare)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            TestServer::start(guarded)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        )
    });
    let client = reqwest::Client::new();
    let n = AtomicU64::new(0);
    // Time to the first chunk, or to the end, of `iters` fresh requests.
    let run = |url: String, keyed: bool, first_only: bool, iters: u64| {
        let (client, n) = (&client, &n);
        async move {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let mut req = client.post(&url);
                if keyed {
                    req = req.header(
                        "idempotency-key",
                        format!("stream-{}", n.fetch_add(1, Ordering::Relaxed)),
                    );
                }
                let start = Instant::now();
                let mut resp = req.send().await.unwrap_or_else(|e| panic!("{e}"));
                let mut got = 0;
                if let Some(chunk) = resp.chunk().await.unwrap_or_else(|e| panic!("{e}")) {
                    got += chunk.len();
                }
                if first_only {
                    spent += start.elapsed();
                }
                while let Some(chunk) = resp.chunk().await.unwrap_or_else(|e| panic!("{e}")) {
                    got += chunk.len();
                }
                if !first_only {
                    spent += start.elapsed();
                }
                assert_eq!(got, CHUNKS * CHUNK);
            }
            spent
        }
    };

    let mut g = c.benchmark_group("stream_1MiB_loopback");
    g.throughput(Throughput::Bytes((CHUNKS * CHUNK) as u64));
    for (what, first_only) in [("first_byte", true), ("total", false)] {
        g.bench_function(format!("{what}/bare_handler"), |b| {
            b.to_async(&rt)
                .iter_custom(|iters| run(bare.url("/v1/report"), false, first_only, iters))
        });
        g.bench_function(format!("{what}/fresh_key"), |b| {
            b.to_async(&rt)
                .iter_custom(|iters| run(guarded.url("/v1/report"), true, first_only, iters))
        });
    }
    g.finish();
}

criterion_group!(benches, fingerprint, in_process, loopback, streaming);
criterion_main!(benches);
