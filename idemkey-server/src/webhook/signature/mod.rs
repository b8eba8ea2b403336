//! Webhook signatures, checked before deduplication: one trait ([`VerifySignature`]),
//! one error ([`SignatureError`]), and the senders' schemes.
//!
//! - [`StandardWebhooksVerifier`]: Standard Webhooks and Svix.
//! - [`HmacVerifier`]: an HMAC of the raw body in one header (GitHub, Onfido, Sumsub,
//!   or any sender that signs this way), or Stripe's timestamped `t=...,v1=...` scheme
//!   (Stripe, Persona).
//! - [`DiditVerifier`]: Didit's `X-Signature`, `X-Signature-V2` and
//!   `X-Signature-Simple`.
//! - [`AdyenHmacVerifier`]: the HMAC inside each Adyen notification item, for
//!   [`BatchDeduper::item_verifier`](super::BatchDeduper::item_verifier).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, StatusCode};
use sha2::Sha256;

use crate::rejection::Rejection;
use idemkey_core::protocol::Problem;

mod adyen;
mod didit;
mod hmac_header;
mod standard;

pub use adyen::AdyenHmacVerifier;
pub use didit::DiditVerifier;
pub use hmac_header::HmacVerifier;
pub use standard::StandardWebhooksVerifier;
pub(super) use standard::{SVIX_ID, WEBHOOK_ID};

/// How far a signed timestamp may be from now, either way, unless configured: 5
/// minutes, as the Standard Webhooks specification recommends and Stripe's and Didit's
/// own verifiers use.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

pub(super) type HmacSha256 = Hmac<Sha256>;

/// Checks that a webhook delivery comes from its sender, before anything else reads it.
///
/// The one way a signature is checked in this module. [`Preset::verifier`] runs it on
/// every delivery before the delivery's id is read, so a forged or stale delivery is
/// answered `401 signature-rejected` ([`Problem::SignatureRejected`]) **before any
/// record is claimed**: it can neither run the handler nor receive the replay of a
/// genuine delivery that reuses its id.
/// [`BatchDeduper::item_verifier`](super::BatchDeduper::item_verifier) runs it on each
/// item of a batch (Adyen signs items, not deliveries) before any item is claimed.
///
/// Every verifier of this module implements it; implement it for a sender of your own.
/// `body` is the raw request body (or the raw JSON of one batch item), exactly as
/// received: a signature is checked over bytes, never over a re-serialised value.
///
/// ```
/// use idemkey::server::webhook::{SignatureError, VerifySignature};
/// use http::HeaderMap;
/// use std::time::SystemTime;
///
/// /// A sender that puts a shared token in `X-Token` (no HMAC: an example only).
/// struct SharedToken(String);
///
/// impl VerifySignature for SharedToken {
///     fn verify_at(&self, headers: &HeaderMap, _body: &[u8], _now: SystemTime) -> Result<(), SignatureError> {
///         match headers.get("x-token") {
///             None => Err(SignatureError::missing("header `x-token`")),
///             Some(v) if v.as_bytes() == self.0.as_bytes() => Ok(()),
///             Some(_) => Err(SignatureError::mismatch()),
///         }
///     }
/// }
///
/// let check = SharedToken("s3cret".into());
/// let mut headers = HeaderMap::new();
/// assert!(check.verify(&headers, b"{}").unwrap_err().is_malformed());
/// headers.insert("x-token", "s3cret".parse()?);
/// check.verify(&headers, b"{}")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`Preset::verifier`]: super::Preset::verifier
pub trait VerifySignature: Send + Sync + 'static {
    /// Verifies a delivery (its headers and raw body) as of `now`.
    ///
    /// # Errors
    /// [`SignatureError`]: the signature is missing or malformed, the signed timestamp
    /// is outside the tolerance, or no signature matches.
    fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError>;

    /// Verifies a delivery against the system clock.
    ///
    /// # Errors
    /// See [`VerifySignature::verify_at`].
    fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
        self.verify_at(headers, body, SystemTime::now())
    }
}

/// A delivery whose signature does not hold, or a secret that cannot be used.
///
/// Carries its answer: [`SignatureError::status`] is `401 Unauthorized`, and it converts
/// into the [`Rejection`] `signature-rejected`. Verifiers of your own build it with
/// [`SignatureError::missing`], [`SignatureError::malformed`], [`SignatureError::stale`]
/// and [`SignatureError::mismatch`].
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct SignatureError {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    InvalidSecret(String),
    Missing(String),
    Malformed(String),
    Stale { skew_secs: u64 },
    Mismatch,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::InvalidSecret(e) => write!(
                f,
                "the webhook secret cannot be used ({e}); copy it again from the sender's dashboard"
            ),
            Kind::Missing(what) => write!(f, "the delivery is not signed: {what} is missing"),
            Kind::Malformed(what) => write!(f, "{what} is malformed"),
            Kind::Stale { skew_secs } => write!(
                f,
                "the delivery's timestamp is {skew_secs} s away from now, outside the tolerance; a replayed delivery, or a clock that is off"
            ),
            Kind::Mismatch => f.write_str(
                "no signature matches the delivery: it was not sent by the holder of the secret, or was changed on the way",
            ),
        }
    }
}

