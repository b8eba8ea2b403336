//! The problems (RFC 9457) the verifier answers with, each declared once with its `type`,
//! title and default status.

use std::fmt;

use http::{HeaderValue, StatusCode};

/// The media type of problem responses.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The status of `key-reused` in Stripe's API, and so in the verifier's Stripe-compatible
/// mode: `400` rather than the default `422`. A client reads the problem `type` of a
/// `400` to tell the two apart.
pub const KEY_REUSED_STRIPE_STATUS: StatusCode = StatusCode::BAD_REQUEST;

/// The prefix of every problem `type` this crate sends; the case name follows it
/// (`urn:idemkey:problem:key-reused`).
pub const TYPE_PREFIX: &str = "urn:idemkey:problem:";

macro_rules! problems {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $name:literal, $status:ident, $title:literal;
    )*) => {
        /// Why the verifier answered instead of the handler.
        ///
        /// Each case has a stable name ([`Problem::name`]), a `type` URI
        /// ([`Problem::type_uri`]), a title and a default status. The server sends them as
        /// `application/problem+json`; the client reads them back with
        /// [`Problem::from_type`].
        ///
        /// | problem | default status | handler ran? |
        /// |---|---|---|
        /// | `missing-key` | 400 | no |
        /// | `invalid-key` | 400 | no |
        /// | `body-too-large` | 413 | no |
        /// | `body-unreadable` | 400 | no |
        /// | `body-timeout` | 408 + `Connection: close` | no (the key was not claimed) |
        /// | `key-reused` | 422 (400 in Stripe-compatible mode) | no |
        /// | `in-progress` | 409 + `Retry-After` | no |
        /// | `store-unavailable` | 503 + `Retry-After` | no |
        /// | `store-full` | 503 + `Retry-After` | no (the store refused a new record: its bound is reached) |
        /// | `quota-exceeded` | 429 + `Retry-After` | no (the scope's quota of new keys is spent; nothing was recorded) |
        /// | `record-unreadable` | 500 | no (it ran before; its record cannot be read) |
        /// | `response-not-stored` | 410 | no (it ran once before; its response was too large to keep) |
        /// | `scope-rejected` | chosen by the scope extractor (401 by default) | no |
        /// | `invalid-scope` | 400 | no |
        /// | `signature-rejected` | 401 | no (a webhook delivery whose signature does not verify) |
        /// | `response-failed` | 500 | yes, but its response body failed; the key was released |
        /// | `record-not-found` | 404 | admin service only: no such record |
        /// | `admin-request-invalid` | 400 (405 for a method not allowed) | admin service only |
        /// | `operation-unsupported` | 501 | admin service only: the store cannot do it |
        ///
        /// ```
        /// use idemkey::protocol::Problem;
        /// assert_eq!(Problem::KeyReused.type_uri(), "urn:idemkey:problem:key-reused");
        /// assert_eq!(Problem::KeyReused.default_status(), http::StatusCode::UNPROCESSABLE_ENTITY);
        /// assert_eq!(Problem::from_type("urn:idemkey:problem:in-progress"), Some(Problem::InProgress));
        /// assert_eq!(Problem::from_type("https://errors.example.com/key-reused"), Some(Problem::KeyReused));
        /// assert_eq!(Problem::from_type("about:blank"), None);
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Problem {
            $( $(#[$doc])* $variant, )*
        }

        impl Problem {
            /// Every problem, in declaration order.
            pub const ALL: &'static [Problem] = &[$(Problem::$variant),*];

            /// The stable case name (`"key-reused"`).
            #[must_use]
            pub const fn name(self) -> &'static str {
                match self { $( Self::$variant => $name, )* }
            }

            /// The problem `type` this crate sends (`"urn:idemkey:problem:key-reused"`).
            #[must_use]
            pub const fn type_uri(self) -> &'static str {
                match self { $( Self::$variant => concat!("urn:idemkey:problem:", $name), )* }
            }

            /// The problem's `title`.
            #[must_use]
            pub const fn title(self) -> &'static str {
                match self { $( Self::$variant => $title, )* }
            }

            /// The status the verifier answers with unless configured otherwise.
            #[must_use]
            pub const fn default_status(self) -> StatusCode {
                match self { $( Self::$variant => StatusCode::$status, )* }
            }
        }
    };
}

