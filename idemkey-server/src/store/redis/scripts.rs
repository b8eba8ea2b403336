//! The Lua scripts of the Redis store, each touching one key (so each runs on the node
//! of a cluster that owns the record), loaded once per connection by `EVALSHA`.

use ::redis::Script;

/// `ARGV`: `P` and the token, payload, retention ms. Rewrites the in-progress record
/// held by the token as a completed one (state `C`, the creation time made explicit as
/// it was derived from the expiry that changes now, the payload after the fingerprint)
/// with the new expiry, in three calls (each `redis.call` costs about 1 µs of its own).
/// Returns 1, or 0 when fenced.
pub(super) const COMPLETE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 33) ~= ARGV[1] then return 0 end
local c = string.sub(v, 47, 60)
if string.byte(c, 1) == 76 then
  c = string.format('C%013d', redis.call('PEXPIRETIME', KEYS[1]) - string.sub(v, 34, 46) - string.sub(c, 2))
end
redis.call('SET', KEYS[1], 'C' .. string.sub(v, 2, 46) .. c .. string.sub(v, 61) .. ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', KEYS[1], 'c')
return 1
";

/// `ARGV`: `P` and the token, lease ms. Moves the key's expiry to now + lease + the
/// claim's retention (the creation time made explicit first, as it was derived from
/// the expiry). Returns 1, or 0 when fenced.
pub(super) const RENEW: &str = r"
local h = redis.call('GETRANGE', KEYS[1], 0, 59)
if string.sub(h, 1, 33) ~= ARGV[1] then return 0 end
local retention = tonumber(string.sub(h, 34, 46))
if string.byte(h, 47) == 76 then
  redis.call('SETRANGE', KEYS[1], 46, string.format('C%013d', redis.call('PEXPIRETIME', KEYS[1]) - retention - string.sub(h, 48, 60)))
end
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(ARGV[2] + retention, 1)))
return 1
";

/// `ARGV`: `P` and the token. Returns 1, or 0 when fenced.
pub(super) const RELEASE: &str = r"
if redis.call('GETRANGE', KEYS[1], 0, 32) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'r')
return 1
";

/// The claim that found an expired lease, decided again atomically. `ARGV`: the new
/// in-progress record, its TTL in ms. Returns `{1, takeover}`, `{2, record, lease ms
/// left}` or `{3, record}`.
pub(super) const TAKEOVER: &str = r"
local v = redis.call('GET', KEYS[1])
local takeover = 0
if v then
  if string.byte(v, 1) ~= 80 then return {3, v} end
  local left = redis.call('PTTL', KEYS[1]) - string.sub(v, 34, 46)
  if left > 0 then return {2, v, left} end
  takeover = 1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, takeover}
";

/// Reads a record without its payload. Returns nil, or `{head and fingerprint, expire
/// time ms, payload length}`.
pub(super) const INSPECT: &str = r"
local h = redis.call('GETRANGE', KEYS[1], 0, 69)
if h == '' then return nil end
local n = tonumber(string.sub(h, 61, 70)) or 0
return {h .. redis.call('GETRANGE', KEYS[1], 70, 69 + n), redis.call('PEXPIRETIME', KEYS[1]), redis.call('STRLEN', KEYS[1]) - 70 - n}
";

pub(super) struct Scripts {
    pub(super) takeover: Script,
    pub(super) complete: Script,
    pub(super) renew: Script,
    pub(super) release: Script,
    pub(super) inspect: Script,
    /// A shared quota's scripts (`quota.rs`).
    pub(super) claim_charged: Script,
    pub(super) charge: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            takeover: Script::new(TAKEOVER),
            complete: Script::new(COMPLETE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
            inspect: Script::new(INSPECT),
            claim_charged: Script::new(super::quota::CLAIM_CHARGED),
            charge: Script::new(super::quota::CHARGE),
        }
    }

    pub(super) fn all(&self) -> [&Script; 7] {
        [
            &self.takeover,
            &self.complete,
            &self.renew,
            &self.release,
            &self.inspect,
            &self.claim_charged,
            &self.charge,
        ]
    }
}
