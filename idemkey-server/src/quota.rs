//! Quotas of new keys per scope ([`Quota`]): a token bucket per scope, charged only
//! for new records, and an optional cap on claims in progress per scope.
//!
//! The buckets of a per-process quota live here ([`QuotaState`]), bounded in memory:
//! a bucket that is full again with nothing in progress is the same as no bucket, so it
//! is forgotten; past [`Quota::max_scopes`] tracked scopes, new scopes share one
//! overflow bucket until idle ones are forgotten. Buckets read tokio's clock
//! ([`tokio::time::Instant`]), so tests that pause time drive their refills.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::RecordId;
use crate::store::id_hash::IdHashBuilder;

/// A quota of new idempotency keys per scope: `per_second` new records a second on
/// average, bursts of up to [`Quota::burst`], and optionally at most
/// [`Quota::max_in_progress`] claims running at once per scope.
///
/// Given to [`EngineBuilder::quota`](crate::EngineBuilder::quota) (so that
/// [`Engine::once`](crate::Engine::once), the webhook receivers and the layer all
/// enforce it) or to [`IdempotencyLayer::quota`](crate::IdempotencyLayer::quota). A
/// scope over its quota gets `429 quota-exceeded` with `Retry-After` (the time until a
/// token is there again) from the layer,
/// [`OnceError::is_quota_exceeded`](crate::OnceError::is_quota_exceeded) from
/// [`Engine::once`](crate::Engine::once), [`Claimed::QuotaExceeded`](crate::Claimed::QuotaExceeded)
/// from [`Engine::claim`](crate::Engine::claim). Nothing is recorded then, so the same
/// key sent again after the wait runs normally. Only new records spend quota: a replay,
/// an in-progress answer, a reused key or a takeover of an abandoned claim never do, and
/// they are answered as usual even when the scope's bucket is empty.
///
/// Every setting is checked where it is given: zero, negative, infinite or NaN rates
/// and zero counts are refused with a [`QuotaError`] that says which, never a panic.
///
/// ```
/// use idemkey::server::policy::Quota;
/// # fn main() -> Result<(), idemkey::server::policy::QuotaError> {
/// // AdCP: 60 new keys a second per agent, bursts of 300.
/// let quota = Quota::per_second(60)?.burst(300)?.max_in_progress(50)?;
/// assert_eq!(quota.burst_size(), Some(300));
/// assert!(Quota::per_second(0).is_err());
/// assert!(Quota::per_second(f64::NAN).is_err());
/// assert!(Quota::per_second(-1).is_err());
/// # Ok(()) }
/// ```
///
/// # Per process, or shared through the store
///
/// By default each process keeps its own buckets: N instances behind a load balancer
/// allow up to N times the quota. [`Quota::shared`] keeps the buckets in the store
/// instead ([`Store::claim_charged`](crate::store::Store::claim_charged); Redis today,
/// folded into the claim's round trip), so N instances enforce one limit. The cap on
/// claims in progress is always per process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    /// Tokens per second, `None` for no rate limit (only a cap on claims in progress).
    rate: Option<f64>,
    burst: u32,
    max_in_progress: Option<usize>,
    shared: bool,
    max_scopes: usize,
}

/// A [`Quota`] setting that cannot be: what was given and what is allowed.
///
/// ```
/// use idemkey::server::policy::Quota;
/// let e = Quota::per_second(60).and_then(|q| q.burst(0)).unwrap_err();
/// assert!(e.to_string().contains("burst"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaError {
    what: String,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid quota: {}", self.what)
    }
}

impl std::error::Error for QuotaError {}

fn refuse(what: String) -> QuotaError {
    QuotaError { what }
}

impl Quota {
    /// Default of [`Quota::max_scopes`].
    pub const DEFAULT_MAX_SCOPES: usize = 100_000;

