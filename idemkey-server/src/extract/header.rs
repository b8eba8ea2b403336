//! Keys and scopes carried in a header: the one rule of the [module docs](super), and
//! the two extractors that apply it alone.

use std::borrow::Cow;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{ExtractKey, ExtractScope};
use crate::IdempotencyKey;
use crate::rejection::Rejection;
use idemkey_core::protocol::Problem;
use idemkey_core::protocol::headers::IDEMPOTENCY_KEY;

/// The key in header `name`: `None` when the header is absent, `invalid-key` when it is
/// sent more than once or is not a key (an empty value is not one).
pub(crate) fn key(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<IdempotencyKey>, Rejection> {
    let Some(value) = single(headers, name, Rejection::invalid_key, "exactly one key")? else {
        return Ok(None);
    };
    IdempotencyKey::from_header_value(value)
        .map(Some)
        .map_err(|e| {
            Rejection::invalid_key(format_args!(
                "the `{name}` header is not a valid idempotency key: {e}"
            ))
        })
}

/// The scope in header `name`: `None` when the header is absent, `invalid-scope` when it
/// is sent more than once or is empty; any other value, opaque bytes included.
pub(crate) fn scope<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<Cow<'h, str>>, Rejection> {
    let Some(value) = single(headers, name, Rejection::invalid_scope, "it once")? else {
        return Ok(None);
    };
    let bytes = trim(value.as_bytes());
    if bytes.is_empty() {
        return Err(Rejection::invalid_scope(format_args!(
            "the `{name}` header is empty; send the scope, or leave the header out"
        )));
    }
    Ok(Some(match std::str::from_utf8(bytes) {
        Ok(text) if value.to_str().is_ok() => Cow::Borrowed(text),
        // Opaque bytes: hex, marked so it never equals a textual value (a header value
        // never holds a NUL).
        _ => Cow::Owned(format!("\0hex:{}", hex::encode(bytes))),
    }))
}

/// The one value of header `name`, if it is there; sent more than once, it is refused
/// with `reject`, asking for `wanted`.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
    reject: impl FnOnce(String) -> Rejection,
    wanted: &str,
) -> Result<Option<&'h HeaderValue>, Rejection> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(reject(format!(
            "the `{name}` header was sent more than once; send {wanted}"
        ))),
        (first, _) => Ok(first),
    }
}

/// Without the spaces and tabs around it (RFC 9110 `OWS`).
fn trim(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

/// The key from a header, bare or RFC 8941 sf-string (default `Idempotency-Key`; a
/// [`KeyHeader`](idemkey_core::protocol::KeyHeader) names the vendor variants). The header is
/// read by the [one rule](crate#keys-and-scopes-in-headers-one-rule): sent twice, or
/// empty, it is `400 invalid-key`.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// The key from header `name` (a [`KeyHeader`](idemkey_core::protocol::KeyHeader) or any
    /// [`HeaderName`]).
    #[must_use]
    pub fn new(name: impl Into<HeaderName>) -> Self {
        Self { name: name.into() }
    }

    /// The header this extractor reads.
    #[must_use]
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl Default for HeaderKey {
    fn default() -> Self {
        Self::new(IDEMPOTENCY_KEY)
    }
}

impl ExtractKey for HeaderKey {
    fn extract_key(
        &self,
        parts: &Parts,
        _body: &Bytes,
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        key(&parts.headers, &self.name)
    }

    fn describe(&self) -> Cow<'static, str> {
        Cow::Owned(format!("the `{}` header", title_case(self.name.as_str())))
    }

    fn needs_body(&self) -> bool {
        false
    }
}

/// The scope is the value of a header (an API credential, a tenant id); requests
/// without it are unscoped unless [`HeaderScope::required`].
///
/// The header is read by the [one rule](crate#keys-and-scopes-in-headers-one-rule):
/// sent twice, or empty, it is `400 invalid-scope`; a value that is not visible ASCII
/// is a scope of its own. The value only reaches the store hashed together with the
/// key, never raw.
#[derive(Debug, Clone)]
pub struct HeaderScope {
    name: HeaderName,
    required: bool,
}

impl HeaderScope {
    /// The scope from header `name`.
    #[must_use]
    pub fn new(name: impl Into<HeaderName>) -> Self {
        Self {
            name: name.into(),
            required: false,
        }
    }

    /// Requests without the header are refused with `401 scope-rejected`.
    #[must_use]
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }
}

impl ExtractScope for HeaderScope {
    fn extract_scope(&self, parts: &Parts, _body: &Bytes) -> Result<String, Rejection> {
        match scope(&parts.headers, &self.name)? {
            Some(s) => Ok(s.into_owned()),
            None if self.required => Err(Rejection::scope_rejected(
                Problem::ScopeRejected.default_status(),
                format!("this endpoint needs the `{}` header", self.name),
            )),
            None => Ok(String::new()),
        }
    }

    fn needs_body(&self) -> bool {
        false
    }
}

/// `idempotency-key` as `Idempotency-Key`, for messages.
fn title_case(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut c = part.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                "x-id",
                HeaderValue::from_bytes(v).expect("test header values are valid"),
            );
        }
        h
    }

    fn name() -> HeaderName {
        HeaderName::from_static("x-id")
    }

    fn problem<T: std::fmt::Debug>(r: Result<T, Rejection>) -> Problem {
        r.expect_err("rejected").problem()
    }

    #[test]
    fn a_key_header_is_one_non_empty_key() {
        let key = |values: &[&[u8]]| key(&headers(values), &name());
        assert_eq!(key(&[]).expect("absent is fine"), None);
        assert_eq!(
            key(&[b" k-1\t"]).expect("a key").map(|k| k.to_string()),
            Some("k-1".into())
        );
        assert_eq!(
            key(&[b"\"k-1\""])
                .expect("an sf-string")
                .map(|k| k.to_string()),
            Some("k-1".into())
        );
        for bad in [&b""[..], b"  ", b"\"\"", b"a b", b"caf\xc3\xa9"] {
            assert_eq!(problem(key(&[bad])), Problem::InvalidKey, "{bad:?}");
        }
        assert_eq!(problem(key(&[b"a", b"a"])), Problem::InvalidKey, "twice");
    }

    #[test]
    fn a_scope_header_is_one_non_empty_value_of_any_bytes() {
        let scope =
            |values: &[&[u8]]| scope(&headers(values), &name()).map(|s| s.map(Cow::into_owned));
        assert_eq!(scope(&[]).expect("absent is fine"), None);
        assert_eq!(
            scope(&[b" Bearer t\t"]).expect("a scope"),
            Some("Bearer t".into())
        );
        let opaque = scope(&[b"caf\xc3\xa9"]).expect("opaque bytes are a scope");
        assert_eq!(opaque, Some("\0hex:636166c3a9".into()));
        assert_ne!(opaque, scope(&[b"caf"]).expect("text"));
        for bad in [&b""[..], b" \t "] {
            assert_eq!(problem(scope(&[bad])), Problem::InvalidScope, "{bad:?}");
        }
        assert_eq!(
            problem(scope(&[b"a", b"b"])),
            Problem::InvalidScope,
            "twice"
        );
    }
}
