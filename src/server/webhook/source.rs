//! Key and scope sources: where a delivery's id and scope come from.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::pointer::{self, Pointer, Scalar};
use crate::key::{IdempotencyKey, InvalidKey};
use crate::server::{ExtractKey, ExtractScope, Rejection};

/// Where a delivery's id (its idempotency key) comes from.
///
/// Sources compose: [`KeySource::or`] tries fallbacks in order, [`KeySource::composite`]
/// hashes several fields into one key. Build them once, share them (cheap to clone).
///
/// How values become keys:
///
/// - A **header** value is read as an idempotency key (bare or RFC 8941 sf-string, as for
///   `Idempotency-Key`); a value that is not 1 to 255 characters of visible ASCII is
///   rejected as invalid (400, problem `invalid-key`).
/// - A **JSON field** is data: a string (unescaped) or a number (its JSON text). A value
///   that is not a valid key as is (too long, spaces, non-ASCII) is replaced by
///   `sha256:` and the hex SHA-256 of its text, so that every id the sender may use
///   still deduplicates. `null`, an empty string and an absent field count as missing;
///   an object, array or boolean is rejected as invalid.
/// - A **composite** is the hex SHA-256 over the length-prefixed values of its parts,
///   all of which must be present.
///
/// ```
/// use idemkey::server::webhook::KeySource;
/// use http::{HeaderMap, HeaderName};
///
/// let source = KeySource::header(HeaderName::from_static("webhook-id"))
///     .or(KeySource::json_pointer("/id"));
///
/// let mut headers = HeaderMap::new();
/// let key = source.extract(&headers, br#"{"id":"evt_1"}"#)?.expect("found in the body");
/// assert_eq!(key.as_str(), "evt_1");
///
/// headers.insert("webhook-id", "msg_2".parse()?);
/// let key = source.extract(&headers, br#"{"id":"evt_1"}"#)?.expect("found in the header");
/// assert_eq!(key.as_str(), "msg_2");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct KeySource(Field);

/// Where a delivery's scope comes from: records are keyed by (scope, key), so the same
/// id under two scopes (two Stripe connected accounts, two GitHub hooks) is two
/// deliveries.
///
/// A scope that is absent leaves the delivery in the source's base scope (see
/// [`Preset`](super::Preset)); scopes are used verbatim, never validated.
///
/// ```
/// use idemkey::server::webhook::ScopeSource;
/// use http::HeaderMap;
///
/// let scope = ScopeSource::json_pointer("/account").or(ScopeSource::constant("platform"));
/// let headers = HeaderMap::new();
/// assert_eq!(scope.extract(&headers, br#"{"account":"acct_1"}"#)?.as_deref(), Some("acct_1"));
/// assert_eq!(scope.extract(&headers, br#"{"id":"evt_1"}"#)?.as_deref(), Some("platform"));
/// # Ok::<(), idemkey::server::Rejection>(())
/// ```
#[derive(Clone, Debug)]
pub struct ScopeSource(Field);

#[derive(Clone, Debug)]
enum Field {
    Header(HeaderName),
    Pointer(Pointer),
    Constant(Arc<str>),
    FirstOf(Vec<Field>),
    Composite(Vec<Field>),
}

