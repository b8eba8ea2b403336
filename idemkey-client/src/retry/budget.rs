//! The retry budget one client's calls share: the token bucket of the AWS SDKs' standard
//! retry mode.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A token bucket shared by every call of a client (and its clones): each retry takes
/// tokens, a call that succeeds gives some back, and when the bucket is empty no call
/// retries until successes refill it. A dead upstream then costs about one attempt per
/// call instead of one per retry.
///
/// The numbers are those of the AWS SDKs' standard retry mode: a bucket of 500 tokens, a
/// retry costs 5, a retry after a timeout costs 10, and a call that succeeds returns the
/// cost of the retry that got it through, or 1 token if it needed none; the bucket never
/// holds more than it started with. They come from the SDKs' sources, not the mode's
/// documentation page (which describes "retry quotas" without numbers):
/// `DEFAULT_CAPACITY = 500`, `RETRY_COST = 5`, `RETRY_TIMEOUT_COST = RETRY_COST * 2`,
/// `PERMIT_REGENERATION_AMOUNT = 1` in smithy-rs
/// (`aws-smithy-runtime/src/client/retries/token_bucket.rs`, the Rust SDK), and
/// `INITIAL_RETRY_TOKENS = 500`, `RETRY_COST = 5`, `TIMEOUT_RETRY_COST = 10`,
/// `NO_RETRY_INCREMENT = 1` in the JavaScript SDK v3 (`middleware-retry`'s
/// `constants.ts`). AWS is revising them in an opt-in 2026 mode.
///
/// A retry the budget refuses ends the call with
/// [`Error::is_retry_budget_exhausted`](crate::Error::is_retry_budget_exhausted),
/// which carries the key (a call without a key gets its last answer back).
///
/// ```
/// use idemkey::client::{IdempotentClientBuilder, RetryBudget};
///
/// // The default: RetryBudget::standard(), one bucket per client.
/// let budget = RetryBudget::standard();
/// assert_eq!(budget.available(), 500);
/// // Two clients sharing one bucket, with a bigger one.
/// let shared = RetryBudget::new(2000).with_retry_cost(2);
/// let a = IdempotentClientBuilder::default().retry_budget(shared.clone()).build();
/// let b = IdempotentClientBuilder::default().retry_budget(shared).build();
/// // No budget at all.
/// let c = IdempotentClientBuilder::default().without_retry_budget().build();
/// # let _ = (a, b, c);
/// ```
#[derive(Debug, Clone)]
pub struct RetryBudget {
    bucket: Arc<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    capacity: u32,
    retry_cost: u32,
    timeout_cost: u32,
    success_reward: u32,
    tokens: AtomicU32,
}

/// Tokens taken for one retry, handed back by a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent(u32);

impl Default for RetryBudget {
    /// [`RetryBudget::standard`].
    fn default() -> Self {
        Self::standard()
    }
}

impl RetryBudget {
    /// The AWS SDKs' standard retry mode: 500 tokens, 5 per retry, 10 per retry after a
    /// timeout, 1 back per success that needed no retry.
    #[must_use]
    pub fn standard() -> Self {
        Self::build(500, 5, 10, 1)
    }

    /// A full bucket of `capacity` tokens, with the standard costs.
    #[must_use]
    pub fn new(capacity: u32) -> Self {
        Self::build(capacity, 5, 10, 1)
    }

    /// Tokens one retry takes (default 5). A new, full bucket.
    #[must_use]
    pub fn with_retry_cost(self, cost: u32) -> Self {
        let b = &self.bucket;
        Self::build(b.capacity, cost, b.timeout_cost, b.success_reward)
    }

    /// Tokens a retry after a timeout takes (default 10). A new, full bucket.
    #[must_use]
    pub fn with_timeout_cost(self, cost: u32) -> Self {
        let b = &self.bucket;
        Self::build(b.capacity, b.retry_cost, cost, b.success_reward)
    }

    /// Tokens a success that needed no retry gives back (default 1). A new, full bucket.
    #[must_use]
    pub fn with_success_reward(self, reward: u32) -> Self {
        let b = &self.bucket;
        Self::build(b.capacity, b.retry_cost, b.timeout_cost, reward)
    }

    fn build(capacity: u32, retry_cost: u32, timeout_cost: u32, success_reward: u32) -> Self {
        Self {
            bucket: Arc::new(Bucket {
                capacity,
                retry_cost,
                timeout_cost,
                success_reward,
                tokens: AtomicU32::new(capacity),
            }),
        }
    }

    /// Tokens in the bucket now.
    #[must_use]
    pub fn available(&self) -> u32 {
        self.bucket.tokens.load(Ordering::Relaxed)
    }

    /// The bucket's size.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.bucket.capacity
    }

    /// Takes the tokens for one retry (the timeout cost after a timeout), or `None` when
    /// the bucket holds too few: then the call must not retry.
    pub(crate) fn try_spend(&self, after_timeout: bool) -> Option<Spent> {
        let b = &self.bucket;
        let cost = if after_timeout {
            b.timeout_cost
        } else {
            b.retry_cost
        };
        b.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(cost))
            .ok()
            .map(|_| Spent(cost))
    }

    /// A call succeeded: give back what its last retry took, or the success reward if it
    /// needed none; never above the capacity.
    pub(crate) fn succeeded(&self, last_retry: Option<Spent>) {
        let b = &self.bucket;
        let back = last_retry.map_or(b.success_reward, |Spent(n)| n);
        // The common case, a full bucket, costs one load and no write.
        if back == 0 || b.tokens.load(Ordering::Relaxed) >= b.capacity {
            return;
        }
        let _ = b
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                (t < b.capacity).then(|| t.saturating_add(back).min(b.capacity))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_bucket_allows_a_hundred_retries_and_refills_on_success() {
        let budget = RetryBudget::standard();
        let spent: Vec<_> = std::iter::from_fn(|| budget.try_spend(false)).collect();
        assert_eq!(spent.len(), 100);
        assert_eq!(budget.available(), 0);
        budget.succeeded(None);
        assert_eq!(budget.available(), 1);
        budget.succeeded(Some(Spent(10)));
        assert_eq!(budget.available(), 11);
        assert_eq!(budget.try_spend(true), Some(Spent(10)));
        assert_eq!(
            budget.try_spend(true),
            None,
            "1 token left, a timeout retry costs 10"
        );
    }

    #[test]
    fn successes_never_overfill() {
        let budget = RetryBudget::new(3);
        budget.succeeded(Some(Spent(5)));
        assert_eq!(budget.available(), 3);
        assert!(
            budget.try_spend(false).is_none(),
            "a 5-token retry from a 3-token bucket"
        );
    }
}
