//! The shared store on Redis (feature `redis`).
//!
//! The key layout and what each operation costs are documented on [`RedisStore`]; here,
//! how the scripts work.
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
//! record at the end of its lease plus the claim's retention, so that an owner whose
//! lease expired and whom nobody took over can still complete (contract rules 3 and 4),
//! and so that the claim that takes it over can report `takeover: true`. A key that
//! exists is therefore a record the store still keeps, and complete, renew and release
//! need only compare the token. Inspect reads the record without `TIME` for the same
//! reason; force-release is one `DEL`.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, Script, Value};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use super::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, RecordState, Store, StoreError,
    clamp_forever,
};

/// Shared by every writing script: `now` in milliseconds of the Redis clock, and
/// `held()`: the claim's retention in milliseconds when `ARGV[1]` (a token) holds the
/// in-progress record at `KEYS[1]`, `nil` otherwise. The key's TTL (lease end +
/// retention) removes a record once it is no longer kept, so no time is compared.
const PRELUDE: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function held()
  local r = redis.call('HMGET', KEYS[1], 's', 't', 'r')
  if r[1] == 'p' and r[2] == ARGV[1] then return tonumber(r[3]) or 0 end
  return nil
end
";

/// `ARGV`: fingerprint, token, lease ms, retention ms.
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
redis.call('HSET', KEYS[1], 's', 'p', 'f', ARGV[1], 't', ARGV[2], 'e', e, 'c', now, 'r', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], e + tonumber(ARGV[4]))
return {1, takeover}
";

/// `ARGV`: token, payload, retention ms. Returns 1, or 0 when fenced.
const COMPLETE: &str = r"
if not held() then return 0 end
local e = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 'c', 'p', ARGV[2], 'e', e)
redis.call('HDEL', KEYS[1], 't', 'r')
redis.call('PEXPIREAT', KEYS[1], e)
return 1
";

/// `ARGV`: token, lease ms. Returns 1, or 0 when fenced.
const RENEW: &str = r"
local retention = held()
if not retention then return 0 end
local e = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'e', e)
redis.call('PEXPIREAT', KEYS[1], e + retention)
return 1
";

/// `ARGV`: token. Returns 1, or 0 when fenced.
const RELEASE: &str = r"
if not held() then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// Reads a record (no `TIME`: a key that exists is kept). Returns nil, or
/// `{state, fingerprint, created ms, expires ms, payload length}`.
const INSPECT: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'c', 'e')
if not r[1] then return nil end
return {r[1], r[2], tonumber(r[3]) or 0, tonumber(r[4]) or 0, redis.call('HSTRLEN', KEYS[1], 'p')}
";

/// How many keys one `SCAN` call asks a server to look at.
const SCAN_COUNT: usize = 1000;
/// How many records [`Store::list_in_progress`] reads at once.
const READS_IN_FLIGHT: usize = 64;

/// The default key prefix.
const DEFAULT_PREFIX: &str = "idemkey:";

/// A store shared by every instance of an application through one Redis (or Redis
/// Cluster).
///
/// Cheap to clone (clones share one multiplexed connection, re-established after a
/// failure). [`RedisStore::cluster`] connects to a Redis Cluster instead: every script
/// touches one hash-tagged key, so it runs on the node that owns the record. Connection
/// failures and timeouts are [`StoreError::is_unavailable`], so the verifier answers 503
/// while Redis is down and resumes by itself when it is back.
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
///
/// # Layout
///
/// One hash per record at `<prefix>{<record id hex>}` ([`RecordId::to_hex`]): the braces
/// are a Redis Cluster hash tag, and every script touches exactly one key, so the store
/// works unchanged on a cluster. Fields: `s` (state: `p` in progress, `c` completed),
/// `f` (fingerprint), `t` (the owner's token, while in progress), `e` (lease or
/// retention end, in milliseconds of the Redis clock), `c` (when the current claim was
/// made, same clock), `r` (the claim's retention in milliseconds, while in progress),
/// `p` (payload, once completed).
///
/// Expiry is by TTL: a completed record expires with its retention, an in-progress one
/// at the end of its lease plus the claim's retention (an abandoned claim is kept that
/// long so that its owner can still complete it). Records written by a version without
/// `c` show the Unix epoch as `created`.
///
/// # Costs
///
/// A fresh request takes 2 round trips (claim, complete), a replay 1;
/// [`Store::inspect`] and [`Store::force_release`] 1. [`Store::list_in_progress`] `SCAN`s
/// the keys under the prefix (on every primary of a cluster) and reads each record
/// (pipelined): it costs a read per record the store holds, a tool for operators, not
/// for the request path.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: String,
    scripts: std::sync::Arc<Scripts>,
}

/// One server through a reconnecting manager, or a cluster.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

