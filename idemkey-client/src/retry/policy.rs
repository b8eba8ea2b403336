//! How long to wait before the next attempt: the backoff policy, capped by what the
//! server asked for.

use std::time::{Duration, SystemTime};

use reqwest::Response;
use retry_policies::policies::ExponentialBackoff;
use retry_policies::{Jitter, RetryDecision, RetryPolicy};

use idemkey_core::protocol::retry_after;

/// The default cap on a server's `Retry-After`.
pub const DEFAULT_RETRY_AFTER_CAP: Duration = Duration::from_secs(30);

/// The default per-attempt timeout: how long one attempt may wait for the head of its
/// answer (80 s, the timeout the Stripe SDKs ship: stripe-node's `DEFAULT_TIMEOUT =
/// 80000` ms, stripe-go's `defaultHTTPTimeout = 80 * time.Second`, "consistent with the
/// other Stripe language libraries and [...] other timeouts configured in the Stripe
/// infrastructure"; Adyen's Node library ships 30 s). An attempt that passes it is
/// retried with the same key, like any other timeout.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(80);

/// The default overall deadline of a logical request, all attempts and waits included:
/// 5 minutes, a little over three attempts that each hang for the whole
/// [`DEFAULT_ATTEMPT_TIMEOUT`] (Stripe's SDKs, with their 80 s timeout and 2 retries,
/// give up on a hung server after 4 minutes).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// The default retry policy: up to 3 retries (4 attempts), exponential backoff from
/// 100 ms to 10 s with bounded jitter.
#[must_use]
pub fn default_policy() -> ExponentialBackoff {
    ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(100), Duration::from_secs(10))
        .jitter(Jitter::Bounded)
        .build_with_max_retries(3)
}

/// The wait before retry number `retries_so_far + 1`, and whether the server asked for
/// it, or `None` when the policy says stop. The wait a server asks for
/// (`retry-after-ms`, else `Retry-After`) replaces the backoff, capped at `cap`.
pub(super) fn next_wait(
    policy: &(dyn RetryPolicy + Send + Sync),
    answer: Option<&Response>,
    started: SystemTime,
    retries_so_far: u32,
    cap: Duration,
) -> Option<(Duration, bool)> {
    let RetryDecision::Retry { execute_after } = policy.should_retry(started, retries_so_far)
    else {
        return None;
    };
    let now = SystemTime::now();
    let backoff = execute_after.duration_since(now).unwrap_or_default();
    let asked = answer.and_then(|r| retry_after::asked_wait(r.headers(), now));
    Some(asked.map_or((backoff, false), |asked| (asked.min(cap), true)))
}