    /// `rate` new keys per second and scope (fractions allowed: `0.5` is one every two
    /// seconds), with bursts of `rate` rounded up (at least 1) until [`Quota::burst`]
    /// says otherwise.
    ///
    /// # Errors
    /// A rate that is zero, negative, infinite or NaN.
    pub fn per_second(rate: impl Into<f64>) -> Result<Self, QuotaError> {
        let rate = rate.into();
        if !(rate.is_finite() && rate > 0.0) {
            return Err(refuse(format!(
                "a rate of {rate} new keys a second; give a finite number above zero (a fraction such as 0.5 for one every two seconds), or use Quota::in_progress_only for no rate limit"
            )));
        }
        Ok(Self {
            rate: Some(rate),
            burst: burst_of(rate),
            max_in_progress: None,
            shared: false,
            max_scopes: Self::DEFAULT_MAX_SCOPES,
        })
    }

    /// `count` new keys per minute and scope: [`Quota::per_second`] of `count / 60`,
    /// with bursts of `count` until [`Quota::burst`] says otherwise.
    ///
    /// ```
    /// use idemkey::server::policy::Quota;
    /// let q = Quota::per_minute(120).unwrap();
    /// assert_eq!(q.rate_per_second(), Some(2.0));
    /// assert_eq!(q.burst_size(), Some(120));
    /// ```
    ///
    /// # Errors
    /// As [`Quota::per_second`].
    pub fn per_minute(count: impl Into<f64>) -> Result<Self, QuotaError> {
        let count = count.into();
        let mut q = Self::per_second(count / 60.0).map_err(|_| {
            refuse(format!(
                "a rate of {count} new keys a minute; give a finite number above zero"
            ))
        })?;
        q.burst = burst_of(count);
        Ok(q)
    }

    /// No rate limit, only a cap of `max` claims in progress at once per scope (see
    /// [`Quota::max_in_progress`]).
    ///
    /// ```
    /// use idemkey::server::policy::Quota;
    /// let q = Quota::in_progress_only(8).unwrap();
    /// assert_eq!(q.rate_per_second(), None);
    /// assert_eq!(q.in_progress_limit(), Some(8));
    /// ```
    ///
    /// # Errors
    /// `max` zero.
    pub fn in_progress_only(max: usize) -> Result<Self, QuotaError> {
        Self {
            rate: None,
            burst: 0,
            max_in_progress: None,
            shared: false,
            max_scopes: Self::DEFAULT_MAX_SCOPES,
        }
        .max_in_progress(max)
    }

    /// The most new keys a scope may send at once after a quiet spell: the bucket's
    /// size. The rate refills it.
    ///
    /// # Errors
    /// `burst` zero (no key could ever be new), or a quota made by
    /// [`Quota::in_progress_only`] (it has no bucket).
    pub fn burst(mut self, burst: u32) -> Result<Self, QuotaError> {
        if self.rate.is_none() {
            return Err(refuse(
                "a burst on a quota without a rate (Quota::in_progress_only); start from Quota::per_second".into(),
            ));
        }
        if burst == 0 {
            return Err(refuse(
                "a burst of 0: no key could ever be new; give at least 1".into(),
            ));
        }
        self.burst = burst;
        Ok(self)
    }

    /// At most `max` claims in progress at once per scope, in this process: one more
    /// new key gets `quota-exceeded`, with the engine's
    /// [`in_progress_retry_after`](crate::EngineBuilder::in_progress_retry_after) as
    /// its `Retry-After`. A claim stops counting when its execution ends however it
    /// ends: completed, released, failed, panicked, or dropped.
    ///
    /// # Errors
    /// `max` zero.
    pub fn max_in_progress(mut self, max: usize) -> Result<Self, QuotaError> {
        if max == 0 {
            return Err(refuse(
                "at most 0 claims in progress: nothing could ever run; give at least 1".into(),
            ));
        }
        self.max_in_progress = Some(max);
        Ok(self)
    }

    /// Keep the buckets in the store, so that every instance over the store spends one
    /// quota ([`Store::claim_charged`](crate::store::Store::claim_charged), one round
    /// trip per claim on Redis, like the claim alone). A store that does not keep
    /// buckets fails every new key's claim with
    /// [`StoreError::is_configuration`](crate::store::StoreError::is_configuration) (so
    /// `503 store-unavailable`): the engine does not quietly fall back to per-process
    /// buckets, which would let N instances allow N times the quota.
    ///
    /// Not for [`Quota::in_progress_only`] (nothing to share): ignored there.
    #[must_use]
    pub fn shared(mut self) -> Self {
        self.shared = self.rate.is_some();
        self
    }

