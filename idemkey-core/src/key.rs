//! The idempotency key: generation, derivation, validation and header form.
//!
//! A key is 1 to 255 characters of visible ASCII (`0x21` to `0x7E`), as both halves of
//! this crate agree (see the crate docs). Keys come from four sources:
//!
//! | source | constructor | when to use it |
//! |---|---|---|
//! | random UUID v4 | [`IdempotencyKey::random`] | one logical call made once by this process |
//! | UUID v5 of (namespace, name) | [`IdempotencyKey::v5`] | you already have a stable name (an order id) |
//! | UUID v5 of an operation and its payload | [`IdempotencyKey::derive`] | a call that must reuse its key when re-run, even by another process |
//! | caller-supplied string | [`IdempotencyKey::new`] | the key comes from elsewhere (an upstream request, a database row) |
//!
//! The key is sent bare on the wire (`Idempotency-Key: 5f1c...`), as Stripe's SDKs do.
//! [`IdempotencyKey::from_header_value`] accepts both the bare form and the RFC 8941
//! sf-string form (`"5f1c..."`) and treats them as the same key.
//!
//! ```
//! use idemkey::IdempotencyKey;
//!
//! let a = IdempotencyKey::derive("create_charge", &serde_json::json!({"amount": 100, "currency": "eur"}))?;
//! let b = IdempotencyKey::derive("create_charge", &serde_json::json!({"currency": "eur", "amount": 100}))?;
//! assert_eq!(a, b, "field order does not change a derived key");
//!
//! let bare = IdempotencyKey::from_header_value(&http::HeaderValue::from_static("order-42"))?;
//! let quoted = IdempotencyKey::from_header_value(&http::HeaderValue::from_static("\"order-42\""))?;
//! assert_eq!(bare, quoted);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use http::HeaderValue;
use serde::Serialize;
use uuid::Uuid;

/// The longest key accepted, in bytes (equal to characters: keys are ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// The UUID namespace of keys made by [`IdempotencyKey::derive`].
///
/// Fixed forever: changing it would change every derived key, so that a re-run after an
/// upgrade would no longer be recognised as a retry.
pub const DERIVED_KEY_NAMESPACE: Uuid = Uuid::from_u128(0x6a0f_5b8e_2d1c_5e37_9a44_1f0c_8b7d_3e21);

/// A validated idempotency key.
///
/// Cheap to clone (shared storage). Compares by its exact characters: the wire forms
/// `abc` and `"abc"` both parse to the key `abc`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

impl IdempotencyKey {
    /// Validates a caller-supplied key.
    ///
    /// # Errors
    /// [`InvalidKey`] when the key is empty, longer than [`MAX_KEY_LEN`], or holds a
    /// character outside visible ASCII (`0x21` to `0x7E`; spaces are not allowed).
    ///
    /// ```
    /// use idemkey::IdempotencyKey;
    /// assert!(IdempotencyKey::new("order-42/attempt").is_ok());
    /// assert!(IdempotencyKey::new("has space").is_err());
    /// assert!(IdempotencyKey::new("").is_err());
    /// ```
    pub fn new(key: impl AsRef<str>) -> Result<Self, InvalidKey> {
        let key = key.as_ref();
        validate(key.as_bytes())?;
        Ok(Self(Arc::from(key)))
    }

    /// A fresh random UUID v4 key, in its hyphenated lower-case form.
    ///
    /// ```
    /// use idemkey::IdempotencyKey;
    /// assert_ne!(IdempotencyKey::random(), IdempotencyKey::random());
    /// assert_eq!(IdempotencyKey::random().as_str().len(), 36);
    /// ```
    #[must_use]
    pub fn random() -> Self {
        Self::from_uuid(Uuid::new_v4())
    }

    /// A UUID v5 key from a namespace and a name: the same inputs give the same key in
    /// every process, on every machine.
    ///
    /// ```
    /// use idemkey::IdempotencyKey;
    /// use uuid::Uuid;
    /// let ns = Uuid::from_u128(0x1234);
    /// assert_eq!(IdempotencyKey::v5(&ns, b"order-42"), IdempotencyKey::v5(&ns, b"order-42"));
    /// assert_ne!(IdempotencyKey::v5(&ns, b"order-42"), IdempotencyKey::v5(&ns, b"order-43"));
    /// ```
    #[must_use]
    pub fn v5(namespace: &Uuid, name: &[u8]) -> Self {
        Self::from_uuid(Uuid::new_v5(namespace, name))
    }

