//! A charge API behind the verifier (the app is `examples/common/charge_app.rs`).
//!
//! ```sh
//! cargo run --features metrics --example charge_server -- --addr 127.0.0.1:3000 [--store memory]
//! cargo run --features redis --example charge_server -- --addr localhost:3000 \
//!     --store redis://127.0.0.1:6379        # or postgres://..., sqlite://charges.db
//! ```
//!
//! It prints `charge_server listening on http://...` on standard error once it serves;
//! `RUST_LOG` sets what else it logs (`examples/common/telemetry.rs`; a failing store
//! shows up there as idemkey's warnings).
//!
//! `--store` takes any connection string of `idemkey::store::open`; several servers
//! given one Redis or PostgreSQL share their records. The memory store is bounded
//! (1,000,000 records or 512 MiB by default; `--store 'memory://?max_records=N'` for
//! another bound): when it is full, new keys get `503 store-full`. `--quota 60,300`
//! gives each scope (the `Authorization` header) 60 new keys a second with bursts of
//! 300; over it, `429 quota-exceeded` with `Retry-After`, and nothing is recorded.
//!
//! It does not wait forever for a client: a connection whose request head has not
//! arrived within `--header-read-timeout-ms` (default 10 000) is closed, and a body
//! that has not arrived within `--body-read-timeout-ms` (default 30 000) is answered
//! `408 body-timeout` before its key is claimed (`examples/common/serve.rs`). On Ctrl-C
//! it stops accepting, lets open requests finish, and waits (up to 10 s) for outcomes
//! still being recorded after a store outage.
//!
//! - `POST /v1/charges` (key required; scope: the `Authorization` header, unscoped when
//!   absent). Body JSON or form-encoded: `amount` (integer), optional `delay_ms` (sleeps
//!   that long before answering) and `fail` (answers 500 without creating a charge).
//!   Answers `200 {"id": "ch_<n>", "object": "charge", "amount": ...}`.
//! - `POST /v1/events?count=N&interval_ms=M` (same verifier): `text/event-stream`, N
//!   events `data: {"seq": i}` M ms apart, each sent as it is made (the verifier tees
//!   the stream into its record); a retry gets the whole stream replayed at once.
//! - `GET /stats`: `{"executions": n, "orders": o, "orders_with_several_keys": m}`, the
//!   number of charges created (and streams), and the `order`s charged (under more than
//!   one key).
//! - `GET /metrics`: Prometheus text (`examples/common/metrics.rs`): the verifier's
//!   requests by decision, store latency and errors, with `--features metrics`.
//!
//! It logs to standard error (`RUST_LOG`, default `warn,idemkey=info`): a store that
//! fails shows there as it happens. `RUST_LOG=idemkey=debug` adds the verifier's spans.
//!
//! Try it:
//!
//! ```sh
//! curl -si localhost:3000/v1/charges -H 'idempotency-key: k1' -d amount=100
//! curl -si localhost:3000/v1/charges -H 'idempotency-key: k1' -d amount=100  # replayed
//! curl -si localhost:3000/v1/charges -H 'idempotency-key: k1' -d amount=200  # 422
//! curl -s localhost:3000/stats                                               # 1
//! curl -N -X POST 'localhost:3000/v1/events?count=5&interval_ms=500' -H 'idempotency-key: e1'
//! curl -si -X POST 'localhost:3000/v1/events?count=5&interval_ms=500' -H 'idempotency-key: e1'
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use idemkey::server::policy::Quota;
use idemkey::server::{Engine, IdempotencyLayer};

#[path = "common/charge_app.rs"]
mod charge_app;
#[path = "common/metrics.rs"]
mod metrics;
#[path = "common/serve.rs"]
mod serve;
#[path = "common/telemetry.rs"]
mod telemetry;
use charge_app::ChargeApp;

