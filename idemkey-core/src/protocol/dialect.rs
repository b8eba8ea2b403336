//! Vendor dialects: how one API speaks idempotency, described once for both halves.
//!
//! A [`Dialect`] says where the key travels ([`KeyPlacement`]), how long it may be, which
//! header marks a replay, how long keys are kept, and the exact status, headers and body
//! of each answer the verifier gives instead of running the handler ([`Refusal`]). The
//! client builds its `VendorProfile` from it (what it sends, and how it tells each
//! answer apart: [`Recognition`]); the verifier's `IdempotencyLayer::dialect` answers in
//! it. One description per vendor, so the two halves cannot drift apart.
//!
//! Every fact is cited from the vendor's public documentation (or from its official
//! SDK, and said so). Where the documentation is silent, the constructor says so and
//! names what was chosen: then the answer uses the vendor's error envelope with a code
//! of this crate's choosing, and `Retry-After` (which every dialect sends with an
//! in-progress answer: the verifier knows when the running request's lease ends).
//!
//! ```
//! use idemkey::protocol::dialect::{Dialect, KeyPlacement, Refusal};
//! let stripe = Dialect::stripe();
//! let reply = stripe.reply(Refusal::KeyReused, "use a new key", None);
//! assert_eq!(reply.status, 400);
//! assert_eq!(reply.body["error"]["type"], "idempotency_error");
//! assert_eq!(
//!     Dialect::square().key_placement(),
//!     &KeyPlacement::JsonBodyField("idempotency_key".into())
//! );
//! ```

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use super::headers::{
    CKO_IDEMPOTENCY_KEY, IDEMPOTENCY_KEY, PAYPAL_REQUEST_ID, STRIPE_SHOULD_RETRY, TRANSIENT_ERROR,
    X_SHOULD_RETRY,
};
use super::problem::PROBLEM_JSON;
use super::{Problem, ReplayHeader, retry_after};
use crate::key::MAX_KEY_LEN;

/// The `true|false` hints read where a vendor's SDKs document none of their own.
static BOTH_HINTS: [HeaderName; 2] = [X_SHOULD_RETRY, STRIPE_SHOULD_RETRY];
static STRIPE_HINT: [HeaderName; 1] = [STRIPE_SHOULD_RETRY];
static STAINLESS_HINT: [HeaderName; 1] = [X_SHOULD_RETRY];
static ADYEN_HINT: [HeaderName; 1] = [TRANSIENT_ERROR];

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Where the key travels.
///
/// ```
/// use idemkey::protocol::dialect::KeyPlacement;
/// let header = KeyPlacement::Header(idemkey::protocol::headers::IDEMPOTENCY_KEY);
/// assert_eq!(header.to_string(), "the `idempotency-key` header");
/// assert_eq!(KeyPlacement::JsonBodyField("idempotency_key".into()).to_string(),
///     "the `idempotency_key` field of the JSON body");
/// ```
///
/// Exhaustive on purpose: both halves match every placement, so a new one cannot be
/// added to one half alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPlacement {
    /// In this request header (sent bare).
    Header(HeaderName),
    /// In this top-level field of the JSON request body (Square's `idempotency_key`). A
    /// body that already has the field carries the caller's key; otherwise the client
    /// adds the field, leaving the rest of the body's bytes as they are.
    JsonBodyField(Cow<'static, str>),
}

impl fmt::Display for KeyPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "the `{name}` header"),
            Self::JsonBodyField(field) => write!(f, "the `{field}` field of the JSON body"),
        }
    }
}

/// An answer the verifier gives instead of running the handler, as a dialect shapes it.
///
/// ```
/// use idemkey::protocol::dialect::Refusal;
/// assert_eq!(Refusal::ALL.len(), 6);
/// assert_eq!(Refusal::InProgress.to_string(), "in progress");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The key was used before for a different request (`key-reused`).
    KeyReused,
    /// A request with the key is still running (`in-progress`).
    InProgress,
    /// A request with the key completed before, and the vendor answers repeats with a
    /// conflict instead of the stored response (GoCardless's
    /// `idempotent_creation_conflict`). Dialects that replay never give it.
    AlreadyExecuted,
    /// The route requires a key and the request has none (`missing-key`).
    MissingKey,
    /// The key breaks the dialect's length or charset rules (`invalid-key`).
    InvalidKey,
    /// The verifier's store cannot be reached; nothing ran (`store-unavailable`).
    StoreUnavailable,
}

impl Refusal {
    /// Every refusal, in declaration order.
    pub const ALL: [Refusal; 6] = [
        Self::KeyReused,
        Self::InProgress,
        Self::AlreadyExecuted,
        Self::MissingKey,
        Self::InvalidKey,
        Self::StoreUnavailable,
    ];

    /// The refusal a verifier problem stands for, if a dialect shapes it (the other
    /// problems, such as `store-full` or `body-too-large`, are answered as problem
    /// documents in every dialect).
    ///
    /// ```
    /// use idemkey::protocol::{Problem, dialect::Refusal};
    /// assert_eq!(Refusal::of(Problem::KeyReused), Some(Refusal::KeyReused));
    /// assert_eq!(Refusal::of(Problem::StoreFull), None);
    /// ```
    #[must_use]
    pub const fn of(problem: Problem) -> Option<Self> {
        match problem {
            Problem::KeyReused => Some(Self::KeyReused),
            Problem::InProgress => Some(Self::InProgress),
            Problem::MissingKey => Some(Self::MissingKey),
            Problem::InvalidKey => Some(Self::InvalidKey),
            Problem::StoreUnavailable => Some(Self::StoreUnavailable),
            _ => None,
        }
    }

