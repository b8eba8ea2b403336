//! The peers of `load --peers`: other verifiers around the same charge app
//! (`examples/common/charge_app.rs`), driven in the same alternating rounds as the bare
//! handler, idemkey and the floor.
//!
//! - axum-idempotent (crates.io, the Rust peer), served by the `--serve` process beside
//!   the others: the app's router behind `IdempotentLayer` in its direct-key mode
//!   (`Idempotency-Key` as the record's key, the header idemkey reads), inside ruts'
//!   `SessionLayer` and tower-cookies' `CookieManagerLayer`, the order its README gives.
//!   It keeps its records in the caller's session, so each driver connection first opens
//!   one (`POST /v1/sessions`) and sends its cookie with every charge. The session store
//!   is ruts' `MokaStore`, the in-process one (its README: "single-node deployments"), as
//!   idemkey runs over its memory store here; the others (Redis, PostgreSQL, Scylla) are
//!   servers of their own.
//! - express-idempotency (npm), a Node process of its own (`perf/peers/express_charge.cjs`,
//!   the same charge logic), installed at pinned versions with npm into `<target>/peers/`
//!   by the tests' installer (`tests/support/peers/install.rs`, included by path).
//!
//! Neither logs per request: the `--serve` process installs no tracing subscriber and
//! axum-idempotent logs only failures; the Node app has no logger.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use axum_idempotent::{IdempotentLayer, IdempotentOptions};
use ruts::store::Ttl;
use ruts::store::moka::MokaStore;
use ruts::{CookieOptions, Session, SessionLayer};
use tokio::io::{AsyncBufReadExt, BufReader};
use tower_cookies::CookieManagerLayer;

use crate::Workload;
use crate::charge_app::ChargeApp;

#[path = "../../../../tests/support/peers/install.rs"]
mod install;

/// express-idempotency and the express it was written against, pinned (npm resolves
/// express's own dependencies).
const EXPRESS_PEERS: &[&str] = &["express-idempotency@1.0.6", "express@4.21.2"];

/// The route of the axum-idempotent app that opens a session (sets its cookie).
pub(crate) const SESSION_PATH: &str = "/v1/sessions";

/// The charge app behind axum-idempotent (see the module's documentation).
pub(crate) fn axum_idempotent(app: &ChargeApp) -> Router {
    let store = Arc::new(MokaStore::builder().build());
    // The key from `Idempotency-Key` (not a hash of the request), required on no route:
    // the charges carry one, `/v1/sessions` and `/stats` none.
    let options =
        IdempotentOptions::default().use_idempotency_key_header(Some("idempotency-key"), false);
    app.bare_router()
        .route(SESSION_PATH, post(open_session))
        .layer(IdempotentLayer::<MokaStore>::new(options))
        .layer(
            SessionLayer::new(store)
                .with_cookie_options(CookieOptions::build().name("session").path("/")),
        )
        .layer(CookieManagerLayer::new())
}

