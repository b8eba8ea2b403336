//! The shared store on Redis (feature `redis`).
//!
//! # Layout
//!
//! One hash per record at `<prefix>{<record id hex>}`: the braces are a Redis Cluster
//! hash tag, and every script touches exactly one key, so the store works unchanged on
//! a cluster. Fields: `s` (state: `p` in progress, `c` completed), `f` (fingerprint),
//! `t` (the owner's token, while in progress), `e` (lease or retention end, in
//! milliseconds of the Redis clock), `p` (payload, once completed).
//!
//! # Transitions
//!
//! Each operation is one Lua script, run atomically by Redis: one round trip each (the
//! scripts are loaded when the store connects; `EVALSHA` reloads them after a server
//! restart). Lease and retention decisions read `TIME` inside the script, so every
//! instance of the application agrees on one clock. Redis 7 replicates script effects,
//! which allows `TIME` in a writing script; older servers are asked for it with
//! `redis.replicate_commands()`.
//!
//! Expiry is by TTL: a completed record expires with its retention; an in-progress
//! record outlives its lease by a grace period, so that the claim that takes it over
//! can report `takeover: true`.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, RedisError, Script, Value};
use bytes::Bytes;

use super::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// How long an in-progress record is kept after its lease ended (so a takeover is told
/// apart from a fresh claim), in milliseconds.
const IN_PROGRESS_GRACE_MS: u64 = 10 * 60 * 1000;

/// Shared by every script: `now` in milliseconds of the Redis clock, and the check that
/// `ARGV[1]` (a token) holds the live in-progress record at `KEYS[1]`.
const PRELUDE: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function held()
  local r = redis.call('HMGET', KEYS[1], 's', 't', 'e')
  return r[1] == 'p' and r[2] == ARGV[1] and tonumber(r[3]) > now
end
";

/// `ARGV`: fingerprint, token, lease ms, grace ms.
/// Returns `{1, takeover}`, `{2, fingerprint, remaining ms}` or `{3, fingerprint, payload}`.
const CLAIM: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 'e', 'f', 'p')
local takeover = 0
if r[1] then
  local e = tonumber(r[2])
  if e > now then
    if r[1] == 'c' then return {3, r[3], r[4]} end
    return {2, r[3], e - now}
  end
  if r[1] == 'p' then takeover = 1 end
  redis.call('DEL', KEYS[1])
end
local e = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 'p', 'f', ARGV[1], 't', ARGV[2], 'e', e)
redis.call('PEXPIREAT', KEYS[1], e + tonumber(ARGV[4]))
return {1, takeover}
";

/// `ARGV`: token, payload, retention ms. Returns 1, or 0 when fenced.
const COMPLETE: &str = r"
if not held() then return 0 end
local e = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 'c', 'p', ARGV[2], 'e', e)
redis.call('HDEL', KEYS[1], 't')
redis.call('PEXPIREAT', KEYS[1], e)
return 1
";

/// `ARGV`: token, lease ms, grace ms. Returns 1, or 0 when fenced.
const RENEW: &str = r"
if not held() then return 0 end
local e = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'e', e)
redis.call('PEXPIREAT', KEYS[1], e + tonumber(ARGV[3]))
return 1
";

/// `ARGV`: token. Returns 1, or 0 when fenced.
const RELEASE: &str = r"
if not held() then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// The default key prefix.
const DEFAULT_PREFIX: &str = "idemkey:";

/// A store shared by every instance of an application through one Redis (or Redis
/// Cluster).
///
/// Cheap to clone (clones share one multiplexed connection, re-established after a
/// failure). Connection failures and timeouts are [`StoreError::is_unavailable`], so the
/// verifier answers 503 while Redis is down and resumes by itself when it is back.
///
/// Costs: a fresh request takes 2 round trips (claim, complete), a replay 1.
///
/// ```no_run
/// use idemkey::store::RedisStore;
/// # async fn demo() -> Result<(), idemkey::store::StoreError> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .prefix("payments:idem:")
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    scripts: std::sync::Arc<Scripts>,
}

struct Scripts {
    claim: Script,
    complete: Script,
    renew: Script,
    release: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Self {
            claim: with_prelude(CLAIM),
            complete: with_prelude(COMPLETE),
            renew: with_prelude(RENEW),
            release: with_prelude(RELEASE),
        }
    }

    fn all(&self) -> [&Script; 4] {
        [&self.claim, &self.complete, &self.renew, &self.release]
    }
}

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    reconnect_attempts: usize,
}

