//! Standard Webhooks signatures (HMAC-SHA256), checked before deduplication.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use sha2::Sha256;

use crate::protocol::Problem;
use crate::server::rejection::Rejection;

type HmacSha256 = Hmac<Sha256>;

/// The tolerance the Standard Webhooks specification recommends: 5 minutes either way.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

const SECRET_PREFIX: &str = "whsec_";

/// The id header of a Standard Webhooks delivery (specification, "Webhook headers"):
/// what the signature covers first, and what the preset keys deliveries by.
pub(super) const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
/// Svix's name for [`WEBHOOK_ID`].
pub(super) const SVIX_ID: HeaderName = HeaderName::from_static("svix-id");

/// Verifies (and makes) [Standard Webhooks](https://www.standardwebhooks.com/) signatures:
/// HMAC-SHA256 over `{webhook-id}.{webhook-timestamp}.{body}`, base64-encoded, sent as
/// one or more space-separated `v1,<signature>` entries in `webhook-signature` (several
/// while the sender rotates its secret; any one that matches is enough). Svix sends the
/// same scheme under `svix-*` header names ([`StandardWebhooksVerifier::svix_headers`]).
///
/// The timestamp must be within the tolerance of now (default 5 minutes either way), so
/// a captured delivery cannot be replayed later.
///
/// **Check the signature before deduplicating.** A forged delivery that reuses a genuine
/// delivery's id must be rejected before it reaches the store: otherwise it would be
/// answered with the genuine delivery's recorded response.
///
/// ```
/// use idemkey::server::webhook::StandardWebhooksVerifier;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let verifier = StandardWebhooksVerifier::new("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
/// let body = br#"{"type":"user.created"}"#;
/// let headers = verifier.sign_headers("msg_1", 1_700_000_000, body)?;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_700_000_060);
/// verifier.verify_at(&headers, body, now)?;
/// assert!(verifier.verify_at(&headers, b"{}", now).unwrap_err().is_mismatch());
/// let later = UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 3600);
/// assert!(verifier.verify_at(&headers, body, later).unwrap_err().is_stale());
/// # Ok::<(), idemkey::server::webhook::SignatureError>(())
/// ```
#[derive(Clone)]
pub struct StandardWebhooksVerifier {
    key: Vec<u8>,
    tolerance: Duration,
    id: HeaderName,
    timestamp: HeaderName,
    signature: HeaderName,
}

impl fmt::Debug for StandardWebhooksVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardWebhooksVerifier")
            .field("key", &"<redacted>")
            .field("tolerance", &self.tolerance)
            .field("signature_header", &self.signature)
            .finish()
    }
}

impl StandardWebhooksVerifier {
    /// A verifier for a `whsec_<base64>` secret, as senders display it (the prefix is
    /// optional).
    ///
    /// # Errors
    /// [`SignatureError::is_invalid_secret`] when the part after `whsec_` is not base64
    /// or is empty.
    pub fn new(secret: &str) -> Result<Self, SignatureError> {
        let encoded = secret.trim();
        let encoded = encoded.strip_prefix(SECRET_PREFIX).unwrap_or(encoded);
        let key = BASE64
            .decode(encoded)
            .map_err(|e| SignatureError::new(Kind::InvalidSecret(e.to_string())))?;
        if key.is_empty() {
            return Err(SignatureError::new(Kind::InvalidSecret(
                "the secret is empty".into(),
            )));
        }
        Ok(Self::from_key_bytes(key))
    }

