//! Didit's webhook signatures: `X-Signature`, `X-Signature-V2`, `X-Signature-Simple`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hmac::Mac;
use http::{HeaderMap, HeaderName};
use serde_json::value::RawValue;

use super::{
    DEFAULT_TOLERANCE, SignatureError, VerifySignature, check_fresh, header_text, hmac_sha256,
    matches,
};
use crate::json_pointer::{self as pointer, Pointer};

const X_SIGNATURE: HeaderName = HeaderName::from_static("x-signature");
const X_SIGNATURE_V2: HeaderName = HeaderName::from_static("x-signature-v2");
const X_SIGNATURE_SIMPLE: HeaderName = HeaderName::from_static("x-signature-simple");
const X_TIMESTAMP: HeaderName = HeaderName::from_static("x-timestamp");

/// The deepest JSON nesting the `X-Signature-V2` canonical form is rebuilt for (the
/// JSON parser's own limit).
const MAX_DEPTH: usize = 128;

/// Verifies [Didit](https://didit.me)'s webhook signatures, keyed with the
/// destination's "Webhook Secret Key" (its UTF-8 bytes).
///
/// Didit sends three HMAC-SHA256 signatures, lowercase hex, with every delivery (Didit
/// docs, "Webhooks", "Signature Verification Methods", docs.didit.me/integration/webhooks):
///
/// | header | signed bytes | checked |
/// |---|---|---|
/// | `X-Signature` | the raw body | yes |
/// | `X-Signature-V2` | the body re-encoded canonically: keys sorted, no whitespace, non-ASCII characters and `/` unescaped, whole floats written as integers | yes |
/// | `X-Signature-Simple` | `{timestamp}:{session_id}:{status}:{webhook_type}` from the body | only with [`DiditVerifier::accept_simple`] |
///
/// A delivery passes when one checked signature matches. The recipes are Didit's
/// server-side code as carried verbatim by Didit's own WordPress plugin
/// (didit-protocol/plugin-wordpress, `tests/generate-fixtures.py`: "copied verbatim
/// from service-didit-verification (src/sessions/utils/webhooks.py)"), whose
/// fixtures this type is tested against: V2 is `json.dumps(shorten_floats(data),
/// sort_keys=True, separators=(",", ":"), ensure_ascii=False)`, **without** a timestamp
/// prefix. (Didit's docs table calls V2 "ASCII-escaped JSON HMAC", and one of Didit's
/// agent-skill documents prefixes it with the timestamp; the plugin's fixtures, made
/// with the server's code, settle both: no escapes, no prefix.)
///
/// **Freshness.** The body's `timestamp` (Unix seconds) must be within the tolerance of
/// now (default 5 minutes, the window of Didit's plugin); it is covered by all three
/// signatures, so a replayed body cannot be freshened. Only when the body has no
/// `timestamp` is the `X-Timestamp` header used (it is covered by no signature). A
/// manual resend refreshes `timestamp`, `X-Timestamp` and the signatures
/// (docs.didit.me/management-api/sessions/resend-webhook): it passes, and is
/// deduplicated by its unchanged `event_id` (see [`Preset::didit`]).
///
/// **`X-Signature-Simple` is off by default.** It covers four envelope fields only:
/// with it, a captured delivery could be replayed within the tolerance with another
/// `decision`, `vendor_data` or `event_id`. Turn it on only behind a proxy that
/// re-encodes bodies *and* strips `X-Signature-V2`, and then trust nothing but the four
/// fields it covers.
///
/// ```
/// use idemkey::server::webhook::{DiditVerifier, VerifySignature};
/// use http::HeaderMap;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// // A fixture of Didit's WordPress plugin ("declined"), signed by Didit's server code.
/// let body = br#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","metadata":{"wp_user_id":42},"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Declined","timestamp":1774970000,"vendor_data":"wp-42","webhook_type":"status.updated","workflow_id":"22222222-3333-4444-5555-666666666666","workflow_version":4}"#;
/// let mut headers = HeaderMap::new();
/// headers.insert("x-signature-v2", "1b132d6284727cc34cb259add34355e547fe103c65475a8d6286462edf909b63".parse()?);
/// headers.insert("x-timestamp", "1774970000".parse()?);
///
/// let didit = DiditVerifier::new("wh_test_secret_9f2c4b8e1a7d");
/// let now = UNIX_EPOCH + Duration::from_secs(1_774_970_030);
/// didit.verify_at(&headers, body, now)?;
/// let an_hour_later = now + Duration::from_secs(3600);
/// assert!(didit.verify_at(&headers, body, an_hour_later).unwrap_err().is_stale());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`Preset::didit`]: crate::webhook::Preset::didit
#[derive(Clone)]
pub struct DiditVerifier {
    key: Arc<[u8]>,
    tolerance: Duration,
    simple: bool,
}

