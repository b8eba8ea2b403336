//! A library author wrapping a vendor's payments API with idemkey.
//!
//! `AcmePay` is a small typed client. Each method derives its idempotency key from its
//! own arguments, so a call that is retried, or re-run after a crash by another
//! process, sends the same key and the vendor answers with the stored result instead
//! of charging twice. Callers of the SDK never see keys unless they want to.
//!
//! ```sh
//! cargo run --example vendor_sdk
//! ```
//!
//! The example starts a stand-in for the vendor on 127.0.0.1 that fails the first
//! attempt of every key with 503 and remembers completed keys.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// The SDK: what a vendor crate would publish.
#[path = "common/acme.rs"]
#[allow(unreachable_pub)]
mod acme;

/// A stand-in for the vendor: 503 on the first attempt of each key, then it charges
/// once per key and replays the stored charge to every later request with that key.
async fn fake_vendor() -> std::io::Result<String> {
    #[derive(Default)]
    struct Vendor {
        attempts: HashMap<String, u32>,
        charges: HashMap<String, String>,
    }
    let state = Arc::new(Mutex::new(Vendor::default()));
    let handler = move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
        let state = Arc::clone(&state);
        async move {
            use axum::http::StatusCode;
            use idemkey::protocol::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
            let key = headers
                .get(IDEMPOTENCY_KEY)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let amount = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["amount"].as_u64())
                .unwrap_or(0);
            let Ok(mut vendor) = state.lock() else {
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [(IDEMPOTENT_REPLAYED, "false")],
                    String::new(),
                );
            };
            let seen = vendor.attempts.entry(key.clone()).or_insert(0);
            *seen += 1;
            if *seen == 1 {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(IDEMPOTENT_REPLAYED, "false")],
                    String::new(),
                );
            }
            let replayed = vendor.charges.contains_key(&key);
            let n = vendor.charges.len() + 1;
            let charge = vendor
                .charges
                .entry(key)
                .or_insert_with(|| format!(r#"{{"id":"ch_{n}","amount":{amount}}}"#))
                .clone();
            let flag = if replayed { "true" } else { "false" };
            (StatusCode::OK, [(IDEMPOTENT_REPLAYED, flag)], charge)
        }
    };
    let app = axum::Router::new()
        .route("/v1/charges", axum::routing::post(handler.clone()))
        .route("/v1/refunds", axum::routing::post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let acme = acme::AcmePay::new(fake_vendor().await?);
    let mut out = std::io::stdout().lock();
    let order = acme::NewCharge {
        amount: 4200,
        currency: "eur",
        reference: "order-42",
    };

    let first = acme.create_charge(&order).await?;
    writeln!(
        out,
        "create_charge: {} ({} attempts, replayed: {})",
        first.value.id, first.attempts, first.replayed
    )?;

    // The process "crashed" before recording the charge id; the job runs again.
    let again = acme.create_charge(&order).await?;
    writeln!(
        out,
        "create_charge again: {} (replayed: {})",
        again.value.id, again.replayed
    )?;
    assert_eq!(first.value.id, again.value.id, "charged once");

    let refund = acme.refund(&first.value.id, 1000, "damaged").await?;
    writeln!(
        out,
        "refund: {} of {} ({} attempts)",
        refund.value.id, refund.value.amount, refund.attempts
    )?;
    Ok(())
}