    /// A verifier for raw key bytes (the secret already decoded).
    #[must_use]
    pub fn from_key_bytes(key: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            tolerance: DEFAULT_TOLERANCE,
            id: WEBHOOK_ID,
            timestamp: HeaderName::from_static("webhook-timestamp"),
            signature: HeaderName::from_static("webhook-signature"),
        }
    }

    /// Reads Svix's header names: `svix-id`, `svix-timestamp`, `svix-signature`.
    #[must_use]
    pub fn svix_headers(mut self) -> Self {
        self.id = SVIX_ID;
        self.timestamp = HeaderName::from_static("svix-timestamp");
        self.signature = HeaderName::from_static("svix-signature");
        self
    }

    /// How far the timestamp may be from now, either way (default 5 minutes).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies a delivery against the system clock.
    ///
    /// # Errors
    /// See [`StandardWebhooksVerifier::verify_at`].
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
        self.verify_at(headers, body, SystemTime::now())
    }

    /// Verifies a delivery as of `now`.
    ///
    /// # Errors
    /// [`SignatureError`]: a signature header is missing or malformed
    /// ([`is_malformed`](SignatureError::is_malformed)), the timestamp is outside the
    /// tolerance ([`is_stale`](SignatureError::is_stale)), or no `v1` signature matches
    /// ([`is_mismatch`](SignatureError::is_mismatch)).
    pub fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        let id = text(headers, &self.id)?;
        let ts_text = text(headers, &self.timestamp)?;
        let ts: i64 = ts_text
            .parse()
            .map_err(|_| SignatureError::new(Kind::Malformed(self.timestamp.clone())))?;
        let now = unix_seconds(now);
        // i128: no overflow whatever the sender put in the header.
        let skew = (i128::from(now) - i128::from(ts)).unsigned_abs();
        if skew > u128::from(self.tolerance.as_secs()) {
            return Err(SignatureError::new(Kind::Stale {
                skew_secs: u64::try_from(skew).unwrap_or(u64::MAX),
            }));
        }
        let mac = self.mac(id, ts, body)?;
        let mut signatures = headers.get_all(&self.signature).iter().peekable();
        if signatures.peek().is_none() {
            return Err(SignatureError::new(Kind::Missing(self.signature.clone())));
        }
        for value in signatures {
            let value = value
                .to_str()
                .map_err(|_| SignatureError::new(Kind::Malformed(self.signature.clone())))?;
            for entry in value.split_ascii_whitespace() {
                let Some(("v1", encoded)) = entry.split_once(',') else {
                    continue; // other schemes (v1a: asymmetric) are not ours to check
                };
                let Ok(candidate) = BASE64.decode(encoded) else {
                    continue;
                };
                if mac.clone().verify_slice(&candidate).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(SignatureError::new(Kind::Mismatch))
    }

    /// The `v1,<base64>` signature of a delivery, as a sender makes it.
    ///
    /// # Errors
    /// Never for keys made by the constructors (HMAC takes keys of any length); the
    /// `Result` guards the HMAC crate's contract.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> Result<String, SignatureError> {
        let tag = self.mac(id, timestamp, body)?.finalize().into_bytes();
        Ok(format!("v1,{}", BASE64.encode(tag)))
    }

    /// The three headers of a signed delivery (id, timestamp, signature), as a sender
    /// sends them; for tests and for forwarding.
    ///
    /// # Errors
    /// [`SignatureError::is_malformed`] when `id` cannot be a header value.
    pub fn sign_headers(
        &self,
        id: &str,
        timestamp: i64,
        body: &[u8],
    ) -> Result<HeaderMap, SignatureError> {
        let value = |name: &HeaderName, v: String| {
            HeaderValue::try_from(v).map_err(|_| SignatureError::new(Kind::Malformed(name.clone())))
        };
        let mut headers = HeaderMap::new();
        headers.insert(self.id.clone(), value(&self.id, id.to_owned())?);
        headers.insert(
            self.timestamp.clone(),
            value(&self.timestamp, timestamp.to_string())?,
        );
        headers.insert(
            self.signature.clone(),
            value(&self.signature, self.sign(id, timestamp, body)?)?,
        );
        Ok(headers)
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Result<HmacSha256, SignatureError> {
        let mut mac = HmacSha256::new_from_slice(&self.key)
            .map_err(|e| SignatureError::new(Kind::InvalidSecret(e.to_string())))?;
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        Ok(mac)
    }
}

