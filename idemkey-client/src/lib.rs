//! The client half: idempotency keys that stay fixed across retries.
//!
//! [`IdempotentClientBuilder`] assembles a [`reqwest_middleware::ClientWithMiddleware`]
//! that gives every POST and PATCH an `Idempotency-Key` (a random UUID v4, or one you set
//! or derive per call), retries transient failures **with the same key** within a
//! per-attempt timeout, a deadline and a client-wide retry budget, honours the server's
//! retry hints, speaks the vendor's dialect ([`VendorProfile`]), tells you on every
//! response whether it was replayed ([`ResponseExt::idempotency`]), and turns the cases
//! you must handle into a typed [`Error`]. With the `outbox` feature, [`outbox`] keeps
//! calls across a crash.
//!
//! # Quick start
//!
//! ```
//! use idemkey::client::{IdempotentClientBuilder, Error, RequestBuilderExt, ResponseExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A server that answers 503 to the first attempt of each key, then 200 replayed.
//! # let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
//! # let app = axum::Router::new().route("/charges", axum::routing::post(
//! #     move |headers: axum::http::HeaderMap| async move {
//! #         let key = headers["idempotency-key"].to_str().unwrap_or_default().to_owned();
//! #         if seen.lock().map(|mut s| s.insert(key)).unwrap_or(false) {
//! #             (axum::http::StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "0")], "").into_response()
//! #         } else {
//! #             ([("idempotent-replayed", "true")], "{\"id\":\"ch_1\"}").into_response()
//! #         }
//! #     }));
//! # use axum::response::IntoResponse;
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let base = format!("http://{}", listener.local_addr()?);
//! # tokio::spawn(async move { axum::serve(listener, app).await });
//! let client = IdempotentClientBuilder::new(reqwest::Client::new()).build();
//!
//! // A random key, fixed across the retry that the 503 causes.
//! let response = client.post(format!("{base}/charges")).body(r#"{"amount":100}"#).send().await?;
//! let info = response.idempotency().expect("POST requests get a key");
//! assert_eq!(info.attempts(), 2);
//! assert!(info.replayed());
//!
//! // A key derived from the operation and its payload: re-running sends the same key.
//! let charge = serde_json::json!({"order": "o-42", "amount": 100});
//! let result = client
//!     .post(format!("{base}/charges"))
//!     .derive_idempotency_key("create_charge", &charge)
//!     .body(charge.to_string())
//!     .send()
//!     .await;
//! match result {
//!     Ok(response) => println!("charged, key {}", response.idempotency().expect("keyed").key()),
//!     Err(err) => match Error::from_middleware(&err) {
//!         Some(e) if e.is_outcome_unknown() => println!("retry later with key {:?}", e.key()),
//!         Some(e) => println!("{}: {e}", e.kind_str()),
//!         None => println!("{err}"),
//!     },
//! }
//! # Ok(())
//! # }
//! ```
//!
// Without the feature the module is absent: the link then leads to its docs.rs page.
#![cfg_attr(
    not(feature = "outbox"),
    doc = "[`outbox`]: https://docs.rs/idemkey-client/latest/idemkey_client/outbox/"
)]
//!
#![doc = include_str!("guide.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod buffered;
mod builder;
mod error;
mod flight;
mod key;
mod middleware;
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub mod outbox;
mod outcome;
mod profile;
mod request;
mod response;
mod retry;
mod telemetry;

pub use builder::IdempotentClientBuilder;
// The key type, from idemkey-core: one type for both halves and the facade.
pub use error::Error;
pub use idemkey_core::{IdempotencyKey, InvalidKey};
pub use middleware::IdempotencyKeyMiddleware;
pub use profile::{AnswerMatch, KeyPlacement, VendorProfile};
pub use request::{Attempt, RequestBuilderExt};
pub use response::{IdempotencyInfo, ResponseExt};
pub use retry::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_DEADLINE, DEFAULT_RETRY_AFTER_CAP, IdempotentRetryStrategy,
    RetryBudget, RetryMiddleware, default_policy,
};
