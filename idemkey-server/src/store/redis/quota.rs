//! A quota shared through Redis ([`Store::claim_charged`](crate::store::Store::claim_charged)):
//! the scope's token bucket is a hash beside the records, charged by the claim's own
//! script, so a new key still costs one round trip.
//!
//! The bucket of a scope is `<prefix>quota:{<bucket id hex>}`, one number: the bucket's
//! theoretical arrival time (GCRA, the token bucket written as one time: microseconds
//! of the Redis clock at which the bucket would be full again). With `T` the time one
//! token takes to come back and `burst` the bucket's size, a key is new at `now` when
//! `tat - now <= (burst - 1) * T`, and then `tat` moves on by `T`; otherwise a token is
//! back in `tat - now - (burst - 1) * T`. An absent bucket is full, and a bucket expires
//! when it would be full again, so idle scopes cost no memory. Its key is not under the
//! records' pattern (`<prefix>{...}`), so listing records never meets it.
//!
//! One server: the claim and the charge are one script over both keys (atomic). On a
//! Redis Cluster the two keys live in different slots, which one script cannot touch,
//! so there the charge is its own script on the bucket's node before the claim, and a
//! claim that finds a live record gives the token back: two round trips for a new key
//! (three for a replay whose bucket had a token), still one bucket for every instance.

use std::time::Duration;

use ::redis::Value;
use bytes::Bytes;

use super::RedisStore;
use super::codec::{bulk, decode_found, millis, progress_value};
use super::conn::{Conn, unavailable};
use crate::store::{ChargedClaim, Claim, ClaimRequest, QuotaCharge, Store, StoreError};

/// `KEYS`: the record, the bucket. `ARGV`: the new in-progress record, its TTL ms, the
/// microseconds one token takes to come back, the burst. Returns `{0, record, PTTL}`
/// when a record is there (no token taken), `{1}` when the record was written (a token
/// taken), `{2, ms}` when the bucket is empty (nothing written; a token is back in
/// `ms`).
pub(super) const CLAIM_CHARGED: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return {0, v, redis.call('PTTL', KEYS[1])} end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval = tonumber(ARGV[3])
local tat = math.max(tonumber(redis.call('GET', KEYS[2]) or 0) or 0, now)
local late = tat - now - (ARGV[4] - 1) * interval
if late > 0 then return {2, math.ceil(late / 1000)} end
tat = tat + interval
redis.call('SET', KEYS[2], string.format('%.17g', tat), 'PX', string.format('%d', math.ceil((tat - now) / 1000) + 1))
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1}
";

/// `KEYS`: the bucket. `ARGV`: the microseconds one token takes to come back, the
/// burst, and `-1` to take a token or `1` to give one back. Returns `{1}` when taken
/// (or given back), `{2, ms}` when the bucket is empty.
pub(super) const CHARGE: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval = tonumber(ARGV[1])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or 0) or 0, now)
if ARGV[3] == '1' then
  tat = math.max(tat - interval, now)
  if tat <= now then redis.call('DEL', KEYS[1]) return {1} end
else
  local late = tat - now - (ARGV[2] - 1) * interval
  if late > 0 then return {2, math.ceil(late / 1000)} end
  tat = tat + interval
end
redis.call('SET', KEYS[1], string.format('%.17g', tat), 'PX', string.format('%d', math.ceil((tat - now) / 1000) + 1))
return {1}
";

/// The quota's rate as Redis scripts read it: the microseconds one token takes to come
/// back.
fn interval_us(charge: &QuotaCharge<'_>) -> String {
    format!("{}", 1e6 / charge.per_second)
}

/// What a charging script answered: `Ok(None)` taken (or the record written),
/// `Ok(Some(record, pttl))` a record found, `Err(retry_after)` the bucket empty.
type Reply = Result<Option<(Bytes, i64)>, Duration>;

