//! The client half: idempotency keys that stay fixed across retries.
//!
//! [`ClientBuilder`] assembles a [`reqwest_middleware::ClientWithMiddleware`] that
//!
//! - gives every POST and PATCH (the method set is configurable) an `Idempotency-Key`
//!   (or a vendor's header name, see [`KeyHeader`](idemkey_core::protocol::KeyHeader)): a random UUID v4, or the key you
//!   set or derive per call with [`RequestBuilderExt`]; a key you set is never replaced;
//! - retries connect errors, timeouts, dropped connections, 408, 429, 5xx, and 409 and
//!   423 (an earlier request with the key is still running) **with the same key**, with
//!   exponential backoff and jitter, honouring the server's hints (`x-should-retry`,
//!   `Stripe-Should-Retry`, `retry-after-ms`, `Retry-After` in seconds or as an HTTP
//!   date; capped) within a per-attempt timeout ([`DEFAULT_ATTEMPT_TIMEOUT`], 80 s), an
//!   overall deadline ([`DEFAULT_DEADLINE`], 5 minutes) and a client-wide
//!   [`RetryBudget`]; 400 and 422 are never retried, and a POST or PATCH without a key is
//!   never retried;
//! - speaks the vendor's dialect ([`VendorProfile`]: Stripe, Adyen, PayPal, Square,
//!   Checkout.com, GoCardless, Stainless-style APIs, or your own): where the key goes,
//!   how long it may be, which answers mean "key reused", "already executed" or "in
//!   progress";
//! - lets concurrent calls with the same chosen key share one request
//!   ([`ClientBuilder::single_flight`]);
//! - tells you, on every response, the key, the number of attempts, and whether the
//!   server replayed a stored response ([`ResponseExt::idempotency`]);
//! - turns the cases you must handle into a typed [`Error`]: key reused with a different
//!   payload, conflict that outlasted the retries, already executed, outcome unknown
//!   (with the key, so you can retry later), never sent (every attempt failed to
//!   connect: nothing executed), retry budget exhausted, invalid key, body that cannot
//!   be replayed.
//!
//! # Quick start
//!
//! ```
//! use idemkey::client::{ClientBuilder, Error, RequestBuilderExt, ResponseExt};
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
//! let client = ClientBuilder::new(reqwest::Client::new()).build();
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
//! # Where the key lives
//!
//! The key middleware stores the key it chose in the request's [`http::Extensions`].
//! A retry middleware hands the same extensions to every attempt, so the key is reused
//! whether [`IdempotencyKeyMiddleware`] runs outside the retry loop (as
//! [`ClientBuilder`] places it) or inside `reqwest_retry::RetryTransientMiddleware` in a
//! stack of your own.
//!
//! # Errors
//!
//! Middleware errors reach you inside [`reqwest_middleware::Error::Middleware`]; get
//! this crate's [`Error`] back with [`Error::from_middleware`]. A non-success final
//! answer of a keyed request becomes an [`Error`] that keeps the response
//! ([`Error::response`]): in progress when the retries ran out ([`Error::is_conflict`]),
//! a reused key ([`Error::is_key_reused`]: the `key-reused` problem or the profile's
//! equivalent), already executed ([`Error::is_already_executed`]), 5xx/408/429 that
//! outlasted the retries ([`Error::is_outcome_unknown`]) or the retry budget
//! ([`Error::is_retry_budget_exhausted`]). Transport errors that outlasted the retries
//! are [`Error::is_outcome_unknown`] too, unless no attempt got as far as sending the
//! request ([`Error::is_never_sent`]: connection refused, unknown host). Other statuses (404, 401, a validation 422,
//! ...) come back as ordinary responses.

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

pub use builder::ClientBuilder;
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
