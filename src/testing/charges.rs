//! A small charge API that counts its executions: the app of
//! `examples/charge_server.rs` and `examples/payments.rs`, and a ready-made handler for
//! tests.
//!
//! - `POST /v1/charges` behind the verifier (key required; scope: the `Authorization`
//!   header, unscoped when absent). Body JSON or form-encoded: `amount` (integer),
//!   optional `delay_ms` (sleeps that long first) and `fail` (answers 500 without
//!   creating a charge). Answers `200 {"id": "ch_<n>", "object": "charge", "amount": ...}`.
//! - `GET /stats`: `{"executions": n}`, the number of charges created.

use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use serde::{Deserialize, Serialize};

use super::Executions;
use crate::server::{HeaderScope, IdempotencyLayer};

/// The charge API over a verifier layer.
#[derive(Debug, Clone)]
pub struct ChargeApp {
    layer: IdempotencyLayer,
    executions: Executions,
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
}

impl ChargeApp {
    /// The app, with the scope of `layer` set to the `Authorization` header.
    #[must_use]
    pub fn new(layer: IdempotencyLayer) -> Self {
        Self {
            layer: layer.scope(HeaderScope::new(header::AUTHORIZATION)),
            executions: Executions::default(),
        }
    }

    /// Charges created so far.
    #[must_use]
    pub fn executions(&self) -> &Executions {
        &self.executions
    }

    /// The axum router: `POST /v1/charges` behind the verifier, `GET /stats`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/charges", post(create).layer(self.layer.clone()))
            .route("/stats", get(stats))
            .with_state(self.executions.clone())
    }
}

async fn create(State(executions): State<Executions>, req: Request) -> Response {
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
    let n = executions.record();
    Json(Charge {
        id: format!("ch_{n}"),
        object: "charge",
        amount: charge.amount,
    })
    .into_response()
}

async fn stats(State(executions): State<Executions>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "executions": executions.count() }))
}
