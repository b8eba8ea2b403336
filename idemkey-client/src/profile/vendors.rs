//! The vendor profiles: each the client side of the [`Dialect`] of the same name, where
//! every fact is cited from the vendor's public documentation (or, where the
//! documentation is silent, from the vendor's official SDK, or chosen, and said so).

use super::VendorProfile;
use idemkey_core::protocol::Dialect;

impl VendorProfile {
    /// The IETF draft (`draft-ietf-httpapi-idempotency-key-header`) as this crate's
    /// verifier speaks it, and the default profile: [`Dialect::standard`].
    ///
    /// A reused key is a problem document naming `key-reused` under 400, 409 or 422
    /// (this crate's `urn:idemkey:problem:key-reused`, any type URI ending in
    /// `key-reused`, idemkit 1.0's `urn:idemkit:payload-mismatch`); a 422 without such a
    /// body (a validation error) is an ordinary answer. 409 and 423 are "in progress".
    #[must_use]
    pub fn standard() -> Self {
        Self::from_dialect(&Dialect::standard())
    }

    /// Stripe (API v1): [`Dialect::stripe`]. A reused key is `idempotency_error` under
    /// 400 or 404; only `Stripe-Should-Retry` is read as a hint (Stripe's SDKs read no
    /// `Retry-After`; this client still honours one if sent); a replayed 500 stays a
    /// 500.
    #[must_use]
    pub fn stripe() -> Self {
        Self::from_dialect(&Dialect::stripe())
    }

    /// Adyen: [`Dialect::adyen`]. Keys up to 64 characters; error code 704 under 422
    /// or 409 is "in progress" and is retried although a 422 otherwise would not be;
    /// `Transient-Error` steers retries. Adyen marks no replays, so
    /// [`IdempotencyInfo::replayed`](crate::IdempotencyInfo::replayed) reads `false`
    /// on them.
    #[must_use]
    pub fn adyen() -> Self {
        Self::from_dialect(&Dialect::adyen())
    }

    /// PayPal REST APIs: [`Dialect::paypal`]. The key goes in `PayPal-Request-Id`, 1 to
    /// 108 characters; the retention is the Orders API's 6 hours (set another API's
    /// with [`with_retention`](Self::with_retention)).
    #[must_use]
    pub fn paypal() -> Self {
        Self::from_dialect(&Dialect::paypal())
    }

    /// Square: [`Dialect::square`]. The key goes in the `idempotency_key` field of the
    /// JSON request body: the client adds the field to a body that lacks it; a body
    /// that has it carries the caller's key. A request without a JSON object body fails
    /// with [`Error::is_invalid_key`](crate::Error::is_invalid_key), unsent. Keys up
    /// to 45 bytes (CreatePayment's limit; [`with_max_key_len`](Self::with_max_key_len)
    /// for other endpoints). `IDEMPOTENCY_KEY_REUSED` in any 4xx is a reused key.
    #[must_use]
    pub fn square() -> Self {
        Self::from_dialect(&Dialect::square())
    }

    /// Checkout.com: [`Dialect::checkout`]. The key goes in `Cko-Idempotency-Key`; its
    /// 409 ("currently processing") is retried, as is a 429 from before it replaced it.
    #[must_use]
    pub fn checkout() -> Self {
        Self::from_dialect(&Dialect::checkout())
    }

    /// GoCardless: [`Dialect::gocardless`]. A repeat after the first request succeeded
    /// is answered `409 idempotent_creation_conflict`: neither "in progress" nor a
    /// reused key, it fails with
    /// [`Error::is_already_executed`](crate::Error::is_already_executed), which keeps
    /// the response, whose body names the resource (the official client fetches it).
    #[must_use]
    pub fn gocardless() -> Self {
        Self::from_dialect(&Dialect::gocardless())
    }

    /// APIs whose SDKs Stainless generates and that take idempotency keys (Orb, Modern
    /// Treasury): [`Dialect::stainless`]. Orb answers a reused key with the same 409 as
    /// an in-flight duplicate, so both are retried until `conflict`; `x-should-retry`,
    /// `retry-after-ms` and `Retry-After` steer retries.
    ///
    /// OpenAI's and Anthropic's SDKs are Stainless-generated too but send no key; for
    /// them this profile only brings the hint semantics.
    #[must_use]
    pub fn stainless() -> Self {
        Self::from_dialect(&Dialect::stainless())
    }
}
