//! Header names both halves agree on, with presets for vendor variants.

use http::HeaderName;

/// `Idempotency-Key`, the IETF draft's header and the default of both halves.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `PayPal-Request-Id`, PayPal's name for the idempotency key.
pub const PAYPAL_REQUEST_ID: HeaderName = HeaderName::from_static("paypal-request-id");
/// `Cko-Idempotency-Key`, Checkout.com's name for the idempotency key.
pub const CKO_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("cko-idempotency-key");
/// `X-Idempotency-Key`, a common pre-standard variant (Adyen, many in-house APIs).
pub const X_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("x-idempotency-key");
/// `Idempotent-Replayed`, set to `true` on a response the verifier replayed from its store.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
