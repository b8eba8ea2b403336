//! Key and scope sources: where a delivery's id and scope come from.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::{ExtractKey, ExtractScope, header};
use crate::json_pointer::{self as pointer, Pointer, Scalar};
use crate::rejection::Rejection;
use idemkey_core::key::IdempotencyKey;

/// Where a delivery's id (its idempotency key) comes from.
///
/// Sources compose: [`KeySource::or`] tries fallbacks in order, [`KeySource::composite`]
/// hashes several fields into one key. Build them once, share them (cheap to clone).
///
/// How values become keys:
///
/// - A **header** is read by the crate's [one rule for key headers](crate#keys-and-scopes-in-headers-one-rule),
///   as [`HeaderKey`](super::HeaderKey) reads it: a key, bare or RFC 8941 sf-string; a
///   header sent twice, empty, or not 1 to 255 characters of visible ASCII is rejected
///   (400, problem `invalid-key`).
/// - A **JSON field** is data: a string (unescaped) or a number (its JSON text). A value
///   that is not a valid key as is (too long, spaces, non-ASCII) is replaced by
///   `sha256:` and the hex SHA-256 of its text, so that every id the sender may use
///   still deduplicates. `null`, an empty string and an absent field count as missing;
///   an object, array or boolean is rejected as invalid.
/// - A **composite** is `composite:` and the hex SHA-256 over the length-prefixed
///   values of its parts, all of which must be present.
///
/// **Derived keys never meet the ids senders send.** A value that itself starts with
/// `sha256:` or `composite:` (from a header or the body) is hashed as well, so an event
/// whose literal id is `sha256:<hex>` is never taken for the delivery whose unusable id
/// hashed to that string, nor for a composite: the keys a source gives are one-to-one
/// with the values it read (up to SHA-256 collisions).
///
/// ```
/// use idemkey::server::extract::KeySource;
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
/// [`Preset`](crate::webhook::Preset)). A header is read by the crate's
/// [one rule for scope headers](crate#keys-and-scopes-in-headers-one-rule), as
/// [`HeaderScope`](super::HeaderScope) reads it (sent twice or empty: 400, problem
/// `invalid-scope`; opaque bytes are a scope of their own); a JSON field as for
/// [`KeySource`] (a string or a number; `null` and `""` are missing).
///
/// ```
/// use idemkey::server::extract::ScopeSource;
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
    /// The SHA-256 of the canonical JSON (RFC 8785) at a pointer, whatever its type.
    Digest(Pointer),
    Constant(Arc<str>),
    FirstOf(Vec<Field>),
    Composite(Vec<Field>),
}

/// What a field is read for: the rules (of headers) and the problem (of bad values)
/// differ.
#[derive(Clone, Copy)]
enum Role {
    Key,
    Scope,
}