impl KeySource {
    /// The value of header `name`.
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self(Field::Header(name))
    }

    /// The value at a JSON pointer (RFC 6901) into the body, such as `/id` or
    /// `/event-data/id`. Follows [`serde_json::Value::pointer`]: a pointer that does not
    /// start with `/` matches nothing.
    ///
    /// The body is not parsed into a tree: it is validated once and only the path to
    /// the value is walked.
    #[must_use]
    pub fn json_pointer(pointer: &str) -> Self {
        Self(Field::Pointer(Pointer::new(pointer)))
    }

    /// The first of `sources` that finds a value, in order.
    #[must_use]
    pub fn first_of(sources: impl IntoIterator<Item = KeySource>) -> Self {
        Self(Field::FirstOf(sources.into_iter().map(|s| s.0).collect()))
    }

    /// This source, or `fallback` when this one finds nothing.
    #[must_use]
    pub fn or(self, fallback: KeySource) -> Self {
        Self(self.0.or(fallback.0))
    }

    /// A key hashed from several fields, for senders whose events are identified by a
    /// combination (an event type and an object id, say). Every part must be present;
    /// the key is the hex SHA-256 over the length-prefixed values, so `("ab", "c")` and
    /// `("a", "bc")` differ.
    ///
    /// ```
    /// use idemkey::server::webhook::KeySource;
    /// let source = KeySource::composite([
    ///     KeySource::json_pointer("/eventCode"),
    ///     KeySource::json_pointer("/pspReference"),
    /// ]);
    /// let headers = http::HeaderMap::new();
    /// let a = source.extract(&headers, br#"{"eventCode":"CAPTURE","pspReference":"P1"}"#)?;
    /// let b = source.extract(&headers, br#"{"pspReference":"P1","eventCode":"CAPTURE"}"#)?;
    /// assert_eq!(a, b);
    /// assert_eq!(a.expect("both present").as_str().len(), 64);
    /// assert_eq!(source.extract(&headers, br#"{"eventCode":"CAPTURE"}"#)?, None);
    /// # Ok::<(), idemkey::server::Rejection>(())
    /// ```
    #[must_use]
    pub fn composite(parts: impl IntoIterator<Item = KeySource>) -> Self {
        Self(Field::Composite(parts.into_iter().map(|s| s.0).collect()))
    }

    /// The key of a delivery, or `None` when the source finds no value.
    ///
    /// # Errors
    /// [`Rejection`] when a value is there but unusable: a header that is not a valid
    /// key, a body that is not JSON where a JSON field is needed, a JSON field that is
    /// an object, array or boolean.
    pub fn extract(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        self.extract_in(&Input::new(headers, body))
    }

    pub(crate) fn extract_in(&self, d: &Input<'_>) -> Result<Option<IdempotencyKey>, Rejection> {
        let Some(value) = self.0.value(d)? else {
            return Ok(None);
        };
        let key =
            match value {
                Value::Header(text) => IdempotencyKey::from_wire(text.as_bytes())
                    .map_err(|e| invalid_key(&self.0, &e))?,
                Value::Body(text) => IdempotencyKey::new(&*text)
                    .or_else(|_| {
                        IdempotencyKey::new(format!(
                            "sha256:{}",
                            hex::encode(Sha256::digest(text.as_bytes()))
                        ))
                    })
                    .map_err(|e| invalid_key(&self.0, &e))?,
                Value::Hashed(digest) => IdempotencyKey::new(hex::encode(digest))
                    .map_err(|e| invalid_key(&self.0, &e))?,
            };
        Ok(Some(key))
    }
}

impl ScopeSource {
    /// The value of header `name`.
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self(Field::Header(name))
    }

    /// The value at a JSON pointer into the body (see [`KeySource::json_pointer`]).
    #[must_use]
    pub fn json_pointer(pointer: &str) -> Self {
        Self(Field::Pointer(Pointer::new(pointer)))
    }

    /// Always `scope`: for a route that receives one sender's events only.
    #[must_use]
    pub fn constant(scope: impl Into<Arc<str>>) -> Self {
        Self(Field::Constant(scope.into()))
    }

    /// This source, or `fallback` when this one finds nothing.
    #[must_use]
    pub fn or(self, fallback: ScopeSource) -> Self {
        Self(self.0.or(fallback.0))
    }

    /// The scope of a delivery, or `None` when the source finds no value.
    ///
    /// # Errors
    /// [`Rejection`] when a header is not visible ASCII, or a JSON field is needed
    /// and the body is not JSON, or the field is an object, array or boolean.
    pub fn extract(&self, headers: &HeaderMap, body: &[u8]) -> Result<Option<String>, Rejection> {
        self.extract_in(&Input::new(headers, body))
    }

    pub(crate) fn extract_in(&self, d: &Input<'_>) -> Result<Option<String>, Rejection> {
        Ok(self.0.value(d)?.map(|v| match v {
            Value::Header(t) | Value::Body(t) => t.into_owned(),
            Value::Hashed(digest) => hex::encode(digest),
        }))
    }
}

impl fmt::Display for KeySource {
    /// What the source looks at: "header `webhook-id` or JSON field `/id`".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for ScopeSource {
    /// What the source looks at.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Plugs a key source into [`IdempotencyLayer::key`](crate::server::IdempotencyLayer::key).
impl ExtractKey for KeySource {
    fn extract_key(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        self.extract(&parts.headers, body)
    }

    fn describe(&self) -> Cow<'static, str> {
        Cow::Owned(format!("the delivery's {self}"))
    }
}

/// Plugs a scope source into
/// [`IdempotencyLayer::scope`](crate::server::IdempotencyLayer::scope); a delivery that
/// names no scope is unscoped (`""`).
impl ExtractScope for ScopeSource {
    fn extract_scope(&self, parts: &Parts, body: &Bytes) -> Result<String, Rejection> {
        Ok(self.extract(&parts.headers, body)?.unwrap_or_default())
    }
}

/// One delivery as the sources see it: headers and the buffered body, with the body
/// validated as JSON at most once however many JSON fields are read.
pub(crate) struct Input<'a> {
    headers: &'a HeaderMap,
    body: &'a [u8],
    doc: OnceLock<Result<&'a RawValue, String>>,
}

impl<'a> Input<'a> {
    pub(crate) fn new(headers: &'a HeaderMap, body: &'a [u8]) -> Self {
        Self {
            headers,
            body,
            doc: OnceLock::new(),
        }
    }

