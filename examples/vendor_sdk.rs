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

use idemkey::client::{Error, IdempotentClientBuilder, RequestBuilderExt, ResponseExt};
use reqwest_middleware::ClientWithMiddleware;
use serde::{Deserialize, Serialize};

/// The SDK: what a vendor crate would publish (hence `pub` everywhere).
#[allow(unreachable_pub)]
mod acme {
    use super::*;

    /// A charge to create.
    #[derive(Debug, Clone, Serialize)]
    pub struct NewCharge<'a> {
        /// Minor units.
        pub amount: u64,
        pub currency: &'a str,
        /// The caller's reference (an order id): the natural idempotency scope.
        pub reference: &'a str,
    }

    /// A charge as the vendor returns it.
    #[derive(Debug, Clone, Deserialize)]
    pub struct Charge {
        pub id: String,
        pub amount: u64,
    }

    /// What the SDK tells its callers.
    #[derive(Debug, thiserror::Error)]
    pub enum PaymentsError {
        /// The same reference was charged before with other arguments.
        #[error("reference already charged with different arguments (key {0})")]
        Conflict(String),
        /// No answer: call again with the same arguments, it is safe.
        #[error("outcome unknown; call again with the same arguments (key {0})")]
        Unknown(String),
        /// Anything else.
        #[error(transparent)]
        Other(#[from] reqwest_middleware::Error),
    }

    /// Whether the last call was answered from the vendor's store.
    #[derive(Debug)]
    pub struct Outcome<T> {
        pub value: T,
        pub replayed: bool,
        pub attempts: u32,
    }

    /// The typed client.
    #[derive(Clone)]
    pub struct AcmePay {
        http: ClientWithMiddleware,
        base: String,
    }

    impl AcmePay {
        pub fn new(base: impl Into<String>) -> Self {
            let http = IdempotentClientBuilder::new(reqwest::Client::new())
                .max_retries(3)
                .build();
            Self {
                http,
                base: base.into(),
            }
        }

        /// Creates a charge. The key is derived from the arguments: calling again with
        /// the same charge is a retry, never a second charge.
        pub async fn create_charge(
            &self,
            charge: &NewCharge<'_>,
        ) -> Result<Outcome<Charge>, PaymentsError> {
            self.post("/v1/charges", "acme.create_charge", charge).await
        }

        /// Refunds part of a charge; the key is derived from (charge id, amount, reason).
        pub async fn refund(
            &self,
            charge_id: &str,
            amount: u64,
            reason: &str,
        ) -> Result<Outcome<Charge>, PaymentsError> {
            let args = serde_json::json!({"charge": charge_id, "amount": amount, "reason": reason});
            self.post("/v1/refunds", "acme.refund", &args).await
        }

        async fn post<T: Serialize>(
            &self,
            path: &str,
            operation: &str,
            args: &T,
        ) -> Result<Outcome<Charge>, PaymentsError> {
            let result = self
                .http
                .post(format!("{}{path}", self.base))
                .derive_idempotency_key(operation, args)
                .json(args)
                .send()
                .await;
            let response = match result {
                Ok(response) => response,
                Err(err) => {
                    return Err(match Error::from_middleware(&err) {
                        Some(e) if e.is_key_reused() => PaymentsError::Conflict(key_of(e.key())),
                        Some(e) if e.is_outcome_unknown() || e.is_in_progress() => {
                            PaymentsError::Unknown(key_of(e.key()))
                        }
                        _ => PaymentsError::Other(err),
                    });
                }
            };
            let (replayed, attempts) = response
                .idempotency()
                .map_or((false, 1), |i| (i.replayed(), i.attempts()));
            let value = response
                .error_for_status()
                .map_err(reqwest_middleware::Error::from)?
                .json::<Charge>()
                .await
                .map_err(reqwest_middleware::Error::from)?;
            Ok(Outcome {
                value,
                replayed,
                attempts,
            })
        }
    }

    fn key_of(key: Option<&idemkey::IdempotencyKey>) -> String {
        key.map(ToString::to_string).unwrap_or_default()
    }
}

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
