//! A charge API behind the verifier (the app is `examples/common/charge_app.rs`).
//!
//! ```sh
//! cargo run --example charge_server -- --addr 127.0.0.1:3000 [--store memory]
//! cargo run --all-features --example charge_server -- --addr 127.0.0.1:3000 \
//!     --store redis://127.0.0.1:6379        # or postgres://..., sqlite://charges.db
//! ```
//!
//! `--store` takes any connection string of `idemkey::store::open`; several servers
//! given one Redis or PostgreSQL share their records.
//!
//! - `POST /v1/charges` (key required; scope: the `Authorization` header, unscoped when
//!   absent). Body JSON or form-encoded: `amount` (integer), optional `delay_ms` (sleeps
//!   that long before answering) and `fail` (answers 500 without creating a charge).
//!   Answers `200 {"id": "ch_<n>", "object": "charge", "amount": ...}`.
//! - `GET /stats`: `{"executions": n}`, the number of charges created.
//!
//! Try it:
//!
//! ```sh
//! curl -si localhost:3000/v1/charges -H 'idempotency-key: k1' -d amount=100
//! curl -si localhost:3000/v1/charges -H 'idempotency-key: k1' -d amount=100  # replayed
//! curl -si localhost:3000/v1/charges -H 'idempotency-key: k1' -d amount=200  # 422
//! curl -s localhost:3000/stats                                               # 1
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;

use idemkey::server::{Engine, IdempotencyLayer};

#[path = "common/charge_app.rs"]
mod charge_app;
use charge_app::ChargeApp;

const USAGE: &str = "usage: charge_server --addr IP:PORT [--store URL]
  stores: memory (default), sqlite://PATH, redis://HOST:PORT, postgres://USER@HOST:PORT/DB,
          mysql://USER@HOST:PORT/DB, dynamodb://TABLE?region=REGION
  (each needs its idemkey feature: sqlite, redis, postgres, mysql, dynamodb; e.g. --all-features)";

struct Args {
    addr: SocketAddr,
    store: String,
}

fn parse_args() -> Result<Args, String> {
    let mut addr = None;
    let mut store = "memory".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value; {USAGE}"));
        match arg.as_str() {
            "--addr" => {
                let v = value()?;
                addr = Some(
                    v.parse()
                        .map_err(|e| format!("--addr {v}: {e}; use IP:PORT"))?,
                );
            }
            "--store" => store = value()?,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    let addr = addr.ok_or(format!("--addr is required; {USAGE}"))?;
    Ok(Args { addr, store })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let store = match idemkey::store::open(&args.store).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // PostgreSQL, MySQL and SQLite keep expired records until swept.
    let _sweeper =
        idemkey::store::spawn_sweeper(store.clone(), std::time::Duration::from_secs(300));
    let app = ChargeApp::new().router(IdempotencyLayer::new(Engine::new(store)));
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let bound = listener.local_addr().unwrap_or(args.addr);
    eprintln!(
        "charge_server listening on http://{bound} (store: {})",
        args.store
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server failed: {e}");
            ExitCode::FAILURE
        }
    }
}