impl KeySource {
    /// The value of header `name`.
    #[must_use]
    pub fn header(name: impl Into<HeaderName>) -> Self {
        Self(Field::Header(name.into()))
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

    /// The SHA-256 of the value at a JSON pointer, of any type (an object, an array, a
    /// boolean), in its canonical form (RFC 8785: key order and whitespace do not
    /// matter). For a part of a [`KeySource::composite`] that is a whole sub-document,
    /// such as Didit's `decision` (the part is the hex digest); on its own, the key is
    /// derived as a composite's is (`composite:` and the hex digest). `null` and an
    /// absent field count as missing.
    ///
    /// ```
    /// use idemkey::server::extract::KeySource;
    /// let decision = KeySource::json_digest("/decision");
    /// let headers = http::HeaderMap::new();
    /// let a = decision.extract(&headers, br#"{"decision":{"status":"Approved","score":1}}"#)?;
    /// let b = decision.extract(&headers, br#"{"decision":{ "score":1, "status":"Approved" }}"#)?;
    /// assert_eq!(a, b);
    /// assert_eq!(decision.extract(&headers, br#"{"decision":null}"#)?, None);
    /// # Ok::<(), idemkey::server::Rejection>(())
    /// ```
    #[must_use]
    pub fn json_digest(pointer: &str) -> Self {
        Self(Field::Digest(Pointer::new(pointer)))
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
    /// the key is `composite:` and the hex SHA-256 over the length-prefixed values, so
    /// `("ab", "c")` and `("a", "bc")` differ.
    ///
    /// ```
    /// use idemkey::server::extract::KeySource;
    /// let source = KeySource::composite([
    ///     KeySource::json_pointer("/eventCode"),
    ///     KeySource::json_pointer("/pspReference"),
    /// ]);
    /// let headers = http::HeaderMap::new();
    /// let a = source.extract(&headers, br#"{"eventCode":"CAPTURE","pspReference":"P1"}"#)?;
    /// let b = source.extract(&headers, br#"{"pspReference":"P1","eventCode":"CAPTURE"}"#)?;
    /// assert_eq!(a, b);
    /// assert!(a.expect("both present").as_str().starts_with("composite:"));
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
    /// [`Rejection`] (`invalid-key`) when a value is there but unusable: a header that
    /// is not one valid key, a body that is not JSON where a JSON field is needed, a
    /// JSON field that is an object, array or boolean.
    pub fn extract(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        self.extract_in(&Input::new(headers, body))
    }

    pub(crate) fn extract_in(&self, d: &Input<'_>) -> Result<Option<IdempotencyKey>, Rejection> {
        let Some(value) = self.0.value(d, Role::Key)? else {
            return Ok(None);
        };
        let key = match value {
            Value::Key(key) if is_derived(key.as_str()) => hashed(key.as_str()),
            Value::Key(key) => key,
            Value::Text(text) => match IdempotencyKey::new(&*text) {
                Ok(key) if !is_derived(key.as_str()) => key,
                _ => hashed(&text),
            },
            Value::Hashed(digest) => derived(COMPOSITE, &digest),
        };
        Ok(Some(key))
    }
}

/// The prefix of a key hashed from a value that cannot be used as is.
const HASHED: &str = "sha256:";
/// The prefix of a key hashed from the parts of a [`KeySource::composite`].
const COMPOSITE: &str = "composite:";

/// `true` when `key` has the form of a key this module derives (hashed or composite):
/// such a value is hashed too when a sender sends it, so that derived keys and the
/// values senders send never meet.
fn is_derived(key: &str) -> bool {
    key.starts_with(HASHED) || key.starts_with(COMPOSITE)
}

/// `sha256:` and the hex SHA-256 of `text`.
fn hashed(text: &str) -> IdempotencyKey {
    derived(HASHED, &Sha256::digest(text.as_bytes()).into())
}

fn derived(prefix: &str, digest: &[u8; 32]) -> IdempotencyKey {
    IdempotencyKey::new(format!("{prefix}{}", hex::encode(digest)))
        .expect("a short ASCII prefix and 64 hex digits are a valid key")
}

impl ScopeSource {
    /// The value of header `name`.
    #[must_use]
    pub fn header(name: impl Into<HeaderName>) -> Self {
        Self(Field::Header(name.into()))
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
    /// [`Rejection`] (`invalid-scope`) when a header is sent twice or empty, or a JSON
    /// field is needed and the body is not JSON, or the field is an object, array or
    /// boolean.
    pub fn extract(&self, headers: &HeaderMap, body: &[u8]) -> Result<Option<String>, Rejection> {
        self.extract_in(&Input::new(headers, body))
    }

    pub(crate) fn extract_in(&self, d: &Input<'_>) -> Result<Option<String>, Rejection> {
        Ok(self.0.value(d, Role::Scope)?.map(|v| v.text().into_owned()))
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

/// Plugs a key source into [`IdempotencyLayer::key`](crate::IdempotencyLayer::key).
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

    fn needs_body(&self) -> bool {
        self.0.needs_body()
    }
}

/// Plugs a scope source into
/// [`IdempotencyLayer::scope`](crate::IdempotencyLayer::scope); a delivery that
/// names no scope is unscoped (`""`).
impl ExtractScope for ScopeSource {
    fn extract_scope(&self, parts: &Parts, body: &Bytes) -> Result<String, Rejection> {
        Ok(self.extract(&parts.headers, body)?.unwrap_or_default())
    }

    fn needs_body(&self) -> bool {
        self.0.needs_body()
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

    fn doc(&self) -> Result<&'a RawValue, String> {
        self.doc
            .get_or_init(|| pointer::parse_document(self.body).map_err(|e| e.to_string()))
            .clone()
    }
}

enum Value<'a> {
    /// A key header, read as a key.
    Key(IdempotencyKey),
    /// A scope header, a JSON field or a constant.
    Text(Cow<'a, str>),
    Hashed([u8; 32]),
}

impl Value<'_> {
    fn text(&self) -> Cow<'_, str> {
        match self {
            Value::Key(k) => Cow::Borrowed(k.as_str()),
            Value::Text(t) => Cow::Borrowed(t),
            Value::Hashed(d) => Cow::Owned(hex::encode(d)),
        }
    }
}

impl Role {
    fn reject(self, why: fmt::Arguments<'_>) -> Rejection {
        match self {
            Role::Key => Rejection::invalid_key(why),
            Role::Scope => Rejection::invalid_scope(why),
        }
    }

    fn reads(self) -> &'static str {
        match self {
            Role::Key => "identify",
            Role::Scope => "scope",
        }
    }
}

impl Field {
    /// `true` when reading the field may need the body (a JSON field anywhere in it).
    fn needs_body(&self) -> bool {
        match self {
            Field::Header(_) | Field::Constant(_) => false,
            Field::Pointer(_) | Field::Digest(_) => true,
            Field::FirstOf(fields) | Field::Composite(fields) => {
                fields.iter().any(Field::needs_body)
            }
        }
    }

