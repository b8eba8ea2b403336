//! Webhook receivers: process each provider event exactly once.
//!
//! Providers deliver webhooks *at least* once, and retry for hours to days when the
//! receiver does not answer 2xx in time (Stripe for up to three days). A receiver that
//! must not ship an order twice needs the verifier keyed by the provider's **event id**
//! instead of an `Idempotency-Key` header. This module says where that id is:
//!
//! - [`KeySource`]: where a delivery's id comes from: a header, a JSON field of the body
//!   (a JSON pointer, read without parsing the whole body into a tree), ordered
//!   fallbacks ([`KeySource::or`]), or several fields hashed into one key
//!   ([`KeySource::composite`]).
//! - [`ScopeSource`]: the tenant a delivery belongs to (a header, a JSON field, a
//!   constant), so that two tenants' ids never collide.
//! - [`Preset`]: both, plus the retention and its floor, for each sender: Standard
//!   Webhooks, Svix, Stripe, GitHub, Shopify, Slack, GitLab, Paddle, Square, PayPal,
//!   Mailgun, Jira and the generic IETF `Idempotency-Key`. Each preset's rustdoc names
//!   its source in the provider's documentation.
//! - [`BatchDeduper`]: for senders that put many events in one delivery (SendGrid's
//!   event arrays): keeps only the items not processed yet, and records them.
//! - [`StandardWebhooksVerifier`]: Standard Webhooks (and Svix) signatures, checked
//!   **before** deduplication so a forged delivery never reaches the store, and never
//!   receives a replay of a genuine one.
//!
//! # Setup: signature first, then deduplication
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, body::Body, extract::{Request, State}, middleware::{self, Next}};
//! use axum::{response::{IntoResponse, Response}, routing::post};
//! use idemkey::server::{Engine, Rejection};
//! use idemkey::server::webhook::{Preset, StandardWebhooksVerifier};
//! use idemkey::store::MemoryStore;
//!
//! async fn verify(State(v): State<Arc<StandardWebhooksVerifier>>, req: Request, next: Next) -> Response {
//!     let (parts, body) = req.into_parts();
//!     let Ok(bytes) = axum::body::to_bytes(body, 2 << 20).await else {
//!         return Rejection::body_too_large(2 << 20).into_response().into_response();
//!     };
//!     if let Err(e) = v.verify(&parts.headers, &bytes) {
//!         // 401 signature-rejected, as a problem response.
//!         return Rejection::from(e).into_response().into_response();
//!     }
//!     next.run(Request::from_parts(parts, Body::from(bytes))).await
//! }
//!
//! # fn main() -> Result<(), idemkey::server::webhook::SignatureError> {
//! let verifier = Arc::new(StandardWebhooksVerifier::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?);
//! let app: Router = Router::new()
//!     .route("/webhooks/standard", post(|| async { "processed" }))
//!     .layer(Preset::standard_webhooks().layer(Engine::new(MemoryStore::new())))
//!     // Added last, so it runs first: a forged delivery never reaches the store.
//!     .layer(middleware::from_fn_with_state(verifier, verify));
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! `examples/webhook_receiver.rs` does the same for Stripe (`Stripe-Signature`) and
//! GitHub (`X-Hub-Signature-256`).
//!
#![doc = include_str!("deliveries.md")]
//!
//! # Retention
//!
//! Webhook records are kept [`DEFAULT_WEBHOOK_RETENTION`] (7 days) by default, longer
//! than any preset's automatic retry window; a preset whose sender may deliver the same
//! event later carries a floor below which its retention is never set.

mod batch;
mod preset;
mod signature;

#[doc(no_inline)]
pub use crate::server::extract::{KeySource, ScopeSource};
pub use batch::{BatchDeduper, BatchError, BatchItem, BatchOutcome, DEFAULT_ITEM_LEASE};
pub use preset::{DEFAULT_WEBHOOK_RETENTION, DeliveryId, Preset};
pub use signature::{DEFAULT_TOLERANCE, SignatureError, StandardWebhooksVerifier};
