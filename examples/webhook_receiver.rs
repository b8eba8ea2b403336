//! A webhook receiver that processes each provider event exactly once.
//!
//! ```sh
//! cargo run --features metrics --example webhook_receiver -- --addr 127.0.0.1:8080 [--store URL] [--secret S]
//! ```
//!
//! - `POST /webhooks/stripe`: Stripe events, keyed by the event `id`, scoped by the
//!   connected `account`;
//! - `POST /webhooks/github`: GitHub deliveries, keyed by `X-GitHub-Delivery`, scoped by
//!   `X-GitHub-Hook-ID`;
//! - `POST /webhooks/standard`: Standard Webhooks messages, keyed by `webhook-id`;
//! - `POST /webhooks/didit`: Didit identity-verification events, keyed by `event_id`
//!   (or session, type, status and decision), scoped by `application_id`;
//! - `POST /webhooks/adyen`: Adyen notification batches, each item keyed by merchant
//!   account, PSP reference, event code and success; answered `[accepted]`;
//! - `GET /stats`: `{"processed": n}`, the number of events (Adyen: items) processed,
//!   not replayed;
//! - `GET /metrics`: Prometheus text (`examples/common/metrics.rs`), idemkey's metrics
//!   with `--features metrics`.
//!
//! Any other path is `404`: the presets' layers wrap the routes only (`route_layer`).
//!
//! `--store` takes any URL of `idemkey::store::open` (`memory`, the default;
//! `redis://...`, `postgres://...`, `sqlite://PATH` with their features). Two instances
//! on one Redis or PostgreSQL process each event once between them.
//!
//! With `--secret`, every route checks its sender's signature **before** deduplication
//! (the presets' verifiers), so a forged or stale delivery is refused
//! (`401 signature-rejected`) before any record is touched, and never receives the
//! replay of a genuine one: Standard Webhooks (`webhook-signature`, the secret as
//! `whsec_<base64>`), Stripe (`Stripe-Signature`), GitHub (`X-Hub-Signature-256`), Didit
//! (`X-Signature` or `X-Signature-V2`, body `timestamp`) and Adyen (each item's
//! `additionalData.hmacSignature`, the secret as the hex HMAC key). A secret that starts
//! with `whsec_` must be `whsec_<base64>`, as Standard Webhooks senders show it: a
//! malformed one stops the receiver at start. Any other secret is used as raw key bytes
//! for Standard Webhooks, and so is one that is not hex for Adyen. Timestamps must be
//! within 5 minutes.
//!
//! A signed test delivery (Standard Webhooks: the signature is HMAC-SHA256 over
//! `id.timestamp.body` with the base64-decoded secret, base64 again, after `v1,`):
//!
//! ```sh
//! cargo run --example webhook_receiver -- --addr 127.0.0.1:8080 \
//!     --secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw &
//! SECRET=MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw ID=msg_test_1 TS=$(date +%s) BODY='{"type":"test"}'
//! SIG=$(printf '%s' "$ID.$TS.$BODY" | openssl dgst -sha256 -mac HMAC \
//!     -macopt hexkey:$(printf '%s' "$SECRET" | base64 -d | od -An -tx1 | tr -d ' \n') -binary | base64)
//! curl -si localhost:8080/webhooks/standard -H "webhook-id: $ID" \
//!     -H "webhook-timestamp: $TS" -H "webhook-signature: v1,$SIG" -d "$BODY"
//! ```
//!
//! The `curl` is processed (`200`); the same `curl` line again gets the replay
//! (`Idempotent-Replayed: true`), and `GET /stats` still says `{"processed": 1}`.
//!
//! It does not wait forever for a sender: a connection whose request head has not
//! arrived within `--header-read-timeout-ms` (default 10 000) is closed, and a body
//! that has not arrived within `--body-read-timeout-ms` (default 30 000) is answered
//! `408 body-timeout`, before its signature is checked or its id claimed.
//!
//! A duplicate delivery gets the first delivery's 2xx replayed (with
//! `Idempotent-Replayed: true`); a duplicate that arrives while the first is being
//! processed gets 409 with `Retry-After`; a delivery whose handler fails (5xx) releases
//! its id, so the provider's retry is processed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use idemkey::server::Engine;
use idemkey::server::Rejection;
use idemkey::server::webhook::{
    AdyenHmacVerifier, BatchDeduper, DiditVerifier, HmacVerifier, Preset, StandardWebhooksVerifier,
};
use idemkey::store::Store;