    /// The most scopes whose buckets a process tracks at once (default
    /// [`Quota::DEFAULT_MAX_SCOPES`], about 100 bytes each). A bucket full again with
    /// nothing in progress is forgotten (it is the same as none); when the table is
    /// full of busy scopes, new scopes share one overflow bucket of the same quota
    /// until idle ones are forgotten, so a flood of distinct scopes can neither grow
    /// memory nor mint keys past one scope's quota.
    ///
    /// # Errors
    /// `max` zero.
    pub fn max_scopes(mut self, max: usize) -> Result<Self, QuotaError> {
        if max == 0 {
            return Err(refuse("at most 0 tracked scopes; give at least 1".into()));
        }
        self.max_scopes = max;
        Ok(self)
    }

    /// The rate in new keys per second, `None` without a rate limit.
    #[must_use]
    pub fn rate_per_second(&self) -> Option<f64> {
        self.rate
    }

    /// The bucket's size, `None` without a rate limit.
    #[must_use]
    pub fn burst_size(&self) -> Option<u32> {
        self.rate.map(|_| self.burst)
    }

    /// The cap on claims in progress per scope, if any.
    #[must_use]
    pub fn in_progress_limit(&self) -> Option<usize> {
        self.max_in_progress
    }

    /// `true` when the buckets are kept in the store ([`Quota::shared`]).
    #[must_use]
    pub fn is_shared(&self) -> bool {
        self.shared
    }
}

/// `rate` rounded up, at least 1, at most `u32::MAX`.
fn burst_of(rate: f64) -> u32 {
    let up = rate.ceil();
    if up >= f64::from(u32::MAX) {
        u32::MAX
    } else if up >= 1.0 {
        // In range and integral: exact.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked range"
        )]
        let b = up as u32;
        b
    } else {
        1
    }
}

/// A quota and its per-process buckets, shared by an engine and the engines derived
/// from it.
pub(crate) struct QuotaState {
    pub(crate) quota: Quota,
    /// Two seeded hashes of a scope make its key in the map: 128 bits that nobody who
    /// does not know the seeds can make two scopes share, for a few instructions (a
    /// SHA-256 of the scope would cost more than the rest of the admission).
    seeds: (IdHashBuilder, IdHashBuilder),
    buckets: Mutex<Buckets>,
}

struct Buckets {
    map: HashMap<u128, Bucket, IdHashBuilder>,
    /// Where new scopes go while the map is full of busy ones.
    overflow: Bucket,
    /// When the map may be swept again for idle buckets.
    next_sweep: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
    in_progress: usize,
}

/// Why a scope was refused, and when to ask again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused {
    pub(crate) retry_after: Duration,
}

/// A scope's admission: the token taken (given back with [`Permit::refund`] when the
/// claim finds a live record) and the in-progress slot held until the permit drops.
pub(crate) struct Permit {
    state: Arc<QuotaState>,
    bucket: Slot,
    token: bool,
    slot: bool,
}

#[derive(Clone, Copy)]
enum Slot {
    Scope(u128),
    Overflow,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("token", &self.token)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl Bucket {
    fn full(quota: &Quota, now: Instant) -> Self {
        Self {
            tokens: f64::from(quota.burst),
            at: now,
            in_progress: 0,
        }
    }

    fn refill(&mut self, quota: &Quota, now: Instant) {
        if let Some(rate) = quota.rate {
            let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(f64::from(quota.burst));
        }
        self.at = now;
    }

    fn idle(&self, quota: &Quota) -> bool {
        self.in_progress == 0 && (quota.rate.is_none() || self.tokens >= f64::from(quota.burst))
    }
}

impl QuotaState {
    pub(crate) fn new(quota: Quota) -> Arc<Self> {
        Arc::new(Self {
            quota,
            seeds: (IdHashBuilder::default(), IdHashBuilder::default()),
            buckets: Mutex::new(Buckets {
                map: HashMap::default(),
                overflow: Bucket::full(&quota, Instant::now()),
                next_sweep: Instant::now(),
            }),
        })
    }

