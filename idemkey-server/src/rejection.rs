//! Rejections: every answer the verifier gives instead of running the handler, as an
//! RFC 9457 `application/problem+json` response that carries its own status.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};

use super::body::ResponseBody;
use idemkey_core::protocol::dialect::{Dialect, Refusal, Reply};
use idemkey_core::protocol::problem::{PROBLEM_JSON, Problem};
use idemkey_core::protocol::retry_after;

/// Why the verifier answered instead of the handler.
///
/// Carries its status ([`Rejection::status`]), a stable problem type
/// ([`Rejection::problem_type`]) and, for the cases a client should retry later, a
/// `Retry-After` ([`Rejection::retry_after`]). Turn it into a response with
/// [`Rejection::into_response`] (works as an axum handler's return value too, since
/// `http::Response<ResponseBody>` implements axum's `IntoResponse`).
///
/// The cases, their statuses and `type`s are the [`Problem`]s of the wire protocol.
///
/// ```
/// use idemkey::server::Rejection;
/// let r = Rejection::missing_key("the `Idempotency-Key` header");
/// assert_eq!(r.status(), http::StatusCode::BAD_REQUEST);
/// assert_eq!(r.problem_type(), "missing-key");
/// let resp = r.into_response();
/// assert_eq!(resp.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Debug, Clone)]
pub struct Rejection {
    problem: Problem,
    status: StatusCode,
    detail: String,
    retry_after: Option<Duration>,
    close: bool,
}

impl Rejection {
    /// `problem` with its default status.
    pub(crate) fn of(problem: Problem, detail: impl Into<String>) -> Self {
        Self::new(problem, problem.default_status(), detail)
    }

