//! The layer's policies: which requests must carry a key ([`KeyRequirement`]), what a
//! duplicate of a running request gets ([`InProgressPolicy`]), and which handler
//! responses are kept and replayed and which release the key so that a retry executes
//! again ([`OutcomePolicy`], giving each outcome its [`Disposition`]).
//!
//! ```
//! use std::time::Duration;
//! use idemkey::server::policy::{InProgressPolicy, KeyRequirement, OutcomePolicy};
//! use idemkey::server::{Engine, IdempotencyLayer};
//! use idemkey::store::MemoryStore;
//!
//! let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
//!     .require(KeyRequirement::Optional)
//!     .in_progress(InProgressPolicy::Wait(Duration::from_secs(5)))
//!     .policy(OutcomePolicy::began_executing());
//! # let _ = layer;
//! ```

use std::time::Duration;

use http::StatusCode;

use idemkey_core::protocol::status::{is_refused_as_sent, is_transient};

pub use crate::layer::KeyRequirement;
pub use crate::quota::{Quota, QuotaError};

/// What the verifier does with a handler's outcome: keep it, or release the key.
///
/// Not an outcome itself: the outcome is the handler's answer (the client's
/// [`outbox::Outcome`](https://docs.rs/idemkey-client/latest/idemkey_client/outbox/struct.Outcome.html)
/// is such an answer, as recorded by the caller); an [`OutcomePolicy`] gives each
/// outcome its disposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Keep the response for the retention period and replay it to every retry.
    Store,
    /// Forget the claim: the next request with this key executes the handler again.
    Release,
}

/// Decides per response status whether the outcome is stored or the key released.
///
/// A stored outcome is replayed to every retry for the retention period; a released key
/// lets the next request with it run the handler again. Two classes of answers are
/// released by default, both written once in [`protocol::status`](idemkey_core::protocol::status):
///
/// - **nothing was done, try again** ([`is_transient`]): 5xx, `408 Request Timeout` and
///   `429 Too Many Requests`, the answers a client is expected to retry;
/// - **refused as sent** ([`is_refused_as_sent`]): the answers that judge the request
///   message itself before anything ran: `400`, `401`, `403`, `404`, `405`, `415` and
///   the like. A `PUT` to a `POST`-only route (`405`), a typo in the path (`404`), a
///   missing credential (`401`) or a request the handler cannot parse (`400`) does not
///   burn its key: once corrected, the request runs with the same key. This is Stripe's
///   rule: results are saved only once an endpoint began executing.
///
/// Everything else is stored: 2xx, 3xx, and the 4xx a handler gives after judging the
/// request against the state it found (`402`, `409`, `410`, `422`, ...).
///
/// **`400`.** A handler's `400` is released (RFC 9110 §15.5.1: the server "cannot or
/// will not process the request due to something that is perceived to be a client
/// error"), so the corrected request can reuse the key. A handler that does work and
/// *then* answers `400` should answer something else (`409`, `422`) or use a policy of
/// its own. The verifier's own `400 missing-key` / `invalid-key` and
/// `422 key-reused` are answered before any claim and never reach the policy.
///
/// Policies:
///
/// - [`OutcomePolicy::default`]: as above.
/// - [`OutcomePolicy::began_executing`]: Stripe's behaviour: store every answer once the
///   handler began executing, 5xx included (a retry of a request that failed with 500
///   gets the same 500 back); release only the refused-as-sent class.
/// - [`OutcomePolicy::store_all`]: store every answer, even those refused as sent.
/// - [`OutcomePolicy::success_only`]: store 2xx only (webhook receivers: only a 2xx
///   acknowledges a delivery, every other answer lets the redelivery run again).
/// - [`OutcomePolicy::custom`]: your own function of the status.
///
/// ```
/// use idemkey::server::{policy::OutcomePolicy, policy::Disposition};
/// use http::StatusCode;
/// let p = OutcomePolicy::default();
/// assert_eq!(p.decide(StatusCode::CREATED), Disposition::Store);
/// assert_eq!(p.decide(StatusCode::CONFLICT), Disposition::Store);
/// assert_eq!(p.decide(StatusCode::UNPROCESSABLE_ENTITY), Disposition::Store);
/// assert_eq!(p.decide(StatusCode::NOT_FOUND), Disposition::Release);
/// assert_eq!(p.decide(StatusCode::METHOD_NOT_ALLOWED), Disposition::Release);
/// assert_eq!(p.decide(StatusCode::TOO_MANY_REQUESTS), Disposition::Release);
/// assert_eq!(p.decide(StatusCode::BAD_GATEWAY), Disposition::Release);
/// let stripe = OutcomePolicy::began_executing();
/// assert_eq!(stripe.decide(StatusCode::BAD_GATEWAY), Disposition::Store);
/// assert_eq!(stripe.decide(StatusCode::UNAUTHORIZED), Disposition::Release);
/// assert_eq!(OutcomePolicy::store_all().decide(StatusCode::NOT_FOUND), Disposition::Store);
/// assert_eq!(OutcomePolicy::success_only().decide(StatusCode::CONFLICT), Disposition::Release);
/// let only_2xx = OutcomePolicy::custom(|s| if s.is_success() { Disposition::Store } else { Disposition::Release });
/// assert_eq!(only_2xx.decide(StatusCode::CONFLICT), Disposition::Release);
/// ```
#[derive(Clone, Copy)]
pub struct OutcomePolicy(fn(StatusCode) -> Disposition);

