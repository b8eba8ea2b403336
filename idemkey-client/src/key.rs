//! Which key a request carries: the one resolver both the key middleware and the retry
//! middleware use.

use std::borrow::Cow;

use http::{Extensions, HeaderName, Method};
use reqwest::Request;

use super::error::Error;
use super::profile::{KeyPlacement, VendorProfile};
use super::request::{InFlight, KeyChoice};
use crate::{IdempotencyKey, InvalidKey};
use idemkey_core::key::MAX_KEY_LEN;
use idemkey_core::protocol::headers;

/// Where a logical request's key comes from, where it travels (a header, or a field of
/// the JSON body) and how long it may be.
///
/// First match wins:
/// 1. the key fixed by an earlier pass over the same logical request (a retry through
///    the same extensions);
/// 2. the key already on the request (its header, or its body field; validated, never
///    replaced);
/// 3. a per-call option ([`RequestBuilderExt`](super::RequestBuilderExt));
/// 4. a fresh random UUID v4, for the configured methods.
#[derive(Debug, Clone)]
pub(crate) struct KeyResolver {
    placement: KeyPlacement,
    max_len: usize,
    vendor: Cow<'static, str>,
    methods: Vec<Method>,
}

/// The key of a logical request, whether this crate generated it at random (such keys
/// never meet another call's), and the key header this pass put on the request, if it
/// did (the key travels in a header, and the caller's was not there).
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) key: IdempotencyKey,
    pub(crate) random: bool,
    pub(crate) placed_header: bool,
}

impl Default for KeyResolver {
    fn default() -> Self {
        Self {
            placement: KeyPlacement::Header(headers::IDEMPOTENCY_KEY),
            max_len: MAX_KEY_LEN,
            vendor: Cow::Borrowed("this crate"),
            methods: vec![Method::POST, Method::PATCH],
        }
    }
}

impl KeyResolver {
    pub(crate) fn set_header(&mut self, name: HeaderName) {
        self.placement = KeyPlacement::Header(name);
    }

    /// The header the key travels in, unless it travels in the body.
    pub(crate) fn header_name(&self) -> Option<&HeaderName> {
        match &self.placement {
            KeyPlacement::Header(name) => Some(name),
            KeyPlacement::JsonBodyField(_) => None,
        }
    }

    pub(crate) fn set_methods(&mut self, methods: impl IntoIterator<Item = Method>) {
        self.methods = methods.into_iter().collect();
    }

    /// Takes the key's placement and length limit from `profile`.
    pub(crate) fn set_profile(&mut self, profile: &VendorProfile) {
        self.placement = profile.key_placement().clone();
        self.max_len = profile.max_key_len();
        self.vendor = Cow::Owned(profile.name().to_owned());
    }

    /// The key of this logical request, fixed in `ext` on first sight, and put in the
    /// request (its header or body field) unless the caller's is there already; counts
    /// this pass.
    ///
    /// # Errors
    /// [`Error::is_invalid_key`] when the caller's key is invalid or too long for the
    /// vendor, or cannot be placed (a body field on a body that is not a JSON object):
    /// nothing is sent.
    pub(crate) fn attach(
        &self,
        req: &mut Request,
        ext: &mut Extensions,
    ) -> Result<Option<Resolved>, Error> {
        if let KeyPlacement::Header(name) = &self.placement {
            return self
                .attach_header(name, req, ext)
                .map_err(Error::invalid_key);
        }
        self.attach_elsewhere(req, ext)
    }

    /// [`attach`](Self::attach) for a key that travels in the body: out of line, so
    /// that the header's path (every request of the default stack) stays short.
    #[inline(never)]
    fn attach_elsewhere(
        &self,
        req: &mut Request,
        ext: &mut Extensions,
    ) -> Result<Option<Resolved>, Error> {
        let (resolved, on_request) = self.resolve(req, ext).map_err(Error::invalid_key)?;
        if let (Some(resolved), false) = (&resolved, on_request) {
            self.place(req, &resolved.key).map_err(Error::invalid_key)?;
        }
        Ok(resolved)
    }

    /// [`attach`](Self::attach) for a key that travels in a header: one look-up of the
    /// header, and the key written into it when it is not there yet.
    #[inline(never)]
    fn attach_header(
        &self,
        name: &HeaderName,
        req: &mut Request,
        ext: &mut Extensions,
    ) -> Result<Option<Resolved>, InvalidKey> {
        if let Some(callers) = req.headers().get(name) {
            if let Some(fixed) = reuse(ext) {
                return Ok(Some(fixed));
            }
            let key = IdempotencyKey::from_header_value(callers)?;
            return self.fix(ext, key, false).map(Some);
        }
        let random_allowed = self.methods.contains(req.method());
        let resolved = match reuse(ext) {
            Some(fixed) => fixed,
            None => {
                let (key, random) = match ext.get::<KeyChoice>() {
                    Some(KeyChoice::Use(key)) => (key.clone(), false),
                    Some(KeyChoice::Invalid(e)) => return Err(e.clone()),
                    Some(KeyChoice::Off) => return Ok(None),
                    None if random_allowed => (IdempotencyKey::random(), true),
                    None => return Ok(None),
                };
                self.fix(ext, key, random)?
            }
        };
        req.headers_mut()
            .insert(name.clone(), resolved.key.to_header_value());
        Ok(Some(Resolved {
            placed_header: true,
            ..resolved
        }))
    }

