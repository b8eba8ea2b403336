//! Which key a request carries: the one resolver both the key middleware and the retry
//! middleware use.

use http::{Extensions, HeaderName, Method};
use reqwest::Request;

use super::error::Error;
use super::request::{KeyChoice, KeyInUse};
use crate::IdempotencyKey;
use crate::protocol::headers;

/// Where a logical request's key comes from and under which header it travels.
///
/// First match wins:
/// 1. the key fixed by an earlier pass over the same logical request (a retry through
///    the same extensions);
/// 2. the key header already on the request (validated, never replaced);
/// 3. a per-call option ([`RequestBuilderExt`](super::RequestBuilderExt));
/// 4. a fresh random UUID v4, for the configured methods.
#[derive(Debug, Clone)]
pub(crate) struct KeyResolver {
    header: HeaderName,
    methods: Vec<Method>,
}

impl Default for KeyResolver {
    fn default() -> Self {
        Self {
            header: headers::IDEMPOTENCY_KEY,
            methods: vec![Method::POST, Method::PATCH],
        }
    }
}

impl KeyResolver {
    pub(crate) fn set_header(&mut self, name: HeaderName) {
        self.header = name;
    }

    pub(crate) fn set_methods(&mut self, methods: impl IntoIterator<Item = Method>) {
        self.methods = methods.into_iter().collect();
    }

    /// The key of this logical request, fixed in `ext` on first sight, and put in the
    /// request's header unless the caller's is there already; counts this pass.
    ///
    /// # Errors
    /// [`Error::is_invalid_key`] when the caller's header or per-call key is invalid:
    /// nothing is sent.
    pub(crate) fn attach(
        &self,
        req: &mut Request,
        ext: &mut Extensions,
    ) -> Result<Option<IdempotencyKey>, Error> {
        let key = self.resolve(req, ext)?;
        if let Some(key) = &key {
            if !req.headers().contains_key(&self.header) {
                req.headers_mut()
                    .insert(self.header.clone(), key.to_header_value());
            }
        }
        Ok(key)
    }

    fn resolve(
        &self,
        req: &Request,
        ext: &mut Extensions,
    ) -> Result<Option<IdempotencyKey>, Error> {
        if let Some(in_use) = ext.get_mut::<KeyInUse>() {
            in_use.passes += 1;
            return Ok(Some(in_use.key.clone()));
        }
        let key = if let Some(value) = req.headers().get(&self.header) {
            Some(IdempotencyKey::from_header_value(value).map_err(Error::invalid_key)?)
        } else {
            match ext.get::<KeyChoice>() {
                Some(KeyChoice::Use(key)) => Some(key.clone()),
                Some(KeyChoice::Invalid(e)) => return Err(Error::invalid_key(e.clone())),
                Some(KeyChoice::Off) => None,
                None => self
                    .methods
                    .contains(req.method())
                    .then(IdempotencyKey::random),
            }
        };
        if let Some(key) = &key {
            ext.insert(KeyInUse {
                key: key.clone(),
                passes: 1,
            });
        }
        Ok(key)
    }
}