    /// The verifier problem this refusal is (`already-executed` has none of its own:
    /// `None`).
    #[must_use]
    pub const fn problem(self) -> Option<Problem> {
        match self {
            Self::KeyReused => Some(Problem::KeyReused),
            Self::InProgress => Some(Problem::InProgress),
            Self::MissingKey => Some(Problem::MissingKey),
            Self::InvalidKey => Some(Problem::InvalidKey),
            Self::StoreUnavailable => Some(Problem::StoreUnavailable),
            Self::AlreadyExecuted => None,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::KeyReused => "key reused",
            Self::InProgress => "in progress",
            Self::AlreadyExecuted => "already executed",
            Self::MissingKey => "missing key",
            Self::InvalidKey => "invalid key",
            Self::StoreUnavailable => "store unavailable",
        })
    }
}

/// A dialect's answer, ready to send: status, headers (`Content-Type` and the retry
/// hints included) and JSON body.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Reply {
    /// The HTTP status.
    pub status: StatusCode,
    /// `Content-Type`, `Retry-After` and the vendor's hint headers.
    pub headers: HeaderMap,
    /// The JSON body.
    pub body: Value,
}

/// How a client tells one of a dialect's answers apart: its statuses, and the JSON
/// fields (or problem type) that mark it. The client's profile turns it into a rule.
///
/// ```
/// use idemkey::protocol::dialect::{Dialect, Refusal};
/// let r = Dialect::square().recognition(Refusal::KeyReused).expect("documented");
/// assert!(r.statuses().any(|s| s == 400));
/// assert_eq!(r.fields(), [("/errors/*/code", "IDEMPOTENCY_KEY_REUSED")]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recognition {
    statuses: Statuses,
    problem: Option<Problem>,
    fields: Vec<(&'static str, &'static str)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Statuses {
    Only(&'static [u16]),
    /// Any 4xx: the vendor does not document the status, the body decides.
    ClientErrors,
}

impl Recognition {
    /// The statuses the answer may come with (the verifier sends the first).
    pub fn statuses(&self) -> impl Iterator<Item = u16> + '_ {
        let (list, range) = match &self.statuses {
            Statuses::Only(list) => (*list, None),
            Statuses::ClientErrors => (&[][..], Some(400..=499)),
        };
        list.iter().copied().chain(range.into_iter().flatten())
    }

    /// A problem document (`type`) naming this problem marks the answer.
    #[must_use]
    pub fn problem(&self) -> Option<Problem> {
        self.problem
    }

    /// JSON pointers (RFC 6901; a `*` segment stands for any element of an array or
    /// member of an object) and the string each must find.
    #[must_use]
    pub fn fields(&self) -> &[(&'static str, &'static str)] {
        &self.fields
    }
}

/// The error envelope a vendor wraps its answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Envelope {
    /// RFC 9457, this crate's `urn:idemkey:problem:*` types.
    Problem,
    /// `{"error": {"type", "code", "message"}}`.
    Stripe,
    /// `{"status", "errorCode", "message", "errorType"}`.
    Adyen,
    /// `{"name", "message", "details": [{"issue", "description"}]}`.
    PayPal,
    /// `{"errors": [{"category", "code", "detail", "field"}]}`.
    Square,
    /// `{"request_id", "error_type", "error_codes": [..]}`.
    Checkout,
    /// `{"error": {"type", "code", "message", "errors": [{"reason", "message"}]}}`.
    GoCardless,
    /// Orb's problem-like `{"type", "status", "title", "detail"}`.
    Orb,
}

/// One answer of a dialect: the statuses (the first is sent), the envelope's kind (its
/// type, category or name) and code.
#[derive(Debug, Clone, Copy)]
struct Spec {
    statuses: &'static [u16],
    /// Any 4xx is recognised (the sent status is `statuses[0]`).
    any_client_error: bool,
    kind: &'static str,
    code: &'static str,
    /// The answer carries no mark of its own: a client cannot tell it from the
    /// dialect's in-progress answer (Orb's 409).
    unmarked: bool,
}

const fn spec(statuses: &'static [u16], kind: &'static str, code: &'static str) -> Spec {
    Spec {
        statuses,
        any_client_error: false,
        kind,
        code,
        unmarked: false,
    }
}

/// How one API speaks idempotency; see the [module docs](self).
///
/// ```
/// use idemkey::protocol::dialect::Dialect;
/// let d: Dialect = "checkout".parse()?;
/// assert_eq!(d.name(), "Checkout.com");
/// assert_eq!(d.replay_header(), None, "Checkout.com marks no replays");
/// assert_eq!(Dialect::ALL_NAMES.len(), 8);
/// # Ok::<(), idemkey::protocol::dialect::UnknownDialect>(())
/// ```
#[derive(Debug, Clone)]
pub struct Dialect {
    id: &'static str,
    name: &'static str,
    key: KeyPlacement,
    max_key_len: usize,
    replay: Option<ReplayHeader>,
    should_retry: &'static [HeaderName],
    /// Sent with an in-progress answer: `(header, value)`.
    in_progress_hints: &'static [(&'static str, &'static str)],
    retention: Option<Duration>,
    envelope: Envelope,
    key_reused: Spec,
    in_progress: Spec,
    already_executed: Option<Spec>,
    missing_key: Spec,
    invalid_key: Spec,
    store_unavailable: Spec,
}