    /// Fixes `key` as the logical request's key in `ext`, after the vendor's length check.
    fn fix(
        &self,
        ext: &mut Extensions,
        key: IdempotencyKey,
        random: bool,
    ) -> Result<Resolved, InvalidKey> {
        if key.as_str().len() > self.max_len {
            return Err(InvalidKey::over_vendor_limit(
                key.as_str().len(),
                self.max_len,
                &self.vendor,
            ));
        }
        let in_flight = InFlight {
            key: Some(key.clone()),
            passes: 1,
            random,
            attempt: 0,
        };
        match ext.get_mut::<InFlight>() {
            Some(existing) => *existing = in_flight,
            None => {
                ext.insert(in_flight);
            }
        }
        Ok(Resolved {
            key,
            random,
            placed_header: false,
        })
    }

    /// The key, and whether it is on the request already (so need not be placed).
    fn resolve(
        &self,
        req: &Request,
        ext: &mut Extensions,
    ) -> Result<(Option<Resolved>, bool), InvalidKey> {
        if let Some(fixed) = reuse(ext) {
            return Ok((Some(fixed), false));
        }
        let mut on_request = false;
        let (key, random) = if let Some(key) = self.on_request(req)? {
            on_request = true;
            (Some(key), false)
        } else {
            match ext.get::<KeyChoice>() {
                Some(KeyChoice::Use(key)) => (Some(key.clone()), false),
                Some(KeyChoice::Invalid(e)) => return Err(e.clone()),
                Some(KeyChoice::Off) => (None, false),
                None => (
                    self.methods
                        .contains(req.method())
                        .then(IdempotencyKey::random),
                    true,
                ),
            }
        };
        let Some(key) = key else {
            return Ok((None, false));
        };
        Ok((Some(self.fix(ext, key, random)?), on_request))
    }

    /// The key the caller put on the request itself.
    fn on_request(&self, req: &Request) -> Result<Option<IdempotencyKey>, InvalidKey> {
        match &self.placement {
            KeyPlacement::Header(name) => req
                .headers()
                .get(name)
                .map(IdempotencyKey::from_header_value)
                .transpose(),
            KeyPlacement::JsonBodyField(field) => {
                let Some(object) = json_object(req, field)? else {
                    return Ok(None);
                };
                match object.get(field.as_ref()) {
                    None => Ok(None),
                    Some(serde_json::Value::String(key)) => IdempotencyKey::new(key).map(Some),
                    Some(other) => Err(InvalidKey::placement(format!(
                        "the body field `{field}` holds {other}, not a string key"
                    ))),
                }
            }
        }
    }

    /// Puts `key` where it travels, unless the caller's key is there already.
    fn place(&self, req: &mut Request, key: &IdempotencyKey) -> Result<(), InvalidKey> {
        match &self.placement {
            KeyPlacement::Header(name) => {
                if !req.headers().contains_key(name) {
                    req.headers_mut()
                        .insert(name.clone(), key.to_header_value());
                }
                Ok(())
            }
            KeyPlacement::JsonBodyField(field) => {
                let Some(object) = json_object(req, field)? else {
                    return Err(InvalidKey::placement(format!(
                        "{} takes the key in the JSON body field `{field}`, and this request \
                         has no body; send a JSON object body",
                        self.vendor
                    )));
                };
                if object.contains_key(field.as_ref()) {
                    return Ok(());
                }
                let body = req
                    .body()
                    .and_then(reqwest::Body::as_bytes)
                    .unwrap_or_default();
                let with_key = insert_field(body, field, key.as_str(), object.is_empty());
                *req.body_mut() = Some(with_key.into());
                Ok(())
            }
        }
    }
}

/// The key an earlier pass over the same logical request fixed, counting this pass.
fn reuse(ext: &mut Extensions) -> Option<Resolved> {
    let in_flight = ext.get_mut::<InFlight>()?;
    let key = in_flight.key.clone()?;
    in_flight.passes += 1;
    Some(Resolved {
        key,
        random: in_flight.random,
        placed_header: false,
    })
}

/// The request's body as a JSON object, `None` without a body.
fn json_object(
    req: &Request,
    field: &str,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, InvalidKey> {
    let Some(body) = req.body() else {
        return Ok(None);
    };
    let Some(bytes) = body.as_bytes() else {
        return Err(InvalidKey::placement(format!(
            "the key goes in the JSON body field `{field}`, and this body is a stream; \
             buffer the body (json, Bytes, String)"
        )));
    };
    serde_json::from_slice(bytes).map(Some).map_err(|e| {
        InvalidKey::placement(format!(
            "the key goes in the JSON body field `{field}`, and the body is not a JSON object \
             ({e}); send a JSON object body"
        ))
    })
}

/// `body` (a JSON object) with `"field":"key"` added as its first member; the other bytes
/// are kept as they are.
fn insert_field(body: &[u8], field: &str, key: &str, empty: bool) -> Vec<u8> {
    let open = body.iter().position(|&b| b == b'{').map_or(0, |i| i + 1);
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let member = format!(
        "{}:{}{}",
        quote(field),
        quote(key),
        if empty { "" } else { "," }
    );
    let mut out = Vec::with_capacity(body.len() + member.len());
    out.extend_from_slice(&body[..open]);
    out.extend_from_slice(member.as_bytes());
    out.extend_from_slice(&body[open..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_inserted_first_and_the_rest_is_untouched() {
        let out = insert_field(
            br#" { "amount_money": {"amount": 100} }"#,
            "idempotency_key",
            "k-1",
            false,
        );
        assert_eq!(
            std::str::from_utf8(&out).ok(),
            Some(r#" {"idempotency_key":"k-1", "amount_money": {"amount": 100} }"#)
        );
        let out = insert_field(b"{}", "idempotency_key", "k\"1", true);
        let parsed: serde_json::Value = serde_json::from_slice(&out).expect("still JSON");
        assert_eq!(parsed["idempotency_key"], "k\"1");
    }
}
