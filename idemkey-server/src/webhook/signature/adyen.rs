//! The HMAC signature of each Adyen notification item.

use std::fmt;
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::Mac;
use http::HeaderMap;
use serde_json::value::RawValue;

use super::{SignatureError, VerifySignature, hmac_sha256, matches};
use crate::json_pointer::{self as pointer, Pointer, Scalar};

/// The fields of a `NotificationRequestItem` that its signature covers, in order.
const SIGNED_FIELDS: [&str; 8] = [
    "/pspReference",
    "/originalReference",
    "/merchantAccountCode",
    "/merchantReference",
    "/amount/value",
    "/amount/currency",
    "/eventCode",
    "/success",
];
const SIGNATURE_FIELD: &str = "/additionalData/hmacSignature";

/// Verifies the HMAC signature of one Adyen standard-webhook item (a
/// `NotificationRequestItem`), with the endpoint's HMAC key.
///
/// Adyen signs each item, not the delivery: the signature is in the item's
/// `additionalData.hmacSignature` (Adyen docs, "Verify HMAC signatures",
/// docs.adyen.com/development-resources/webhooks/secure-webhooks/verify-hmac-signatures:
/// "For our Standard webhooks, the signature is included in the `additionalData`
/// field"). So this verifier takes an item's raw JSON as its `body` and ignores the
/// headers; [`BatchDeduper::adyen`] runs it on every item of a delivery before any item
/// is claimed.
///
/// The signed string and encoding follow Adyen's own libraries
/// (Adyen/adyen-node-api-library `src/utils/hmacValidator.ts`, and the Python
/// library's `is_valid_hmac_notification`, which checks every item of a delivery):
/// the values of `pspReference`, `originalReference`, `merchantAccountCode`,
/// `merchantReference`, `amount.value`, `amount.currency`, `eventCode` and `success`
/// joined with `:` (an absent value is empty; values are not escaped), HMAC-SHA256
/// keyed with the hex-decoded key, base64. Tested against the libraries' vectors.
///
/// Adyen keeps signing queued events with the previous key after a new one is saved
/// ("make sure that you can still accept webhooks signed with your previous HMAC key for
/// some time", same page): add it with [`AdyenHmacVerifier::previous_key`].
///
/// ```
/// use idemkey::server::webhook::{AdyenHmacVerifier, VerifySignature};
/// use http::HeaderMap;
///
/// // The test vector of Adyen's Node library (src/__tests__/hmacValidator.spec.ts).
/// let adyen = AdyenHmacVerifier::new("DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00")?;
/// let item = br#"{"pspReference":"pspReference","originalReference":"originalReference","merchantAccountCode":"merchantAccount","merchantReference":"reference","amount":{"currency":"EUR","value":1000},"eventCode":"REPORT_AVAILABLE","eventDate":"2019-09-21T11:45:24.637Z","paymentMethod":"VISA","reason":"reason","success":"true","additionalData":{"hmacSignature":"ZNBPtI+oDyyRrLyD1XirkKnQgIAlFc07Vj27TeHsDRE="}}"#;
/// adyen.verify(&HeaderMap::new(), item)?;
/// let tampered = String::from_utf8_lossy(item).replace("1000", "100000");
/// assert!(adyen.verify(&HeaderMap::new(), tampered.as_bytes()).unwrap_err().is_mismatch());
/// # Ok::<(), idemkey::server::webhook::SignatureError>(())
/// ```
///
/// [`BatchDeduper::adyen`]: crate::webhook::BatchDeduper::adyen
#[derive(Clone)]
pub struct AdyenHmacVerifier {
    keys: Vec<Vec<u8>>,
}

impl fmt::Debug for AdyenHmacVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdyenHmacVerifier")
            .field("keys", &self.keys.len())
            .finish()
    }
}

fn decode_key(hex_key: &str) -> Result<Vec<u8>, SignatureError> {
    let key = hex::decode(hex_key.trim()).map_err(|e| {
        SignatureError::invalid_secret(format_args!(
            "an Adyen HMAC key is hexadecimal, as the Customer Area shows it: {e}"
        ))
    })?;
    if key.is_empty() {
        return Err(SignatureError::invalid_secret("the HMAC key is empty"));
    }
    Ok(key)
}