impl Default for Dialect {
    /// [`Dialect::standard`].
    fn default() -> Self {
        Self::standard()
    }
}

/// A dialect name [`Dialect::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dialect {0:?}; use one of: {names}", names = Dialect::ALL_NAMES.join(", "))]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;

    /// By [`Dialect::id`] (`"stripe"`), ASCII case ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::all()
            .into_iter()
            .find(|d| d.id.eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownDialect(s.to_owned()))
    }
}

impl Dialect {
    /// The ids [`Dialect::from_str`] takes, in the order of [`Dialect::all`].
    pub const ALL_NAMES: [&'static str; 8] = [
        "standard",
        "stripe",
        "stainless",
        "adyen",
        "paypal",
        "square",
        "checkout",
        "gocardless",
    ];

    /// Every dialect, [`Dialect::standard`] first.
    #[must_use]
    pub fn all() -> Vec<Dialect> {
        vec![
            Self::standard(),
            Self::stripe(),
            Self::stainless(),
            Self::adyen(),
            Self::paypal(),
            Self::square(),
            Self::checkout(),
            Self::gocardless(),
        ]
    }

    /// The IETF draft (`draft-ietf-httpapi-idempotency-key-header`) as this crate's
    /// verifier speaks it: the default of both halves.
    ///
    /// - Key: `Idempotency-Key`, 1 to 255 visible ASCII characters.
    /// - Answers: RFC 9457 problem documents (`application/problem+json`) with this
    ///   crate's `urn:idemkey:problem:*` types: `422 key-reused` (a client also reads
    ///   a `key-reused` type under 400 and 409, and idemkit 1.0's
    ///   `urn:idemkit:payload-mismatch`), `409 in-progress` with `Retry-After` (a
    ///   client also reads 423, idemkit's), `400 missing-key`, `400 invalid-key`,
    ///   `503 store-unavailable` with `Retry-After`.
    /// - Replays: `Idempotent-Replayed: true`. Hints read: `x-should-retry` and
    ///   `Stripe-Should-Retry`.
    /// - Retention: none documented (the draft: "The resource server SHOULD define such
    ///   expiration policy and publish it in the documentation"); 24 h assumed.
    #[must_use]
    pub fn standard() -> Self {
        Self {
            id: "standard",
            name: "standard",
            key: KeyPlacement::Header(IDEMPOTENCY_KEY),
            max_key_len: MAX_KEY_LEN,
            replay: Some(ReplayHeader::IdempotentReplayed),
            should_retry: &BOTH_HINTS,
            in_progress_hints: &[],
            retention: None,
            envelope: Envelope::Problem,
            key_reused: spec(&[422, 400, 409], "", ""),
            in_progress: spec(&[409, 423], "", ""),
            already_executed: None,
            missing_key: spec(&[400], "", ""),
            invalid_key: spec(&[400], "", ""),
            store_unavailable: spec(&[503], "", ""),
        }
    }

    /// Stripe (API v1).
    ///
    /// - Key: `Idempotency-Key`; "Idempotency keys are up to 255 characters long."
    ///   (<https://docs.stripe.com/idempotency>). Charset: docs silent; visible ASCII
    ///   (this crate's rule).
    /// - Reused key: "The idempotency layer compares incoming parameters to those of the
    ///   original request and errors if they're not the same" (same page), with error
    ///   type `idempotency_error`. The page does not pin the status; stripe-node maps
    ///   `idempotency_error` only under 400 and 404 (`src/Error.ts`): the verifier
    ///   sends `400 {"error": {"type": "idempotency_error", "message": ...}}`; a client
    ///   reads it under 400 or 404.
    /// - In progress: a request that "conflicts with another request that's executing
    ///   concurrently" is not saved and "You can retry these requests."
    ///   (<https://docs.stripe.com/api/idempotent_requests>); Stripe's error code list
    ///   names `idempotency_key_in_use`; its status is not on the pages read: `409`
    ///   (Stripe's SDKs retry every 409) with `{"error": {"type":
    ///   "invalid_request_error", "code": "idempotency_key_in_use"}}` and
    ///   `Stripe-Should-Retry: true`.
    /// - Missing and invalid keys: Stripe takes requests without a key; a required key
    ///   missing (the verifier's default on unsafe methods), or one over 255
    ///   characters, is chosen to be `400 invalid_request_error` with `param:
    ///   "Idempotency-Key"`. Store unavailable: chosen `503 api_error` with
    ///   `Stripe-Should-Retry: true`.
    /// - Hints read: `Stripe-Should-Retry` only, as stripe-node's `_shouldRetry` reads it.
    /// - Replays: `Idempotent-Replayed: true`. Stripe stores "the status code and body of
    ///   the first request made with a given idempotency key after endpoint execution
    ///   begins ... including `500` errors".
    /// - Retention: 24 h, a floor: "You can remove keys from the system automatically
    ///   after they're at least 24 hours old." API v2 uses "a 30-day window"
    ///   (<https://docs.stripe.com/error-low-level>).
    #[must_use]
    pub fn stripe() -> Self {
        Self {
            id: "stripe",
            name: "Stripe",
            key: KeyPlacement::Header(IDEMPOTENCY_KEY),
            max_key_len: MAX_KEY_LEN,
            replay: Some(ReplayHeader::IdempotentReplayed),
            should_retry: &STRIPE_HINT,
            in_progress_hints: &[("stripe-should-retry", "true")],
            retention: Some(DAY),
            envelope: Envelope::Stripe,
            key_reused: spec(&[400, 404], "idempotency_error", ""),
            in_progress: spec(&[409], "invalid_request_error", "idempotency_key_in_use"),
            already_executed: None,
            missing_key: spec(&[400], "invalid_request_error", "parameter_missing"),
            invalid_key: spec(&[400], "invalid_request_error", "parameter_invalid_string"),
            store_unavailable: spec(&[503], "api_error", ""),
        }
    }

