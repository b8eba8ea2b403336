//! Webhook receivers: process each provider event exactly once.
//!
//! Providers deliver webhooks *at least* once, and retry for hours to days when the
//! receiver does not answer 2xx in time (Stripe for up to three days). A receiver that
//! must not ship an order twice needs the verifier keyed by the provider's **event id**
//! instead of an `Idempotency-Key` header. This module says where that id is:
//!
//! - [`KeySource`](crate::extract::KeySource): where a delivery's id comes from: a header, a JSON field of the body
//!   (a JSON pointer, read without parsing the whole body into a tree), ordered
//!   fallbacks ([`KeySource::or`](crate::extract::KeySource::or)), or several fields hashed into one key
//!   ([`KeySource::composite`](crate::extract::KeySource::composite)).
//! - [`ScopeSource`](crate::extract::ScopeSource): the tenant a delivery belongs to (a header, a JSON field, a
//!   constant), so that two tenants' ids never collide.
//! - [`Preset`]: both, plus the retention and its floor, for each sender: Standard
//!   Webhooks, Svix, Stripe, GitHub, Shopify, Slack, GitLab, Paddle, Square, PayPal,
//!   Mailgun, Jira, the identity-verification senders Didit, Persona, Onfido and
//!   Sumsub, and the generic IETF `Idempotency-Key`. Each preset's rustdoc names its
//!   source in the provider's documentation.
//! - [`BatchDeduper`]: for senders that put many events in one delivery (SendGrid's
//!   event arrays, Adyen's notification items): keeps only the items not processed yet,
//!   and records them.
//! - [`VerifySignature`]: the one way a signature is checked, **before** deduplication,
//!   so that a forged delivery never reaches the store and never receives a replay of a
//!   genuine one. [`Preset::verifier`] runs it on each delivery,
//!   [`BatchDeduper::item_verifier`] on each item; the senders' schemes come with the
//!   crate: [`StandardWebhooksVerifier`] (Standard Webhooks, Svix), [`HmacVerifier`]
//!   (GitHub, Stripe, Persona, Onfido, Sumsub, or any header HMAC of the body),
//!   [`DiditVerifier`], [`AdyenHmacVerifier`].
//!
//! # Setup: signature first, then deduplication
//!
//! ```
//! use axum::{Router, routing::post};
//! use idemkey::server::Engine;
//! use idemkey::server::webhook::{DiditVerifier, Preset, StandardWebhooksVerifier};
//! use idemkey::store::MemoryStore;
//!
//! # fn main() -> Result<(), idemkey::server::webhook::SignatureError> {
//! let engine = Engine::new(MemoryStore::new());
//! let standard = Preset::standard_webhooks()
//!     .verifier(StandardWebhooksVerifier::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?);
//! let didit = Preset::didit().verifier(DiditVerifier::new("your Didit webhook secret"));
//! let app: Router = Router::new()
//!     .route("/webhooks/standard", post(|| async { "processed" }))
//!     .route_layer(standard.layer(engine.clone()))
//!     .merge(
//!         Router::new()
//!             .route("/webhooks/didit", post(|| async { "processed" }))
//!             .route_layer(didit.layer(engine)),
//!     );
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! A delivery whose signature does not hold gets `401 signature-rejected` from the
//! preset's layer before any record is claimed. Use `route_layer`, not `Router::layer`:
//! the latter also wraps the router's fallback, and every unknown path would be answered
//! by the preset's layer (`400 missing-key`) instead of `404` ([`Preset::layer`] says
//! more). `examples/webhook_receiver.rs` serves Stripe, GitHub, Standard Webhooks, Didit
//! and Adyen this way.
//!
#![doc = include_str!("deliveries.md")]
//!
#![doc = include_str!("presets.md")]
//!
//! # Retention
//!
//! Webhook records are kept [`DEFAULT_WEBHOOK_RETENTION`] (7 days) by default, longer
//! than any preset's automatic retry window; a preset whose sender may deliver the same
//! event later carries a floor below which its retention is never set.

mod batch;
mod preset;
mod signature;

pub use batch::{BatchDeduper, BatchError, BatchItem, BatchOutcome, DEFAULT_ITEM_LEASE};
pub use preset::{DEFAULT_WEBHOOK_RETENTION, DeliveryId, Preset};
pub use signature::{
    AdyenHmacVerifier, DEFAULT_TOLERANCE, DiditVerifier, HmacVerifier, SignatureError,
    StandardWebhooksVerifier, VerifySignature,
};
