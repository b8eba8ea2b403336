//! Header names both halves agree on: the key header and its vendor variants, the two
//! spellings of the replay marker, and the retry hints servers send.

use http::{HeaderMap, HeaderName, HeaderValue};

/// `Idempotency-Key`, the IETF draft's header and the default of both halves.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `PayPal-Request-Id`, PayPal's name for the idempotency key.
pub const PAYPAL_REQUEST_ID: HeaderName = HeaderName::from_static("paypal-request-id");
/// `Cko-Idempotency-Key`, Checkout.com's name for the idempotency key.
pub const CKO_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("cko-idempotency-key");
/// `X-Idempotency-Key`, a common pre-standard variant (Adyen, many in-house APIs).
pub const X_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("x-idempotency-key");
/// `Idempotent-Replayed`, set to `true` on a response the verifier replayed from its store
/// (Stripe's spelling, and this crate's verifier's default).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// `Idempotency-Replayed`, the other spelling of the replay marker in the wild
/// (idemkit's default mode, fastapi-idempotency-key, axum-idempotent).
pub const IDEMPOTENCY_REPLAYED: HeaderName = HeaderName::from_static("idempotency-replayed");
/// `retry-after-ms`: the wait a server asks for, in milliseconds (the Stainless-generated
/// SDKs read it before `Retry-After`; see [`retry_after`](super::retry_after)).
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
/// `x-should-retry: true|false`: the server says whether a retry can help (read by the
/// Stainless-generated SDKs: OpenAI, Anthropic, Orb, Modern Treasury).
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
/// `Stripe-Should-Retry: true|false`: Stripe's spelling of the same hint (read by
/// Stripe's SDKs).
pub const STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");
/// `Transient-Error: true|false`: Adyen's and Orb's hint that an answer can (or cannot)
/// be retried with the same key.
pub const TRANSIENT_ERROR: HeaderName = HeaderName::from_static("transient-error");

/// The header a verifier marks a replayed response with: the two spellings in the wild.
/// A client recognises both ([`is_replayed`]); this crate's verifier sends the one it is
/// configured with.
///
/// ```
/// use idemkey::protocol::headers::ReplayHeader;
/// assert_eq!(ReplayHeader::default().name(), "idempotent-replayed");
/// assert_eq!(ReplayHeader::IdempotencyReplayed.name(), "idempotency-replayed");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReplayHeader {
    /// `Idempotent-Replayed: true` (Stripe, drf-idempotency, fastapi-idempotency): the
    /// default.
    #[default]
    IdempotentReplayed,
    /// `Idempotency-Replayed: true` (idemkit's default mode, fastapi-idempotency-key,
    /// axum-idempotent).
    IdempotencyReplayed,
}

impl ReplayHeader {
    /// Both spellings, the default first.
    pub const ALL: [ReplayHeader; 2] = [Self::IdempotentReplayed, Self::IdempotencyReplayed];

    /// The header name this spelling stands for.
    #[must_use]
    pub const fn name(self) -> HeaderName {
        match self {
            Self::IdempotentReplayed => IDEMPOTENT_REPLAYED,
            Self::IdempotencyReplayed => IDEMPOTENCY_REPLAYED,
        }
    }

    /// The header's value on a replayed response.
    #[must_use]
    pub const fn value() -> HeaderValue {
        HeaderValue::from_static("true")
    }
}

impl From<ReplayHeader> for HeaderName {
    fn from(header: ReplayHeader) -> Self {
        header.name()
    }
}

/// Whether `headers` mark a replayed response: either spelling of [`ReplayHeader`] with
/// the value `true` (ASCII case and surrounding whitespace ignored).
///
/// ```
/// use http::HeaderMap;
/// use idemkey::protocol::headers::is_replayed;
/// let mut h = HeaderMap::new();
/// assert!(!is_replayed(&h));
/// h.insert("idempotency-replayed", "True".parse().unwrap());
/// assert!(is_replayed(&h));
/// h.insert("idempotency-replayed", "false".parse().unwrap());
/// assert!(!is_replayed(&h));
/// ```
#[must_use]
pub fn is_replayed(headers: &HeaderMap) -> bool {
    // A scan of the few headers an answer has costs less than hashing both names.
    headers.iter().any(|(name, value)| {
        (*name == IDEMPOTENT_REPLAYED || *name == IDEMPOTENCY_REPLAYED)
            && value.as_bytes().trim_ascii().eq_ignore_ascii_case(b"true")
    })
}

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