    /// APIs whose SDKs Stainless generates and that take idempotency keys: Orb
    /// (<https://docs.withorb.com/reference/idempotency>) and Modern Treasury
    /// (<https://docs.moderntreasury.com/reference/idempotent-requests>); the answers
    /// are Orb's.
    ///
    /// - Key: `Idempotency-Key` (the SDKs send `stainless-node-retry-<uuid4>`); Orb: "a
    ///   max length of 64 characters" (Modern Treasury: docs silent).
    /// - In progress: 409 on both ("Orb will return a 409 resource conflict error if the
    ///   request was retried before the original request completed"), body as Orb's
    ///   error reference shows it: `{"type":
    ///   "https://docs.withorb.com/reference/error-responses#409-resource-conflict",
    ///   "status": 409, "title": "Resource conflict"}`, with `x-should-retry: true`.
    /// - Reused key with another payload: Orb answers the same 409 ("reusing an
    ///   idempotency key with a different request payload will also result in a 409"),
    ///   so a client cannot tell the two apart: it retries until `conflict`.
    /// - Missing and invalid keys: docs silent; chosen: Orb's `400` request validation
    ///   error (`#400-request-validation-errors`). Store unavailable: chosen `503` with
    ///   `x-should-retry: true`.
    /// - Hints read: `x-should-retry`, `retry-after-ms`, `Retry-After`, as the generated
    ///   SDKs read them (`shouldRetry` and `retryRequest` in orb-billing 6.11.0).
    /// - Replays: Orb sends `Idempotent-Replayed: true`.
    /// - Retention: 24 h, the shorter of the two ("we will save the result of that request
    ///   for 24 hours", Modern Treasury; Orb: "Keys will expire after 48 hours").
    #[must_use]
    pub fn stainless() -> Self {
        const CONFLICT: &str =
            "https://docs.withorb.com/reference/error-responses#409-resource-conflict";
        const INVALID: &str =
            "https://docs.withorb.com/reference/error-responses#400-request-validation-errors";
        const UNAVAILABLE: &str =
            "https://docs.withorb.com/reference/error-responses#500-internal-server-error";
        Self {
            id: "stainless",
            name: "Stainless-style",
            key: KeyPlacement::Header(IDEMPOTENCY_KEY),
            max_key_len: 64,
            replay: Some(ReplayHeader::IdempotentReplayed),
            should_retry: &STAINLESS_HINT,
            in_progress_hints: &[("x-should-retry", "true")],
            retention: Some(DAY),
            envelope: Envelope::Orb,
            key_reused: Spec {
                unmarked: true,
                ..spec(&[409], CONFLICT, "Resource conflict")
            },
            in_progress: spec(&[409], CONFLICT, "Resource conflict"),
            already_executed: None,
            missing_key: spec(&[400], INVALID, "Request validation error"),
            invalid_key: spec(&[400], INVALID, "Request validation error"),
            store_unavailable: spec(&[503], UNAVAILABLE, "Internal server error"),
        }
    }

    /// Adyen (<https://docs.adyen.com/development-resources/api-idempotency>).
    ///
    /// - Key: `Idempotency-Key`; "a unique identifier for the message with a maximum of
    ///   64 characters". Charset: docs silent.
    /// - In progress: "If you submit a duplicate request before the first request has
    ///   completed, the API returns an HTTP 422 – Unprocessable Entity or HTTP 409 -
    ///   Conflict status with the error code 704", body `{"status": 409, "errorCode":
    ///   "704", "message": "request already processed or in progress", ...}`, and
    ///   `Transient-Error: true` ("retry later with the same key"). That section is
    ///   quoted from secondary sources. The verifier sends the 422 (named first); a
    ///   client reads both.
    /// - Reused key with another payload, missing and invalid keys, store unavailable:
    ///   docs silent; chosen: Adyen's error object with `errorType: "validation"` and
    ///   codes of this crate's choosing (`idempotency_key_reused` under 422,
    ///   `idempotency_key_missing` and `idempotency_key_invalid` under 400), and
    ///   `503` `errorType: "internal"` with `Transient-Error: true`.
    /// - Replays: Adyen echoes the `Idempotency-Key` header and documents no replay
    ///   marker: the verifier sends none.
    /// - Retention: "Idempotency keys are valid for a minimum period of 31 days after
    ///   first submission (but may be retained for longer)."
    #[must_use]
    pub fn adyen() -> Self {
        Self {
            id: "adyen",
            name: "Adyen",
            key: KeyPlacement::Header(IDEMPOTENCY_KEY),
            max_key_len: 64,
            replay: None,
            should_retry: &ADYEN_HINT,
            in_progress_hints: &[("transient-error", "true")],
            retention: Some(31 * DAY),
            envelope: Envelope::Adyen,
            key_reused: spec(&[422], "validation", "idempotency_key_reused"),
            in_progress: spec(&[422, 409], "validation", "704"),
            already_executed: None,
            missing_key: spec(&[400], "validation", "idempotency_key_missing"),
            invalid_key: spec(&[400], "validation", "idempotency_key_invalid"),
            store_unavailable: spec(&[503], "internal", "idempotency_store_unavailable"),
        }
    }