impl OutcomePolicy {
    /// Store every answer, even those that say the request was refused as sent
    /// (`404`, `405`, ...): a key is then used up by the first request that reached the
    /// layer, whatever became of it.
    #[must_use]
    pub const fn store_all() -> Self {
        Self(|_| Disposition::Store)
    }

    /// Store every answer once the handler began executing, 5xx included; release the
    /// key only when the answer says the request was refused as sent
    /// ([`is_refused_as_sent`]). Stripe's API behaves so ("Idempotent requests": the
    /// status and body of the first request are saved once the endpoint's execution
    /// began, `500` errors included; a request that failed validation saves nothing).
    #[must_use]
    pub const fn began_executing() -> Self {
        Self(|s| {
            if is_refused_as_sent(s) {
                Disposition::Release
            } else {
                Disposition::Store
            }
        })
    }

    /// Store 2xx responses only; release the key on every other answer.
    ///
    /// The policy of the [webhook presets](super::webhook::Preset::layer): a webhook
    /// sender redelivers every answer that is not 2xx and expects the event to be
    /// processed then, so only a 2xx acknowledges a delivery.
    #[must_use]
    pub const fn success_only() -> Self {
        Self(|s| {
            if s.is_success() {
                Disposition::Store
            } else {
                Disposition::Release
            }
        })
    }

    /// Decide with your own function.
    #[must_use]
    pub const fn custom(f: fn(StatusCode) -> Disposition) -> Self {
        Self(f)
    }

    /// The outcome for a response with `status`.
    #[must_use]
    pub fn decide(&self, status: StatusCode) -> Disposition {
        (self.0)(status)
    }
}

fn default_decision(status: StatusCode) -> Disposition {
    if is_transient(status) || is_refused_as_sent(status) {
        Disposition::Release
    } else {
        Disposition::Store
    }
}

impl Default for OutcomePolicy {
    fn default() -> Self {
        Self(default_decision)
    }
}

impl std::fmt::Debug for OutcomePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutcomePolicy(..)")
    }
}

/// What the layer does with a duplicate that arrives while the first request with its
/// key (and fingerprint) still runs.
///
/// - [`InProgressPolicy::Reject`], the default: `409 in-progress` at once, with
///   `Retry-After`, as the IETF draft says; the client retries.
/// - [`InProgressPolicy::Wait`]: the duplicate waits up to the given time for the first
///   request's answer and gets its replay (or runs itself, if the first request
///   released the key); past that, `409` with `Retry-After`. This spares the client a
///   retry and the server a second round trip, at the cost of a connection held while
///   it waits. The store wakes waiters when it can notify (memory, Redis pub/sub,
///   PostgreSQL `LISTEN`/`NOTIFY` with `notify(true)`) and they poll otherwise (see
///   [`Store::watch`](crate::store::Store::watch)). A duplicate with another
///   fingerprint is still rejected at once (`422 key-reused`).
///
/// ```
/// use idemkey::server::{Engine, IdempotencyLayer, policy::InProgressPolicy};
/// use idemkey::store::MemoryStore;
/// use std::time::Duration;
/// let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()))
///     .in_progress(InProgressPolicy::Wait(Duration::from_secs(10)));
/// # let _ = layer;
/// assert_eq!(InProgressPolicy::default(), InProgressPolicy::Reject);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InProgressPolicy {
    /// `409 in-progress` at once (the default).
    #[default]
    Reject,
    /// Wait up to this long for the first request's outcome, then `409 in-progress`.
    Wait(Duration),
}
