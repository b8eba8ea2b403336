//! Client half: key generation, and the client stack's overhead per request against a
//! bare reqwest client, both on the same loopback server in the same run.
//!
//! ```sh
//! cargo bench -p perf --bench client -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Besides criterion's figures it prints interleaved measurements (alternating rounds,
//! so both sides see the same load on a shared machine; medians of per-round figures):
//! - `loopback`: the default stack's round-trip time (every feature on: vendor profile,
//!   retry hints, retry budget, single flight) over that of the floor (a
//!   reqwest-middleware client that sets a random key header by hand), of reqwest-retry
//!   with the key set by hand, and of the bare client;
//! - `in-process`: the stack's own CPU time per request (the same canned in-process
//!   answer with and without the stack), and that time over the bare loopback round trip;
//! - `paired`: the stack and the floor alternating request by request (60,000 each),
//!   every round trip timed, and the ratios of their latency quantiles. On a shared
//!   machine a burst of other work lands on a whole round of the measurements above and
//!   moves their medians by several percent between runs; here it lands on both sides
//!   alike, and the low quantiles (the round trips nothing disturbed) are what the
//!   stack's own cost moves.
//!
//! `perf/src/bin/client_overhead.rs` runs the same loopback calls for an instruction counter
//! (callgrind), the figure the machine's load cannot move.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use idemkey::IdempotencyKey;
use idemkey::client::IdempotentClientBuilder;

fn keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let ns = uuid::Uuid::from_u128(0x1234);
    let payload = serde_json::json!({"amount": 1000, "currency": "eur", "order": "o-42",
        "customer": {"id": "cu_1", "email": "a@example.com"}});
    group.bench_function("random_v4", |b| b.iter(IdempotencyKey::random));
    group.bench_function("v5", |b| {
        b.iter(|| IdempotencyKey::v5(black_box(&ns), black_box(b"order-42")))
    });
    group.bench_function("derive_payload", |b| {
        b.iter(|| IdempotencyKey::derive(black_box("create_charge"), black_box(&payload)))
    });
    group.finish();
}