    /// PayPal REST APIs (<https://developer.paypal.com/api/rest/reference/idempotency>).
    ///
    /// - Key: `PayPal-Request-Id`, "1 - 108" characters (the Orders v2 reference). "Not
    ///   all APIs support this header."
    /// - Reused key: the Payment Method Tokens v3 error `PAYPAL_REQUEST_ID_PREVIOUSLY_USED`
    ///   ("The PayPal-Request-ID has already been used for another request.", listed
    ///   as "semantically incorrect, or failed business validation": `422
    ///   UNPROCESSABLE_ENTITY`), in PayPal's error object `{"name", "message",
    ///   "details": [{"issue", "description"}], "debug_id"}`.
    /// - In progress: "PayPal processes the first request and might fail the second
    ///   request"; the status is not documented: chosen `409` with issue
    ///   `REQUEST_IN_PROGRESS` (a name of this crate's choosing).
    /// - Missing and invalid keys: chosen `400 INVALID_REQUEST` with issues
    ///   `MISSING_REQUIRED_PARAMETER` and `INVALID_PARAMETER_VALUE` (PayPal's
    ///   validation issues). Store unavailable: chosen `503 SERVICE_UNAVAILABLE`.
    /// - Replays: "PayPal returns the latest status of the previous request that used
    ///   that same header"; the verifier replays the stored response as it was (Orders
    ///   v2 answers a replayed create 200 where the first answer was 201: not modelled).
    ///   Replay marker: docs silent, none sent.
    /// - Retention, per API (the official server SDK's parameter docs): Orders "The server
    ///   stores keys for 6 hours" (up to 72 h on request), Payments 45 days,
    ///   Subscriptions 72 hours, Vault 3 hours. This dialect carries the Orders window.
    #[must_use]
    pub fn paypal() -> Self {
        Self {
            id: "paypal",
            name: "PayPal",
            key: KeyPlacement::Header(PAYPAL_REQUEST_ID),
            max_key_len: 108,
            replay: None,
            should_retry: &BOTH_HINTS,
            in_progress_hints: &[],
            retention: Some(6 * HOUR),
            envelope: Envelope::PayPal,
            key_reused: spec(
                &[422],
                "UNPROCESSABLE_ENTITY",
                "PAYPAL_REQUEST_ID_PREVIOUSLY_USED",
            ),
            in_progress: spec(&[409], "RESOURCE_CONFLICT", "REQUEST_IN_PROGRESS"),
            already_executed: None,
            missing_key: spec(&[400], "INVALID_REQUEST", "MISSING_REQUIRED_PARAMETER"),
            invalid_key: spec(&[400], "INVALID_REQUEST", "INVALID_PARAMETER_VALUE"),
            store_unavailable: spec(&[503], "SERVICE_UNAVAILABLE", "SERVICE_UNAVAILABLE"),
        }
    }

    /// Square (<https://developer.squareup.com/docs/build-basics/common-api-patterns/idempotency>).
    ///
    /// - Key: the `idempotency_key` field of the JSON request body.
    /// - Length: per endpoint, from the constraint tables of Square's generated SDK docs
    ///   ("*Maximum Length*: `N`"): 45 for CreatePayment (this dialect's limit, the
    ///   strictest), up to 255 for bookings. "The number of allowed characters might be
    ///   less than the stated maximum, if multi-byte characters are used": the limit is
    ///   in bytes.
    /// - Reused key: "you get an error indicating that you used the idempotency key
    ///   previously", error code `IDEMPOTENCY_KEY_REUSED` in the `errors` array
    ///   (`{"errors": [{"category", "code", "detail", "field"}]}`). The status is not
    ///   documented (observed: 400): the verifier sends 400, a client reads the code in
    ///   any 4xx.
    /// - Missing and invalid keys: Square's generic codes `MISSING_REQUIRED_PARAMETER`
    ///   and `VALUE_TOO_LONG` (`400 INVALID_REQUEST_ERROR`, `field: "idempotency_key"`).
    ///   Store unavailable: Square's `503 SERVICE_UNAVAILABLE` (`API_ERROR`).
    /// - In progress: docs silent; chosen `409` with code `IDEMPOTENCY_KEY_IN_USE` (a
    ///   name of this crate's choosing).
    /// - Replays: "the endpoint returns the response as the first successful
    ///   CreatePayment response". Replay marker: docs silent, none sent.
    /// - Retention: not published ("We do not publish a retention period for
    ///   CreatePayment idempotency keys", Square staff on the developer forum).
    #[must_use]
    pub fn square() -> Self {
        Self {
            id: "square",
            name: "Square",
            key: KeyPlacement::JsonBodyField(Cow::Borrowed("idempotency_key")),
            max_key_len: 45,
            replay: None,
            should_retry: &BOTH_HINTS,
            in_progress_hints: &[],
            retention: None,
            envelope: Envelope::Square,
            key_reused: Spec {
                any_client_error: true,
                ..spec(&[400], "INVALID_REQUEST_ERROR", "IDEMPOTENCY_KEY_REUSED")
            },
            in_progress: spec(&[409], "INVALID_REQUEST_ERROR", "IDEMPOTENCY_KEY_IN_USE"),
            already_executed: None,
            missing_key: spec(
                &[400],
                "INVALID_REQUEST_ERROR",
                "MISSING_REQUIRED_PARAMETER",
            ),
            invalid_key: spec(&[400], "INVALID_REQUEST_ERROR", "VALUE_TOO_LONG"),
            store_unavailable: spec(&[503], "API_ERROR", "SERVICE_UNAVAILABLE"),
        }
    }

