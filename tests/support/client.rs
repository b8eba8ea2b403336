//! Shortcuts for the client tests: a client whose retries wait milliseconds, and
//! idemkey's typed error out of a middleware error.

use std::time::Duration;

use idemkey::client::{Error, IdempotentClientBuilder};
use retry_policies::policies::ExponentialBackoff;

/// Backoff of a few milliseconds, so that real waits stay tiny.
pub(crate) fn fast(retries: u32) -> ExponentialBackoff {
    ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(5))
        .build_with_max_retries(retries)
}

/// The default stack with [`fast`] backoff and `retries` retries.
pub(crate) fn builder(retries: u32) -> IdempotentClientBuilder {
    IdempotentClientBuilder::new(reqwest::Client::new()).retry_policy(fast(retries))
}

/// idemkey's error, taken out of `err` (panics when it holds none).
pub(crate) fn ours(err: reqwest_middleware::Error) -> Error {
    Error::try_from_middleware(err)
        .unwrap_or_else(|e| panic!("expected idemkey's error, got {e:?}"))
}