fn decode(v: Value) -> Result<Reply, StoreError> {
    let bad = || StoreError::corrupt("a Redis quota script returned an unexpected reply");
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let mut items = items.into_iter();
    match items.next() {
        Some(Value::Int(0)) => {
            let record = bulk(items.next())?;
            let Some(Value::Int(pttl)) = items.next() else {
                return Err(bad());
            };
            Ok(Ok(Some((record, pttl))))
        }
        Some(Value::Int(1)) => Ok(Ok(None)),
        Some(Value::Int(2)) => {
            let Some(Value::Int(ms)) = items.next() else {
                return Err(bad());
            };
            Ok(Err(Duration::from_millis(
                u64::try_from(ms).unwrap_or(0).max(1),
            )))
        }
        _ => Err(bad()),
    }
}

impl RedisStore {
    /// The Redis key of a scope's bucket.
    fn bucket_key(&self, charge: &QuotaCharge<'_>) -> String {
        format!("{}quota:{{{}}}", self.prefix, charge.bucket.to_hex())
    }

    /// [`Store::claim_charged`] on Redis.
    pub(super) async fn claim_charged_impl(
        &self,
        req: ClaimRequest<'_>,
        charge: QuotaCharge<'_>,
    ) -> Result<ChargedClaim, StoreError> {
        if matches!(self.conn, Conn::Cluster(_)) {
            return self.claim_charged_cluster(req, charge).await;
        }
        let value = progress_value(&req);
        let ttl = millis(req.lease)
            .saturating_add(millis(req.retention))
            .max(1);
        let reply: Value = self
            .scripts
            .claim_charged
            .key(self.key(req.id))
            .key(self.bucket_key(&charge))
            .arg(value)
            .arg(ttl)
            .arg(interval_us(&charge))
            .arg(charge.burst)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("claiming a record charged to its scope's quota", e))?;
        match decode(reply)? {
            Err(retry_after) => Ok(ChargedClaim::OverQuota { retry_after }),
            Ok(None) => Ok(ChargedClaim::Claimed(Claim::Acquired { takeover: false })),
            Ok(Some((record, pttl))) => match decode_found(Some(record), pttl)? {
                Some(claim) => Ok(ChargedClaim::Claimed(claim)),
                // An expired claim: taken over by the plain claim, not charged (no new
                // record).
                None => self.claim(req).await.map(ChargedClaim::Claimed),
            },
        }
    }

    /// Takes (`-1`) or gives back (`1`) a token of the bucket.
    async fn charge(&self, charge: &QuotaCharge<'_>, delta: i8) -> Result<Reply, StoreError> {
        let reply: Value = self
            .scripts
            .charge
            .key(self.bucket_key(charge))
            .arg(interval_us(charge))
            .arg(charge.burst)
            .arg(delta)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("charging a scope's quota", e))?;
        decode(reply)
    }

    /// [`Store::claim_charged`] on a cluster: the bucket and the record in two steps
    /// (see the module docs).
    async fn claim_charged_cluster(
        &self,
        req: ClaimRequest<'_>,
        charge: QuotaCharge<'_>,
    ) -> Result<ChargedClaim, StoreError> {
        let (id, token) = (*req.id, req.token);
        match self.charge(&charge, -1).await? {
            Ok(_) => {
                let claim = self.claim(req).await;
                if !matches!(claim, Ok(Claim::Acquired { takeover: false })) {
                    // No new record: the token goes back (best effort; a failure here
                    // costs the scope one token until the bucket refills).
                    if let Err(e) = self.charge(&charge, 1).await {
                        tracing::debug!(record = %id, error = %e, "could not give a quota token back");
                    }
                }
                claim.map(ChargedClaim::Claimed)
            }
            Err(retry_after) => {
                let exists: bool = ::redis::cmd("EXISTS")
                    .arg(self.key(&id))
                    .query_async(&mut self.conn.clone())
                    .await
                    .map_err(|e| unavailable("looking a record up over its quota", e))?;
                if !exists {
                    return Ok(ChargedClaim::OverQuota { retry_after });
                }
                match self.claim(req).await? {
                    Claim::Acquired { takeover: false } => {
                        // Gone between the look-up and the claim: no new record over
                        // the quota.
                        self.release(&id, token).await?;
                        Ok(ChargedClaim::OverQuota { retry_after })
                    }
                    claim => Ok(ChargedClaim::Claimed(claim)),
                }
            }
        }
    }
}