#[path = "common/metrics.rs"]
mod metrics;
#[path = "common/serve.rs"]
mod serve;
#[path = "common/telemetry.rs"]
mod telemetry;

/// The largest Adyen batch read (the presets' layers have the same default, 2 MiB).
const BODY_LIMIT: usize = idemkey::server::IdempotencyLayer::DEFAULT_BODY_LIMIT;

/// Counts events processed by the handlers (replays do not reach them).
#[derive(Clone, Default)]
pub(crate) struct Stats {
    processed: Arc<AtomicU64>,
}

impl Stats {
    pub(crate) fn processed(&self) -> u64 {
        self.processed.load(Ordering::SeqCst)
    }
}

/// The receiver's routes over `store`; with `secret`, signatures are checked first.
#[allow(
    dead_code,
    reason = "the tests' way in; the binary sets its own timeouts"
)]
pub(crate) fn app(store: Arc<dyn Store>, secret: Option<&str>) -> (Router, Stats) {
    app_with(store, secret, serve::BODY_READ_TIMEOUT)
}

/// [`app`], with the time a delivery's body has to arrive.
pub(crate) fn app_with(
    store: Arc<dyn Store>,
    secret: Option<&str>,
    body_read_timeout: Duration,
) -> (Router, Stats) {
    let engine = Engine::new(store.clone());
    let stats = Stats::default();
    let (stripe, github, standard, didit) = (
        Preset::stripe(),
        Preset::github(),
        Preset::standard_webhooks(),
        Preset::didit(),
    );
    let mut adyen = BatchDeduper::adyen(store);
    let (stripe, github, standard, didit) = match secret {
        None => (stripe, github, standard, didit),
        Some(secret) => {
            // Standard Webhooks secrets are `whsec_<base64>` and Adyen keys hex; any
            // other string is used as raw key bytes, as Stripe, GitHub and Didit use
            // theirs.
            let standard_key = StandardWebhooksVerifier::new(secret)
                .unwrap_or_else(|_| StandardWebhooksVerifier::from_key_bytes(secret.as_bytes()));
            let adyen_key = AdyenHmacVerifier::new(secret)
                .unwrap_or_else(|_| AdyenHmacVerifier::from_key_bytes(secret.as_bytes()));
            adyen = adyen.item_verifier(adyen_key);
            (
                stripe.verifier(HmacVerifier::stripe(secret)),
                github.verifier(HmacVerifier::github(secret)),
                standard.verifier(standard_key),
                didit.verifier(DiditVerifier::new(secret)),
            )
        }
    };
    // One route per sender, its preset's layer on that route only: `route_layer` (not
    // `Router::layer`, which would wrap the fallback too and answer unknown paths with
    // the preset's `400 missing-key`).
    let route = |path: &str, preset: Preset| {
        let layer = preset
            .layer(engine.clone())
            .body_read_timeout(body_read_timeout);
        Router::new().route(path, post(receive)).route_layer(layer)
    };
    let router = Router::new()
        .merge(route("/webhooks/stripe", stripe))
        .merge(route("/webhooks/github", github))
        .merge(route("/webhooks/standard", standard))
        .merge(route("/webhooks/didit", didit))
        .route("/stats", get(stats_handler))
        .with_state(stats.clone())
        .merge(
            Router::new()
                .route("/webhooks/adyen", post(receive_adyen))
                .with_state(Adyen {
                    dedup: adyen,
                    stats: stats.clone(),
                    body_read_timeout,
                }),
        );
    (router, stats)
}

/// Processes one event. Here: counts it; a real receiver updates its database.
async fn receive(State(stats): State<Stats>, body: Bytes) -> impl IntoResponse {
    stats.processed.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::OK,
        Json(serde_json::json!({ "received": true, "bytes": body.len() })),
    )
}

#[derive(Clone)]
struct Adyen {
    dedup: BatchDeduper,
    stats: Stats,
    body_read_timeout: Duration,
}

