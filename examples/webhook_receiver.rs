//! A webhook receiver that processes each provider event exactly once.
//!
//! ```sh
//! cargo run --example webhook_receiver -- --addr 127.0.0.1:8080 [--store URL] [--secret S]
//! ```
//!
//! - `POST /webhooks/stripe`: Stripe events, keyed by the event `id`, scoped by the
//!   connected `account`;
//! - `POST /webhooks/github`: GitHub deliveries, keyed by `X-GitHub-Delivery`, scoped by
//!   `X-GitHub-Hook-ID`;
//! - `POST /webhooks/standard`: Standard Webhooks messages, keyed by `webhook-id`;
//! - `GET /stats`: `{"processed": n}`, the number of events processed (not replayed).
//!
//! `--store` takes any URL of `idemkey::store::open` (`memory`, the default;
//! `redis://...`, `postgres://...`, `sqlite://PATH` with their features). Two instances
//! on one Redis or PostgreSQL process each event once between them.
//!
//! With `--secret`, every route checks its sender's signature **before** deduplication,
//! so a forged delivery is refused (`401 signature-rejected`) and never receives the
//! replay of a genuine one:
//! Standard Webhooks (`webhook-signature`, the secret as `whsec_<base64>`), Stripe
//! (`Stripe-Signature`, `t=...,v1=<hex>` over `{t}.{body}`) and GitHub
//! (`X-Hub-Signature-256`, `sha256=<hex>` over the body). Timestamps must be within
//! 5 minutes.
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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, StatusCode};
use idemkey::server::webhook::{Preset, StandardWebhooksVerifier};
use idemkey::server::{Engine, Rejection};
use idemkey::store::Store;
use sha2::Sha256;

#[path = "common/serve.rs"]
mod serve;

/// The largest webhook body read for signature checks (the layer's own limit is 2 MiB).
const BODY_LIMIT: usize = 2 * 1024 * 1024;
/// How far a signed timestamp may be from now.
const TOLERANCE: Duration = Duration::from_secs(5 * 60);

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
    let engine = Engine::new(store);
    let stats = Stats::default();
    let route = |path: &str, preset: Preset, check: Option<Check>| {
        let verifier = preset
            .layer(engine.clone())
            .body_read_timeout(body_read_timeout);
        let router = Router::new().route(path, post(receive)).layer(verifier);
        // Added after the idempotency layer, so it runs first: a forged delivery
        // never reaches the store.
        match check {
            Some(check) => router.layer(middleware::from_fn_with_state(
                (check, body_read_timeout),
                verify,
            )),
            None => router,
        }
    };
    let checks = secret.map(Checks::new);
    let router = Router::new()
        .merge(route(
            "/webhooks/stripe",
            Preset::stripe(),
            checks.as_ref().map(|c| c.stripe.clone()),
        ))
        .merge(route(
            "/webhooks/github",
            Preset::github(),
            checks.as_ref().map(|c| c.github.clone()),
        ))
        .merge(route(
            "/webhooks/standard",
            Preset::standard_webhooks(),
            checks.as_ref().map(|c| c.standard.clone()),
        ))
        .route("/stats", get(stats_handler))
        .with_state(stats.clone());
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

async fn stats_handler(State(stats): State<Stats>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "processed": stats.processed() }))
}

/// The signature checks of the three senders, from one `--secret`.
struct Checks {
    stripe: Check,
    github: Check,
    standard: Check,
}

impl Checks {
    fn new(secret: &str) -> Self {
        // Standard Webhooks secrets are `whsec_<base64>`; any other string is used as
        // raw key bytes, as Stripe and GitHub use theirs.
        let standard = StandardWebhooksVerifier::new(secret)
            .unwrap_or_else(|_| StandardWebhooksVerifier::from_key_bytes(secret.as_bytes()))
            .tolerance(TOLERANCE);
        Self {
            stripe: Check::Stripe(Arc::from(secret.as_bytes())),
            github: Check::GitHub(Arc::from(secret.as_bytes())),
            standard: Check::Standard(Arc::new(standard)),
        }
    }
}

#[derive(Clone)]
enum Check {
    Stripe(Arc<[u8]>),
    GitHub(Arc<[u8]>),
    Standard(Arc<StandardWebhooksVerifier>),
}