const USAGE: &str =
    "usage: charge_server --addr HOST:PORT [--store URL] [--quota PER_SECOND[,BURST]]
                     [--header-read-timeout-ms MS] [--body-read-timeout-ms MS]
  quota: new keys a second per scope (the Authorization header), and the burst (one
         second's worth by default); over it: 429 quota-exceeded with Retry-After
  stores: memory (default; bounded: memory://?max_records=N&max_bytes=SIZE), sqlite://PATH,
          redis://HOST:PORT, postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB,
          dynamodb://TABLE?region=REGION
  (each needs its feature: cargo run --features redis --example charge_server -- ...;
   or sqlite, postgres, mysql, dynamodb; --all-features for all)
  timeouts: 10000 ms for a request head, 30000 ms for a body, by default";

/// How long a shutdown waits for outcomes still being recorded after a store outage.
const RECORDINGS_DRAIN: Duration = Duration::from_secs(10);

struct Args {
    addr: SocketAddr,
    store: String,
    quota: Option<Quota>,
    header_read_timeout: Duration,
    body_read_timeout: Duration,
}

/// The arguments, or `None` for `--help`.
fn parse_args() -> Result<Option<Args>, String> {
    let mut addr = None;
    let mut store = "memory".to_owned();
    let mut quota = None;
    let mut header_read_timeout = serve::HEADER_READ_TIMEOUT;
    let mut body_read_timeout = serve::BODY_READ_TIMEOUT;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value; {USAGE}"));
        match arg.as_str() {
            "--addr" => addr = Some(serve::listen_addr(&value()?)?),
            "--store" => store = value()?,
            "--quota" => quota = Some(parse_quota(&value()?)?),
            "--header-read-timeout-ms" => header_read_timeout = serve::millis(&arg, &value()?)?,
            "--body-read-timeout-ms" => body_read_timeout = serve::millis(&arg, &value()?)?,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    let addr = addr.ok_or(format!("--addr is required; {USAGE}"))?;
    Ok(Some(Args {
        addr,
        store,
        quota,
        header_read_timeout,
        body_read_timeout,
    }))
}

/// `PER_SECOND[,BURST]`: a quota of new keys per scope.
fn parse_quota(text: &str) -> Result<Quota, String> {
    let bad = |e: &dyn std::fmt::Display| format!("--quota {text:?}: {e}; {USAGE}");
    let (rate, burst) = match text.split_once(',') {
        Some((rate, burst)) => (rate, Some(burst)),
        None => (text, None),
    };
    let rate: f64 = rate.trim().parse().map_err(|e| bad(&e))?;
    let mut quota = Quota::per_second(rate).map_err(|e| bad(&e))?;
    if let Some(burst) = burst {
        let burst: u32 = burst.trim().parse().map_err(|e| bad(&e))?;
        quota = quota.burst(burst).map_err(|e| bad(&e))?;
    }
    Ok(quota)
}

#[allow(
    clippy::print_stdout,
    reason = "--help prints its usage on standard output"
)]
#[tokio::main]
async fn main() -> ExitCode {
    telemetry::init_tracing();
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let store = match idemkey::store::open(&args.store).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("charge_server: {e}");
            return ExitCode::from(2);
        }
    };
    // PostgreSQL, MySQL and SQLite keep expired records until swept.
    let _sweeper =
        idemkey::store::spawn_sweeper(store.clone(), std::time::Duration::from_secs(300));
    let engine = Engine::new(store);
    let mut verifier =
        IdempotencyLayer::new(engine.clone()).body_read_timeout(args.body_read_timeout);
    if let Some(quota) = args.quota {
        verifier = verifier.quota(quota);
    }
    let metrics = match metrics::install() {
        Ok(route) => route,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let app = ChargeApp::new().router(verifier).merge(metrics);
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let bound = listener.local_addr().unwrap_or(args.addr);
    // The line to wait for: requests are served from here on.
    eprintln!(
        "charge_server listening on http://{bound} (store: {})",
        args.store
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve::serve(listener, app, args.header_read_timeout, shutdown).await;
    // Outcomes held through a store outage are recorded once it is back: give them a
    // moment before the process (and what it holds) goes away.
    if tokio::time::timeout(RECORDINGS_DRAIN, engine.wait_for_recordings())
        .await
        .is_err()
    {
        eprintln!(
            "{} outcome(s) still not recorded after {RECORDINGS_DRAIN:?}: the store is still away; their keys run again after their lease",
            engine.pending_recordings()
        );
    }
    ExitCode::SUCCESS
}
