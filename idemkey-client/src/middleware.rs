//! The key middleware: attaches one key per logical request.

use http::{Extensions, HeaderName, Method};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::key::KeyResolver;
use super::profile::VendorProfile;
use super::request::attempts_so_far;
use super::response::annotate;

/// Gives every logical request of the configured methods (POST and PATCH by default) an
/// idempotency key and keeps that key on every attempt.
///
/// [`IdempotentClientBuilder`](crate::IdempotentClientBuilder) and
/// [`RetryMiddleware`](crate::RetryMiddleware) do this work themselves; use this
/// middleware to add keys to a stack built on `reqwest_retry::RetryTransientMiddleware`.
/// It works on either side of it: the key is kept in the request's [`Extensions`],
/// which a retry middleware passes unchanged to every attempt, so a middleware placed
/// inside the retry loop finds and reuses it. Inside the loop it also counts the
/// attempts ([`IdempotencyInfo::attempts`](crate::IdempotencyInfo::attempts));
/// outside `reqwest_retry::RetryTransientMiddleware` it cannot, and reports 1.
///
/// Where the key comes from, first match wins:
/// 1. the key fixed by an earlier attempt of the same logical request;
/// 2. the key header already on the request (validated, never replaced);
/// 3. a per-call option ([`RequestBuilderExt`](crate::RequestBuilderExt));
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
#[derive(Debug, Clone, Default)]
pub struct IdempotencyKeyMiddleware {
    keys: KeyResolver,
}

impl IdempotencyKeyMiddleware {
    /// `Idempotency-Key` on POST and PATCH.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts the key where this API takes it (a header, or a JSON body field) and holds
    /// keys to its length limit. The profile's answer rules and hints are the retry
    /// loop's business: this middleware only attaches keys.
    #[must_use]
    pub fn profile(mut self, profile: VendorProfile) -> Self {
        self.keys.set_profile(&profile);
        self
    }

    /// Sends the key under this header instead of `Idempotency-Key` (a
    /// [`KeyHeader`](idemkey_core::protocol::KeyHeader) or any [`HeaderName`]).
    #[must_use]
    pub fn key_header(mut self, name: impl Into<HeaderName>) -> Self {
        self.keys.set_header(name.into());
        self
    }

    /// The methods that get a generated key (POST and PATCH by default). A key set per
    /// call is sent whatever the method.
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.keys.set_methods(methods);
        self
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
        let Some(key) = self.keys.attach(&mut req, ext)? else {
            return next.run(req, ext).await;
        };
        let mut result = next.run(req, ext).await;
        if let Ok(response) = &mut result {
            annotate(response, &key.key, attempts_so_far(ext));
        }
        result
    }
}