/// A loopback server on its own thread and runtime, answering every request with 200.
fn start_server() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(async move {
            let app = axum::Router::new().fallback(|| async { r#"{"id":"ch_1"}"# });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            tx.send(format!("http://{addr}/charges")).expect("send url");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    rx.recv().expect("server url")
}

fn loopback(c: &mut Criterion) {
    let url = start_server();
    let rt = runtime();
    let bare = reqwest::Client::new();
    let stack = IdempotentClientBuilder::new(reqwest::Client::new()).build();

    let mut group = c.benchmark_group("loopback_post");
    group.bench_function("bare_reqwest", |b| {
        b.to_async(&rt).iter(|| bare_post(&bare, &url))
    });
    group.bench_function("idemkey_stack", |b| {
        b.to_async(&rt).iter(|| stack_post(&stack, &url))
    });
    group.finish();
}

fn in_process(c: &mut Criterion) {
    let rt = runtime();
    let (baseline, stack) = canned_clients();
    let mut group = c.benchmark_group("in_process_post");
    group.bench_function("canned_only", |b| {
        b.to_async(&rt).iter(|| stack_post(&baseline, CANNED_URL))
    });
    group.bench_function("idemkey_stack_canned", |b| {
        b.to_async(&rt).iter(|| stack_post(&stack, CANNED_URL))
    });
    group.finish();
}

/// The interleaved measurements the BENCHMARKS.md figures come from.
fn interleaved(_: &mut Criterion) {
    let url = start_server();
    let rt = runtime();
    let bare = reqwest::Client::new();
    let stack = IdempotentClientBuilder::new(reqwest::Client::new()).build();
    let (canned_only, canned_stack) = canned_clients();
    let plain = reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).build();
    let retrying = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            idemkey::client::default_policy(),
        ))
        .build();
    rt.block_on(async {
        // What the stack saves a caller from writing: a reqwest-middleware client and a
        // fresh key header by hand.
        let floor = || async {
            let key = IdempotencyKey::random().to_header_value();
            let request = plain.post(&url).header("idempotency-key", key);
            let r = request.body(BODY).send().await.expect("200");
            black_box(r.bytes().await.expect("body"));
        };
        let paired_floor = paired(60_000, floor, || stack_post(&stack, &url)).await;
        eprintln!(
            "loopback, paired per request: stack / key header by hand on reqwest-middleware: \
             p10 {:.4}, p25 {:.4}, median {:.4}; the floor's p10 {:.1} us, median {:.1} us",
            paired_floor.ratio[0],
            paired_floor.ratio[1],
            paired_floor.ratio[2],
            paired_floor.base_us[0],
            paired_floor.base_us[2],
        );
        let paired_bare = paired(
            60_000,
            || bare_post(&bare, &url),
            || stack_post(&stack, &url),
        )
        .await;
        eprintln!(
            "loopback, paired per request: stack / bare reqwest: p10 {:.4}, p25 {:.4}, \
             median {:.4}; bare p10 {:.1} us, median {:.1} us",
            paired_bare.ratio[0],
            paired_bare.ratio[1],
            paired_bare.ratio[2],
            paired_bare.base_us[0],
            paired_bare.base_us[2],
        );
        let by_hand = compare(300, floor, || stack_post(&stack, &url)).await;
        eprintln!(
            "loopback, wall time: stack / key header by hand on reqwest-middleware = {:.4} \
             (quartiles {:.4} .. {:.4}); client thread CPU +{:.3} us per request",
            by_hand.ratio[1], by_hand.ratio[0], by_hand.ratio[2], by_hand.extra_cpu_us[1],
        );
        let retry = compare(
            300,
            || async {
                let key = IdempotencyKey::random().to_header_value();
                let request = retrying.post(&url).header("idempotency-key", key);
                let r = request.body(BODY).send().await.expect("200");
                black_box(r.bytes().await.expect("body"));
            },
            || stack_post(&stack, &url),
        )
        .await;
        eprintln!(
            "loopback, wall time: stack / reqwest-retry with the key header by hand = {:.4} \
             (quartiles {:.4} .. {:.4}); client thread CPU {:+.3} us per request",
            retry.ratio[1], retry.ratio[0], retry.ratio[2], retry.extra_cpu_us[1],
        );
        let wire = compare(300, || bare_post(&bare, &url), || stack_post(&stack, &url)).await;
        eprintln!(
            "loopback, wall time: stack / bare reqwest = {:.4} (quartiles {:.4} .. {:.4}); \
             client thread CPU +{:.3} us per request; \
             bare round trip {:.2} us (quartiles {:.2} .. {:.2})",
            wire.ratio[1],
            wire.ratio[0],
            wire.ratio[2],
            wire.extra_cpu_us[1],
            wire.base_us[1],
            wire.base_us[0],
            wire.base_us[2],
        );
        let cpu = compare(
            3000,
            || stack_post(&canned_only, CANNED_URL),
            || stack_post(&canned_stack, CANNED_URL),
        )
        .await;
        // The fastest quarter of bare round trips is the least loaded: the conservative
        // denominator.
        eprintln!(
            "in-process, thread CPU time: the stack's own cost {:.3} us per request \
             (quartiles {:.3} .. {:.3}) = {:.2}% of the bare loopback round trip's first \
             quartile, {:.2}% of its median",
            cpu.extra_cpu_us[1],
            cpu.extra_cpu_us[0],
            cpu.extra_cpu_us[2],
            100.0 * cpu.extra_cpu_us[1] / wire.base_us[0],
            100.0 * cpu.extra_cpu_us[1] / wire.base_us[1],
        );
    });
}

const CANNED_URL: &str = "http://127.0.0.1:9/charges";
const BODY: &str = r#"{"amount":1000,"currency":"eur"}"#;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime")
}

async fn bare_post(client: &reqwest::Client, url: &str) {
    let r = client.post(url).body(BODY).send().await.expect("200");
    black_box(r.bytes().await.expect("body"));
}

async fn stack_post(client: &reqwest_middleware::ClientWithMiddleware, url: &str) {
    let r = client.post(url).body(BODY).send().await.expect("200");
    black_box(r.bytes().await.expect("body"));
}

/// Quartiles (first, median, third) of per-round figures of `b` against `a`.
struct Comparison {
    /// b's wall time over a's.
    ratio: [f64; 3],
    /// a's wall time per request, in microseconds.
    base_us: [f64; 3],
    /// b's thread CPU time minus a's, per request, in microseconds (wall time where
    /// the thread's CPU time cannot be read).
    extra_cpu_us: [f64; 3],
}

