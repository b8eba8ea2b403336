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

/// `true` for the answers that mean "an earlier request with this key is still running":
/// `409 Conflict` (the IETF draft, Stripe, this crate's verifier) and `423 Locked`
/// (idemkit 1.0's default mode, with `Retry-After`). The client retries them with the
/// same key, unless the body says the key was reused for a different request.
///
/// ```
/// use http::StatusCode;
/// use idemkey::protocol::status::is_in_progress;
/// assert!(is_in_progress(StatusCode::CONFLICT));
/// assert!(is_in_progress(StatusCode::LOCKED));
/// assert!(!is_in_progress(StatusCode::UNPROCESSABLE_ENTITY));
/// ```
#[must_use]
pub fn is_in_progress(status: StatusCode) -> bool {
    IN_PROGRESS.contains(&status)
}

/// The statuses of [`is_in_progress`]: `409 Conflict` and `423 Locked`.
pub const IN_PROGRESS: [StatusCode; 2] = [StatusCode::CONFLICT, StatusCode::LOCKED];

/// `true` for the answers no server hint makes retryable: `400 Bad Request` and
/// `422 Unprocessable Content` say the request itself is wrong (or its key was reused),
/// so sending it again cannot help.
///
/// ```
/// use http::StatusCode;
/// use idemkey::protocol::status::is_never_retried;
/// assert!(is_never_retried(StatusCode::BAD_REQUEST));
/// assert!(is_never_retried(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!is_never_retried(StatusCode::CONFLICT));
/// ```
#[must_use]
pub fn is_never_retried(status: StatusCode) -> bool {
    status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY
}

/// `true` for the answers that say the request was refused **as it was sent**, before
/// anything was processed: `400 Bad Request` (malformed: unparsable or invalid
/// parameters), `401 Unauthorized`, `403 Forbidden`, `404 Not Found`,
/// `405 Method Not Allowed`, `406 Not Acceptable`, `411 Length Required`,
/// `413 Content Too Large`, `414 URI Too Long`, `415 Unsupported Media Type`,
/// `417 Expectation Failed`, `421 Misdirected Request` and
/// `431 Request Header Fields Too Large` (RFC 9110 §15.5 defines each as a judgement on
/// the request message, its target or its credentials, not on the state it would
/// change).
///
/// The verifier's default outcome policy releases the key on them, so that the request,
/// corrected or sent to the right route, runs with the same key: no endpoint began
/// executing, so there is no outcome to keep. This is Stripe's rule ("Idempotent
/// requests": results are saved only once an endpoint began executing; a request whose
/// parameters fail validation saves none). Other 4xx (`402`, `409`, `410`, `422`, ...)
/// are a handler's judgement on the request against the state it found, and are kept.
///
/// The verifier's *own* answers never reach the outcome policy: its `400 invalid-key`,
/// `400 missing-key` or `422 key-reused` are given before any claim.
///
/// ```
/// use http::StatusCode;
/// use idemkey::protocol::status::is_refused_as_sent;
/// assert!(is_refused_as_sent(StatusCode::METHOD_NOT_ALLOWED));
/// assert!(is_refused_as_sent(StatusCode::BAD_REQUEST));
/// assert!(!is_refused_as_sent(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!is_refused_as_sent(StatusCode::CONFLICT));
/// ```
#[must_use]
pub fn is_refused_as_sent(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_REQUEST
            | StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::NOT_FOUND
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::NOT_ACCEPTABLE
            | StatusCode::LENGTH_REQUIRED
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::URI_TOO_LONG
            | StatusCode::UNSUPPORTED_MEDIA_TYPE
            | StatusCode::EXPECTATION_FAILED
            | StatusCode::MISDIRECTED_REQUEST
            | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    )
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