    fn doc(&self) -> Result<&'a RawValue, Rejection> {
        self.doc
            .get_or_init(|| pointer::parse_document(self.body).map_err(|e| e.to_string()))
            .clone()
            .map_err(|e| not_json(&e))
    }
}

enum Value<'a> {
    Header(Cow<'a, str>),
    Body(Cow<'a, str>),
    Hashed([u8; 32]),
}

impl Value<'_> {
    fn text(&self) -> Cow<'_, str> {
        match self {
            Value::Header(t) | Value::Body(t) => Cow::Borrowed(t),
            Value::Hashed(d) => Cow::Owned(hex::encode(d)),
        }
    }
}

impl Field {
    fn or(self, fallback: Field) -> Field {
        match self {
            Field::FirstOf(mut v) => {
                v.push(fallback);
                Field::FirstOf(v)
            }
            first => Field::FirstOf(vec![first, fallback]),
        }
    }

    fn value<'a>(&self, d: &Input<'a>) -> Result<Option<Value<'a>>, Rejection> {
        match self {
            Field::Header(name) => {
                let Some(v) = d.headers.get(name) else {
                    return Ok(None);
                };
                let text = v.to_str().map_err(|_| invalid_header(name))?;
                let text = text.trim();
                Ok((!text.is_empty()).then_some(Value::Header(Cow::Borrowed(text))))
            }
            Field::Pointer(p) => {
                let doc = d.doc()?;
                let Some(found) = p.find(doc) else {
                    return Ok(None);
                };
                match pointer::scalar(found) {
                    Scalar::Text(t) if t.is_empty() => Ok(None),
                    Scalar::Text(t) => Ok(Some(Value::Body(t))),
                    Scalar::Null => Ok(None),
                    Scalar::Other(kind) => Err(not_an_id(p.as_str(), kind)),
                }
            }
            Field::Constant(c) => Ok(Some(Value::Body(Cow::Owned(c.to_string())))),
            Field::FirstOf(fields) => {
                for f in fields {
                    if let Some(v) = f.value(d)? {
                        return Ok(Some(v));
                    }
                }
                Ok(None)
            }
            Field::Composite(parts) => {
                let mut h = Sha256::new();
                h.update(b"idemkey/webhook-composite/v1\0");
                for part in parts {
                    let Some(v) = part.value(d)? else {
                        return Ok(None);
                    };
                    crate::framing::field(&mut h, v.text().as_bytes());
                }
                Ok(Some(Value::Hashed(h.finalize().into())))
            }
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, fields: &[Field], sep: &str| {
            for (i, field) in fields.iter().enumerate() {
                if i > 0 {
                    f.write_str(sep)?;
                }
                write!(f, "{field}")?;
            }
            Ok(())
        };
        match self {
            Field::Header(name) => write!(f, "header `{name}`"),
            Field::Pointer(p) => write!(f, "JSON field `{}`", p.as_str()),
            Field::Constant(c) => write!(f, "constant `{c}`"),
            Field::FirstOf(fields) => list(f, fields, " or "),
            Field::Composite(fields) => {
                f.write_str("all of (")?;
                list(f, fields, ", ")?;
                f.write_str(")")
            }
        }
    }
}

fn invalid_key(source: &Field, error: &InvalidKey) -> Rejection {
    Rejection::invalid_key(format_args!(
        "the id in {source} is not a valid idempotency key: {error}"
    ))
}

fn invalid_header(name: &HeaderName) -> Rejection {
    Rejection::invalid_key(format_args!(
        "header `{name}` is not visible ASCII, so it cannot identify the delivery"
    ))
}

fn not_json(e: &str) -> Rejection {
    Rejection::invalid_key(format_args!(
        "the body is not JSON ({e}), so the delivery's id cannot be read from it"
    ))
}