/// Processes the items of an Adyen batch that were not processed before (here: counts
/// them), then answers `[accepted]`, or what the batch's state calls for. The body is
/// read as the presets' layers read theirs: up to the limit, within the timeout.
async fn receive_adyen(State(adyen): State<Adyen>, req: Request) -> impl IntoResponse {
    let read = axum::body::to_bytes(req.into_body(), BODY_LIMIT);
    let body = match tokio::time::timeout(adyen.body_read_timeout, read).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) if is_length_limit(&e) => {
            return Rejection::body_too_large(BODY_LIMIT).into_response();
        }
        Ok(Err(e)) => return Rejection::body_unreadable(e).into_response(),
        Err(_) => return Rejection::body_timeout(adyen.body_read_timeout).into_response(),
    };
    let stats = &adyen.stats;
    let result = adyen
        .dedup
        .process(&body, |_item| async move {
            stats.processed.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(())
        })
        .await;
    adyen.dedup.respond(result)
}

/// `true` when reading the body failed because it passed the limit (not because the
/// sender went away mid-body).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

async fn stats_handler(State(stats): State<Stats>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "processed": stats.processed() }))
}

/// The command line: `--addr`, `--store`, `--secret` and the timeouts.
struct Args {
    addr: SocketAddr,
    store: String,
    secret: Option<String>,
    header_read_timeout: Duration,
    body_read_timeout: Duration,
}

fn args() -> Result<Args, String> {
    let m = clap::Command::new("webhook_receiver")
        .about("Receives Stripe, GitHub, Standard Webhooks, Didit and Adyen deliveries exactly once")
        .override_usage(
            "webhook_receiver --addr HOST:PORT [--store URL] [--secret SECRET] [--header-read-timeout-ms MS] [--body-read-timeout-ms MS]",
        )
        .arg(
            clap::Arg::new("addr")
                .long("addr")
                .help("address to listen on, e.g. 127.0.0.1:8080 or localhost:8080"),
        )
        .arg(
            clap::Arg::new("store")
                .long("store")
                .default_value("memory")
                .help("store URL: memory, redis://..., postgres://..., sqlite://PATH (redis, postgres and sqlite need --features redis, postgres, sqlite)"),
        )
        .arg(
            clap::Arg::new("secret")
                .long("secret")
                .help("webhook signing secret (whsec_<base64> for Standard Webhooks); signatures are checked only when given"),
        )
        .arg(
            clap::Arg::new("header-read-timeout-ms")
                .long("header-read-timeout-ms")
                .help("close a connection whose request head takes longer (ms; default 10000)"),
        )
        .arg(
            clap::Arg::new("body-read-timeout-ms")
                .long("body-read-timeout-ms")
                .help("answer 408 to a delivery whose body takes longer (ms; default 30000)"),
        )
        .get_matches();
    let get = |name: &str| m.get_one::<String>(name).cloned();
    let millis = |name: &str, default: Duration| match get(name) {
        Some(v) => serve::millis(&format!("--{name}"), &v),
        None => Ok(default),
    };
    let addr = get("addr")
        .ok_or("--addr is required: the address to listen on, e.g. --addr 127.0.0.1:8080")?;
    let secret = get("secret");
    if let Some(secret) = &secret {
        check_secret(secret)?;
    }
    Ok(Args {
        addr: serve::listen_addr(&addr)?,
        store: get("store").unwrap_or_else(|| "memory".into()),
        secret,
        header_read_timeout: millis("header-read-timeout-ms", serve::HEADER_READ_TIMEOUT)?,
        body_read_timeout: millis("body-read-timeout-ms", serve::BODY_READ_TIMEOUT)?,
    })
}

/// Refuses a secret no sender issues: an empty one, or a `whsec_` secret whose key is not
/// base64 (it would otherwise be used as raw bytes, and every genuine delivery refused).
fn check_secret(secret: &str) -> Result<(), String> {
    if secret.is_empty() {
        return Err("--secret is empty: give the signing secret the sender shows".into());
    }
    if secret.starts_with("whsec_") {
        StandardWebhooksVerifier::new(secret).map_err(|e| format!("--secret: {e}"))?;
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    telemetry::init_tracing();
    if let Err(e) = run().await {
        eprintln!("webhook_receiver: {e}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let store = idemkey::store::open(&args.store).await?;
    let (app, _stats) = app_with(store, args.secret.as_deref(), args.body_read_timeout);
    let app = app.merge(metrics::install()?);
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    eprintln!(
        "webhook_receiver listening on http://{} (store: {}, signatures: {})",
        listener.local_addr()?,
        args.store,
        if args.secret.is_some() {
            "checked"
        } else {
            "not checked"
        }
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve::serve(listener, app, args.header_read_timeout, shutdown).await;
    Ok(())
}