problems! {
    /// The route requires a key and the request has none.
    MissingKey = "missing-key", BAD_REQUEST, "Idempotency key missing";
    /// The key is not 1 to 255 characters of visible ASCII, or its header was sent twice.
    InvalidKey = "invalid-key", BAD_REQUEST, "Idempotency key malformed";
    /// The request body is over the verifier's buffering limit.
    BodyTooLarge = "body-too-large", PAYLOAD_TOO_LARGE, "Request body too large";
    /// The request body failed while it was read.
    BodyUnreadable = "body-unreadable", BAD_REQUEST, "Request body unreadable";
    /// The request body did not arrive within the verifier's body-read timeout (a body
    /// shorter than its `Content-Length`, a sender that stalled); the key was not
    /// claimed, so the request can be sent again with it.
    BodyTimeout = "body-timeout", REQUEST_TIMEOUT, "Request body not received in time";
    /// The key was used before for a request with a different fingerprint.
    KeyReused = "key-reused", UNPROCESSABLE_ENTITY, "Idempotency key reused with a different request";
    /// A request with this key is still being processed.
    InProgress = "in-progress", CONFLICT, "A request with this idempotency key is in progress";
    /// The store cannot be reached; nothing was executed.
    StoreUnavailable = "store-unavailable", SERVICE_UNAVAILABLE, "Idempotency store unavailable";
    /// The store is at its bound (a record count or byte budget) and refused a new
    /// record; nothing was executed and nothing was evicted. Replays of existing records
    /// still work; the request can be sent again with the same key after `Retry-After`.
    StoreFull = "store-full", SERVICE_UNAVAILABLE, "Idempotency store full";
    /// The scope (tenant, API key, webhook sender) has spent its quota of new keys (or
    /// of claims in progress); nothing was recorded, so the same key sent again after
    /// `Retry-After` is processed normally. Never the stored answer of a key.
    QuotaExceeded = "quota-exceeded", TOO_MANY_REQUESTS, "Quota of new idempotency keys exceeded";
    /// A completed record exists but cannot be decoded.
    RecordUnreadable = "record-unreadable", INTERNAL_SERVER_ERROR, "Stored idempotency record unreadable";
    /// The request was executed, but its response was too large to keep.
    ResponseNotStored = "response-not-stored", GONE, "Original response was not stored";
    /// The scope extractor refused the request (a missing credential, say).
    ScopeRejected = "scope-rejected", UNAUTHORIZED, "Request scope rejected";
    /// The scope is malformed: its header was sent twice or empty, or its JSON field is
    /// not a string or number.
    InvalidScope = "invalid-scope", BAD_REQUEST, "Request scope malformed";
    /// A webhook delivery's signature is missing, malformed, stale or wrong; checked
    /// before the store is asked.
    SignatureRejected = "signature-rejected", UNAUTHORIZED, "Webhook signature rejected";
    /// The handler ran, but its response body failed; the key was released.
    ResponseFailed = "response-failed", INTERNAL_SERVER_ERROR, "Response body failed";
    /// The admin service (`server::admin::AdminService`, feature `admin`) has no
    /// record for this scope and key (or no such resource).
    RecordNotFound = "record-not-found", NOT_FOUND, "No idempotency record found";
    /// An admin request is malformed: a query parameter is missing or invalid, or the
    /// method is not allowed on the resource.
    AdminRequestInvalid = "admin-request-invalid", BAD_REQUEST, "Admin request malformed";
    /// The store does not implement the operation an admin request asked for.
    OperationUnsupported = "operation-unsupported", NOT_IMPLEMENTED, "Operation not supported by the store";
}

/// Other verifiers' names for the same cases: idemkit 1.0 (`urn:idemkit:payload-mismatch`,
/// `urn:idemkit:storage-error`, in `idemkit/problem_details.py`).
const ALIASES: &[(&str, Problem)] = &[
    ("payload-mismatch", Problem::KeyReused),
    ("storage-error", Problem::StoreUnavailable),
];

/// gRPC status codes (`google.rpc.Code`) that [`Problem::grpc_code`] gives.
mod grpc_code {
    pub(super) const INVALID_ARGUMENT: u8 = 3;
    pub(super) const NOT_FOUND: u8 = 5;
    pub(super) const DEADLINE_EXCEEDED: u8 = 4;
    pub(super) const ALREADY_EXISTS: u8 = 6;
    pub(super) const RESOURCE_EXHAUSTED: u8 = 8;
    pub(super) const FAILED_PRECONDITION: u8 = 9;
    pub(super) const ABORTED: u8 = 10;
    pub(super) const UNIMPLEMENTED: u8 = 12;
    pub(super) const INTERNAL: u8 = 13;
    pub(super) const UNAVAILABLE: u8 = 14;
    pub(super) const UNAUTHENTICATED: u8 = 16;
}

