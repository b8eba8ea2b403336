//! The key middleware: attaches one key per logical request.

use http::{Extensions, HeaderName, Method};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::error::Error;
use super::request::{KeyChoice, KeyInUse, attempts_so_far};
use super::response::annotate;
use crate::IdempotencyKey;
use crate::headers;

/// Vendor variants of the key header's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderPreset {
    /// `Idempotency-Key` (IETF draft, Stripe, most APIs): the default.
    IdempotencyKey,
    /// `PayPal-Request-Id` (PayPal).
    PayPal,
    /// `Cko-Idempotency-Key` (Checkout.com).
    Checkout,
    /// `X-Idempotency-Key` (Adyen and many in-house APIs).
    XIdempotencyKey,
}

impl HeaderPreset {
    /// The header name this preset stands for.
    #[must_use]
    pub fn header_name(self) -> HeaderName {
        match self {
            HeaderPreset::IdempotencyKey => headers::IDEMPOTENCY_KEY,
            HeaderPreset::PayPal => headers::PAYPAL_REQUEST_ID,
            HeaderPreset::Checkout => headers::CKO_IDEMPOTENCY_KEY,
            HeaderPreset::XIdempotencyKey => headers::X_IDEMPOTENCY_KEY,
        }
    }
}

/// Gives every logical request of the configured methods (POST and PATCH by default) an
/// idempotency key and keeps that key on every attempt.
///
/// [`ClientBuilder`](crate::client::ClientBuilder) puts it in the right place for you.
/// Use it alone to add keys to a stack of your own; it works on either side of
/// `reqwest_retry::RetryTransientMiddleware`: the key is kept in the request's
/// [`Extensions`], which a retry middleware passes unchanged to every attempt, so a
/// middleware placed inside the retry loop finds and reuses it. Inside the loop it
/// also counts the attempts ([`IdempotencyInfo::attempts`](crate::client::IdempotencyInfo::attempts));
/// outside `reqwest_retry::RetryTransientMiddleware` it cannot, and reports 1.
///
/// Where the key comes from, first match wins:
/// 1. the key header already on the request (validated, never replaced);
/// 2. the key fixed by an earlier attempt of the same logical request;
/// 3. a per-call option ([`RequestBuilderExt`](crate::client::RequestBuilderExt));
/// 4. a fresh random UUID v4, for the configured methods.
///
/// ```
/// use idemkey::client::IdempotencyKeyMiddleware;
/// use reqwest_retry::{RetryTransientMiddleware, policies::ExponentialBackoff};
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryTransientMiddleware::new_with_policy(
///         ExponentialBackoff::builder().build_with_max_retries(3),
///     ))
///     .with(IdempotencyKeyMiddleware::new()) // inside the retry loop: still one key
///     .build();
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyKeyMiddleware {
    header: HeaderName,
    methods: Vec<Method>,
}

impl Default for IdempotencyKeyMiddleware {
    fn default() -> Self {
        Self {
            header: headers::IDEMPOTENCY_KEY,
            methods: vec![Method::POST, Method::PATCH],
        }
    }
}

impl IdempotencyKeyMiddleware {
    /// `Idempotency-Key` on POST and PATCH.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends the key under this header name instead of `Idempotency-Key`.
    #[must_use]
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// The methods that get a generated key (POST and PATCH by default). A key set per
    /// call is sent whatever the method.
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The key this logical request carries, fixed in `ext` on first sight; counts this
    /// pass.
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

    /// Resolves the key and puts it in the request's header (unless the caller's is
    /// there already).
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
}

#[async_trait::async_trait]
impl Middleware for IdempotencyKeyMiddleware {
    async fn handle(
        &self,
        mut req: Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let Some(key) = self.attach(&mut req, ext)? else {
            return next.run(req, ext).await;
        };
        let mut result = next.run(req, ext).await;
        if let Ok(response) = &mut result {
            annotate(response, &key, attempts_so_far(ext));
        }
        result
    }
}
