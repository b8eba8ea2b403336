//! Header names both halves agree on, with the vendor variants of the key header.

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

/// The name of the key header, as the IETF draft and the vendors spell it.
///
/// Both halves take it: the client sends its keys under it, the verifier reads them from
/// it. It converts into a [`HeaderName`], so a name of your own works wherever a
/// `KeyHeader` does.
///
/// ```
/// use idemkey::protocol::KeyHeader;
/// assert_eq!(KeyHeader::PayPal.name(), "paypal-request-id");
/// let name: http::HeaderName = KeyHeader::Standard.into();
/// assert_eq!(name, idemkey::protocol::headers::IDEMPOTENCY_KEY);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum KeyHeader {
    /// `Idempotency-Key` (IETF draft, Stripe, most APIs): the default.
    #[default]
    Standard,
    /// `PayPal-Request-Id` (PayPal).
    PayPal,
    /// `Cko-Idempotency-Key` (Checkout.com).
    Checkout,
    /// `X-Idempotency-Key` (Adyen and many in-house APIs).
    XIdempotencyKey,
}

impl KeyHeader {
    /// The header name this variant stands for.
    #[must_use]
    pub const fn name(self) -> HeaderName {
        match self {
            Self::Standard => IDEMPOTENCY_KEY,
            Self::PayPal => PAYPAL_REQUEST_ID,
            Self::Checkout => CKO_IDEMPOTENCY_KEY,
            Self::XIdempotencyKey => X_IDEMPOTENCY_KEY,
        }
    }
}

impl From<KeyHeader> for HeaderName {
    fn from(header: KeyHeader) -> Self {
        header.name()
    }
}
