//! The examples' charge app (`examples/common/charge_app.rs`, included as is) behind
//! verifiers over given stores, and a client's charge.

#[path = "../../examples/common/charge_app.rs"]
mod charge_app;

use std::net::SocketAddr;
use std::sync::Arc;

use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::Store;
use idemkey::testing::TestServer;

pub(crate) use charge_app::ChargeApp;

use super::verifier::Answer;

/// Serves `app` (`POST /v1/charges` behind a verifier of its own over `store`) on a free
/// port of 127.0.0.1. Apps spawned from clones of one [`ChargeApp`] share its count.
pub(crate) async fn spawn_app(store: Arc<dyn Store>, app: &ChargeApp) -> TestServer {
    super::serve(app.router(IdempotencyLayer::new(Engine::new(store)))).await
}

/// `POST /v1/charges` with `key` and a fixed JSON body.
pub(crate) async fn charge(client: &reqwest::Client, addr: SocketAddr, key: &str) -> Answer {
    let resp = client
        .post(format!("http://{addr}/v1/charges"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":1000,"currency":"eur"}"#)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST to the verifier at {addr}: {e}"));
    Answer::read(resp).await
}
