//! Standard Webhooks signatures (HMAC-SHA256), checked before deduplication.

use std::fmt;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::Mac;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{
    DEFAULT_TOLERANCE, HmacSha256, SignatureError, VerifySignature, check_fresh, hmac_sha256,
    matches, required_header,
};

const SECRET_PREFIX: &str = "whsec_";

/// The id header of a Standard Webhooks delivery (specification, "Webhook headers"):
/// what the signature covers first, and what the preset keys deliveries by.
pub(in crate::webhook) const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
/// Svix's name for [`WEBHOOK_ID`].
pub(in crate::webhook) const SVIX_ID: HeaderName = HeaderName::from_static("svix-id");

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
        let key = BASE64.decode(encoded).map_err(|e| {
            SignatureError::invalid_secret(format_args!("not `whsec_` followed by base64: {e}"))
        })?;
        if key.is_empty() {
            return Err(SignatureError::invalid_secret("the secret is empty"));
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

    /// How far the timestamp may be from now, either way (default
    /// [`DEFAULT_TOLERANCE`], 5 minutes).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies a delivery against the system clock ([`VerifySignature::verify`],
    /// callable without importing the trait).
    ///
    /// # Errors
    /// See [`StandardWebhooksVerifier::verify_at`].
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
        self.verify_at(headers, body, SystemTime::now())
    }

    /// Verifies a delivery as of `now` ([`VerifySignature::verify_at`], callable
    /// without importing the trait).
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
        let id = required_header(headers, &self.id)?;
        let ts: i64 = required_header(headers, &self.timestamp)?
            .parse()
            .map_err(|_| SignatureError::malformed(format_args!("header `{}`", self.timestamp)))?;
        check_fresh(ts, now, self.tolerance)?;
        let mac = self.mac(id, ts, body);
        let mut signatures = headers.get_all(&self.signature).iter().peekable();
        if signatures.peek().is_none() {
            return Err(SignatureError::missing(format_args!(
                "header `{}`",
                self.signature
            )));
        }
        for value in signatures {
            let value = value.to_str().map_err(|_| {
                SignatureError::malformed(format_args!("header `{}`", self.signature))
            })?;
            for entry in value.split_ascii_whitespace() {
                let Some(("v1", encoded)) = entry.split_once(',') else {
                    continue; // other schemes (v1a: asymmetric) are not ours to check
                };
                let Ok(candidate) = BASE64.decode(encoded) else {
                    continue;
                };
                if matches(&mac, &candidate) {
                    return Ok(());
                }
            }
        }
        Err(SignatureError::mismatch())
    }

    /// The `v1,<base64>` signature of a delivery, as a sender makes it.
    ///
    /// # Errors
    /// Never: HMAC takes keys of any length. The `Result` is kept so that signing
    /// code does not change if a fallible key type is added.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> Result<String, SignatureError> {
        let tag = self.mac(id, timestamp, body).finalize().into_bytes();
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
            HeaderValue::try_from(v)
                .map_err(|_| SignatureError::malformed(format_args!("header `{name}`")))
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

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        let mut mac = hmac_sha256(&self.key);
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// The one way to check a signature: what [`Preset::verifier`](crate::webhook::Preset::verifier) runs.
impl VerifySignature for StandardWebhooksVerifier {
    fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        StandardWebhooksVerifier::verify_at(self, headers, body, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use std::time::UNIX_EPOCH;

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
