//! Where the key and the scope of a request come from.
//!
//! The layer asks an [`ExtractKey`] for the key and an [`ExtractScope`] for the scope;
//! both see the request head and the buffered body, so that extractors can read
//! headers, the path, or fields of the body (webhook event ids). Closures of the right
//! shape implement both traits.
//!
//! An extractor that reads only the head says so ([`ExtractKey::needs_body`]), and the
//! layer then judges the key (and a head-only scope) **before reading the body**: a
//! missing or malformed key is answered at once, without buffering up to the body limit,
//! and a client that sent `Expect: 100-continue` gets its `400` instead of a
//! `100 Continue`.
//!
//! Two families of extractors come with the crate, and read headers by the same rule:
//!
//! - [`HeaderKey`] and [`HeaderScope`]: one header each, for APIs.
//! - [`KeySource`] and [`ScopeSource`]: a header, a JSON field of the body, fallbacks,
//!   composites and constants, for webhook deliveries (the [presets](super::webhook)
//!   are built from them).
//!
//! Both read a header by the one rule documented in the
//! [`server` docs](crate#keys-and-scopes-in-headers-one-rule).

use std::borrow::Cow;

use bytes::Bytes;
use http::request::Parts;

use super::rejection::Rejection;
use crate::IdempotencyKey;

mod dialect;
mod header;
mod source;

pub(crate) use dialect::DialectKey;
pub use header::{HeaderKey, HeaderScope};
pub(crate) use source::Input;
pub use source::{KeySource, ScopeSource};

/// Finds the idempotency key of a request.
///
/// ```
/// use idemkey::server::{extract::ExtractKey, extract::HeaderKey, extract::HeaderScope, Rejection};
/// use idemkey::IdempotencyKey;
/// use bytes::Bytes;
///
/// // The default: the `Idempotency-Key` header, bare or sf-string.
/// let key = HeaderKey::default();
/// // A scope per API credential; requests without one share the unscoped space.
/// let scope = HeaderScope::new(http::header::AUTHORIZATION);
///
/// // A closure: the key is the `id` field of a JSON body.
/// let from_body = |_: &http::request::Parts, body: &Bytes| -> Result<Option<IdempotencyKey>, Rejection> {
///     let v: serde_json::Value = serde_json::from_slice(body).map_err(Rejection::invalid_key)?;
///     v["id"].as_str().map(IdempotencyKey::new).transpose().map_err(Rejection::invalid_key)
/// };
/// let (req, _) = http::Request::new(()).into_parts();
/// let k = from_body.extract_key(&req, &Bytes::from_static(br#"{"id":"evt_1"}"#))?;
/// assert_eq!(k.map(|k| k.to_string()), Some("evt_1".to_owned()));
/// # let _ = (key, scope);
/// # Ok::<(), Rejection>(())
/// ```
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

    /// The `400 missing-key` answer to a request without a key on a route that requires
    /// one; by default [`Rejection::missing_key`] naming [`ExtractKey::describe`]
    /// (webhook presets speak to the sender of a delivery instead).
    fn missing(&self) -> Rejection {
        Rejection::missing_key(&self.describe())
    }

    /// Whether [`ExtractKey::extract_key`] reads the body. `false` promises that it
    /// reads only the head: the layer then calls it with an empty body *before* reading
    /// the body, and answers a missing or malformed key without reading it. Default
    /// `true` (a closure may read anything).
    fn needs_body(&self) -> bool {
        true
    }
}

/// Finds the scope of a request: records of different scopes never meet.
pub trait ExtractScope: Send + Sync + 'static {
    /// The scope; `""` is the unscoped space.
    ///
    /// # Errors
    /// The rejection the layer answers with (a missing credential, say).
    fn extract_scope(&self, parts: &Parts, body: &Bytes) -> Result<String, Rejection>;

    /// Whether [`ExtractScope::extract_scope`] reads the body (see
    /// [`ExtractKey::needs_body`]). Default `true`.
    fn needs_body(&self) -> bool {
        true
    }
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

/// Every request in one scope: keys are global to the service.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unscoped;

impl ExtractScope for Unscoped {
    fn extract_scope(&self, _parts: &Parts, _body: &Bytes) -> Result<String, Rejection> {
        Ok(String::new())
    }

    fn needs_body(&self) -> bool {
        false
    }
}
