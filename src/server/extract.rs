//! Where the key and the scope of a request come from.
//!
//! The layer buffers the body, then asks an [`ExtractKey`] for the key and an
//! [`ExtractScope`] for the scope; both see the request head and the buffered body, so
//! that extractors can read headers, the path, or fields of the body (webhook event
//! ids). Closures of the right shape implement both traits.
//!
//! ```
//! use idemkey::server::{ExtractKey, HeaderKey, HeaderScope, Rejection};
//! use idemkey::IdempotencyKey;
//! use bytes::Bytes;
//!
//! // The default: the `Idempotency-Key` header, bare or sf-string.
//! let key = HeaderKey::default();
//! // A scope per API credential; requests without one share the unscoped space.
//! let scope = HeaderScope::new(http::header::AUTHORIZATION);
//!
//! // A closure: the key is the `id` field of a JSON body.
//! let from_body = |_: &http::request::Parts, body: &Bytes| -> Result<Option<IdempotencyKey>, Rejection> {
//!     let v: serde_json::Value = serde_json::from_slice(body).map_err(Rejection::invalid_key)?;
//!     v["id"].as_str().map(IdempotencyKey::new).transpose().map_err(Rejection::invalid_key)
//! };
//! let (req, _) = http::Request::new(()).into_parts();
//! let k = from_body.extract_key(&req, &Bytes::from_static(br#"{"id":"evt_1"}"#))?;
//! assert_eq!(k.map(|k| k.to_string()), Some("evt_1".to_owned()));
//! # let _ = (key, scope);
//! # Ok::<(), Rejection>(())
//! ```

use std::borrow::Cow;

use bytes::Bytes;
use http::HeaderName;
use http::request::Parts;

use super::Rejection;
use crate::IdempotencyKey;
use crate::protocol::headers::IDEMPOTENCY_KEY;

/// Finds the idempotency key of a request.
pub trait ExtractKey: Send + Sync + 'static {
    /// The key; `Ok(None)` when the request carries none (the layer then answers
    /// `400 missing-key` on routes that require one); `Err` for a malformed key
    /// (usually [`Rejection::invalid_key`]).
    ///
    /// # Errors
    /// The rejection the layer answers with.
    fn extract_key(&self, parts: &Parts, body: &Bytes)
    -> Result<Option<IdempotencyKey>, Rejection>;

    /// Where the key is expected, for the `missing-key` message ("the `Idempotency-Key`
    /// header").
    fn describe(&self) -> Cow<'static, str> {
        Cow::Borrowed("the request")
    }
}

/// Finds the scope of a request: records of different scopes never meet.
pub trait ExtractScope: Send + Sync + 'static {
    /// The scope; `""` is the unscoped space.
    ///
    /// # Errors
    /// The rejection the layer answers with (a missing credential, say).
    fn extract_scope(&self, parts: &Parts, body: &Bytes) -> Result<String, Rejection>;
}

impl<F> ExtractKey for F
where
    F: Fn(&Parts, &Bytes) -> Result<Option<IdempotencyKey>, Rejection> + Send + Sync + 'static,
{
    fn extract_key(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<Option<IdempotencyKey>, Rejection> {
        self(parts, body)
    }
}

impl<F> ExtractScope for F
where
    F: Fn(&Parts, &Bytes) -> Result<String, Rejection> + Send + Sync + 'static,
{
    fn extract_scope(&self, parts: &Parts, body: &Bytes) -> Result<String, Rejection> {
        self(parts, body)
    }
}

/// The key from a header, bare or RFC 8941 sf-string (default `Idempotency-Key`; see
/// [`crate::protocol::headers`] for vendor variants). A header sent twice is malformed.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// The key from header `name`.
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self { name }
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
        let mut values = parts.headers.get_all(&self.name).iter();
        let Some(v) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Rejection::invalid_key(format_args!(
                "the `{}` header was sent more than once; send exactly one key",
                self.name
            )));
        }
        IdempotencyKey::from_header_value(v)
            .map(Some)
            .map_err(Rejection::invalid_key)
    }

    fn describe(&self) -> Cow<'static, str> {
        Cow::Owned(format!("the `{}` header", title_case(self.name.as_str())))
    }
}

/// Every request in one scope: keys are global to the service.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unscoped;

impl ExtractScope for Unscoped {
    fn extract_scope(&self, _parts: &Parts, _body: &Bytes) -> Result<String, Rejection> {
        Ok(String::new())
    }
}

/// The scope is the value of a header (an API credential, a tenant id); requests
/// without it are unscoped unless [`HeaderScope::required`].
///
/// The value only reaches the store hashed together with the key, never raw.
#[derive(Debug, Clone)]
pub struct HeaderScope {
    name: HeaderName,
    required: bool,
}

impl HeaderScope {
    /// The scope from header `name`.
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self {
            name,
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
        let values = parts.headers.get_all(&self.name);
        let mut out = String::new();
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            match v.to_str() {
                Ok(s) => out.push_str(s),
                // Opaque bytes: hex, marked so it never equals a textual value.
                Err(_) => {
                    out.push_str("\u{0}hex:");
                    out.push_str(&hex::encode(v.as_bytes()));
                }
            }
        }
        if out.is_empty() && self.required {
            return Err(Rejection::scope_rejected(
                http::StatusCode::UNAUTHORIZED,
                format!("this endpoint needs the `{}` header", self.name),
            ));
        }
        Ok(out)
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