impl SignatureError {
    fn new(kind: Kind) -> Self {
        Self { kind }
    }

    /// A secret that cannot be used: `why` says what is wrong with it.
    #[must_use]
    pub fn invalid_secret(why: impl fmt::Display) -> Self {
        Self::new(Kind::InvalidSecret(why.to_string()))
    }

    /// The signature (or a part it needs) is absent: `what` names it ("header
    /// `x-signature`").
    #[must_use]
    pub fn missing(what: impl fmt::Display) -> Self {
        Self::new(Kind::Missing(what.to_string()))
    }

    /// The signature (or a part it needs) is there but cannot be read: `what` names it.
    #[must_use]
    pub fn malformed(what: impl fmt::Display) -> Self {
        Self::new(Kind::Malformed(what.to_string()))
    }

    /// The signed timestamp is `skew` away from now, outside the tolerance.
    #[must_use]
    pub fn stale(skew: Duration) -> Self {
        Self::new(Kind::Stale {
            skew_secs: skew.as_secs(),
        })
    }

    /// No signature matches the delivery.
    #[must_use]
    pub fn mismatch() -> Self {
        Self::new(Kind::Mismatch)
    }

    /// `true` when the secret given to the constructor is unusable.
    #[must_use]
    pub fn is_invalid_secret(&self) -> bool {
        matches!(self.kind, Kind::InvalidSecret(_))
    }

    /// `true` when a signature (or a part it needs) is missing or malformed.
    #[must_use]
    pub fn is_malformed(&self) -> bool {
        matches!(self.kind, Kind::Missing(_) | Kind::Malformed(_))
    }

    /// `true` when the timestamp is outside the tolerance.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self.kind, Kind::Stale { .. })
    }

    /// `true` when no signature matches.
    #[must_use]
    pub fn is_mismatch(&self) -> bool {
        matches!(self.kind, Kind::Mismatch)
    }

    /// The status to answer a delivery with: `401 Unauthorized`, the status of the
    /// `signature-rejected` problem this error converts into.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        Problem::SignatureRejected.default_status()
    }
}

/// The `401 signature-rejected` answer to a delivery, with this error as its detail.
impl From<SignatureError> for Rejection {
    fn from(e: SignatureError) -> Self {
        Rejection::signature_rejected(e)
    }
}

/// The text of header `name`: `Ok(None)` when absent; malformed when it is not visible
/// ASCII.
pub(super) fn header_text<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h str>, SignatureError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()))
            .map_err(|_| SignatureError::malformed(format_args!("header `{name}`"))),
    }
}

/// The text of header `name`, which must be there.
pub(super) fn required_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<&'h str, SignatureError> {
    header_text(headers, name)?
        .ok_or_else(|| SignatureError::missing(format_args!("header `{name}`")))
}

/// Checks that the signed Unix time `ts` is within `tolerance` of `now`, either way.
pub(super) fn check_fresh(
    ts: i64,
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let now = unix_seconds(now);
    // i128: no overflow whatever the sender put in the header.
    let skew = (i128::from(now) - i128::from(ts)).unsigned_abs();
    if skew > u128::from(tolerance.as_secs()) {
        return Err(SignatureError::stale(Duration::from_secs(
            u64::try_from(skew).unwrap_or(u64::MAX),
        )));
    }
    Ok(())
}

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// An HMAC-SHA256 keyed with `key` (any length).
pub(super) fn hmac_sha256(key: &[u8]) -> HmacSha256 {
    <HmacSha256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
}

/// `true` when `candidate` is the tag of `mac` (compared in constant time).
pub(super) fn matches(mac: &(impl Mac + Clone), candidate: &[u8]) -> bool {
    mac.clone().verify_slice(candidate).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_and_answer_401() {
        let e = SignatureError::missing("header `x-signature`");
        assert!(
            e.is_malformed() && e.to_string().contains("`x-signature`"),
            "{e}"
        );
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        let r = Rejection::from(SignatureError::mismatch());
        assert_eq!(r.problem(), Problem::SignatureRejected);
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
}