impl RedisStoreBuilder {
    /// The prefix of every key (default `"idemkey:"`). Give each
    /// application (or test) its own to keep their records apart in one Redis.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for Redis to answer one command before the request gets a 503
    /// (default 5 s).
    #[must_use]
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 1 s).
    #[must_use]
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How many times a lost connection is retried (with backoff) before the waiting
    /// request fails; the next request tries again (default 1, so that requests fail
    /// fast during an outage).
    #[must_use]
    pub fn reconnect_attempts(mut self, attempts: usize) -> Self {
        self.reconnect_attempts = attempts;
        self
    }

    /// Connects and loads the scripts.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the URL is invalid or Redis cannot be reached.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let client = Client::open(self.url.as_str())
            .map_err(|e| StoreError::unavailable(format!("invalid Redis URL {:?}", self.url), e))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(self.reconnect_attempts)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let mut conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| unavailable("connecting to Redis", e))?;
        let scripts = Scripts::new();
        for script in scripts.all() {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| unavailable("loading the Lua scripts", e))?;
        }
        Ok(RedisStore {
            conn,
            prefix: self.prefix,
            scripts: std::sync::Arc::new(scripts),
        })
    }
}

impl RedisStore {
    /// A builder for a store at `url` (`redis://[:password@]host[:port][/db]`, or
    /// `rediss://` with TLS where the `redis` crate is built with it).
    #[must_use]
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            response_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(1),
            reconnect_attempts: 1,
        }
    }

    /// Connects to `url` with the default settings.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the URL is invalid or Redis cannot be reached.
    pub async fn connect(url: impl Into<String>) -> Result<Self, StoreError> {
        Self::builder(url).connect().await
    }

    /// The Redis key of a record: prefix, then the id hash-tagged for Redis Cluster.
    #[must_use]
    pub fn key(&self, id: &RecordId) -> String {
        format!("{}{{{}}}", self.prefix, id.to_hex())
    }

    async fn fenced_write(
        &self,
        what: &str,
        script: &Script,
        id: &RecordId,
        args: &[&[u8]],
    ) -> Result<(), StoreError> {
        let mut invocation = script.key(self.key(id));
        for arg in args {
            invocation.arg(*arg);
        }
        let written: i64 = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable(what, e))?;
        if written == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }
}

fn unavailable(what: &str, e: RedisError) -> StoreError {
    StoreError::unavailable(format!("Redis: {what}"), e)
}

fn millis(d: Duration) -> Vec<u8> {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX / 4)
        .to_string()
        .into_bytes()
}

fn decode_claim(v: Value) -> Result<Claim, StoreError> {
    let bad = || StoreError::corrupt("Redis claim script returned an unexpected reply");
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let bytes = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => Ok(Bytes::copy_from_slice(b)),
        // A field stored as an empty string may come back as nil through Lua.
        Some(Value::Nil) => Ok(Bytes::new()),
        _ => Err(bad()),
    };
    match items.first() {
        Some(Value::Int(1)) => Ok(Claim::Acquired {
            takeover: matches!(items.get(1), Some(Value::Int(1))),
        }),
        Some(Value::Int(2)) => {
            let Some(Value::Int(ms)) = items.get(2) else {
                return Err(bad());
            };
            Ok(Claim::InProgress {
                fingerprint: bytes(items.get(1))?,
                lease_remaining: Duration::from_millis(u64::try_from(*ms).unwrap_or(0)),
            })
        }
        Some(Value::Int(3)) => Ok(Claim::Completed {
            fingerprint: bytes(items.get(1))?,
            payload: bytes(items.get(2))?,
        }),
        _ => Err(bad()),
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let reply: Value = self
            .scripts
            .claim
            .key(self.key(req.id))
            .arg(req.fingerprint)
            .arg(req.token.to_hex())
            .arg(millis(req.lease))
            .arg(IN_PROGRESS_GRACE_MS)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("claiming a record", e))?;
        decode_claim(reply)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let token = token.to_hex();
        let args: [&[u8]; 3] = [token.as_bytes(), &payload, &millis(retention)];
        self.fenced_write("completing a record", &self.scripts.complete, id, &args)
            .await
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let token = token.to_hex();
        let grace = IN_PROGRESS_GRACE_MS.to_string();
        let args: [&[u8]; 3] = [token.as_bytes(), &millis(lease), grace.as_bytes()];
        self.fenced_write("renewing a lease", &self.scripts.renew, id, &args)
            .await
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let token = token.to_hex();
        self.fenced_write(
            "releasing a record",
            &self.scripts.release,
            id,
            &[token.as_bytes()],
        )
        .await
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