impl AdyenHmacVerifier {
    /// A verifier for the endpoint's HMAC key, in hexadecimal as Adyen's Customer Area
    /// shows it (Developers > Webhooks > the webhook > Security).
    ///
    /// # Errors
    /// [`SignatureError::is_invalid_secret`] when `hex_key` is not hexadecimal or empty.
    pub fn new(hex_key: &str) -> Result<Self, SignatureError> {
        Ok(Self::from_key_bytes(decode_key(hex_key)?))
    }

    /// A verifier for raw key bytes (the hex already decoded).
    #[must_use]
    pub fn from_key_bytes(key: impl Into<Vec<u8>>) -> Self {
        Self {
            keys: vec![key.into()],
        }
    }

    /// Also accepts items signed with `hex_key`: the key before a rotation, for the
    /// events Adyen queued before the new key was saved.
    ///
    /// # Errors
    /// [`SignatureError::is_invalid_secret`] when `hex_key` is not hexadecimal or empty.
    pub fn previous_key(mut self, hex_key: &str) -> Result<Self, SignatureError> {
        self.keys.push(decode_key(hex_key)?);
        Ok(self)
    }
}

/// The signed string of an item: its [`SIGNED_FIELDS`] joined with `:`.
fn signing_string(item: &RawValue) -> Result<String, SignatureError> {
    let mut parts = Vec::with_capacity(SIGNED_FIELDS.len());
    for field in SIGNED_FIELDS {
        let part = match Pointer::new(field).find(item) {
            None => String::new(),
            Some(v) => match (pointer::scalar(v), v.get()) {
                (Scalar::Text(t), _) => t.into_owned(),
                (Scalar::Null, _) => String::new(),
                // `success` is the string "true" or "false"; a boolean is read as its text.
                (Scalar::Other("boolean"), text) => text.to_owned(),
                (Scalar::Other(kind), _) => {
                    return Err(SignatureError::malformed(format_args!(
                        "the item's `{}` (an {kind})",
                        &field[1..]
                    )));
                }
            },
        };
        parts.push(part);
    }
    Ok(parts.join(":"))
}

