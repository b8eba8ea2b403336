//! The vendor profiles, each fact cited from the vendor's public documentation (or, where
//! the documentation is silent, from the vendor's official SDK, and said so).

use std::time::Duration;

use super::{AnswerMatch, VendorProfile};
use idemkey_core::protocol::Problem;
use idemkey_core::protocol::headers::{
    CKO_IDEMPOTENCY_KEY, PAYPAL_REQUEST_ID, STRIPE_SHOULD_RETRY, TRANSIENT_ERROR, X_SHOULD_RETRY,
};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

impl VendorProfile {
    /// The IETF draft (`draft-ietf-httpapi-idempotency-key-header`) as this crate's
    /// verifier speaks it, and the default profile.
    ///
    /// - Key: `Idempotency-Key`, 1 to 255 visible ASCII characters.
    /// - Reused key: 400, 409 or 422 with a problem document (RFC 9457, `type`) naming
    ///   `key-reused`: this crate's `urn:idemkey:problem:key-reused` (422, or 400 in the
    ///   verifier's Stripe-compatible mode), any type URI ending in `key-reused`, and
    ///   idemkit 1.0's `urn:idemkit:payload-mismatch` (422 in its default mode, 409 in
    ///   its stripe mode). A 422 without such a body (a validation error) is an ordinary
    ///   answer.
    /// - In progress: 409 and 423 (idemkit's default mode answers a duplicate that
    ///   outwaited it with 423 and `Retry-After`).
    /// - Hints: `x-should-retry` and `Stripe-Should-Retry`, `retry-after-ms`,
    ///   `Retry-After`.
    /// - Retention: 24 h, this crate's verifier's default. The draft fixes none: "The
    ///   resource server SHOULD define such expiration policy and publish it in the
    ///   documentation."
    #[must_use]
    pub fn standard() -> Self {
        Self::new("standard")
            .with_key_reused(AnswerMatch::statuses([400, 409, 422]).problem(Problem::KeyReused))
    }

    /// Stripe (API v1).
    ///
    /// - Key: `Idempotency-Key`; "Idempotency keys are up to 255 characters long."
    ///   (<https://docs.stripe.com/idempotency>). Charset: docs silent.
    /// - Reused key: "The idempotency layer compares incoming parameters to those of the
    ///   original request and errors if they're not the same" (same page), with error
    ///   type `idempotency_error`. The page does not pin the status; stripe-node maps
    ///   `idempotency_error` only under 400 and 404 (`src/Error.ts`), so the rule is
    ///   400 or 404 with `{"error": {"type": "idempotency_error"}}`.
    /// - In progress: a request that "conflicts with another request that's executing
    ///   concurrently" is not saved and "You can retry these requests."
    ///   (<https://docs.stripe.com/api/idempotent_requests>); its status (409,
    ///   `idempotency_key_in_use`) is not on the pages read, and Stripe's SDKs retry every
    ///   409. Kept: the 409/423 baseline.
    /// - Hints: `Stripe-Should-Retry` only, as stripe-node's `_shouldRetry` reads it ("The
    ///   API may ask us not to retry ... or advise us to retry ...; we defer to that");
    ///   Stripe's SDKs read no `Retry-After` (this client still honours one if sent).
    /// - Replays: `Idempotent-Replayed: true`. Stripe stores "the status code and body of
    ///   the first request made with a given idempotency key after endpoint execution
    ///   begins ... including `500` errors", so a replayed 500 stays a 500.
    /// - Retention: 24 h, a floor: "You can remove keys from the system automatically
    ///   after they're at least 24 hours old." (<https://docs.stripe.com/idempotency>).
    ///   API v2 uses "a 30-day window" (<https://docs.stripe.com/error-low-level>).
    #[must_use]
    pub fn stripe() -> Self {
        Self::new("Stripe")
            .with_key_reused(
                AnswerMatch::statuses([400, 404]).json("/error/type", "idempotency_error"),
            )
            .with_should_retry_headers([STRIPE_SHOULD_RETRY])
            .with_retention(DAY)
    }