    fn or(self, fallback: Field) -> Field {
        match self {
            Field::FirstOf(mut v) => {
                v.push(fallback);
                Field::FirstOf(v)
            }
            first => Field::FirstOf(vec![first, fallback]),
        }
    }

    fn value<'a>(&self, d: &Input<'a>, role: Role) -> Result<Option<Value<'a>>, Rejection> {
        match self {
            Field::Header(name) => match role {
                Role::Key => Ok(header::key(d.headers, name)?.map(Value::Key)),
                Role::Scope => Ok(header::scope(d.headers, name)?.map(Value::Text)),
            },
            Field::Pointer(p) => {
                let doc =
                    d.doc().map_err(|e| {
                        role.reject(format_args!(
                        "the body is not JSON ({e}), so the delivery's {} cannot be read from it",
                        if matches!(role, Role::Key) { "id" } else { "scope" }
                    ))
                    })?;
                let Some(found) = p.find(doc) else {
                    return Ok(None);
                };
                match pointer::scalar(found) {
                    Scalar::Text(t) if t.is_empty() => Ok(None),
                    Scalar::Text(t) => Ok(Some(Value::Text(t))),
                    Scalar::Null => Ok(None),
                    Scalar::Other(kind) => Err(role.reject(format_args!(
                        "JSON field `{}` is an {kind}, not a string or number, so it cannot {} the delivery",
                        p.as_str(),
                        role.reads()
                    ))),
                }
            }
            Field::Digest(p) => {
                let doc = d.doc().map_err(|e| {
                    role.reject(format_args!(
                        "the body is not JSON ({e}), so JSON field `{}` cannot be read from it",
                        p.as_str()
                    ))
                })?;
                let Some(found) = p.find(doc) else {
                    return Ok(None);
                };
                let canonical = serde_json::from_str::<serde_json::Value>(found.get())
                    .map_err(|e| e.to_string())
                    .and_then(|v| match v {
                        serde_json::Value::Null => Ok(None),
                        v => serde_json_canonicalizer::to_vec(&v)
                            .map(Some)
                            .map_err(|e| e.to_string()),
                    })
                    .map_err(|e| {
                        role.reject(format_args!(
                            "JSON field `{}` cannot be put in canonical form ({e})",
                            p.as_str()
                        ))
                    })?;
                Ok(canonical.map(|bytes| {
                    let mut h = Sha256::new();
                    h.update(b"idemkey/webhook-json-digest/v1\0");
                    h.update(&bytes);
                    Value::Hashed(h.finalize().into())
                }))
            }
            Field::Constant(c) => Ok(Some(Value::Text(Cow::Owned(c.to_string())))),
            Field::FirstOf(fields) => {
                for f in fields {
                    if let Some(v) = f.value(d, role)? {
                        return Ok(Some(v));
                    }
                }
                Ok(None)
            }
            Field::Composite(parts) => {
                let mut h = Sha256::new();
                h.update(b"idemkey/webhook-composite/v1\0");
                for part in parts {
                    let Some(v) = part.value(d, role)? else {
                        return Ok(None);
                    };
                    idemkey_core::framing::field(&mut h, v.text().as_bytes());
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
            Field::Digest(p) => write!(f, "the digest of JSON field `{}`", p.as_str()),
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
        for empty in ["", "  "] {
            let e = s
                .extract(&headers(&[("idempotency-key", empty)]), b"")
                .expect_err("an empty key header is malformed, as for the layer");
            assert_eq!(e.problem_type(), "invalid-key", "{empty:?}");
        }
        let twice = s
            .extract(
                &headers(&[("idempotency-key", "a"), ("idempotency-key", "a")]),
                b"",
            )
            .expect_err("sent twice, as for the layer");
        assert_eq!(twice.problem_type(), "invalid-key");
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

    /// An id that is not a key is hashed to `sha256:<hex>`; an event whose literal id is
    /// that very string (or looks like a composite) must not be taken for it, from the
    /// body or from a header.
    #[test]
    fn derived_keys_never_equal_a_literal_id() {
        let body = KeySource::json_pointer("/id");
        let h = HeaderMap::new();
        let spaced = key(&body, &h, r#"{"id":"a b"}"#).expect("hashed");
        let literal = key(&body, &h, &format!(r#"{{"id":"{spaced}"}}"#)).expect("a key");
        assert_ne!(
            literal, spaced,
            "a literal `sha256:` id has a key of its own"
        );
        assert!(literal.starts_with("sha256:"), "{literal}");
        assert_eq!(
            key(&body, &h, &format!(r#"{{"id":"{spaced}"}}"#)),
            Some(literal.clone()),
            "and it still deduplicates"
        );

        let composite =
            KeySource::composite([KeySource::json_pointer("/a"), KeySource::json_pointer("/b")])
                .or(KeySource::json_pointer("/id"));
        let derived = key(&composite, &h, r#"{"a":"x","b":"y"}"#).expect("composite");
        let bare_hex = derived.trim_start_matches("composite:").to_owned();
        for posing in [derived.clone(), bare_hex] {
            let got = key(&composite, &h, &format!(r#"{{"id":"{posing}"}}"#)).expect("a key");
            assert_ne!(got, derived, "{posing}");
        }

        let header = KeySource::header(HeaderName::from_static("x-id")).or(body);
        let from_header = key(&header, &headers(&[("x-id", &spaced)]), "{}").expect("a key");
        assert_ne!(from_header, spaced, "a header value is kept apart too");
        assert_eq!(
            from_header, literal,
            "and means what the same body id means"
        );
        assert_eq!(
            key(&header, &headers(&[("x-id", "evt_1")]), "{}"),
            key(&header, &h, r#"{"id":"evt_1"}"#),
            "plain ids are used as they are, wherever they come from"
        );
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
        assert!(ab_c.starts_with("composite:") && ab_c.len() == 74, "{ab_c}");
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

    /// The layer's extractors and the webhook sources are one family: every header,
    /// however malformed, gets the same answer from both.
    #[test]
    fn header_extractors_and_sources_read_headers_alike() {
        use crate::extract::{HeaderKey, HeaderScope};
        use idemkey_core::protocol::Problem;
        let name = HeaderName::from_static("x-id");
        let cases: [&[&[u8]]; 10] = [
            &[],
            &[b"k-1"],
            &[b" k-1\t"],
            &[b"\"k-1\""],
            &[b""],
            &[b"  "],
            &[b"a", b"b"],
            &[b"k", b"k"],
            &[b"a b"],
            &[b"caf\xc3\xa9"],
        ];
        let answer = |r: Result<Option<String>, Rejection>| -> Result<Option<String>, Problem> {
            r.map_err(|e| e.problem())
        };
        for values in cases {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(
                    &name,
                    http::HeaderValue::from_bytes(v).expect("valid test value"),
                );
            }
            let (parts, ()) = {
                let mut req = http::Request::new(());
                *req.headers_mut() = h.clone();
                req.into_parts()
            };
            let body = Bytes::new();
            let layer_key = HeaderKey::new(name.clone())
                .extract_key(&parts, &body)
                .map(|k| k.map(|k| k.to_string()));
            let source_key = KeySource::header(name.clone())
                .extract(&h, b"")
                .map(|k| k.map(|k| k.to_string()));
            assert_eq!(answer(layer_key), answer(source_key), "key {values:?}");

            let layer_scope = HeaderScope::new(name.clone()).extract_scope(&parts, &body);
            let source_scope = ScopeSource::header(name.clone())
                .extract(&h, b"")
                .map(Option::unwrap_or_default);
            assert_eq!(
                answer(layer_scope.map(Some)),
                answer(source_scope.map(Some)),
                "scope {values:?}"
            );
        }
    }

    #[test]
    fn a_scope_header_of_opaque_bytes_is_a_scope_of_its_own() {
        let s = ScopeSource::header(HeaderName::from_static("x-shop"));
        let mut h = HeaderMap::new();
        h.insert(
            "x-shop",
            http::HeaderValue::from_bytes(b"caf\xc3\xa9").expect("opaque bytes"),
        );
        let opaque = s.extract(&h, b"").expect("accepted").expect("a scope");
        assert!(opaque.starts_with('\0'), "{opaque:?}");
        let text = s
            .extract(&headers(&[("x-shop", "caf")]), b"")
            .expect("accepted");
        assert_ne!(Some(opaque), text);
        for bad in [vec![("x-shop", "")], vec![("x-shop", "a"), ("x-shop", "b")]] {
            let e = s.extract(&headers(&bad), b"").expect_err("malformed");
            assert_eq!(e.problem_type(), "invalid-scope", "{bad:?}");
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        }
    }
}