    /// Checkout.com (<https://www.checkout.com/docs/developer-resources/api/idempotency>).
    ///
    /// - Key: `Cko-Idempotency-Key`, on payments, payment actions and transfers. Length
    ///   and charset: docs silent ("We strongly recommend using V4 UUIDs"); this crate's
    ///   255 applies.
    /// - In progress: "Currently processing – You receive a 409 response." (it used to
    ///   be 429: "this has been replaced with the 409 – Conflict with another request
    ///   being processed", Checkout.com support). Body: docs silent; chosen Checkout's
    ///   error object `{"request_id", "error_type", "error_codes"}` with code
    ///   `idempotency_key_in_use`.
    /// - Reused key with another payload, missing and invalid keys: docs silent;
    ///   chosen `422 request_invalid` (Checkout's validation answer) with codes
    ///   `idempotency_key_reused`, `idempotency_key_required`,
    ///   `idempotency_key_invalid`. Store unavailable: chosen `503`.
    /// - Replays: later requests "return the same HTTP status code and response body as
    ///   the original request". Replay marker: docs silent, none sent.
    /// - Retention: "By default, keys will expire after 24 hours for production
    ///   environments" (120 seconds in the sandbox).
    #[must_use]
    pub fn checkout() -> Self {
        Self {
            id: "checkout",
            name: "Checkout.com",
            key: KeyPlacement::Header(CKO_IDEMPOTENCY_KEY),
            max_key_len: MAX_KEY_LEN,
            replay: None,
            should_retry: &BOTH_HINTS,
            in_progress_hints: &[],
            retention: Some(DAY),
            envelope: Envelope::Checkout,
            key_reused: spec(&[422], "request_invalid", "idempotency_key_reused"),
            in_progress: spec(&[409], "request_conflict", "idempotency_key_in_use"),
            already_executed: None,
            missing_key: spec(&[422], "request_invalid", "idempotency_key_required"),
            invalid_key: spec(&[422], "request_invalid", "idempotency_key_invalid"),
            store_unavailable: spec(&[503], "service_unavailable", "service_unavailable"),
        }
    }

    /// GoCardless (<https://gocardless.com/blog/idempotency-keys/>).
    ///
    /// - Key: `Idempotency-Key`. Length: docs silent (the official client sends UUID v4s).
    /// - Already executed: a repeat after the first request succeeded is answered
    ///   `409 Conflict` with `{"error": {"type": "invalid_state", "errors": [{"reason":
    ///   "idempotent_creation_conflict", "links": {"conflicting_resource_id": "PM1234"}}],
    ///   ...}}` ("A resource has already been created with this idempotency key"; body
    ///   as in the official Node client's fixture) instead of a replay. The verifier
    ///   does the same for a completed key, naming the `id` of the stored response's
    ///   resource.
    /// - Reused key with another payload, in-flight duplicates, missing and invalid
    ///   keys, store unavailable: docs silent; chosen: GoCardless's error object with
    ///   reasons of this crate's choosing: `422 invalid_api_usage`
    ///   `idempotency_key_reused`, `409 invalid_state` `idempotent_creation_in_progress`
    ///   (a client reads any other 409 as in progress), `400 invalid_api_usage`
    ///   `idempotency_key_missing` / `idempotency_key_invalid`, `503 gocardless`
    ///   `service_unavailable`.
    /// - Retention: docs silent.
    #[must_use]
    pub fn gocardless() -> Self {
        Self {
            id: "gocardless",
            name: "GoCardless",
            key: KeyPlacement::Header(IDEMPOTENCY_KEY),
            max_key_len: MAX_KEY_LEN,
            replay: None,
            should_retry: &BOTH_HINTS,
            in_progress_hints: &[],
            retention: None,
            envelope: Envelope::GoCardless,
            key_reused: spec(&[422], "invalid_api_usage", "idempotency_key_reused"),
            in_progress: spec(&[409], "invalid_state", "idempotent_creation_in_progress"),
            already_executed: Some(spec(
                &[409],
                "invalid_state",
                "idempotent_creation_conflict",
            )),
            missing_key: spec(&[400], "invalid_api_usage", "idempotency_key_missing"),
            invalid_key: spec(&[400], "invalid_api_usage", "idempotency_key_invalid"),
            store_unavailable: spec(&[503], "gocardless", "service_unavailable"),
        }
    }