impl fmt::Debug for DiditVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiditVerifier")
            .field("key", &"<redacted>")
            .field("tolerance", &self.tolerance)
            .field("accept_simple", &self.simple)
            .finish()
    }
}

impl DiditVerifier {
    /// A verifier for the destination's "Webhook Secret Key" (Didit's Console, "API &
    /// Webhooks"; the `secret_shared_key` of a webhook destination).
    #[must_use]
    pub fn new(secret: &str) -> Self {
        Self {
            key: Arc::from(secret.trim().as_bytes()),
            tolerance: DEFAULT_TOLERANCE,
            simple: false,
        }
    }

    /// How far the delivery's `timestamp` may be from now, either way (default
    /// [`DEFAULT_TOLERANCE`](super::DEFAULT_TOLERANCE), 5 minutes).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Whether `X-Signature-Simple` alone is enough (default `false`; see the type's
    /// docs for what it leaves unsigned).
    #[must_use]
    pub fn accept_simple(mut self, accept: bool) -> Self {
        self.simple = accept;
        self
    }

    fn timestamp(
        doc: Option<&RawValue>,
        headers: &HeaderMap,
    ) -> Result<(i64, Option<String>), SignatureError> {
        let field = doc
            .and_then(|d| Pointer::new("/timestamp").find(d))
            .and_then(python_str);
        if let Some(text) = field.as_deref().filter(|t| !t.is_empty()) {
            let ts = unix_time(text).ok_or_else(|| {
                SignatureError::malformed("the body's `timestamp` field (not a Unix time)")
            })?;
            return Ok((ts, field));
        }
        let header = header_text(headers, &X_TIMESTAMP)?.ok_or_else(|| {
            SignatureError::missing("the body's `timestamp` field (and header `x-timestamp`)")
        })?;
        let ts = unix_time(header)
            .ok_or_else(|| SignatureError::malformed("header `x-timestamp` (not a Unix time)"))?;
        Ok((ts, field))
    }
}

/// A Unix time in seconds: an integer, or a number with a fraction (truncated).
fn unix_time(text: &str) -> Option<i64> {
    text.parse::<i64>().ok().or_else(|| {
        let f = text.parse::<f64>().ok()?;
        #[allow(clippy::cast_possible_truncation, reason = "checked to be in range")]
        (f.is_finite() && f.abs() < 9.0e18).then(|| f.trunc() as i64)
    })
}

fn signature(headers: &HeaderMap, name: &HeaderName) -> Result<Option<Vec<u8>>, SignatureError> {
    header_text(headers, name)?
        .filter(|s| !s.is_empty())
        .map(|s| {
            hex::decode(s)
                .map_err(|_| SignatureError::malformed(format_args!("header `{name}` (not hex)")))
        })
        .transpose()
}

/// The one way to check a signature: what
/// [`Preset::verifier`](crate::webhook::Preset::verifier) runs.
impl VerifySignature for DiditVerifier {
    fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        let doc = pointer::parse_document(body).ok();
        let (ts, ts_field) = Self::timestamp(doc, headers)?;
        check_fresh(ts, now, self.tolerance)?;