    /// A UUID v5 key derived from an operation name and the operation's payload, in the
    /// namespace [`DERIVED_KEY_NAMESPACE`].
    ///
    /// The payload is serialised to canonical JSON (RFC 8785: sorted keys, no
    /// insignificant whitespace, canonical numbers), so field order and formatting do
    /// not change the key. Re-running the same operation with the same payload, in any
    /// process, gives the same key; that is what makes a re-run a retry.
    ///
    /// # Errors
    /// [`InvalidKey`] when the payload cannot be serialised to JSON (a map with
    /// non-string keys, a float that is NaN or infinite).
    ///
    /// ```
    /// use idemkey::IdempotencyKey;
    /// #[derive(serde::Serialize)]
    /// struct Refund<'a> { charge: &'a str, amount: u64 }
    /// let k1 = IdempotencyKey::derive("refund", &Refund { charge: "ch_1", amount: 500 })?;
    /// let k2 = IdempotencyKey::derive("refund", &Refund { charge: "ch_1", amount: 500 })?;
    /// let k3 = IdempotencyKey::derive("refund", &Refund { charge: "ch_1", amount: 501 })?;
    /// assert_eq!(k1, k2);
    /// assert_ne!(k1, k3);
    /// # Ok::<(), idemkey::InvalidKey>(())
    /// ```
    pub fn derive<T: Serialize>(operation: &str, payload: &T) -> Result<Self, InvalidKey> {
        Self::derive_in(&DERIVED_KEY_NAMESPACE, operation, payload)
    }

    /// Like [`IdempotencyKey::derive`], in a namespace of your own (so that two
    /// applications deriving from the same operation names never share keys).
    ///
    /// # Errors
    /// As [`IdempotencyKey::derive`].
    pub fn derive_in<T: Serialize>(
        namespace: &Uuid,
        operation: &str,
        payload: &T,
    ) -> Result<Self, InvalidKey> {
        let canonical = serde_json_canonicalizer::to_vec(payload).map_err(|e| InvalidKey {
            reason: Reason::Payload(e.to_string()),
        })?;
        // The operation is framed so that ("ab", "c...") and ("a", "bc...") differ.
        let mut name = Vec::with_capacity(8 + operation.len() + canonical.len());
        crate::framing::field(&mut name, operation.as_bytes());
        name.extend_from_slice(&canonical);
        Ok(Self::v5(namespace, &name))
    }

    /// Parses a key from a header value, accepting the bare form (`abc`) and the RFC 8941
    /// sf-string form (`"abc"`), which name the same key.
    ///
    /// # Errors
    /// [`InvalidKey`] when the value is a malformed sf-string, or the key inside is not
    /// 1 to 255 characters of visible ASCII.
    pub fn from_header_value(value: &HeaderValue) -> Result<Self, InvalidKey> {
        Self::from_wire(value.as_bytes())
    }

    /// [`IdempotencyKey::from_header_value`] on raw bytes.
    ///
    /// # Errors
    /// As [`IdempotencyKey::from_header_value`].
    pub fn from_wire(bytes: &[u8]) -> Result<Self, InvalidKey> {
        let trimmed = trim_ows(bytes);
        if trimmed.first() == Some(&b'"') {
            let item: sfv::Item =
                sfv::Parser::new(trimmed)
                    .parse_item()
                    .map_err(|e| InvalidKey {
                        reason: Reason::SfString(e.to_string()),
                    })?;
            let Some(s) = item.bare_item.as_string() else {
                return Err(InvalidKey {
                    reason: Reason::SfString("not an sf-string".into()),
                });
            };
            return Self::new(s.as_str());
        }
        validate(trimmed)?;
        #[allow(clippy::expect_used)]
        let s = std::str::from_utf8(trimmed)
            .expect("validate() proved every byte visible ASCII, which is valid UTF-8");
        Ok(Self(Arc::from(s)))
    }

    /// The key's characters.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The bare header form the client sends.
    #[must_use]
    pub fn to_header_value(&self) -> HeaderValue {
        #[allow(clippy::expect_used)]
        HeaderValue::from_str(&self.0)
            .expect("a key is validated visible ASCII, and visible ASCII is a valid header value")
    }

    fn from_uuid(uuid: Uuid) -> Self {
        let mut buf = Uuid::encode_buffer();
        Self(Arc::from(&*uuid.hyphenated().encode_lower(&mut buf)))
    }
}

fn trim_ows(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

fn validate(bytes: &[u8]) -> Result<(), InvalidKey> {
    if bytes.is_empty() {
        return Err(InvalidKey {
            reason: Reason::Empty,
        });
    }
    if bytes.len() > MAX_KEY_LEN {
        return Err(InvalidKey {
            reason: Reason::TooLong(bytes.len()),
        });
    }
    if let Some(index) = bytes.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        return Err(InvalidKey {
            reason: Reason::BadChar {
                index,
                byte: bytes[index],
            },
        });
    }
    Ok(())
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&&*self.0).finish()
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for IdempotencyKey {
    type Err = InvalidKey;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = InvalidKey;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = InvalidKey;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<Uuid> for IdempotencyKey {
    fn from(uuid: Uuid) -> Self {
        Self::from_uuid(uuid)
    }
}

impl Serialize for IdempotencyKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::new(&*s).map_err(serde::de::Error::custom)
    }
}

/// A key that is not 1 to 255 characters of visible ASCII, or a payload a key cannot be
/// derived from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid idempotency key: {reason}")]
pub struct InvalidKey {
    reason: Reason,
}