    /// The dialect's id, as [`Dialect::from_str`] and `idemkey proxy --dialect` take it
    /// (`"checkout"`).
    #[must_use]
    pub fn id(&self) -> &'static str {
        self.id
    }

    /// The vendor's name (`"Checkout.com"`).
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where the key travels.
    #[must_use]
    pub fn key_placement(&self) -> &KeyPlacement {
        &self.key
    }

    /// The longest key accepted, in bytes (keys are 1 or more visible ASCII characters
    /// in every dialect: the vendors document no other charset).
    #[must_use]
    pub fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// The header replays are marked with (`None`: the vendor marks none).
    #[must_use]
    pub fn replay_header(&self) -> Option<ReplayHeader> {
        self.replay
    }

    /// The `true|false` retry hint headers the vendor's SDKs read.
    #[must_use]
    pub fn should_retry_headers(&self) -> &'static [HeaderName] {
        self.should_retry
    }

    /// How long keys are kept, where documented.
    #[must_use]
    pub fn retention(&self) -> Option<Duration> {
        self.retention
    }

    /// Whether the verifier answers a repeat of a completed request with
    /// [`Refusal::AlreadyExecuted`] rather than the stored response (GoCardless).
    #[must_use]
    pub fn refuses_replays(&self) -> bool {
        self.already_executed.is_some()
    }

    fn spec(&self, refusal: Refusal) -> Option<&Spec> {
        Some(match refusal {
            Refusal::KeyReused => &self.key_reused,
            Refusal::InProgress => &self.in_progress,
            Refusal::AlreadyExecuted => return self.already_executed.as_ref(),
            Refusal::MissingKey => &self.missing_key,
            Refusal::InvalidKey => &self.invalid_key,
            Refusal::StoreUnavailable => &self.store_unavailable,
        })
    }

    /// The status the verifier answers `refusal` with (`None`: the dialect never gives
    /// it).
    ///
    /// ```
    /// use idemkey::protocol::dialect::{Dialect, Refusal};
    /// assert_eq!(Dialect::adyen().status(Refusal::InProgress), Some(http::StatusCode::UNPROCESSABLE_ENTITY));
    /// assert_eq!(Dialect::stripe().status(Refusal::AlreadyExecuted), None);
    /// ```
    #[must_use]
    pub fn status(&self, refusal: Refusal) -> Option<StatusCode> {
        self.spec(refusal)
            .and_then(|s| StatusCode::from_u16(s.statuses[0]).ok())
    }

    /// How a client tells `refusal` apart: `None` where it cannot (the dialect never
    /// gives it, or gives it unmarked, like Orb's 409 for a reused key, which reads as
    /// in progress), and for the answers a client needs no rule for (missing and
    /// invalid keys, an unavailable store: ordinary 4xx and 5xx).
    #[must_use]
    pub fn recognition(&self, refusal: Refusal) -> Option<Recognition> {
        if matches!(
            refusal,
            Refusal::MissingKey | Refusal::InvalidKey | Refusal::StoreUnavailable
        ) {
            return None;
        }
        let spec = self.spec(refusal)?;
        if spec.unmarked {
            return None;
        }
        let statuses = if spec.any_client_error {
            Statuses::ClientErrors
        } else {
            Statuses::Only(spec.statuses)
        };
        let (problem, fields) = match self.envelope {
            Envelope::Problem => (
                refusal.problem().filter(|_| refusal != Refusal::InProgress),
                vec![],
            ),
            Envelope::Stripe if spec.code.is_empty() => (None, vec![("/error/type", spec.kind)]),
            Envelope::Stripe => (None, vec![("/error/code", spec.code)]),
            Envelope::Adyen => (None, vec![("/errorCode", spec.code)]),
            Envelope::PayPal => (None, vec![("/details/*/issue", spec.code)]),
            Envelope::Square => (None, vec![("/errors/*/code", spec.code)]),
            Envelope::Checkout => (None, vec![("/error_codes/*", spec.code)]),
            Envelope::GoCardless if refusal == Refusal::AlreadyExecuted => (
                None,
                vec![
                    ("/error/type", spec.kind),
                    ("/error/errors/*/reason", spec.code),
                ],
            ),
            // In progress is read by status alone in these envelopes (any 409 that
            // no other rule claims), as the client's baseline reads it.
            Envelope::GoCardless | Envelope::Orb if refusal == Refusal::InProgress => {
                (None, vec![])
            }
            Envelope::GoCardless => (None, vec![("/error/errors/*/reason", spec.code)]),
            Envelope::Orb => (None, vec![("/type", spec.kind)]),
        };
        Some(Recognition {
            statuses,
            problem,
            fields,
        })
    }

    /// The answer to `refusal` in this dialect, with `detail` as its human-readable
    /// message and, where the refusal asks for a later retry, `Retry-After` (whole
    /// seconds, rounded up). A dialect that never gives `refusal`
    /// ([`Refusal::AlreadyExecuted`] outside GoCardless) answers it as its reused-key
    /// answer would be shaped, with the standard status `409`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemkey::protocol::dialect::{Dialect, Refusal};
    /// let r = Dialect::adyen().reply(Refusal::InProgress, "still running", Some(Duration::from_millis(1500)));
    /// assert_eq!(r.status, 422);
    /// assert_eq!(r.body["errorCode"], "704");
    /// assert_eq!(r.headers["transient-error"], "true");
    /// assert_eq!(r.headers["retry-after"], "2");
    /// ```
    #[must_use]
    pub fn reply(&self, refusal: Refusal, detail: &str, retry_after: Option<Duration>) -> Reply {
        let fallback = spec(&[409], "", "");
        let spec = self.spec(refusal).copied().unwrap_or(fallback);
        let status = StatusCode::from_u16(spec.statuses[0]).unwrap_or(StatusCode::CONFLICT);
        let code = status.as_u16();
        let body = match self.envelope {
            Envelope::Problem => {
                let problem = refusal.problem().unwrap_or(Problem::KeyReused);
                let mut v = json!({
                    "type": problem.type_uri(),
                    "title": problem.title(),
                    "status": code,
                    "detail": detail,
                });
                if let Some(ra) = retry_after {
                    v["retry_after"] = retry_after::whole_seconds(ra).into();
                }
                v
            }
            Envelope::Stripe => {
                let mut error = json!({"type": spec.kind, "message": detail});
                if !spec.code.is_empty() {
                    error["code"] = spec.code.into();
                }
                if matches!(refusal, Refusal::MissingKey | Refusal::InvalidKey) {
                    error["param"] = "Idempotency-Key".into();
                }
                json!({ "error": error })
            }
            Envelope::Adyen => json!({
                "status": code,
                "errorCode": spec.code,
                "message": detail,
                "errorType": spec.kind,
            }),
            Envelope::PayPal => json!({
                "name": spec.kind,
                "message": detail,
                "details": [{"issue": spec.code, "description": detail}],
                "debug_id": "idemkey-verifier",
            }),
            Envelope::Square => {
                let mut error = json!({"category": spec.kind, "code": spec.code, "detail": detail});
                if matches!(
                    refusal,
                    Refusal::MissingKey | Refusal::InvalidKey | Refusal::KeyReused
                ) {
                    error["field"] = "idempotency_key".into();
                }
                json!({ "errors": [error] })
            }
            Envelope::Checkout => json!({
                "request_id": "idemkey-verifier",
                "error_type": spec.kind,
                "error_codes": [spec.code],
                "message": detail,
            }),
            Envelope::GoCardless => json!({"error": {
                "message": detail,
                "errors": [{"reason": spec.code, "message": detail}],
                "documentation_url": "https://developer.gocardless.com/api-reference#errors",
                "type": spec.kind,
                "request_id": "idemkey-verifier",
                "code": code,
            }}),
            Envelope::Orb => json!({
                "type": spec.kind,
                "status": code,
                "title": spec.code,
                "detail": detail,
            }),
        };
        let mut headers = HeaderMap::new();
        let content_type = if self.envelope == Envelope::Problem {
            PROBLEM_JSON
        } else {
            "application/json"
        };
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Some(ra) = retry_after {
            headers.insert(header::RETRY_AFTER, retry_after::to_header_value(ra));
        }
        let hints: &[(&str, &str)] = match refusal {
            Refusal::InProgress | Refusal::StoreUnavailable => self.in_progress_hints,
            _ => &[],
        };
        for (name, value) in hints {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        Reply {
            status,
            headers,
            body,
        }
    }
}