/// This thread's CPU time in nanoseconds: insensitive to other processes taking the CPU
/// away between our instructions.
fn thread_cpu_ns() -> Option<f64> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Some(t.tv_sec as f64 * 1e9 + t.tv_nsec as f64)
}

/// (wall, thread CPU) microseconds per call of `f`, over `n` calls.
async fn time<F: Fn() -> Fut, Fut: Future<Output = ()>>(n: u32, f: &F) -> (f64, f64) {
    let cpu = thread_cpu_ns();
    let start = std::time::Instant::now();
    for _ in 0..n {
        f().await;
    }
    let wall = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    let cpu = match (cpu, thread_cpu_ns()) {
        (Some(before), Some(after)) => (after - before) / 1e3 / f64::from(n),
        _ => wall,
    };
    (wall, cpu)
}

async fn compare<A, AF, B, BF>(per_round: u32, a: A, b: B) -> Comparison
where
    A: Fn() -> AF,
    AF: Future<Output = ()>,
    B: Fn() -> BF,
    BF: Future<Output = ()>,
{
    const ROUNDS: usize = 201;
    // Warm-up (connection pools, caches).
    time(per_round, &a).await;
    time(per_round, &b).await;
    let mut ratios = Vec::with_capacity(ROUNDS);
    let mut bases = Vec::with_capacity(ROUNDS);
    let mut extras = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let (ta, tb) = if round % 2 == 0 {
            let ta = time(per_round, &a).await;
            (ta, time(per_round, &b).await)
        } else {
            let tb = time(per_round, &b).await;
            (time(per_round, &a).await, tb)
        };
        ratios.push(tb.0 / ta.0);
        bases.push(ta.0);
        extras.push(tb.1 - ta.1);
    }
    let quartiles = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        [v[ROUNDS / 4], v[ROUNDS / 2], v[3 * ROUNDS / 4]]
    };
    Comparison {
        ratio: quartiles(ratios),
        base_us: quartiles(bases),
        extra_cpu_us: quartiles(extras),
    }
}

/// The quantiles (10th, 25th, 50th) of `b`'s round-trip times over `a`'s.
struct Paired {
    /// b's quantile over a's, at the 10th, 25th and 50th percentile.
    ratio: [f64; 3],
    /// a's round trip at those quantiles, in microseconds.
    base_us: [f64; 3],
}

/// `a` and `b` alternating call by call, `n` calls each (the order within a pair
/// alternates too), every call timed: both sides see the same moments of the machine.
async fn paired<A, AF, B, BF>(n: usize, a: A, b: B) -> Paired
where
    A: Fn() -> AF,
    AF: Future<Output = ()>,
    B: Fn() -> BF,
    BF: Future<Output = ()>,
{
    async fn timed<F: Future<Output = ()>>(f: F) -> f64 {
        let start = std::time::Instant::now();
        f.await;
        start.elapsed().as_secs_f64() * 1e6
    }
    // Warm-up (connection pools, caches).
    for _ in 0..2_000 {
        a().await;
        b().await;
    }
    let (mut ta, mut tb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            ta.push(timed(a()).await);
            tb.push(timed(b()).await);
        } else {
            tb.push(timed(b()).await);
            ta.push(timed(a()).await);
        }
    }
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    let at = |v: &[f64], q: usize| v[v.len() * q / 100];
    let quantiles = [10, 25, 50];
    Paired {
        ratio: quantiles.map(|q| at(&tb, q) / at(&ta, q)),
        base_us: quantiles.map(|q| at(&ta, q)),
    }
}

/// Answers every request in-process, without a network: what is left is the cost of the
/// middlewares around it.
struct Canned;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Canned {
    async fn handle(
        &self,
        req: reqwest::Request,
        _: &mut http::Extensions,
        _: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        black_box(req);
        Ok(reqwest::Response::from(http::Response::new(
            r#"{"id":"ch_1"}"#,
        )))
    }
}

/// The same canned answer without and with the idemkey stack around it.
fn canned_clients() -> (
    reqwest_middleware::ClientWithMiddleware,
    reqwest_middleware::ClientWithMiddleware,
) {
    let baseline = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Canned)
        .build();
    let stack = IdempotentClientBuilder::new(reqwest::Client::new())
        .with_inner(Canned)
        .build();
    (baseline, stack)
}

criterion_group!(benches, keys, in_process, loopback, interleaved);
criterion_main!(benches);