    /// The address of `scope`'s bucket in a store ([`Quota::shared`]): a hash, the same
    /// in every process (raw scopes are kept nowhere). No key is empty, so it is no
    /// record's id.
    pub(crate) fn bucket_of(scope: &str) -> RecordId {
        RecordId::new(scope, "")
    }

    /// The key of `scope`'s bucket in this process's map.
    fn local_key(&self, scope: &str) -> u128 {
        use std::hash::BuildHasher;
        (u128::from(self.seeds.0.hash_one(scope)) << 64) | u128::from(self.seeds.1.hash_one(scope))
    }

    fn lock(&self) -> MutexGuard<'_, Buckets> {
        // A panic while the lock is held leaves counts that are still numbers.
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a claim of `scope`: takes a token (unless `charge` is false: a shared
    /// quota charges in the store) and an in-progress slot when the quota caps them.
    /// `in_progress_retry` is the advice when the cap refuses.
    pub(crate) fn admit(
        self: &Arc<Self>,
        scope: &str,
        charge: bool,
        in_progress_retry: Duration,
    ) -> Result<Permit, Refused> {
        let q = self.quota;
        let charge = charge && q.rate.is_some();
        let key = self.local_key(scope);
        let now = Instant::now();
        let mut b = self.lock();
        b.sweep(&q, now);
        let slot = if b.map.len() < q.max_scopes || b.map.contains_key(&key) {
            Slot::Scope(key)
        } else {
            Slot::Overflow
        };
        let entry = match slot {
            Slot::Scope(id) => b.map.entry(id).or_insert_with(|| Bucket::full(&q, now)),
            Slot::Overflow => &mut b.overflow,
        };
        entry.refill(&q, now);
        if q.max_in_progress
            .is_some_and(|max| entry.in_progress >= max)
        {
            return Err(Refused {
                retry_after: in_progress_retry,
            });
        }
        if charge {
            if entry.tokens < 1.0 {
                let rate = q.rate.unwrap_or(1.0);
                return Err(Refused {
                    retry_after: Duration::from_secs_f64(((1.0 - entry.tokens) / rate).min(1e9)),
                });
            }
            entry.tokens -= 1.0;
        }
        let held = q.max_in_progress.is_some();
        if held {
            entry.in_progress += 1;
        }
        Ok(Permit {
            state: Arc::clone(self),
            bucket: slot,
            token: charge,
            slot: held,
        })
    }
}

impl Buckets {
    /// Forgets idle buckets, at most once per refill of a bucket (and per second), and
    /// whenever the map is full once that long passed.
    fn sweep(&mut self, q: &Quota, now: Instant) {
        if now < self.next_sweep {
            return;
        }
        let refill = q
            .rate
            .map_or(Duration::from_secs(1), |r| {
                Duration::from_secs_f64((f64::from(q.burst) / r).min(3600.0))
            })
            .max(Duration::from_secs(1));
        self.next_sweep = now + refill;
        self.map.retain(|_, bucket| {
            bucket.refill(q, now);
            !bucket.idle(q)
        });
    }
}

impl Permit {
    /// Gives the token back: the claim found a live record (or took an abandoned one
    /// over), which is no new record. The slot is given back too.
    pub(crate) fn refund(mut self) {
        self.give_back(true);
    }

    /// Keeps the token spent; the slot stays held until the permit drops.
    pub(crate) fn spend(mut self) -> Option<Self> {
        self.token = false;
        self.slot.then_some(self)
    }

    /// Keeps the slot, gives the token back (a takeover).
    pub(crate) fn refund_token(mut self) -> Option<Self> {
        let slot = std::mem::take(&mut self.slot);
        self.give_back(true);
        self.slot = slot;
        self.slot.then_some(self)
    }