/// The one way to check a signature: what
/// [`BatchDeduper::item_verifier`](crate::webhook::BatchDeduper::item_verifier)
/// runs on each item.
impl VerifySignature for AdyenHmacVerifier {
    fn verify_at(
        &self,
        _headers: &HeaderMap,
        item: &[u8],
        _now: SystemTime,
    ) -> Result<(), SignatureError> {
        let item = pointer::parse_document(item)
            .map_err(|e| SignatureError::malformed(format_args!("the item (not JSON: {e})")))?;
        let signature = match Pointer::new(SIGNATURE_FIELD)
            .find(item)
            .map(pointer::scalar)
        {
            None | Some(Scalar::Null) => {
                return Err(SignatureError::missing(
                    "the item's `additionalData.hmacSignature`",
                ));
            }
            Some(Scalar::Text(t)) => BASE64.decode(t.as_bytes()).map_err(|_| {
                SignatureError::malformed("the item's `additionalData.hmacSignature` (not base64)")
            })?,
            Some(Scalar::Other(_)) => {
                return Err(SignatureError::malformed(
                    "the item's `additionalData.hmacSignature` (not a string)",
                ));
            }
        };
        let signed = signing_string(item)?;
        let matched = self.keys.iter().any(|key| {
            let mut mac = hmac_sha256(key);
            mac.update(signed.as_bytes());
            matches(&mac, &signature)
        });
        if matched {
            Ok(())
        } else {
            Err(SignatureError::mismatch())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";

    fn item(event_code: &str, signature: Option<&str>) -> String {
        let mut v = serde_json::json!({
            "pspReference": "pspReference",
            "originalReference": "originalReference",
            "merchantAccountCode": "merchantAccount",
            "merchantReference": "reference",
            "amount": {"currency": "EUR", "value": 1000},
            "eventCode": event_code,
            "eventDate": "2019-09-21T11:45:24.637Z",
            "paymentMethod": "VISA",
            "reason": "reason",
            "success": "true",
        });
        if let Some(s) = signature {
            v["additionalData"] = serde_json::json!({ "hmacSignature": s });
        }
        v.to_string()
    }

    #[test]
    fn adyens_library_vectors() {
        // Adyen/adyen-node-api-library src/__tests__/hmacValidator.spec.ts.
        let doc = |s: &str| -> String {
            signing_string(pointer::parse_document(s.as_bytes()).expect("JSON")).expect("signs")
        };
        assert_eq!(
            doc(&item("REPORT_AVAILABLE", None)),
            "pspReference:originalReference:merchantAccount:reference:1000:EUR:REPORT_AVAILABLE:true"
        );
        let v = AdyenHmacVerifier::new(KEY).expect("hex key");
        let h = HeaderMap::new();
        for (code, sig) in [
            (
                "REPORT_AVAILABLE",
                "ZNBPtI+oDyyRrLyD1XirkKnQgIAlFc07Vj27TeHsDRE=",
            ),
            ("EVENT", "ipnxGCaUZ4l8TUW75a71/ghd2Fe5ffvX0pV4TLTntIc="),
        ] {
            v.verify(&h, item(code, Some(sig)).as_bytes()).expect(code);
        }
        let swapped = item(
            "EVENT",
            Some("ZNBPtI+oDyyRrLyD1XirkKnQgIAlFc07Vj27TeHsDRE="),
        );
        assert!(
            v.verify(&h, swapped.as_bytes())
                .expect_err("swapped")
                .is_mismatch()
        );
    }

    #[test]
    fn missing_fields_are_empty_and_a_missing_signature_is_refused() {
        let no_original = r#"{"pspReference":"p","merchantAccountCode":"m","merchantReference":"r","amount":{"currency":"EUR","value":5},"eventCode":"CAPTURE","success":"false"}"#;
        assert_eq!(
            signing_string(pointer::parse_document(no_original.as_bytes()).expect("JSON"))
                .expect("signs"),
            "p::m:r:5:EUR:CAPTURE:false"
        );
        let v = AdyenHmacVerifier::new(KEY).expect("hex key");
        let e = v
            .verify(&HeaderMap::new(), item("EVENT", None).as_bytes())
            .expect_err("unsigned");
        assert!(
            e.is_malformed() && e.to_string().contains("hmacSignature"),
            "{e}"
        );
        let e = v
            .verify(&HeaderMap::new(), item("EVENT", Some("***")).as_bytes())
            .expect_err("not base64");
        assert!(e.is_malformed(), "{e}");
        assert!(
            v.verify(&HeaderMap::new(), b"[1,2")
                .expect_err("not JSON")
                .is_malformed()
        );
    }

    #[test]
    fn keys_rotate_and_bad_keys_are_refused() {
        let old = AdyenHmacVerifier::new(KEY).expect("hex key");
        let rotated = AdyenHmacVerifier::new(
            "11223344D785FBAE710E7F943F307971BB61B21281C98C9129B3D4018A57B2EB",
        )
        .expect("hex key");
        let signed = item(
            "EVENT",
            Some("ipnxGCaUZ4l8TUW75a71/ghd2Fe5ffvX0pV4TLTntIc="),
        );
        old.verify(&HeaderMap::new(), signed.as_bytes())
            .expect("old key");
        assert!(
            rotated
                .verify(&HeaderMap::new(), signed.as_bytes())
                .is_err()
        );
        rotated
            .previous_key(KEY)
            .expect("hex key")
            .verify(&HeaderMap::new(), signed.as_bytes())
            .expect("the previous key is still accepted");
        for bad in ["not hex", ""] {
            assert!(
                AdyenHmacVerifier::new(bad)
                    .expect_err(bad)
                    .is_invalid_secret()
            );
        }
        assert!(!format!("{old:?}").contains("DFB1"), "Debug hides the key");
    }
}