        let raw = signature(headers, &X_SIGNATURE)?;
        let v2 = signature(headers, &X_SIGNATURE_V2)?;
        let simple = if self.simple {
            signature(headers, &X_SIGNATURE_SIMPLE)?
        } else {
            None
        };
        if raw.is_none() && v2.is_none() && simple.is_none() {
            return Err(SignatureError::missing(if self.simple {
                "header `x-signature-v2`, `x-signature` or `x-signature-simple`"
            } else {
                "header `x-signature-v2` or `x-signature`"
            }));
        }
        if let Some(sig) = raw {
            let mut mac = hmac_sha256(&self.key);
            mac.update(body);
            if matches(&mac, &sig) {
                return Ok(());
            }
        }
        if let (Some(sig), Some(doc)) = (v2, doc) {
            let mut canonical = String::with_capacity(body.len());
            if canonical_v2(doc, &mut canonical, 0).is_ok() {
                let mut mac = hmac_sha256(&self.key);
                mac.update(canonical.as_bytes());
                if matches(&mac, &sig) {
                    return Ok(());
                }
            }
        }
        if let (Some(sig), Some(doc)) = (simple, doc) {
            let field = |p: &str| Pointer::new(p).find(doc).and_then(python_str);
            let fields = [
                ts_field,
                field("/session_id"),
                field("/status"),
                field("/webhook_type"),
            ];
            if fields.iter().all(Option::is_some) {
                let message = fields.map(Option::unwrap_or_default).join(":");
                let mut mac = hmac_sha256(&self.key);
                mac.update(message.as_bytes());
                if matches(&mac, &sig) {
                    return Ok(());
                }
            }
        }
        Err(SignatureError::mismatch())
    }
}

/// What Python's `str()` gives for a JSON value as `json.loads` reads it, for the
/// fields of `X-Signature-Simple`; `None` for an object or array.
fn python_str(value: &RawValue) -> Option<String> {
    let text = value.get();
    match text.as_bytes().first()? {
        b'"' => serde_json::from_str::<String>(text).ok(),
        b'n' => Some("None".into()),
        b't' => Some("True".into()),
        b'f' => Some("False".into()),
        b'-' | b'0'..=b'9' => Some(python_number(text)),
        _ => None,
    }
}

/// Writes `value` as Didit's server writes the `X-Signature-V2` message:
/// `json.dumps(shorten_floats(data), sort_keys=True, separators=(",", ":"),
/// ensure_ascii=False)`.
fn canonical_v2(value: &RawValue, out: &mut String, depth: usize) -> Result<(), ()> {
    if depth > MAX_DEPTH {
        return Err(());
    }
    let text = value.get();
    match text.as_bytes().first() {
        Some(b'{') => {
            // Python sorts `str` keys by code point, which is the byte order of UTF-8;
            // a repeated key keeps its last value, as `json.loads` does.
            let map: BTreeMap<String, &RawValue> = serde_json::from_str(text).map_err(drop)?;
            out.push('{');
            for (i, (k, v)) in map.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                python_string(&k, out);
                out.push(':');
                canonical_v2(v, out, depth + 1)?;
            }
            out.push('}');
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).map_err(drop)?;
            out.push('[');
            for (i, v) in items.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_v2(v, out, depth + 1)?;
            }
            out.push(']');
        }
        Some(b'"') => python_string(&serde_json::from_str::<String>(text).map_err(drop)?, out),
        Some(b't' | b'f' | b'n') => out.push_str(text),
        Some(b'-' | b'0'..=b'9') => out.push_str(&python_number(text)),
        _ => return Err(()),
    }
    Ok(())
}