fn text<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<&'h str, SignatureError> {
    headers
        .get(name)
        .ok_or_else(|| SignatureError::new(Kind::Missing(name.clone())))?
        .to_str()
        .map_err(|_| SignatureError::new(Kind::Malformed(name.clone())))
}

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// A delivery whose signature does not hold, or a secret that cannot be used.
///
/// Carries its answer: [`SignatureError::status`] is `401 Unauthorized` for a delivery.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct SignatureError {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    InvalidSecret(String),
    Missing(HeaderName),
    Malformed(HeaderName),
    Stale { skew_secs: u64 },
    Mismatch,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::InvalidSecret(e) => write!(
                f,
                "the webhook secret is not `whsec_` followed by base64 ({e}); copy it again from the sender's dashboard"
            ),
            Kind::Missing(h) => write!(f, "the delivery is not signed: header `{h}` is missing"),
            Kind::Malformed(h) => write!(f, "header `{h}` is malformed"),
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

    /// `true` when the secret given to the constructor is unusable.
    #[must_use]
    pub fn is_invalid_secret(&self) -> bool {
        matches!(self.kind, Kind::InvalidSecret(_))
    }

    /// `true` when a signature header is missing or malformed.
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

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;

    fn at(secs: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    }

    #[test]
    fn matches_the_specifications_test_vector() {
        // The Standard Webhooks reference libraries' test vector.
        let v = StandardWebhooksVerifier::new(SECRET).expect("valid secret");
        assert_eq!(
            v.sign(ID, 1_649_367_553, BODY).expect("signs"),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn accepts_any_matching_v1_entry_and_skips_other_schemes() {
        let v = StandardWebhooksVerifier::new(SECRET).expect("valid secret");
        let mut h = v.sign_headers(ID, 1_649_367_553, BODY).expect("signs");
        let good = h
            .get("webhook-signature")
            .expect("set")
            .to_str()
            .expect("ascii")
            .to_owned();
        let rotated = format!("v1a,bm90IGNoZWNrZWQ= v1,Zm9yZ2Vk {good} v1,not-base64");
        h.insert("webhook-signature", rotated.parse().expect("ascii"));
        v.verify_at(&h, BODY, at(1_649_367_553))
            .expect("one entry matches");
        h.insert(
            "webhook-signature",
            "v1,Zm9yZ2Vk v2,abc".parse().expect("ascii"),
        );
        assert!(
            v.verify_at(&h, BODY, at(1_649_367_553))
                .expect_err("none matches")
                .is_mismatch()
        );
    }

    #[test]
    fn timestamp_tolerance_both_ways_and_no_overflow() {
        let v = StandardWebhooksVerifier::new(SECRET)
            .expect("valid secret")
            .tolerance(Duration::from_secs(300));
        let h = v.sign_headers(ID, 1_000_000, BODY).expect("signs");
        v.verify_at(&h, BODY, at(1_000_300)).expect("at the edge");
        v.verify_at(&h, BODY, at(999_700))
            .expect("at the other edge");
        assert!(
            v.verify_at(&h, BODY, at(1_000_301))
                .expect_err("too old")
                .is_stale()
        );
        assert!(
            v.verify_at(&h, BODY, at(999_699))
                .expect_err("from the future")
                .is_stale()
        );
        for extreme in [i64::MIN, i64::MAX] {
            let h = v.sign_headers(ID, extreme, BODY).expect("signs");
            assert!(
                v.verify_at(&h, BODY, at(1_000_000))
                    .expect_err("far away")
                    .is_stale()
            );
        }
    }

    #[test]
    fn missing_and_malformed_headers() {
        let v = StandardWebhooksVerifier::new(SECRET).expect("valid secret");
        let h = v.sign_headers(ID, 1_000_000, BODY).expect("signs");
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            let mut partial = h.clone();
            partial.remove(name);
            let e = v
                .verify_at(&partial, BODY, at(1_000_000))
                .expect_err("missing");
            assert!(e.is_malformed() && e.to_string().contains(name), "{e}");
            assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        }
        let mut bad = h.clone();
        bad.insert("webhook-timestamp", "soon".parse().expect("ascii"));
        assert!(
            v.verify_at(&bad, BODY, at(1_000_000))
                .expect_err("not a number")
                .is_malformed()
        );
    }

    #[test]
    fn svix_headers_and_secrets() {
        let v = StandardWebhooksVerifier::new("C2FVsBQIhrscChlQIMV+b5sSYspob7oD")
            .expect("the prefix is optional")
            .svix_headers();
        let h = v.sign_headers(ID, 1_000_000, BODY).expect("signs");
        assert!(h.contains_key("svix-signature"));
        v.verify_at(&h, BODY, at(1_000_000)).expect("verifies");
        assert!(
            StandardWebhooksVerifier::new("whsec_***")
                .expect_err("not base64")
                .is_invalid_secret()
        );
        assert!(
            StandardWebhooksVerifier::new("whsec_")
                .expect_err("empty")
                .is_invalid_secret()
        );
        assert!(
            !format!("{v:?}").contains("C2FV"),
            "Debug must not print the key"
        );
    }
}
