//! The main demo: a client and a verifier paired over loopback, with injected faults.
//!
//! ```sh
//! cargo run --example payments --features test-util
//! ```
//!
//! Starts the charge API of `examples/charge_server.rs` (`examples/common/charge_app.rs`)
//! in-process on the in-memory store, puts a fault injector between client and server
//! that loses some responses after the server processed them and resets a few
//! connections before their request reaches it, and sends a batch of charges through
//! the default client stack. Every lost response is retried with the same key and
//! answered by a replay, so each charge is created exactly once.
//!
//! It ends with the sentence to check, then the same figures for machines:
//!
//! ```text
//! 24 charges, 24 executions, none twice, despite 10 responses lost after the server had charged (on 8 charges) and 4 connection resets: ...
//! operations=24 attempts=38 executions=24 replays=8 lost_responses=10 resets=4
//! ```
//!
//! `replays` counts charges whose final answer was a replay (one per charge that lost
//! a response, however many it lost); `lost_responses` counts the responses lost
//! (charge 9 of every 12 loses two); `attempts` counts every request sent. It exits 0
//! exactly when every charge succeeded and executions equal charges.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;

use futures_util::future::join_all;
use idemkey::client::{Error, IdempotentClientBuilder, ResponseExt};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use idemkey::testing::{Fault, FaultInjector, TestServer};

#[path = "common/charge_app.rs"]
mod charge_app;
#[path = "common/telemetry.rs"]
mod telemetry;
use charge_app::ChargeApp;

const OPERATIONS: u64 = 24;

/// Deterministic faults by the order in which keys first reach the injector: of every
/// 12 charges, 4 lose their first response after the server processed it (one of them
/// loses the second too), 2 have their first connection reset before the request
/// reaches the server.
fn plan(charge: u64, key_attempt: u32) -> Fault {
    match (key_attempt, charge % 12) {
        (0, 0 | 3 | 6 | 9) => Fault::LoseResponse,
        (0, 5 | 10) => Fault::Reset,
        (1, 9) => Fault::LoseResponse,
        _ => Fault::None,
    }
}

struct Outcome {
    amount: u64,
    id: Option<String>,
    attempts: u32,
    replayed: bool,
    error: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    telemetry::init_tracing();
    let app = ChargeApp::new();
    let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()));
    let server = match TestServer::start(app.router(layer)).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot start the charge server on 127.0.0.1: {e}");
            return ExitCode::FAILURE;
        }
    };
    let faults = FaultInjector::new(|shot| plan(shot.key_index, shot.key_attempt));
    let client = IdempotentClientBuilder::new(reqwest::Client::new())
        .with_inner(faults.clone())
        .build();
    let url = server.url("/v1/charges");

    println!("charging {OPERATIONS} payments through {url} with injected faults...");
    let runs = (0..OPERATIONS).map(|i| {
        let (client, url) = (&client, &url);
        async move {
            let amount = 1000 + i;
            let sent = client
                .post(url)
                .header("authorization", "Bearer demo-merchant")
                .header("content-type", "application/json")
                .body(format!(r#"{{"amount":{amount}}}"#))
                .send()
                .await;
            match sent {
                Ok(resp) => {
                    let (attempts, replayed) = resp
                        .idempotency()
                        .map_or((1, false), |i| (i.attempts(), i.replayed()));
                    let status = resp.status();
                    let body: serde_json::Value = resp
                        .bytes()
                        .await
                        .ok()
                        .and_then(|b| serde_json::from_slice(&b).ok())
                        .unwrap_or_default();
                    Outcome {
                        amount,
                        id: body["id"].as_str().map(str::to_owned),
                        attempts,
                        replayed,
                        error: (!status.is_success()).then(|| format!("HTTP {status}")),
                    }
                }
                Err(err) => Outcome {
                    amount,
                    id: None,
                    attempts: Error::from_middleware(&err).map_or(1, Error::attempts),
                    replayed: false,
                    error: Some(
                        Error::from_middleware(&err)
                            .map_or_else(|| err.to_string(), |e| format!("{}: {e}", e.kind_str())),
                    ),
                },
            }
        }
    });
    let outcomes = join_all(runs).await;

    for o in &outcomes {
        let what = match (&o.id, &o.error) {
            (_, Some(e)) => format!("FAILED {e}"),
            (Some(id), None) => id.clone(),
            (None, None) => "no id".to_owned(),
        };
        let note = if o.replayed {
            "  (response lost, retried with the same key, replayed)"
        } else if o.attempts > 1 {
            "  (connection reset before the server saw it, retried)"
        } else {
            ""
        };
        println!(
            "  amount {:>5}  ->  {what:<8} attempts={}{note}",
            o.amount, o.attempts
        );
    }
    let stats = faults.stats();
    let operations = outcomes.len();
    let attempts: u64 = outcomes.iter().map(|o| u64::from(o.attempts)).sum();
    let executions = app.executions().count();
    let replays = outcomes.iter().filter(|o| o.replayed).count();
    let failed = outcomes.iter().filter(|o| o.error.is_some()).count();
    let (lost, resets) = (stats.lost_responses, stats.resets);
    let faults = format!(
        "{lost} responses lost after the server had charged (on {replays} charges) and \
         {resets} connection resets"
    );
    let ok = failed == 0 && executions == operations as u64;
    if ok {
        println!(
            "{operations} charges, {executions} executions, none twice, despite {faults}: \
             every retry carried its charge's key, and the server answered each retry of \
             a charge it had made with a replay instead of charging again."
        );
    } else {
        println!(
            "FAILED: {operations} charges, {executions} executions, {failed} failed, \
             with {faults}."
        );
    }
    println!(
        "operations={operations} attempts={attempts} executions={executions} \
         replays={replays} lost_responses={lost} resets={resets}"
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