#[doc(hidden)]
impl InvalidKey {
    /// A key longer than a vendor accepts (`limit` bytes).
    #[cold]
    #[inline(never)]
    pub fn over_vendor_limit(len: usize, limit: usize, vendor: &str) -> Self {
        Self {
            reason: Reason::VendorLimit {
                len,
                limit,
                vendor: vendor.to_owned(),
            },
        }
    }

    /// The key cannot be put where the vendor takes it (a JSON body field of a body that
    /// is not a JSON object, say); `why` says what to do.
    pub fn placement(why: String) -> Self {
        Self {
            reason: Reason::Placement(why),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Reason {
    #[error("the key is empty; use 1 to 255 visible ASCII characters")]
    Empty,
    #[error("the key is {0} characters long; the limit is 255")]
    TooLong(usize),
    #[error(
        "byte 0x{byte:02x} at position {index} is not visible ASCII (0x21 to 0x7E); spaces and non-ASCII characters are not allowed"
    )]
    BadChar { index: usize, byte: u8 },
    #[error("the value starts with a quote but is not a valid RFC 8941 sf-string ({0})")]
    SfString(String),
    #[error(
        "the payload cannot be serialised to canonical JSON ({0}); derive the key from a JSON-serialisable value"
    )]
    Payload(String),
    #[error(
        "the key is {len} bytes long; {vendor} accepts at most {limit}: use a shorter key (a UUID has 36)"
    )]
    VendorLimit {
        len: usize,
        limit: usize,
        vendor: String,
    },
    #[error("{0}")]
    Placement(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_full_visible_range() {
        let all: String = (0x21u8..=0x7e).map(char::from).collect();
        assert_eq!(IdempotencyKey::new(&all).map(|k| k.as_str().len()), Ok(94));
        assert!(IdempotencyKey::new("a".repeat(255)).is_ok());
    }

    #[test]
    fn rejects_bad_keys() {
        for bad in ["", " ", "a b", "é", "tab\t", "new\nline"] {
            assert!(IdempotencyKey::new(bad).is_err(), "{bad:?}");
        }
        assert!(IdempotencyKey::new("a".repeat(256)).is_err());
        assert!(IdempotencyKey::from_wire(b"\x7f").is_err());
        assert!(IdempotencyKey::from_wire(b"\xff\xfe").is_err());
    }

    #[test]
    fn wire_forms() {
        let k = IdempotencyKey::new("abc").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(IdempotencyKey::from_wire(b"abc"), Ok(k.clone()));
        assert_eq!(IdempotencyKey::from_wire(b"\"abc\""), Ok(k.clone()));
        assert_eq!(IdempotencyKey::from_wire(b" \"abc\" "), Ok(k.clone()));
        assert_eq!(
            IdempotencyKey::from_wire(br#""a\"b""#).map(|k| k.as_str().to_owned()),
            Ok("a\"b".to_owned())
        );
        assert!(IdempotencyKey::from_wire(b"\"abc").is_err());
        assert!(IdempotencyKey::from_wire(b"\"\"").is_err());
        assert!(IdempotencyKey::from_wire(b"\"a b\"").is_err());
    }

    #[test]
    fn derived_keys_are_stable() {
        // Pinned: a derived key must never change between releases.
        let k = IdempotencyKey::derive(
            "create_charge",
            &serde_json::json!({"b": 1, "a": [1.0, "x"]}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let again =
            IdempotencyKey::derive("create_charge", &serde_json::json!({"a": [1, "x"], "b": 1}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k, again);
        // SHA-1 v5 of DERIVED_KEY_NAMESPACE and u64-BE(13) ++ "create_charge" ++
        // `{"a":[1,"x"],"b":1}`, computed outside this crate.
        assert_eq!(k.as_str(), "b31bc86a-c2d0-594d-8b63-cb27194b7ed7");
        let other = IdempotencyKey::derive(
            "create_chargeX",
            &serde_json::json!({"b": 1, "a": [1.0, "x"]}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(k, other);
    }

    #[test]
    fn every_valid_key_is_its_own_header_value() {
        // The header form is built from the validated characters, never a stand-in.
        let all: String = (0x21u8..=0x7e).map(char::from).collect();
        for key in [all.as_str(), "a", &"z".repeat(255)] {
            let k = IdempotencyKey::new(key).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(k.to_header_value().as_bytes(), key.as_bytes());
            assert_eq!(
                IdempotencyKey::from_header_value(&k.to_header_value()),
                Ok(k)
            );
        }
    }

    #[test]
    fn a_non_utf8_value_is_reported_as_a_bad_byte_not_as_empty() {
        let Err(err) = IdempotencyKey::from_wire(b"ab\xc3\xa9") else {
            panic!("non-ASCII bytes are refused");
        };
        assert!(err.to_string().contains("byte 0xc3 at position 2"), "{err}");
    }

    #[test]
    fn serde_round_trip_validates() {
        let k: IdempotencyKey = serde_json::from_str("\"k-1\"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.as_str(), "k-1");
        assert!(serde_json::from_str::<IdempotencyKey>("\"a b\"").is_err());
    }
}