struct Scripts {
    claim: Script,
    complete: Script,
    renew: Script,
    release: Script,
    inspect: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Self {
            claim: with_prelude(CLAIM),
            complete: with_prelude(COMPLETE),
            renew: with_prelude(RENEW),
            release: with_prelude(RELEASE),
            inspect: Script::new(INSPECT),
        }
    }

    fn all(&self) -> [&Script; 5] {
        [
            &self.claim,
            &self.complete,
            &self.renew,
            &self.release,
            &self.inspect,
        ]
    }
}

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`].
#[derive(Clone)]
pub struct RedisStoreBuilder {
    /// One URL, or the seed nodes of a cluster.
    urls: Vec<String>,
    cluster: bool,
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    reconnect_attempts: usize,
}

impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs may carry passwords: not shown.
        f.debug_struct("RedisStoreBuilder")
            .field("nodes", &self.urls.len())
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("response_timeout", &self.response_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("reconnect_attempts", &self.reconnect_attempts)
            .finish()
    }
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
        let mut conn = if self.cluster {
            let client = ClusterClient::builder(self.urls.iter().map(String::as_str))
                .connection_timeout(self.connection_timeout)
                .response_timeout(self.response_timeout)
                .retries(u32::try_from(self.reconnect_attempts).unwrap_or(u32::MAX))
                .build()
                .map_err(|e| unavailable("reading the cluster URLs", e))?;
            Conn::Cluster(
                client
                    .get_async_connection()
                    .await
                    .map_err(|e| unavailable("connecting to the cluster", e))?,
            )
        } else {
            let url = self.urls.first().map_or("", String::as_str);
            let client = Client::open(url).map_err(|e| unavailable("reading the URL", e))?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(self.response_timeout))
                .set_connection_timeout(Some(self.connection_timeout))
                .set_number_of_retries(self.reconnect_attempts)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            Conn::Single(
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(|e| unavailable("connecting", e))?,
            )
        };
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
            urls: vec![url.into()],
            cluster: false,
            prefix: DEFAULT_PREFIX.to_owned(),
            response_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(1),
            reconnect_attempts: 1,
        }
    }

    /// A builder for a store on the Redis Cluster reached through `nodes` (seed URLs,
    /// `redis://host:port`; the client discovers the rest). Each record's key is
    /// hash-tagged, so each script runs on the one node that owns it.
    ///
    /// ```no_run
    /// use idemkey::store::RedisStore;
    /// # async fn demo() -> Result<(), idemkey::store::StoreError> {
    /// let store = RedisStore::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn cluster<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut builder = Self::builder("");
        builder.urls = nodes.into_iter().map(Into::into).collect();
        builder.cluster = true;
        builder
    }

    /// Connects to `url` with the default settings.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when the URL is invalid or Redis cannot be reached.
    pub async fn connect(url: impl Into<String>) -> Result<Self, StoreError> {
        Self::builder(url).connect().await
    }

    /// The Redis key of a record: prefix, then the id hash-tagged for Redis Cluster
    /// (the layout of the [module docs](self)).
    fn key(&self, id: &RecordId) -> String {
        format!("{}{{{}}}", self.prefix, id.to_hex())
    }

    /// The `SCAN` pattern of every record key: the prefix with glob characters escaped.
    fn pattern(&self) -> String {
        let mut p = String::with_capacity(self.prefix.len() + 3);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                p.push('\\');
            }
            p.push(c);
        }
        p.push_str("{*}");
        p
    }

    /// Every key under the prefix (each once), by `SCAN` on the server or on every
    /// primary of the cluster.
    async fn scan_keys(&self) -> Result<HashSet<String>, StoreError> {
        let err = |e| unavailable("listing records (SCAN)", e);
        let bad = |e: ::redis::ParsingError| {
            StoreError::corrupt(format!("Redis Cluster answered SCAN unexpectedly: {e}"))
        };
        let scan = |cursor: u64| {
            let mut cmd = ::redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(self.pattern())
                .arg("COUNT")
                .arg(SCAN_COUNT);
            cmd
        };
        let mut keys = HashSet::new();
        match &self.conn {
            Conn::Single(c) => {
                let mut conn = c.clone();
                let mut cursor = 0;
                loop {
                    let (next, page): (u64, Vec<String>) =
                        scan(cursor).query_async(&mut conn).await.map_err(err)?;
                    keys.extend(page);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Conn::Cluster(c) => {
                let mut conn = c.clone();
                // The first page of every primary at once; then each primary on its own.
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let first = conn.route_command(scan(0), all).await.map_err(err)?;
                let Value::Map(nodes) = first else {
                    return Err(StoreError::corrupt(
                        "Redis Cluster answered SCAN with an unexpected reply",
                    ));
                };
                for (node, page) in nodes {
                    let node: String = ::redis::from_redis_value(node).map_err(bad)?;
                    let Some((host, port)) = node
                        .rsplit_once(':')
                        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                    else {
                        return Err(StoreError::corrupt(format!(
                            "Redis Cluster named a node {node:?}, not host:port"
                        )));
                    };
                    let (mut cursor, first): (u64, Vec<String>) =
                        ::redis::from_redis_value(page).map_err(bad)?;
                    keys.extend(first);
                    while cursor != 0 {
                        let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let page = conn.route_command(scan(cursor), at).await.map_err(err)?;
                        let (next, page): (u64, Vec<String>) =
                            ::redis::from_redis_value(page).map_err(bad)?;
                        keys.extend(page);
                        cursor = next;
                    }
                }
            }
        }
        Ok(keys)
    }

    /// The record at `key` (of record `id`), or `None` when the key does not exist.
    async fn read(&self, key: String, id: RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let reply: Value = self
            .scripts
            .inspect
            .key(key)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("inspecting a record", e))?;
        decode_info(reply, id)
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
    StoreError::unavailable(format!("Redis: {what} failed ({e})"), e)
}

/// A lease or retention in milliseconds, "forever" held to 100 years: Lua numbers are
/// doubles, and the scripts' times (now + lease + retention) must stay exact integers
/// that Redis parses back (a `Duration::MAX` would come out as `4.6e+18`).
fn millis(d: Duration) -> Vec<u8> {
    clamp_forever(d).as_millis().to_string().into_bytes()
}

/// Reads the reply of the inspect script for record `id`.
fn decode_info(v: Value, id: RecordId) -> Result<Option<RecordInfo>, StoreError> {
    let bad = || StoreError::corrupt("Redis inspect script returned an unexpected reply");
    let items = match v {
        Value::Nil => return Ok(None),
        Value::Array(items) => items,
        _ => return Err(bad()),
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => Ok(u64::try_from(*n).unwrap_or(0)),
        _ => Err(bad()),
    };
    let time = |ms: u64| {
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let (state, payload_len) = match items.first() {
        Some(Value::BulkString(s)) if s == b"p" => (RecordState::InProgress, None),
        Some(Value::BulkString(s)) if s == b"c" => {
            (RecordState::Completed, Some(int(items.get(4))?))
        }
        _ => return Err(bad()),
    };
    Ok(Some(RecordInfo {
        id,
        state,
        fingerprint: field(items.get(1)).ok_or_else(bad)?,
        created: time(int(items.get(2))?),
        expires: time(int(items.get(3))?),
        payload_len,
    }))
}

/// A field's bytes; a field stored as an empty string may come back as nil through Lua.
fn field(v: Option<&Value>) -> Option<Bytes> {
    match v {
        Some(Value::BulkString(b)) => Some(Bytes::copy_from_slice(b)),
        Some(Value::Nil) => Some(Bytes::new()),
        _ => None,
    }
}

fn decode_claim(v: Value) -> Result<Claim, StoreError> {
    let bad = || StoreError::corrupt("Redis claim script returned an unexpected reply");
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let bytes = |v: Option<&Value>| field(v).ok_or_else(bad);
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
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let reply: Value = self
            .scripts
            .claim
            .key(self.key(req.id))
            .arg(req.fingerprint)
            .arg(req.token.to_hex())
            .arg(millis(req.lease))
            .arg(millis(req.retention))
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
        let args: [&[u8]; 2] = [token.as_bytes(), &millis(lease)];
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

    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        self.read(self.key(id), *id).await
    }

    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        let removed: i64 = ::redis::cmd("DEL")
            .arg(self.key(id))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("force-releasing a record", e))?;
        Ok(removed > 0)
    }

    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let prefix = self.prefix.len();
        let records = self.scan_keys().await?.into_iter().filter_map(|key| {
            // `<prefix>{<64 hex digits>}`: anything else under the prefix is not ours.
            let hex = key.get(prefix + 1..key.len().checked_sub(1)?)?;
            let mut id = [0_u8; 32];
            hex::decode_to_slice(hex, &mut id).ok()?;
            Some((key, RecordId::from_bytes(id)))
        });
        let read: Vec<Option<RecordInfo>> = futures_util::stream::iter(records)
            .map(|(key, id)| self.read(key, id))
            .buffer_unordered(READS_IN_FLIGHT)
            .try_collect()
            .await?;
        let mut found: Vec<RecordInfo> = read
            .into_iter()
            .flatten()
            .filter(|i| i.state == RecordState::InProgress)
            .collect();
        found.sort_unstable_by_key(|i| (i.created, i.id));
        found.truncate(limit);
        Ok(found)
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