    /// Adyen (<https://docs.adyen.com/development-resources/api-idempotency>).
    ///
    /// - Key: `Idempotency-Key`; "a unique identifier for the message with a maximum of
    ///   64 characters". Charset: docs silent.
    /// - In progress: "If you submit a duplicate request before the first request has
    ///   completed, the API returns an HTTP 422 – Unprocessable Entity or HTTP 409 -
    ///   Conflict status with the error code 704", body `{"status": 409, "errorCode":
    ///   "704", "message": "request already processed or in progress", ...}`. That
    ///   section is quoted from secondary sources; the page itself could not be read
    ///   past its opening. Such a 422 is retried: it is the documented in-progress answer,
    ///   not a hint.
    /// - Hints: `Transient-Error: true|false` ("retry later with the same key"; also
    ///   from the quoted section).
    /// - Reused key with another payload: docs silent (as read). Replays: Adyen echoes the
    ///   `Idempotency-Key` header and documents no replay marker, so
    ///   [`IdempotencyInfo::replayed`](crate::IdempotencyInfo::replayed) reads
    ///   `false` on Adyen's replays.
    /// - Retention: "Idempotency keys are valid for a minimum period of 31 days after
    ///   first submission (but may be retained for longer)." Keys are per company account,
    ///   and "idempotency keys will not be checked for duplication in other regions".
    #[must_use]
    pub fn adyen() -> Self {
        Self::new("Adyen")
            .with_max_key_len(64)
            .with_in_progress(AnswerMatch::statuses([409, 422]).json("/errorCode", "704"))
            .with_should_retry_headers([TRANSIENT_ERROR])
            .with_retention(31 * DAY)
    }

    /// PayPal REST APIs (<https://developer.paypal.com/api/rest/reference/idempotency>).
    ///
    /// - Key: `PayPal-Request-Id`, "1 - 108" characters (the Orders v2 reference). "Not
    ///   all APIs support this header."
    /// - Replays: "PayPal returns the latest status of the previous request that used that
    ///   same header"; Orders v2 answers a replayed create with `200 OK` where the first
    ///   answer was `201`. Replay marker: docs silent.
    /// - In progress: "PayPal processes the first request and might fail the second
    ///   request"; the status of that failure is not documented. Kept: the 409/423
    ///   baseline.
    /// - Reused key with another payload: docs silent.
    /// - Retention, per API (the official server SDK's parameter docs): Orders "The server
    ///   stores keys for 6 hours" (up to 72 h on request), Payments 45 days,
    ///   Subscriptions 72 hours, Vault 3 hours. This profile carries the Orders window;
    ///   set another with [`with_retention`](Self::with_retention).
    #[must_use]
    pub fn paypal() -> Self {
        Self::new("PayPal")
            .with_key_header(PAYPAL_REQUEST_ID)
            .with_max_key_len(108)
            .with_retention(6 * HOUR)
    }

    /// Square (<https://developer.squareup.com/docs/build-basics/common-api-patterns/idempotency>).
    ///
    /// - Key: the `idempotency_key` field of the JSON request body. The client adds the
    ///   field to a body that lacks it; a body that has it carries the caller's key. A
    ///   request without a JSON object body fails with
    ///   [`Error::is_invalid_key`](crate::Error::is_invalid_key), unsent.
    /// - Length: per endpoint, from the constraint tables of Square's generated SDK docs
    ///   ("*Maximum Length*: `N`"): 45 for CreatePayment, UpdatePayment and most
    ///   payment calls (this profile's limit, the strictest), 64 for Terminal, 128 for
    ///   gift cards, loyalty and inventory, 192 for CreateOrder, CreateRefund, PayOrder,
    ///   255 for bookings ([`with_max_key_len`](Self::with_max_key_len)). "The number of
    ///   allowed characters might be less than the stated maximum, if multi-byte
    ///   characters are used": the limit is in bytes.
    /// - Reused key: "you get an error indicating that you used the idempotency key
    ///   previously", error code `IDEMPOTENCY_KEY_REUSED` in the `errors` array
    ///   (`{"errors": [{"category", "code", "detail", "field"}]}`). The status is not
    ///   documented (observed: 400), so the code decides in any 4xx.
    /// - Replays: "the endpoint returns the response as the first successful
    ///   CreatePayment response". Replay marker: docs silent.
    /// - In progress: docs silent (the 409/423 baseline is kept).
    /// - Retention: not published ("We do not publish a retention period for
    ///   CreatePayment idempotency keys", Square staff on the developer forum): 24 h is
    ///   assumed.
    #[must_use]
    pub fn square() -> Self {
        Self::new("Square")
            .with_key_in_json_body("idempotency_key")
            .with_max_key_len(45)
            .with_key_reused(
                AnswerMatch::statuses(400..=499).json("/errors/*/code", "IDEMPOTENCY_KEY_REUSED"),
            )
    }