/// A JSON string as Python's `json.dumps(..., ensure_ascii=False)` writes it: `"`, `\`
/// and control characters escaped, everything else (non-ASCII, `/`) as is.
fn python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON number as Didit's server writes it after `shorten_floats`: integers as they
/// are, whole floats as integers, other floats as Python's `repr` (shortest round trip,
/// exponent form below 1e-4: `1e-05`).
fn python_number(text: &str) -> String {
    let is_float = text.contains(['.', 'e', 'E']);
    if !is_float {
        // `-0` reads as the integer 0.
        return if text == "-0" {
            "0".into()
        } else {
            text.into()
        };
    }
    let Ok(f) = text.parse::<f64>() else {
        return text.into();
    };
    if !f.is_finite() {
        return text.into();
    }
    if f.fract() == 0.0 {
        // `int(f)`: the exact integer; `-0.0` is 0.
        return if f == 0.0 {
            "0".into()
        } else {
            format!("{f:.0}")
        };
    }
    if f.abs() >= 1e-4 {
        // Non-whole floats are below 2^53, so Python's fixed notation applies; Rust's
        // `Display` is the same shortest round trip in fixed notation.
        return format!("{f}");
    }
    // `1.5e-5` -> `1.5e-05`: Python writes at least two exponent digits.
    let sci = format!("{f:e}");
    match sci.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => sci,
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    /// Didit's WordPress plugin (didit-protocol/plugin-wordpress,
    /// `tests/fixtures/webhook-signatures.json`): bodies and the three signatures made
    /// by Didit's server-side code, secret `wh_test_secret_9f2c4b8e1a7d`.
    const SECRET: &str = "wh_test_secret_9f2c4b8e1a7d";
    const FIXTURES: &[(&str, &str, &str, &str, &str)] = &[
        (
            "unicode_names",
            r#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"decision":{"id_verifications":[{"first_name":"Jos\u00e9","last_name":"M\u00fcller-\u00dcnl\u00fc","node_id":"id_verification_1","place_of_birth":"\u5317\u4eac","status":"Approved"}],"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved"},"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved","timestamp":1774970000,"vendor_data":"wp-42","webhook_type":"status.updated","workflow_id":"22222222-3333-4444-5555-666666666666","workflow_version":4}"#,
            "b7b49a28ae4118438ef4d0f0fd603c4387cc39adf3ed451da18dc521c1d3e7eb",
            "7e416d66763a1f7e228ab0d94677f87152ad58560f0c71e8db7eb6b16faf7009",
            "d831dd64f6c1801e214d9c114fe24167baee695a879404771d3d5dbfb10fdf75",
        ),
        (
            "empty_objects",
            r#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"decision":{"reviews":[],"risk_view":{"countries":{"risk_scores":{}},"crimes":{"risk_scores":{}},"custom_list":{}},"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved"},"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","metadata":{},"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved","timestamp":1774970000,"vendor_data":"wp-42","webhook_type":"status.updated","workflow_id":"22222222-3333-4444-5555-666666666666","workflow_version":4}"#,
            "413856e88122d544ad3aeebd48d05b2aa322aba01cd057fe40038bbe4417a1ab",
            "413856e88122d544ad3aeebd48d05b2aa322aba01cd057fe40038bbe4417a1ab",
            "d831dd64f6c1801e214d9c114fe24167baee695a879404771d3d5dbfb10fdf75",
        ),
        (
            "slashes_in_urls",
            r#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"decision":{"id_verifications":[{"front_image":"https://media.didit.me/sessions/abc/front.jpg?sig=a/b+c","node_id":"id_verification_1"}],"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved"},"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved","timestamp":1774970000,"vendor_data":"wp-42","webhook_type":"status.updated","workflow_id":"22222222-3333-4444-5555-666666666666","workflow_version":4}"#,
            "f6e69e9b8df6930ca47970e31eb1d9cc499e80acd77253269bef908ac2a07dff",
            "f6e69e9b8df6930ca47970e31eb1d9cc499e80acd77253269bef908ac2a07dff",
            "d831dd64f6c1801e214d9c114fe24167baee695a879404771d3d5dbfb10fdf75",
        ),
        (
            "float_scores",
            r#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"decision":{"face_matches":[{"node_id":"face_match_1","score":96.15,"threshold":0}],"liveness_checks":[{"node_id":"liveness_1","score":95.4,"threshold":100}],"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved"},"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved","timestamp":1774970000,"vendor_data":"wp-42","webhook_type":"status.updated","workflow_id":"22222222-3333-4444-5555-666666666666","workflow_version":4}"#,
            "44bc5a7be5137ee5ea7f58ed7471724c1fbeb496ea4672c46a898172e710bbfa",
            "44bc5a7be5137ee5ea7f58ed7471724c1fbeb496ea4672c46a898172e710bbfa",
            "d831dd64f6c1801e214d9c114fe24167baee695a879404771d3d5dbfb10fdf75",
        ),
        (
            "numeric_like_keys",
            r#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","metadata":{"10":"ten","2":"two","9":"nine","wp_user_id":42},"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved","timestamp":1774970000,"vendor_data":"wp-42","webhook_type":"status.updated","workflow_id":"22222222-3333-4444-5555-666666666666","workflow_version":4}"#,
            "814093217ff957aba2147b407873f704d0b09553e2861dd870f8eb09aafcef19",
            "814093217ff957aba2147b407873f704d0b09553e2861dd870f8eb09aafcef19",
            "d831dd64f6c1801e214d9c114fe24167baee695a879404771d3d5dbfb10fdf75",
        ),
        (
            "mixed_types",
            r#"{"application_id":"11111111-2222-3333-4444-555555555555","created_at":1774969994,"decision":{"expiration_date":null,"is_sandbox":false,"nfc_available":true,"reviews":[],"session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved","warnings":[{"risk":"b"},{"risk":"a"}]},"environment":"live","event_id":"9c0c8b8a-1111-4222-9333-444444444444","session_id":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","status":"Approved","timestamp":1774970000,"vendor_data":"wp-42","webhook_type":"status.updated","workflow_id":"22222222-3333-4444-5555-666666666666","workflow_version":4}"#,
            "7684b0af2983b3bdd613999ecb443f79e0ff99a2438bd5ba53257aec7ac8f303",
            "7684b0af2983b3bdd613999ecb443f79e0ff99a2438bd5ba53257aec7ac8f303",
            "d831dd64f6c1801e214d9c114fe24167baee695a879404771d3d5dbfb10fdf75",
        ),
    ];
    const SIGNED_AT: u64 = 1_774_970_000;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(SIGNED_AT + 30)
    }

    fn only(name: &'static str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, sig.parse().expect("hex is a header value"));
        h
    }

    #[test]
    fn each_signature_of_didits_fixtures_verifies_alone() {
        let v = DiditVerifier::new(SECRET).accept_simple(true);
        for (name, body, raw, v2, simple) in FIXTURES {
            let body = body.as_bytes();
            v.verify_at(&only("x-signature", raw), body, now())
                .unwrap_or_else(|e| panic!("{name}: X-Signature: {e}"));
            v.verify_at(&only("x-signature-v2", v2), body, now())
                .unwrap_or_else(|e| panic!("{name}: X-Signature-V2: {e}"));
            v.verify_at(&only("x-signature-simple", simple), body, now())
                .unwrap_or_else(|e| panic!("{name}: X-Signature-Simple: {e}"));
            let wrong = DiditVerifier::new("wh_test_secret_wrong");
            assert!(
                wrong
                    .verify_at(&only("x-signature-v2", v2), body, now())
                    .expect_err("another secret")
                    .is_mismatch(),
                "{name}"
            );
        }
    }

    #[test]
    fn v2_survives_a_body_reencoded_on_the_way_and_raw_does_not() {
        let (_, body, raw, v2, _) = FIXTURES[0];
        // A middleware parsed and re-wrote the body: characters unescaped, keys reordered,
        // spaces added.
        let value: serde_json::Value = serde_json::from_str(body).expect("fixture is JSON");
        let reencoded = serde_json::to_string_pretty(&value).expect("serialisable");
        assert!(reencoded.contains("José") && reencoded != body);
        let v = DiditVerifier::new(SECRET);
        v.verify_at(&only("x-signature-v2", v2), reencoded.as_bytes(), now())
            .expect("V2 is over the canonical form");
        assert!(
            v.verify_at(&only("x-signature", raw), reencoded.as_bytes(), now())
                .expect_err("X-Signature is over the bytes")
                .is_mismatch()
        );
    }

    #[test]
    fn simple_is_refused_unless_accepted_and_covers_only_the_envelope() {
        let (_, body, _, _, simple) = FIXTURES[1];
        let e = DiditVerifier::new(SECRET)
            .verify_at(&only("x-signature-simple", simple), body.as_bytes(), now())
            .expect_err("off by default");
        assert!(
            e.is_malformed() && e.to_string().contains("x-signature-v2"),
            "{e}"
        );
        // What Simple leaves open: another decision under the same envelope passes.
        let forged = body.replace(r#""custom_list":{}"#, r#""custom_list":{"forged":1}"#);
        DiditVerifier::new(SECRET)
            .accept_simple(true)
            .verify_at(
                &only("x-signature-simple", simple),
                forged.as_bytes(),
                now(),
            )
            .expect("Simple does not cover the decision");
    }

    #[test]
    fn the_signed_body_timestamp_decides_freshness() {
        let (_, body, raw, _, _) = FIXTURES[0];
        let v = DiditVerifier::new(SECRET);
        let later = UNIX_EPOCH + Duration::from_secs(SIGNED_AT + 3600);
        // A replay an hour later with a freshened X-Timestamp is still stale.
        let mut h = only("x-signature", raw);
        h.insert(
            "x-timestamp",
            (SIGNED_AT + 3600).to_string().parse().expect("digits"),
        );
        assert!(
            v.verify_at(&h, body.as_bytes(), later)
                .expect_err("stale")
                .is_stale()
        );
        // Without a body timestamp, X-Timestamp is used.
        let bare = br#"{"session_id":"s","status":"Approved","webhook_type":"status.updated"}"#;
        let mut mac = hmac_sha256(SECRET.as_bytes());
        mac.update(bare);
        let sig = hex::encode(mac.finalize().into_bytes());
        let mut h = only("x-signature", &sig);
        let e = v.verify_at(&h, bare, now()).expect_err("no time at all");
        assert!(
            e.is_malformed() && e.to_string().contains("timestamp"),
            "{e}"
        );
        h.insert(
            "x-timestamp",
            SIGNED_AT.to_string().parse().expect("digits"),
        );
        v.verify_at(&h, bare, now())
            .expect("X-Timestamp as the fallback");
        assert!(v.verify_at(&h, bare, later).expect_err("stale").is_stale());
    }

    #[test]
    fn python_numbers_and_strings() {
        for (json, python) in [
            ("95.4", "95.4"),
            ("100.0", "100"),
            ("0.0", "0"),
            ("-0.0", "0"),
            ("-0", "0"),
            ("1e2", "100"),
            ("1E22", "10000000000000000000000"),
            ("0.0001", "0.0001"),
            ("0.00001", "1e-05"),
            ("-2.5e-7", "-2.5e-07"),
            ("1234567890123456.7", "1234567890123456.8"),
            ("12345678901234567890", "12345678901234567890"),
        ] {
            assert_eq!(python_number(json), python, "{json}");
        }
        let mut out = String::new();
        python_string("a\"b\\c\n\u{1}/é\u{7f}", &mut out);
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\u0001/é\u{7f}\"");
    }

    #[test]
    fn malformed_headers_and_bodies() {
        let v = DiditVerifier::new(SECRET);
        let (_, body, raw, _, _) = FIXTURES[0];
        let e = v
            .verify_at(&only("x-signature", "not hex"), body.as_bytes(), now())
            .expect_err("not hex");
        assert!(e.is_malformed(), "{e}");
        let e = v
            .verify_at(&HeaderMap::new(), body.as_bytes(), now())
            .expect_err("unsigned");
        assert!(e.is_malformed(), "{e}");
        // A body that is not JSON has no timestamp: refused, never a panic.
        let e = v
            .verify_at(&only("x-signature", raw), b"\xff not json", now())
            .expect_err("not JSON");
        assert!(e.is_malformed(), "{e}");
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let mut out = String::new();
        let doc: Result<&RawValue, _> = serde_json::from_str(&deep);
        if let Ok(doc) = doc {
            assert!(canonical_v2(doc, &mut out, 0).is_err());
        }
        assert!(!format!("{v:?}").contains(SECRET), "Debug hides the key");
    }
}
