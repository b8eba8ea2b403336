//! The client stack's cost per request, in a form that an instruction counter can
//! measure without the noise of a shared machine: N loopback POSTs through one client
//! kind, to a server on its own thread.
//!
//! ```sh
//! cargo build --release -p perf --bin client_overhead
//! for kind in stack by_hand retry_by_hand bare required; do
//!   valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=cg.$kind \
//!     target/release/client_overhead $kind 5000
//! done
//! grep -m1 summary cg.*-01   # the client thread; divide by 5000
//! ```
//!
//! Kinds: `stack` (idemkey's default stack, everything on), `by_hand` (a
//! reqwest-middleware client that sets a random key header by hand: the floor),
//! `retry_by_hand` (that, plus reqwest-retry's middleware), `bare` (reqwest alone),
//! `required` (a measuring stick, [`Required`]: a middleware that does on every call
//! only what the behaviour contract requires of a key middleware that retries, and
//! nothing else; it never retries, so it is not a client to use).
//!
//! A third argument `prometheus` installs a Prometheus recorder first, so that a build
//! with `--features metrics` measures the client's metrics against a real recorder
//! (BENCHMARKS.md, "Cost of telemetry and metrics"). Its builder calibrates a clock in a loop
//! bounded by wall time, which an instruction count should leave out: count `run` only,
//! `--toggle-collect='client_overhead::run*'`.
//!
//! `log=FILTER` installs a formatting subscriber at FILTER first (`tracing_subscriber`'s
//! `fmt` with an `EnvFilter`, on standard error, as a program logging with `RUST_LOG`
//! has), and `span-level=LEVEL` sets the stack's call span level
//! (`IdempotentClientBuilder::span_level`): the cost of the client's spans at a level
//! against the same count with no subscriber (BENCHMARKS.md, "Cost of telemetry").

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Duration;

use idemkey::IdempotencyKey;
use idemkey::client::IdempotentClientBuilder;
use idemkey::protocol::headers;

const BODY: &str = r#"{"amount":1000,"currency":"eur"}"#;

/// `POST` to a loopback server on its own thread and runtime, answering 200.
/// The least work a key middleware that keeps the behaviour contract does on a call
/// answered at once: a random key in the header; what a retry would send kept aside
/// (method, URL, the body's bytes); one timer for the deadline; the key, the attempts
/// and the replay flag stored on the response. No classification, hints, budget,
/// single flight, typed errors or telemetry, and no retry: the floor of what
/// idemkey's default stack could cost (BENCHMARKS.md, "Client").
struct Required;

/// What the caller reads off the response (idemkey's `IdempotencyInfo` has the same
/// fields).
#[derive(Clone)]
#[allow(dead_code)]
struct Facts {
    key: IdempotencyKey,
    attempts: u32,
    replayed: bool,
    shared: bool,
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Required {
    async fn handle(
        &self,
        mut req: reqwest::Request,
        ext: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let key = IdempotencyKey::random();
        req.headers_mut()
            .insert(headers::IDEMPOTENCY_KEY, key.to_header_value());
        let kept = (
            req.method().clone(),
            req.url().clone(),
            req.body()
                .and_then(reqwest::Body::as_bytes)
                .map(bytes::Bytes::copy_from_slice),
        );
        let answer = tokio::time::timeout(Duration::from_secs(300), next.run(req, ext)).await;
        drop(black_box(kept));
        let mut response = answer.map_err(reqwest_middleware::Error::middleware)??;
        let replayed = headers::is_replayed(response.headers());
        response.extensions_mut().insert(Facts {
            key,
            attempts: 1,
            replayed,
            shared: false,
        });
        Ok(response)
    }
}

fn start_server() -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let served = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
            .and_then(|rt| {
                rt.block_on(async {
                    let app = axum::Router::new().fallback(|| async { r#"{"id":"ch_1"}"# });
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                    let _ = tx.send(Ok(format!("http://{}/charges", listener.local_addr()?)));
                    axum::serve(listener, app).await
                })
                .map_err(|e| e.to_string())
            });
        if let Err(e) = served {
            let _ = tx.send(Err(e));
        }
    });
    rx.recv().map_err(|e| e.to_string())?
}

async fn run(
    kind: &str,
    url: &str,
    n: u32,
    span_level: Option<tracing::Level>,
) -> Result<(), String> {
    let by_hand = reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).build();
    let retry_by_hand = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            idemkey::client::default_policy(),
        ))
        .build();
    let stack = IdempotentClientBuilder::new(reqwest::Client::new());
    let stack = match span_level {
        Some(level) => stack.span_level(level),
        None => stack,
    }
    .build();
    let required = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(Required)
        .build();
    let bare = reqwest::Client::new();
    for _ in 0..n {
        let response = match kind {
            "stack" => stack.post(url).body(BODY).send().await,
            "required" => required.post(url).body(BODY).send().await,
            "by_hand" | "retry_by_hand" => {
                let client = if kind == "by_hand" {
                    &by_hand
                } else {
                    &retry_by_hand
                };
                let key = IdempotencyKey::random().to_header_value();
                client
                    .post(url)
                    .header("idempotency-key", key)
                    .body(BODY)
                    .send()
                    .await
            }
            "bare" => bare
                .post(url)
                .body(BODY)
                .send()
                .await
                .map_err(reqwest_middleware::Error::from),
            other => return Err(format!("unknown kind {other}")),
        };
        let body = response
            .map_err(|e| e.to_string())?
            .bytes()
            .await
            .map_err(|e| e.to_string())?;
        black_box(body);
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "stack".into());
    let n = args.next().and_then(|s| s.parse().ok()).unwrap_or(5000);
    let mut span_level = None;
    let set_up = args.try_for_each(|arg| match arg.split_once('=') {
        None if arg == "prometheus" => metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map(drop)
            .map_err(|e| format!("cannot install the Prometheus recorder: {e}")),
        Some(("log", filter)) => tracing_subscriber::EnvFilter::try_new(filter)
            .map_err(|e| format!("log={filter}: {e}"))
            .and_then(|filter| {
                tracing_subscriber::fmt()
                    .with_env_filter(filter)
                    .with_writer(std::io::stderr)
                    .try_init()
                    .map_err(|e| format!("cannot install the log subscriber: {e}"))
            }),
        Some(("span-level", level)) => level
            .parse()
            .map(|level| span_level = Some(level))
            .map_err(|_| format!("span-level={level}: use error, warn, info, debug or trace")),
        _ => Err(format!(
            "unknown argument {arg} (after the count: prometheus, log=FILTER, span-level=LEVEL)"
        )),
    });
    let result = set_up.and_then(|()| start_server()).and_then(|url| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(run(&kind, &url, n, span_level))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "client_overhead {kind}: {e} (kinds: stack, by_hand, retry_by_hand, bare, required)"
            );
            ExitCode::FAILURE
        }
    }
}
