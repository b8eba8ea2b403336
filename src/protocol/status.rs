//! Status and method classes that decide what is retried and what is kept.

use http::{Method, StatusCode};

/// `true` for the answers that mean "nothing was done, try again": 5xx,
/// `408 Request Timeout` and `429 Too Many Requests`.
///
/// The verifier's default outcome policy releases the key on them (so that the retry
/// executes), and the client retries them with the same key.
///
/// ```
/// use http::StatusCode;
/// use idemkey::protocol::status::is_transient;
/// assert!(is_transient(StatusCode::BAD_GATEWAY));
/// assert!(is_transient(StatusCode::TOO_MANY_REQUESTS));
/// assert!(!is_transient(StatusCode::CONFLICT));
/// ```
#[must_use]
pub fn is_transient(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

/// `true` for the safe methods of RFC 9110 §9.2.1 (GET, HEAD, OPTIONS, TRACE): they
/// change nothing, so the verifier steps aside for them by default.
#[must_use]
pub fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// `true` for the idempotent methods of RFC 9110 §9.2.2 (the safe ones, PUT and
/// DELETE): the client may retry them without a key.
///
/// ```
/// use http::Method;
/// use idemkey::protocol::status::is_idempotent;
/// assert!(is_idempotent(&Method::PUT));
/// assert!(!is_idempotent(&Method::POST));
/// ```
#[must_use]
pub fn is_idempotent(method: &Method) -> bool {
    is_safe(method) || matches!(*method, Method::PUT | Method::DELETE)
}
