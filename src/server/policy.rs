//! The outcome policy: which handler responses are kept and replayed, and which release
//! the key so that a retry executes again.

use http::StatusCode;

/// What happens to a key once its handler answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Keep the response for the retention period and replay it to every retry.
    Store,
    /// Forget the claim: the next request with this key executes the handler again.
    Release,
}

/// Decides per response status whether the outcome is stored or the key released.
///
/// - [`OutcomePolicy::default`]: store 2xx, 3xx and deterministic 4xx; release on 5xx,
///   `408 Request Timeout` and `429 Too Many Requests`, the answers a client is expected
///   to retry and that usually mean nothing was done.
/// - [`OutcomePolicy::store_all`]: store every response once execution began (Stripe's
///   behaviour): a retry of a request that failed with 500 gets the same 500 back.
/// - [`OutcomePolicy::success_only`]: store 2xx only (webhook receivers: only a 2xx
///   acknowledges a delivery, every other answer lets the redelivery run again).
/// - [`OutcomePolicy::custom`]: your own function of the status.
///
/// ```
/// use idemkey::server::{OutcomePolicy, Outcome};
/// use http::StatusCode;
/// let p = OutcomePolicy::default();
/// assert_eq!(p.decide(StatusCode::CREATED), Outcome::Store);
/// assert_eq!(p.decide(StatusCode::NOT_FOUND), Outcome::Store);
/// assert_eq!(p.decide(StatusCode::TOO_MANY_REQUESTS), Outcome::Release);
/// assert_eq!(p.decide(StatusCode::BAD_GATEWAY), Outcome::Release);
/// assert_eq!(OutcomePolicy::store_all().decide(StatusCode::BAD_GATEWAY), Outcome::Store);
/// assert_eq!(OutcomePolicy::success_only().decide(StatusCode::NOT_FOUND), Outcome::Release);
/// let only_2xx = OutcomePolicy::custom(|s| if s.is_success() { Outcome::Store } else { Outcome::Release });
/// assert_eq!(only_2xx.decide(StatusCode::NOT_FOUND), Outcome::Release);
/// ```
#[derive(Clone, Copy)]
pub struct OutcomePolicy(fn(StatusCode) -> Outcome);

impl OutcomePolicy {
    /// Store everything once execution began.
    #[must_use]
    pub const fn store_all() -> Self {
        Self(|_| Outcome::Store)
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
                Outcome::Store
            } else {
                Outcome::Release
            }
        })
    }

    /// Decide with your own function.
    #[must_use]
    pub const fn custom(f: fn(StatusCode) -> Outcome) -> Self {
        Self(f)
    }

    /// The outcome for a response with `status`.
    #[must_use]
    pub fn decide(&self, status: StatusCode) -> Outcome {
        (self.0)(status)
    }
}

fn default_decision(status: StatusCode) -> Outcome {
    if crate::protocol::status::is_transient(status) {
        Outcome::Release
    } else {
        Outcome::Store
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