/// The answer `Dialect::reply` gives for [`Refusal::AlreadyExecuted`], naming the
/// resource the first request made: `links.conflicting_resource_id` set to `id` in the
/// first of its errors (GoCardless's shape). Other shapes are left as they are.
///
/// ```
/// use idemkey::protocol::dialect::{Dialect, Refusal, name_conflicting_resource};
/// let mut r = Dialect::gocardless().reply(Refusal::AlreadyExecuted, "created before", None);
/// name_conflicting_resource(&mut r, "PM123");
/// assert_eq!(r.body["error"]["errors"][0]["links"]["conflicting_resource_id"], "PM123");
/// ```
pub fn name_conflicting_resource(reply: &mut Reply, id: &str) {
    if let Some(first) = reply.body.pointer_mut("/error/errors/0") {
        first["links"] = json!({ "conflicting_resource_id": id });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_names_list_the_known() {
        for (d, name) in Dialect::all().iter().zip(Dialect::ALL_NAMES) {
            assert_eq!(d.id(), name);
            assert_eq!(name.parse::<Dialect>().map(|d| d.id()), Ok(name));
        }
        let err = "strip".parse::<Dialect>().expect_err("unknown");
        assert!(err.to_string().contains("stripe, stainless"), "{err}");
    }

    #[test]
    fn every_reply_has_a_json_body_and_an_error_status() {
        for d in Dialect::all() {
            for r in Refusal::ALL {
                let reply = d.reply(r, "detail", Some(Duration::from_secs(1)));
                assert!(reply.status.is_client_error() || reply.status.is_server_error());
                assert!(reply.body.is_object(), "{} {r}", d.id());
            }
        }
    }
}