    /// Checkout.com (<https://checkout.com/docs/payments/manage-payments/retry-a-payment>).
    ///
    /// - Key: `Cko-Idempotency-Key`, on payments, payment actions and transfers. Length
    ///   and charset: docs silent ("We strongly recommend using V4 UUIDs"); this crate's
    ///   255 applies.
    /// - Replays: "This key is cached in our system if the request returns a 2xx response
    ///   code"; later requests "return the same HTTP status code and response body"
    ///   (a support article says 202 instead). Replay marker: docs silent.
    /// - In progress: "Currently processing – You receive a 409 response." (it used to be
    ///   429, which is retried as well).
    /// - Reused key with another payload: docs silent.
    /// - Retention: "By default, keys expire after 24 hours for both the sandbox and
    ///   production environments."
    #[must_use]
    pub fn checkout() -> Self {
        Self::new("Checkout.com")
            .with_key_header(CKO_IDEMPOTENCY_KEY)
            .with_retention(DAY)
    }

    /// GoCardless (<https://gocardless.com/blog/idempotency-keys/>).
    ///
    /// - Key: `Idempotency-Key`. Length: docs silent (the official client sends UUID v4s).
    /// - Already executed: a repeat after the first request succeeded is answered
    ///   `409 Conflict` with `{"error": {"type": "invalid_state", "errors": [{"reason":
    ///   "idempotent_creation_conflict", "links": {"conflicting_resource_id": "PM1234"}}],
    ///   ...}}` ("A resource has already been created with this idempotency key"; body
    ///   as in the official Node client's fixture). It is neither "in progress" nor a
    ///   reused key: [`Error::is_already_executed`](crate::Error::is_already_executed)
    ///   keeps the response, whose body names the resource (the official client fetches
    ///   it).
    /// - Reused key with another payload, in-flight duplicates, retention: docs silent
    ///   (the 409/423 baseline is kept; 24 h is assumed).
    #[must_use]
    pub fn gocardless() -> Self {
        Self::new("GoCardless").with_already_executed(
            AnswerMatch::status(409)
                .json("/error/type", "invalid_state")
                .json("/error/errors/*/reason", "idempotent_creation_conflict"),
        )
    }

    /// APIs whose SDKs Stainless generates and that take idempotency keys: Orb
    /// (<https://docs.withorb.com/reference/idempotency>) and Modern Treasury
    /// (<https://docs.moderntreasury.com/reference/idempotent-requests>).
    ///
    /// - Key: `Idempotency-Key` (the SDKs send `stainless-node-retry-<uuid4>`); Orb: "a
    ///   max length of 64 characters" (Modern Treasury: docs silent).
    /// - In progress: 409 on both ("Orb will return a 409 resource conflict error if the
    ///   request was retried before the original request completed"; Modern Treasury
    ///   "will return a 409 for the newer request").
    /// - Reused key with another payload: Orb answers the same 409 ("reusing an
    ///   idempotency key with a different request payload will also result in a 409"),
    ///   so the two cannot be told apart and both are retried until `conflict`; Modern
    ///   Treasury: docs silent ("Idempotency keys are independent of the route").
    /// - Hints: `x-should-retry`, `retry-after-ms`, `Retry-After`, as the generated SDKs
    ///   read them (`shouldRetry` and `retryRequest` in orb-billing 6.11.0).
    /// - Replays: Orb sends `Idempotent-Replayed: true`.
    /// - Retention: 24 h, the shorter of the two ("we will save the result of that request
    ///   for 24 hours", Modern Treasury; Orb: "Keys will expire after 48 hours").
    ///
    /// OpenAI's and Anthropic's SDKs are Stainless-generated too but send no key; for
    /// them this profile only brings the hint semantics.
    #[must_use]
    pub fn stainless() -> Self {
        Self::new("Stainless-style")
            .with_max_key_len(64)
            .with_should_retry_headers([X_SHOULD_RETRY])
            .with_retention(DAY)
    }
}