/// Opens a session (a field in it gives it an id, which ruts sends as the cookie):
/// axum-idempotent stores answers only in a session the request already has.
async fn open_session(session: Session<MokaStore>) -> StatusCode {
    let stored = match Ttl::new(3600) {
        Ok(ttl) => session.set("client", &true, ttl, None).await.is_ok(),
        Err(_) => false,
    };
    if stored {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

/// The express-idempotency server process, killed on drop.
pub(crate) struct Express {
    child: tokio::process::Child,
    addr: SocketAddr,
}

impl Express {
    /// Installs the Node peers (once; into `peers/` of the target folder `exe`, this
    /// program, was built in) and starts the app, waiting (bounded) for its address.
    pub(crate) async fn start(exe: &Path) -> Result<Self, String> {
        let cache = exe
            .parent()
            .and_then(Path::parent)
            .ok_or(format!("{} is in no target folder", exe.display()))?
            .join("peers");
        let modules = tokio::task::spawn_blocking(move || {
            install::node_modules(&cache, "express", EXPRESS_PEERS)
        })
        .await
        .map_err(|e| e.to_string())??;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/express_charge.cjs");
        let mut child = tokio::process::Command::new("node")
            .arg(script)
            .env("NODE_PATH", &modules)
            .env("NODE_ENV", "production")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start node {script}: {e}; is Node.js installed?"))?;
        let stdout = child.stdout.take().ok_or("the Node app has no stdout")?;
        let line = tokio::time::timeout(
            Duration::from_secs(30),
            BufReader::new(stdout).lines().next_line(),
        )
        .await
        .map_err(|_| format!("node {script} printed no address within 30 s"))?
        .map_err(|e| e.to_string())?
        .ok_or(format!("node {script} exited before it was listening"))?;
        let addr = line
            .strip_prefix("EXPRESS ")
            .and_then(|a| a.trim().parse().ok())
            .ok_or(format!("unexpected line from node {script}: {line}"))?;
        Ok(Self { child, addr })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub(crate) async fn stop(mut self) -> Result<(), String> {
        self.child.kill().await.map_err(|e| e.to_string())
    }
}

/// The charges an app at `addr` has run so far (its `GET /stats`).
pub(crate) async fn executions(addr: SocketAddr) -> Result<u64, String> {
    let stats: serde_json::Value = reqwest::get(format!("http://{addr}/stats"))
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET /stats from {addr}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("GET /stats from {addr}: {e}"))?;
    stats["executions"].as_u64().ok_or(format!(
        "GET /stats from {addr} answered {stats} (no executions)"
    ))
}

/// Fails unless the handler ran once per key: once per request with fresh keys, once
/// per connection with replays (each connection's first request), so that no verifier
/// is measured answering replays it did not make.
pub(crate) fn check_runs(
    workload: Workload,
    connections: usize,
    answered: u64,
    ran: u64,
) -> Result<(), String> {
    let keys = if workload.replays() {
        connections as u64
    } else {
        answered
    };
    if ran == keys {
        return Ok(());
    }
    Err(format!(
        "{}: the handler ran {ran} times for {answered} requests over {keys} keys; a \
         verifier that does not run each key once cannot be compared",
        workload.name()
    ))
}

/// Prints idemkey's and the floor's throughput against each peer's, and each peer's
/// server CPU per request against idemkey's, from the totals of the rounds (indexed as
/// [`Workload::ALL`]; CPU as (microseconds, requests)).
pub(crate) fn print_ratios(totals: &[u64], cpu: &[(u64, u64)]) {
    let at = |w: Workload| Workload::ALL.iter().position(|&x| x == w).unwrap_or(0);
    let ratio = |a: Workload, b: Workload| totals[at(a)] as f64 / totals[at(b)].max(1) as f64;
    let per_request = |w: Workload| {
        let (used, answered) = cpu[at(w)];
        used as f64 / answered.max(1) as f64
    };
    for (peer, fresh, replay) in [
        (
            "axum-idempotent",
            Workload::AxumIdempotentFresh,
            Workload::AxumIdempotentReplay,
        ),
        (
            "express-idempotency",
            Workload::ExpressFresh,
            Workload::ExpressReplay,
        ),
    ] {
        println!(
            "idemkey/{peer}: fresh {:.2}  replay {:.2}   floor/{peer}: fresh {:.2}  replay {:.2}   \
             {peer}/bare: fresh {:.2}  replay {:.2}",
            ratio(Workload::Fresh, fresh),
            ratio(Workload::Replay, replay),
            ratio(Workload::FloorFresh, fresh),
            ratio(Workload::FloorReplay, replay),
            ratio(fresh, Workload::Bare),
            ratio(replay, Workload::Bare),
        );
        if cpu[at(fresh)].1 > 0 && cpu[at(Workload::Fresh)].1 > 0 {
            println!(
                "server CPU per request {peer}/idemkey: fresh {:.2}  replay {:.2}",
                per_request(fresh) / per_request(Workload::Fresh),
                per_request(replay) / per_request(Workload::Replay),
            );
        }
    }
}