    fn give_back(&mut self, token: bool) {
        let give_token = token && std::mem::take(&mut self.token);
        let give_slot = std::mem::take(&mut self.slot);
        if !give_token && !give_slot {
            return;
        }
        let q = self.state.quota;
        let mut b = self.state.lock();
        let entry = match self.bucket {
            Slot::Scope(id) => b.map.get_mut(&id),
            Slot::Overflow => Some(&mut b.overflow),
        };
        // Absent: forgotten as idle, so full already.
        if let Some(entry) = entry {
            if give_token {
                entry.tokens = (entry.tokens + 1.0).min(f64::from(q.burst));
            }
            if give_slot {
                entry.in_progress = entry.in_progress.saturating_sub(1);
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // The token stays spent unless refunded; the slot is always given back.
        self.give_back(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(q: Quota) -> Arc<QuotaState> {
        QuotaState::new(q)
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let s = state(
            Quota::per_second(2)
                .expect("admitted")
                .burst(3)
                .expect("admitted"),
        );
        let id = "a";
        for _ in 0..3 {
            s.admit(id, true, Duration::ZERO).expect("admitted").spend();
        }
        let refused = s.admit(id, true, Duration::ZERO).expect_err("refused");
        assert_eq!(refused.retry_after, Duration::from_millis(500));
        tokio::time::advance(Duration::from_millis(500)).await;
        s.admit(id, true, Duration::ZERO).expect("admitted").spend();
        assert!(s.admit(id, true, Duration::ZERO).is_err());
        // Another scope has its own bucket.
        s.admit("b", true, Duration::ZERO)
            .expect("admitted")
            .spend();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_gives_the_token_back_and_a_drop_the_slot() {
        let s = state(
            Quota::per_second(1)
                .expect("admitted")
                .max_in_progress(1)
                .expect("admitted"),
        );
        let id = "a";
        s.admit(id, true, Duration::ZERO)
            .expect("admitted")
            .refund();
        let held = s.admit(id, true, Duration::ZERO).expect("admitted").spend();
        assert!(held.is_some());
        tokio::time::advance(Duration::from_secs(5)).await;
        // Tokens are there again, the slot is not.
        assert!(s.admit(id, true, Duration::from_secs(1)).is_err());
        drop(held);
        s.admit(id, true, Duration::ZERO).expect("admitted").spend();
    }

    #[tokio::test(start_paused = true)]
    async fn idle_scopes_are_forgotten_and_a_full_table_overflows_into_one_bucket() {
        let q = Quota::per_second(1)
            .expect("admitted")
            .max_scopes(2)
            .expect("admitted");
        let s = state(q);
        for scope in ["a", "b"] {
            s.admit(scope, true, Duration::ZERO)
                .expect("admitted")
                .spend();
        }
        tokio::time::advance(Duration::from_millis(1)).await;
        // "c" and "d" share the overflow bucket (one token).
        s.admit("c", true, Duration::ZERO)
            .expect("admitted")
            .spend();
        assert!(s.admit("d", true, Duration::ZERO).is_err());
        assert_eq!(s.lock().map.len(), 2);
        // Once "a" and "b" are full again, they are forgotten.
        tokio::time::advance(Duration::from_secs(2)).await;
        s.admit("d", true, Duration::ZERO)
            .expect("admitted")
            .spend();
        assert_eq!(s.lock().map.len(), 1);
    }

    #[test]
    fn bad_settings_are_refused_with_what_was_wrong() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = Quota::per_second(bad).expect_err("refused");
            assert!(e.to_string().contains("new keys a second"), "{e}");
        }
        assert!(Quota::per_minute(0).is_err());
        assert!(
            Quota::per_second(1)
                .expect("admitted")
                .max_in_progress(0)
                .is_err()
        );
        assert!(Quota::in_progress_only(0).is_err());
        assert!(
            Quota::in_progress_only(1)
                .expect("admitted")
                .burst(5)
                .is_err()
        );
        assert!(
            Quota::per_second(1)
                .expect("admitted")
                .max_scopes(0)
                .is_err()
        );
        assert_eq!(
            Quota::per_second(0.25).expect("admitted").burst_size(),
            Some(1)
        );
        assert_eq!(
            Quota::per_second(1e12).expect("admitted").burst_size(),
            Some(u32::MAX)
        );
    }
}