    pub(crate) fn new(problem: Problem, status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            problem,
            status,
            detail: detail.into(),
            retry_after: None,
            close: false,
        }
    }

    /// 400 `missing-key`: the route requires a key and the request has none.
    #[must_use]
    pub fn missing_key(source: &str) -> Self {
        Self::of(
            Problem::MissingKey,
            format!(
                "this endpoint requires an idempotency key in {source}; send a unique value (a random UUID) and reuse it when retrying"
            ),
        )
    }

    /// 400 `missing-key` for a webhook route: the delivery lacks the id by which the
    /// route tells deliveries of `sender` (a preset's name) apart, at `source`. Speaks
    /// to the sender: its deliveries carry that id, so a delivery without it is not one
    /// of its deliveries, or lost the id on the way.
    ///
    /// ```
    /// use idemkey::server::Rejection;
    /// let r = Rejection::missing_delivery_id("github", "the `X-GitHub-Delivery` header");
    /// assert_eq!(r.status(), 400);
    /// assert!(r.detail().contains("github deliveries"));
    /// ```
    #[must_use]
    pub fn missing_delivery_id(sender: &str, source: &str) -> Self {
        Self::of(
            Problem::MissingKey,
            format!(
                "this endpoint receives {sender} deliveries and tells them apart by {source}, \
                 which this delivery lacks; every {sender} delivery carries it (the same on \
                 redeliveries of one event): send {sender} deliveries here, and check that \
                 nothing on the way drops it"
            ),
        )
    }

    /// 400 `invalid-key`: the key is not 1 to 255 characters of visible ASCII.
    #[must_use]
    pub fn invalid_key(why: impl fmt::Display) -> Self {
        Self::of(Problem::InvalidKey, why.to_string())
    }

    /// 413 `body-too-large`: the body is over the verifier's buffering limit.
    #[must_use]
    pub fn body_too_large(limit: usize) -> Self {
        Self::of(
            Problem::BodyTooLarge,
            format!("the request body is larger than {limit} bytes, the limit of this endpoint"),
        )
    }

    /// 400 `body-unreadable`: the request body failed while it was read.
    #[must_use]
    pub fn body_unreadable(why: impl fmt::Display) -> Self {
        Self::of(
            Problem::BodyUnreadable,
            format!("the request body could not be read ({why}); send the request again"),
        )
    }

    /// 408 `body-timeout`: the request body did not arrive within `limit`; the key was
    /// not claimed. The response asks to close the connection (`Connection: close`, as
    /// RFC 9110 §15.5.9 advises for 408): what is left of the body is never read.
    #[must_use]
    pub fn body_timeout(limit: Duration) -> Self {
        let mut r = Self::of(
            Problem::BodyTimeout,
            format!(
                "the request body did not arrive within {} ms (is it shorter than its Content-Length?); nothing was executed and the key was not used: send the request again with the same key",
                limit.as_millis()
            ),
        );
        r.close = true;
        r
    }

    /// `key-reused` with `status` (422, or 400 in Stripe-compatible mode).
    #[must_use]
    pub fn key_reused(status: StatusCode) -> Self {
        Self::new(
            Problem::KeyReused,
            status,
            "this idempotency key was already used for a different request (method, path, content type or body differ); use a new key for a new request",
        )
    }

    /// 409 `in-progress`, retry after `lease_remaining` (rounded up, at least 1 s).
    #[must_use]
    pub fn in_progress(lease_remaining: Duration) -> Self {
        let mut r = Self::of(
            Problem::InProgress,
            "a request with this idempotency key is still being processed; retry after the time given in Retry-After to receive its response",
        );
        r.retry_after = Some(Duration::from_secs(retry_after::whole_seconds(
            lease_remaining,
        )));
        r
    }

    /// 429 `quota-exceeded`, retry after `retry_after` (rounded up to whole seconds, at
    /// least 1 s): the scope sent more new keys than its
    /// [quota](crate::EngineBuilder::quota) allows (or has as many claims in progress
    /// as it may). Nothing was executed or recorded, so the same key sent again after
    /// the wait is processed normally. Never stored as a key's answer.
    ///
    /// ```
    /// use idemkey::server::Rejection;
    /// use std::time::Duration;
    /// let r = Rejection::quota_exceeded(Duration::from_millis(1200));
    /// assert_eq!(r.status(), 429);
    /// assert_eq!(r.problem_type(), "quota-exceeded");
    /// assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
    /// assert!(r.is_quota_exceeded());
    /// ```
    #[must_use]
    pub fn quota_exceeded(retry_after: Duration) -> Self {
        Self::of(
            Problem::QuotaExceeded,
            "this client sent more new idempotency keys than its quota allows; nothing was executed or recorded: send the request again with the same key after the time given in Retry-After",
        )
        .with_retry_after(retry_after)
    }

    /// This rejection, sent with `Retry-After: after` (whole seconds, rounded up).
    pub(crate) fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(Duration::from_secs(retry_after::whole_seconds(after)));
        self
    }

    /// 503 `store-unavailable`, retry after `retry_after`; nothing was executed.
    #[must_use]
    pub fn store_unavailable(after: Duration) -> Self {
        Self::of(
            Problem::StoreUnavailable,
            "the idempotency store cannot be reached, so the request was not executed; retry with the same key later",
        )
        .with_retry_after(after)
    }

    /// 503 `store-full`, retry after `after`: the store is at its bound and refused a
    /// new key; nothing was executed, nothing was evicted, and existing keys are still
    /// replayed.
    ///
    /// ```
    /// use idemkey::server::Rejection;
    /// let r = Rejection::store_full(std::time::Duration::from_secs(2));
    /// assert_eq!((r.status(), r.problem_type()), (http::StatusCode::SERVICE_UNAVAILABLE, "store-full"));
    /// assert!(r.is_store_full() && !r.is_store_unavailable());
    /// assert_eq!(r.retry_after(), Some(std::time::Duration::from_secs(2)));
    /// assert_eq!(r.grpc_code(), 8); // RESOURCE_EXHAUSTED
    /// ```
    #[must_use]
    pub fn store_full(after: Duration) -> Self {
        Self::of(
            Problem::StoreFull,
            "the idempotency store is full, so this new key was not recorded and the request was not executed; retry with the same key after the time given in Retry-After",
        )
        .with_retry_after(after)
    }

    /// 500 `record-unreadable`: a completed record exists but cannot be decoded.
    #[must_use]
    pub fn record_unreadable(why: impl fmt::Display) -> Self {
        Self::of(
            Problem::RecordUnreadable,
            format!(
                "the request was executed before, but its stored response cannot be read ({why}); it will not be executed again"
            ),
        )
    }

    /// 410 `response-not-stored`: the request was executed, but its response was larger
    /// than the storage limit and was not kept.
    #[must_use]
    pub fn response_not_stored(size_hint: u64, limit: usize) -> Self {
        Self::of(
            Problem::ResponseNotStored,
            format!(
                "the request with this idempotency key was executed, but its response (over {size_hint} bytes) exceeded the storage limit of {limit} bytes and cannot be replayed; it will not be executed again; look the result up instead"
            ),
        )
    }

    /// `scope-rejected` with a status of the scope extractor's choice (401 for a
    /// missing credential, say).
    #[must_use]
    pub fn scope_rejected(status: StatusCode, detail: impl Into<String>) -> Self {
        Self::new(Problem::ScopeRejected, status, detail)
    }

    /// 400 `invalid-scope`: the scope is there but malformed (its header sent twice or
    /// empty, its JSON field an object).
    #[must_use]
    pub fn invalid_scope(why: impl fmt::Display) -> Self {
        Self::of(Problem::InvalidScope, why.to_string())
    }

    /// 401 `signature-rejected`: a webhook delivery's signature does not verify
    /// (missing, malformed, stale, or made with another secret). A
    /// [`SignatureError`](super::webhook::SignatureError) converts into it.
    #[must_use]
    pub fn signature_rejected(why: impl fmt::Display) -> Self {
        Self::of(Problem::SignatureRejected, why.to_string())
    }

    /// 500 `response-failed`: the handler ran but its response body failed while it
    /// was read; the key was released so that a retry executes again.
    #[must_use]
    pub fn response_failed(why: impl fmt::Display) -> Self {
        Self::of(
            Problem::ResponseFailed,
            format!("the response body failed while it was read ({why}); retry with the same key"),
        )
    }

    /// The HTTP status of the problem response.
    #[must_use]
    pub const fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem's case name, stable across releases (`"key-reused"`).
    #[must_use]
    pub const fn problem_type(&self) -> &'static str {
        self.problem.name()
    }

    /// The problem this rejection answers with.
    #[must_use]
    pub const fn problem(&self) -> Problem {
        self.problem
    }

    /// The human-readable explanation sent as `detail`.
    #[must_use]
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The `Retry-After` sent with `in-progress`, `store-unavailable`, `store-full` and
    /// `quota-exceeded`.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// `true` for `in-progress` (409).
    #[must_use]
    pub fn is_in_progress(&self) -> bool {
        self.problem == Problem::InProgress
    }

    /// `true` for `key-reused` (422 or 400).
    #[must_use]
    pub fn is_key_reused(&self) -> bool {
        self.problem == Problem::KeyReused
    }

    /// `true` for `store-unavailable` (503).
    #[must_use]
    pub fn is_store_unavailable(&self) -> bool {
        self.problem == Problem::StoreUnavailable
    }

    /// `true` for `store-full` (503).
    #[must_use]
    pub fn is_store_full(&self) -> bool {
        self.problem == Problem::StoreFull
    }

    /// `true` for `quota-exceeded` (429).
    #[must_use]
    pub fn is_quota_exceeded(&self) -> bool {
        self.problem == Problem::QuotaExceeded
    }

    /// `true` for `missing-key` and `invalid-key`.
    #[must_use]
    pub fn is_key_error(&self) -> bool {
        matches!(self.problem, Problem::MissingKey | Problem::InvalidKey)
    }

    /// The problem document (RFC 9457).
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "type": self.problem.type_uri(),
            "title": self.problem.title(),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let (Some(ra), Some(obj)) = (self.retry_after, v.as_object_mut()) {
            obj.insert("retry_after".into(), ra.as_secs().into());
        }
        v
    }

    /// The `application/problem+json` response, with `Retry-After` where it applies.
    #[must_use]
    pub fn into_response(self) -> http::Response<ResponseBody> {
        let body = Bytes::from(self.to_json().to_string());
        let mut resp = http::Response::new(ResponseBody::full(body));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(ra) = self.retry_after {
            h.insert(header::RETRY_AFTER, retry_after::to_header_value(ra));
        }
        if self.close {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// A reply of a vendor dialect as the layer's response.
pub(crate) fn reply_response(reply: Reply) -> http::Response<ResponseBody> {
    let body = Bytes::from(reply.body.to_string());
    let mut resp = http::Response::new(ResponseBody::full(body));
    *resp.status_mut() = reply.status;
    *resp.headers_mut() = reply.headers;
    resp
}

impl Rejection {
    /// The response to this rejection in a vendor's `dialect`: its status, body and
    /// hint headers for the answers a dialect shapes (a reused key, in progress, a
    /// missing or invalid key, an unavailable store: see
    /// [`Refusal`](idemkey_core::protocol::dialect::Refusal)); every other problem is
    /// the problem document of [`Rejection::into_response`], as in every dialect.
    /// [`Dialect::standard`] gives exactly [`Rejection::into_response`].
    ///
    /// ```
    /// use idemkey::protocol::Dialect;
    /// use idemkey::server::Rejection;
    /// let r = Rejection::missing_key("the `idempotency_key` field of the JSON body");
    /// let resp = r.into_dialect_response(&Dialect::square());
    /// assert_eq!(resp.status(), 400);
    /// assert_eq!(resp.headers()["content-type"], "application/json");
    /// ```
    #[must_use]
    pub fn into_dialect_response(self, dialect: &Dialect) -> http::Response<ResponseBody> {
        match Refusal::of(self.problem) {
            Some(refusal) if dialect.id() != Dialect::standard().id() => {
                let mut reply = dialect.reply(refusal, &self.detail, self.retry_after);
                if self.close {
                    reply
                        .headers
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                reply_response(reply)
            }
            _ => self.into_response(),
        }
    }
}

/// The gRPC status codes the layer answers with (`google.rpc.Code`).
impl Rejection {
    /// The gRPC status code this rejection is given as to a gRPC call
    /// ([`Rejection::into_grpc_response`]):
    ///
    /// | problem | code |
    /// |---|---|
    /// | `in-progress` | `ABORTED` (10): a concurrency conflict; retry the call |
    /// | `key-reused` | `ALREADY_EXISTS` (6): the key exists, bound to another request; retrying cannot help, use a new key |
    /// | `missing-key`, `invalid-key`, `invalid-scope`, `body-unreadable` | `INVALID_ARGUMENT` (3) |
    /// | `store-unavailable` | `UNAVAILABLE` (14): retryable, nothing ran |
    /// | `admin-request-invalid`, `record-not-found`, `operation-unsupported` (admin service) | `INVALID_ARGUMENT` (3), `NOT_FOUND` (5), `UNIMPLEMENTED` (12) |
    /// | `body-too-large`, `quota-exceeded` | `RESOURCE_EXHAUSTED` (8), as gRPC answers a message over its limit or a quota spent |
    /// | `store-full` | `RESOURCE_EXHAUSTED` (8): the store's bound is reached; retryable later, nothing ran |
    /// | `body-timeout` | `DEADLINE_EXCEEDED` (4) |
    /// | `response-not-stored` | `FAILED_PRECONDITION` (9): it ran, its answer cannot be replayed |
    /// | `scope-rejected`, `signature-rejected` | `UNAUTHENTICATED` (16) |
    /// | `record-unreadable`, `response-failed` | `INTERNAL` (13) |
    ///
    /// `key-reused` is `ALREADY_EXISTS` rather than `FAILED_PRECONDITION`: the gRPC
    /// guide keeps `FAILED_PRECONDITION` for a state the client can fix and then retry
    /// the same call, which a reused key never allows, while `ALREADY_EXISTS` says the
    /// entity the client named (the key) exists already, the way Google's request-id
    /// APIs answer a reused request id.
    ///
    /// ```
    /// use idemkey::server::Rejection;
    /// assert_eq!(Rejection::in_progress(std::time::Duration::from_secs(1)).grpc_code(), 10);
    /// assert_eq!(Rejection::key_reused(http::StatusCode::UNPROCESSABLE_ENTITY).grpc_code(), 6);
    /// ```
    #[must_use]
    pub const fn grpc_code(&self) -> u8 {
        self.problem.grpc_code()
    }

    /// The answer to a gRPC call (`Content-Type: application/grpc*`), the gRPC way: a
    /// trailers-only response, HTTP `200` with `grpc-status` ([`Rejection::grpc_code`])
    /// and `grpc-message` (the detail, percent-encoded), and, where the problem says
    /// when to retry, `grpc-retry-pushback-ms` (gRPC's server pushback) with the
    /// `Retry-After`. The layer answers gRPC calls so.
    ///
    /// ```
    /// use idemkey::server::Rejection;
    /// let resp = Rejection::store_unavailable(std::time::Duration::from_secs(2)).into_grpc_response();
    /// assert_eq!(resp.status(), http::StatusCode::OK);
    /// assert_eq!(resp.headers()["grpc-status"], "14");
    /// assert_eq!(resp.headers()["grpc-retry-pushback-ms"], "2000");
    /// assert_eq!(resp.headers()["content-type"], "application/grpc");
    /// ```
    #[must_use]
    pub fn into_grpc_response(self) -> http::Response<ResponseBody> {
        let mut resp = http::Response::new(ResponseBody::default());
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(
            "grpc-status",
            HeaderValue::from(u16::from(self.grpc_code())),
        );
        let message = crate::grpc::encode_message(&self.detail);
        if let Ok(v) = HeaderValue::try_from(message) {
            h.insert("grpc-message", v);
        }
        if let Some(ra) = self.retry_after {
            let ms = u64::try_from(ra.as_millis()).unwrap_or(u64::MAX);
            h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
        }
        resp
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.problem, self.status, self.detail)
    }
}

impl std::error::Error for Rejection {}

impl From<Rejection> for http::Response<ResponseBody> {
    fn from(r: Rejection) -> Self {
        r.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_never_overflows() {
        let secs = |r: Rejection| r.retry_after().map(|d| d.as_secs());
        assert_eq!(secs(Rejection::in_progress(Duration::ZERO)), Some(1));
        assert_eq!(
            secs(Rejection::in_progress(Duration::from_millis(1500))),
            Some(2)
        );
        assert_eq!(
            secs(Rejection::store_unavailable(Duration::from_secs(2))),
            Some(2)
        );
        // `Duration::MAX` (and anything with a fraction past u64::MAX - 1 s) saturates.
        assert_eq!(
            secs(Rejection::store_unavailable(Duration::MAX)),
            Some(u64::MAX)
        );
        let resp = Rejection::in_progress(Duration::MAX).into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], u64::MAX.to_string());
    }
}
