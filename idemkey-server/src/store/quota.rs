//! The store's part in a quota shared by every instance: a claim charged to the scope's
//! token bucket, kept in the store ([`Store::claim_charged`](super::Store::claim_charged)).

use std::time::Duration;

use super::{Claim, RecordId};

/// The bucket a [`Store::claim_charged`](super::Store::claim_charged) charges a new
/// record to: its address and the quota's rate and burst.
///
/// The bucket holds up to `burst` tokens and refills at `per_second` tokens a second,
/// by the store's clock; a new record takes one token. An absent bucket is full.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct QuotaCharge<'a> {
    /// The bucket's address: a hash of the scope (never the raw scope), distinct from
    /// every record's id.
    pub bucket: &'a RecordId,
    /// Tokens added per second (finite, above zero).
    pub per_second: f64,
    /// The most tokens the bucket holds (at least 1).
    pub burst: u32,
}

impl<'a> QuotaCharge<'a> {
    /// A charge to `bucket` of a quota of `per_second` new records a second with bursts
    /// of `burst` (for stores of your own and their tests; the engine makes these).
    ///
    /// ```
    /// use idemkey::store::{QuotaCharge, RecordId};
    /// let bucket = RecordId::new("tenant-a", "");
    /// let charge = QuotaCharge::new(&bucket, 60.0, 300);
    /// assert_eq!(charge.burst, 300);
    /// ```
    #[must_use]
    pub fn new(bucket: &'a RecordId, per_second: f64, burst: u32) -> Self {
        Self {
            bucket,
            per_second,
            burst,
        }
    }
}

/// What a [`Store::claim_charged`](super::Store::claim_charged) came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargedClaim {
    /// The claim's answer, as [`Store::claim`](super::Store::claim) gives it. A live
    /// record found ([`Claim::InProgress`], [`Claim::Completed`]) took no token; a new
    /// record ([`Claim::Acquired`] without takeover) took one.
    Claimed(Claim),
    /// No record for the id, and the bucket has no token: nothing was written. A token
    /// is there again after `retry_after`.
    OverQuota {
        /// When the bucket holds a token again.
        retry_after: Duration,
    },
}
