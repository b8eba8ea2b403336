//! A small charge API that counts its executions: the app that
//! `examples/charge_server.rs` and `examples/payments.rs` serve, included by path
//! (`#[path = "common/charge_app.rs"] mod charge_app;`), and by the tests
//! (`tests/support/apps.rs`).
//!
//! - `POST /v1/charges` behind the verifier (key required; scope: the `Authorization`
//!   header, unscoped when absent). Body JSON or form-encoded: `amount` (integer),
//!   optional `delay_ms` (sleeps that long first) and `fail` (answers 500 without
//!   creating a charge), `order` (the caller's operation: the app remembers which keys
//!   created charges for it). Answers `200 {"id": "ch_<n>", "object": "charge", "amount": ...}`.
//! - `POST /v1/events?count=N&interval_ms=M` behind the same verifier: a
//!   `text/event-stream` of N events `data: {"seq": i}` (i from 0), M ms apart
//!   (defaults 3 and 100), streamed through the layer as they are made and replayed
//!   byte for byte to a retry; each stream counts as an execution.
//! - `GET /stats`: `{"executions": n, "orders": o, "orders_with_several_keys": m}`: the
//!   charges created (and event streams started), the distinct `order`s charged, and
//!   how many of those were charged under more than one key (a client that lost its key
//!   would show here).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use idemkey::server::{IdempotencyLayer, extract::HeaderScope};
use serde::{Deserialize, Serialize};

/// How many charges the app created; clones share the count (the example servers
/// need no test helpers, so not `idemkey::testing::Executions`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Executions(Arc<AtomicU64>);

impl Executions {
    /// Counts one charge and returns the new total.
    pub(crate) fn record(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Charges so far.
    pub(crate) fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The charge API's handlers and their execution count. Several routers made by
/// [`ChargeApp::router`] (say, verifier instances over one shared store) share the
/// count.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChargeApp {
    executions: Executions,
    /// For each `order`, the keys under which a charge was created for it.
    keys_per_order: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    /// Only the tests hold a charge at a gate (after counting it, before answering).
    #[cfg(test)]
    gate: Option<crate::support::gate::Gate>,
}

#[derive(Debug, Serialize)]
struct Charge {
    id: String,
    object: &'static str,
    amount: i64,
}

#[derive(Debug, Deserialize)]
struct ChargeRequest {
    amount: i64,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    fail: Option<bool>,
    #[serde(default)]
    order: Option<String>,
}

impl ChargeApp {
    /// The app, with no charge created yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The app whose every charge, once counted, waits at `gate` before answering.
    #[cfg(test)]
    pub(crate) fn gated(gate: crate::support::gate::Gate) -> Self {
        Self {
            executions: Executions::default(),
            keys_per_order: Arc::default(),
            gate: Some(gate),
        }
    }

    /// Charges created so far.
    pub(crate) fn executions(&self) -> &Executions {
        &self.executions
    }

    /// The same routes without the verifier: the baseline a load test compares the
    /// verifier against (`examples/load.rs`).
    #[allow(
        dead_code,
        reason = "only the load program compares against the bare app"
    )]
    pub(crate) fn bare_router(&self) -> Router {
        Router::new()
            .route("/v1/charges", post(create))
            .route("/v1/events", post(events))
            .route("/stats", get(stats))
            .with_state(self.clone())
    }

    /// The axum router: `POST /v1/charges` and `POST /v1/events` behind `layer`, its
    /// scope set to the `Authorization` header; `GET /stats`.
    pub(crate) fn router(&self, layer: IdempotencyLayer) -> Router {
        let layer = layer.scope(HeaderScope::new(header::AUTHORIZATION));
        Router::new()
            .route("/v1/charges", post(create).layer(layer.clone()))
            .route("/v1/events", post(events).layer(layer))
            .route("/stats", get(stats))
            .with_state(self.clone())
    }
}

/// The query of `POST /v1/events`.
#[derive(Debug, Deserialize)]
struct EventsQuery {
    #[serde(default = "default_count")]
    count: u32,
    #[serde(default = "default_interval_ms")]
    interval_ms: u64,
}

fn default_count() -> u32 {
    3
}

fn default_interval_ms() -> u64 {
    100
}

/// The most events, and the longest pause, one stream may ask for.
const MAX_EVENTS: u32 = 100_000;
const MAX_INTERVAL_MS: u64 = 60_000;

/// `count` events `data: {"seq": i}`, `interval_ms` apart, as server-sent events.
async fn events(State(app): State<ChargeApp>, Query(q): Query<EventsQuery>) -> Response {
    if q.count > MAX_EVENTS || q.interval_ms > MAX_INTERVAL_MS {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({
                "error": format!("count is at most {MAX_EVENTS} and interval_ms at most {MAX_INTERVAL_MS}")
            })),
        )
            .into_response();
    }
    app.executions.record();
    let pause = Duration::from_millis(q.interval_ms);
    let stream = futures_util::stream::unfold(0_u32, move |seq| async move {
        if seq >= q.count {
            return None;
        }
        if seq > 0 {
            tokio::time::sleep(pause).await;
        }
        let event = format!("data: {{\"seq\": {seq}}}\n\n");
        Some((Ok::<_, std::convert::Infallible>(event), seq + 1))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

async fn create(State(app): State<ChargeApp>, req: Request) -> Response {
    let key = req
        .headers()
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let is_form = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    let charge = if is_form {
        match Form::<ChargeRequest>::from_request(req, &()).await {
            Ok(Form(c)) => c,
            Err(e) => return e.into_response(),
        }
    } else {
        match Json::<ChargeRequest>::from_request(req, &()).await {
            Ok(Json(c)) => c,
            Err(e) => return e.into_response(),
        }
    };
    if let Some(ms) = charge.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if charge.fail == Some(true) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": "charge failed as requested; nothing was created"})),
        )
            .into_response();
    }
    let n = app.executions.record();
    if let Some(order) = charge.order {
        app.keys_per_order
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(order)
            .or_default()
            .insert(key.unwrap_or_default());
    }
    #[cfg(test)]
    if let Some(gate) = &app.gate {
        gate.pass().await;
    }
    Json(Charge {
        id: format!("ch_{n}"),
        object: "charge",
        amount: charge.amount,
    })
    .into_response()
}

async fn stats(State(app): State<ChargeApp>) -> Json<serde_json::Value> {
    let keys = app
        .keys_per_order
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let several = keys.values().filter(|k| k.len() > 1).count();
    Json(serde_json::json!({
        "executions": app.executions().count(),
        "orders": keys.len(),
        "orders_with_several_keys": several,
    }))
}
