//! Which answers are worth another attempt with the same key.

use reqwest::Response;
use reqwest_retry::{
    Retryable, RetryableStrategy, default_on_request_failure, default_on_request_success,
};

use idemkey_core::protocol::status;

/// Which answers are worth another attempt with the same key.
///
/// Transient: connect errors, timeouts, dropped connections, 408, 429, 5xx, and 409 and
/// 423 (an earlier request with the key is in progress,
/// [`is_in_progress`](idemkey_core::protocol::status::is_in_progress)). Fatal: every other
/// 4xx, explicitly 400 and 422, and errors of other middlewares (as `reqwest_retry`
/// classifies them).
///
/// Wrap it in a strategy of your own to change single cases.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdempotentRetryStrategy;

impl RetryableStrategy for IdempotentRetryStrategy {
    fn handle(&self, res: &reqwest_middleware::Result<Response>) -> Option<Retryable> {
        match res {
            Ok(response) => match response.status() {
                s if status::is_in_progress(s) => Some(Retryable::Transient),
                s if status::is_never_retried(s) => Some(Retryable::Fatal),
                _ => default_on_request_success(response),
            },
            Err(err) => default_on_request_failure(err),
        }
    }
}