impl Check {
    fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
        match self {
            Check::Standard(v) => v.verify(headers, body).map_err(|e| e.to_string()),
            Check::Stripe(key) => verify_stripe(key, headers, body),
            Check::GitHub(key) => verify_github(key, headers, body),
        }
    }
}

/// Buffers the body (within `body_read_timeout`), checks the signature, hands the same
/// bytes on. Refusals are the crate's problem answers (`body-too-large`,
/// `body-unreadable`, `body-timeout`, `signature-rejected`).
async fn verify(
    State((check, body_read_timeout)): State<(Check, Duration)>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(body_read_timeout, axum::body::to_bytes(body, BODY_LIMIT));
    let bytes = match read.await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) if is_length_limit(&e) => {
            return answer(Rejection::body_too_large(BODY_LIMIT));
        }
        Ok(Err(e)) => return answer(Rejection::body_unreadable(e)),
        Err(_) => return answer(Rejection::body_timeout(body_read_timeout)),
    };
    if let Err(why) = check.verify(&parts.headers, &bytes) {
        return answer(Rejection::signature_rejected(why));
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
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

/// The problem response of `rejection`, as axum's response type.
fn answer(rejection: Rejection) -> Response {
    rejection.into_response().into_response()
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length: this cannot fail.
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

/// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`, HMAC-SHA256 of
/// `{t}.{body}` with the endpoint secret (Stripe docs: Webhooks, "Verify webhook
/// signatures manually").
fn verify_stripe(key: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    let header = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok())
        .ok_or("the delivery is not signed: header `stripe-signature` is missing")?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for item in header.split(',') {
        match item.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", s)) => signatures.extend(hex::decode(s).ok()),
            _ => {}
        }
    }
    let t = timestamp.ok_or("`stripe-signature` has no timestamp `t=`")?;
    check_timestamp(t)?;
    let mut m = mac(key);
    m.update(t.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    signatures
        .iter()
        .any(|s| m.clone().verify_slice(s).is_ok())
        .then_some(())
        .ok_or_else(|| "no `v1` signature matches the delivery".to_owned())
}

/// GitHub: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body with the
/// webhook secret (GitHub docs: "Validating webhook deliveries").
fn verify_github(key: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    let sig = headers
        .get("x-hub-signature-256")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
        .and_then(|v| hex::decode(v).ok())
        .ok_or(
            "the delivery is not signed: header `x-hub-signature-256` is missing or malformed",
        )?;
    let mut m = mac(key);
    m.update(body);
    m.verify_slice(&sig)
        .map_err(|_| "the signature does not match the delivery".to_owned())
}

fn check_timestamp(t: i64) -> Result<(), String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let skew = (i128::from(now) - i128::from(t)).unsigned_abs();
    if skew > u128::from(TOLERANCE.as_secs()) {
        return Err(format!(
            "the signed timestamp is {skew} s away from now, outside the 5 minute tolerance"
        ));
    }
    Ok(())
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
        .about("Receives Stripe, GitHub and Standard Webhooks deliveries exactly once")
        .override_usage(
            "webhook_receiver --addr ADDR [--store URL] [--secret SECRET] [--header-read-timeout-ms MS] [--body-read-timeout-ms MS]",
        )
        .arg(
            clap::Arg::new("addr")
                .long("addr")
                .help("address to listen on, e.g. 127.0.0.1:8080"),
        )
        .arg(
            clap::Arg::new("store")
                .long("store")
                .default_value("memory")
                .help("store URL: memory, redis://..., postgres://..., sqlite://PATH"),
        )
        .arg(
            clap::Arg::new("secret")
                .long("secret")
                .help("webhook signing secret; signatures are checked only when given"),
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
    Ok(Args {
        addr: addr
            .parse()
            .map_err(|e| format!("--addr {addr:?} is not an address like 127.0.0.1:8080: {e}"))?,
        store: get("store").unwrap_or_else(|| "memory".into()),
        secret: get("secret"),
        header_read_timeout: millis("header-read-timeout-ms", serve::HEADER_READ_TIMEOUT)?,
        body_read_timeout: millis("body-read-timeout-ms", serve::BODY_READ_TIMEOUT)?,
    })
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("webhook_receiver: {e}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let store = idemkey::store::open(&args.store).await?;
    let (app, _stats) = app_with(store, args.secret.as_deref(), args.body_read_timeout);
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