fn not_an_id(pointer: &str, found: &str) -> Rejection {
    Rejection::invalid_key(format_args!(
        "JSON field `{pointer}` is an {found}, not a string or number, so it cannot identify the delivery"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("test header values are valid"));
        }
        h
    }

    fn key(source: &KeySource, h: &HeaderMap, body: &str) -> Option<String> {
        source
            .extract(h, body.as_bytes())
            .expect("extractable")
            .map(|k| k.as_str().to_owned())
    }

    #[test]
    fn header_source_reads_bare_and_sf_string_forms() {
        let s = KeySource::header(HeaderName::from_static("idempotency-key"));
        assert_eq!(
            key(&s, &headers(&[("idempotency-key", "abc")]), ""),
            Some("abc".into())
        );
        assert_eq!(
            key(&s, &headers(&[("idempotency-key", "\"abc\"")]), ""),
            Some("abc".into())
        );
        assert_eq!(key(&s, &headers(&[("idempotency-key", "  ")]), ""), None);
        assert_eq!(key(&s, &HeaderMap::new(), "not json is fine"), None);
        let bad = s
            .extract(&headers(&[("idempotency-key", "a b")]), b"")
            .expect_err("a space is not a key character");
        assert_eq!(bad.problem_type(), "invalid-key");
        assert_eq!(bad.status(), http::StatusCode::BAD_REQUEST);
        let mut h = HeaderMap::new();
        h.insert(
            "idempotency-key",
            http::HeaderValue::from_bytes(b"caf\xc3\xa9").expect("opaque bytes"),
        );
        assert!(s.extract(&h, b"").expect_err("not ASCII").is_key_error());
    }

    #[test]
    fn body_values_that_are_not_keys_are_hashed() {
        let s = KeySource::json_pointer("/id");
        let h = HeaderMap::new();
        assert_eq!(key(&s, &h, r#"{"id":"evt_1"}"#), Some("evt_1".into()));
        assert_eq!(key(&s, &h, r#"{"id":12345}"#), Some("12345".into()));
        let spaced = key(&s, &h, r#"{"id":"a b"}"#).expect("hashed");
        assert!(
            spaced.starts_with("sha256:") && spaced.len() == 71,
            "{spaced}"
        );
        let long = key(&s, &h, &format!(r#"{{"id":"{}"}}"#, "x".repeat(300))).expect("hashed");
        assert_ne!(long, spaced);
        assert_eq!(key(&s, &h, r#"{"id":null}"#), None);
        assert_eq!(key(&s, &h, r#"{"id":""}"#), None);
        assert_eq!(key(&s, &h, r#"{"other":1}"#), None);
        let e = s
            .extract(&h, br#"{"id":{"nested":1}}"#)
            .expect_err("objects are not ids");
        assert!(e.to_string().contains("`/id` is an object"), "{e}");
        let e = s
            .extract(&h, b"id=evt_1")
            .expect_err("form bodies are not JSON");
        assert!(e.to_string().contains("not JSON"), "{e}");
    }

    #[test]
    fn fallbacks_go_in_order_and_stop_at_the_first_value() {
        let s = KeySource::header(HeaderName::from_static("x-a"))
            .or(KeySource::header(HeaderName::from_static("x-b")))
            .or(KeySource::json_pointer("/id"));
        assert_eq!(
            s.to_string(),
            "header `x-a` or header `x-b` or JSON field `/id`"
        );
        assert_eq!(
            key(&s, &headers(&[("x-b", "b"), ("x-a", "a")]), ""),
            Some("a".into())
        );
        assert_eq!(
            key(&s, &headers(&[("x-b", "b")]), "not json"),
            Some("b".into())
        );
        assert_eq!(
            key(&s, &HeaderMap::new(), r#"{"id":"c"}"#),
            Some("c".into())
        );
        let same = KeySource::first_of([
            KeySource::header(HeaderName::from_static("x-a")),
            KeySource::header(HeaderName::from_static("x-b")),
        ]);
        assert_eq!(key(&same, &headers(&[("x-b", "b")]), ""), Some("b".into()));
    }

    #[test]
    fn composites_are_length_prefixed_and_need_every_part() {
        let s =
            KeySource::composite([KeySource::json_pointer("/a"), KeySource::json_pointer("/b")]);
        let h = HeaderMap::new();
        let ab_c = key(&s, &h, r#"{"a":"ab","b":"c"}"#).expect("both present");
        let a_bc = key(&s, &h, r#"{"a":"a","b":"bc"}"#).expect("both present");
        assert_ne!(ab_c, a_bc);
        assert_eq!(ab_c.len(), 64);
        assert_eq!(key(&s, &h, r#"{"b":"c","a":"ab"}"#), Some(ab_c));
        assert_eq!(key(&s, &h, r#"{"a":"ab"}"#), None);
        assert_eq!(s.to_string(), "all of (JSON field `/a`, JSON field `/b`)");
    }

    #[test]
    fn scopes() {
        let s = ScopeSource::header(HeaderName::from_static("x-shop"))
            .or(ScopeSource::constant("default"));
        let h = headers(&[("x-shop", "shop.example")]);
        assert_eq!(
            s.extract(&h, b"").expect("ok").as_deref(),
            Some("shop.example")
        );
        assert_eq!(
            s.extract(&HeaderMap::new(), b"").expect("ok").as_deref(),
            Some("default")
        );
        let p = ScopeSource::json_pointer("/account");
        assert_eq!(
            p.extract(&HeaderMap::new(), br#"{"account":"acct_1"}"#)
                .expect("ok")
                .as_deref(),
            Some("acct_1")
        );
        assert_eq!(p.extract(&HeaderMap::new(), br#"{}"#).expect("ok"), None);
    }
}