impl Problem {
    /// The gRPC status code (`google.rpc.Code`) this problem is given as to a gRPC
    /// call: `in-progress` is `ABORTED` (10), `key-reused` `ALREADY_EXISTS` (6),
    /// `store-unavailable` `UNAVAILABLE` (14), `store-full` and `quota-exceeded`
    /// `RESOURCE_EXHAUSTED` (8); the verifier's `Rejection::grpc_code`
    /// documents every case.
    ///
    /// ```
    /// use idemkey::protocol::Problem;
    /// assert_eq!(Problem::InProgress.grpc_code(), 10);
    /// assert_eq!(Problem::StoreUnavailable.grpc_code(), 14);
    /// ```
    #[must_use]
    pub const fn grpc_code(self) -> u8 {
        use grpc_code::*;
        match self {
            Problem::InProgress => ABORTED,
            Problem::KeyReused => ALREADY_EXISTS,
            Problem::MissingKey
            | Problem::InvalidKey
            | Problem::InvalidScope
            | Problem::BodyUnreadable
            | Problem::AdminRequestInvalid => INVALID_ARGUMENT,
            Problem::RecordNotFound => NOT_FOUND,
            Problem::OperationUnsupported => UNIMPLEMENTED,
            Problem::StoreUnavailable => UNAVAILABLE,
            // gRPC's code for "a per-user quota, or the entire file system is out of
            // space" (google.rpc.Code): both bounds.
            Problem::BodyTooLarge | Problem::StoreFull | Problem::QuotaExceeded => {
                RESOURCE_EXHAUSTED
            }
            Problem::BodyTimeout => DEADLINE_EXCEEDED,
            Problem::ResponseNotStored => FAILED_PRECONDITION,
            Problem::ScopeRejected | Problem::SignatureRejected => UNAUTHENTICATED,
            Problem::RecordUnreadable | Problem::ResponseFailed => INTERNAL,
        }
    }
}

impl Problem {
    /// The problem a `type` names: this crate's URN, or any URI whose last segment (after
    /// the last `:`, `/` or `#`) is a case name, as servers that mint their own type URIs
    /// for the same cases send them, or another verifier's name for the same case
    /// (idemkit's `payload-mismatch` is `key-reused`). `None` for anything else
    /// (`about:blank`).
    ///
    /// ```
    /// use idemkey::protocol::Problem;
    /// assert_eq!(Problem::from_type("urn:idemkit:payload-mismatch"), Some(Problem::KeyReused));
    /// assert_eq!(Problem::from_type("urn:idemkit:in-progress"), Some(Problem::InProgress));
    /// ```
    #[must_use]
    pub fn from_type(type_uri: &str) -> Option<Self> {
        let case = type_uri.rsplit([':', '/', '#']).next().unwrap_or(type_uri);
        Self::ALL
            .iter()
            .copied()
            .find(|p| p.name() == case)
            .or_else(|| {
                ALIASES
                    .iter()
                    .find(|(alias, _)| *alias == case)
                    .map(|&(_, p)| p)
            })
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a `Content-Type` value is `application/problem+json` (parameters and case
/// ignored).
///
/// ```
/// use http::HeaderValue;
/// use idemkey::protocol::problem::is_problem_json;
/// assert!(is_problem_json(&HeaderValue::from_static("application/problem+json; charset=utf-8")));
/// assert!(!is_problem_json(&HeaderValue::from_static("application/json")));
/// ```
#[must_use]
pub fn is_problem_json(content_type: &HeaderValue) -> bool {
    let essence = content_type
        .as_bytes()
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    essence.eq_ignore_ascii_case(PROBLEM_JSON.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_uri_has_the_prefix_and_parses_back() {
        for &p in Problem::ALL {
            assert_eq!(p.type_uri(), format!("{TYPE_PREFIX}{}", p.name()));
            assert_eq!(Problem::from_type(p.type_uri()), Some(p));
        }
    }

    #[test]
    fn other_types_are_not_ours() {
        for t in [
            "",
            "about:blank",
            "urn:idemkey:problem:",
            "xkey-reused",
            "key-reused-x",
        ] {
            assert_eq!(Problem::from_type(t), None, "{t:?}");
        }
    }
}
