//! The shared store on Redis (feature `redis`).
//!
//! The key layout and what each operation costs are documented on [`RedisStore`]; here,
//! how the scripts work.
//!
//! # Transitions
//!
//! A record is one string value (layout on [`RedisStore`]), so that the common claim
//! needs no script: `SET key value NX PX ttl GET` writes the in-progress record if the
//! key is absent and returns the record otherwise, in the same command; `PTTL` is
//! pipelined with it (one round trip). Leases run on the Redis clock: an in-progress
//! record's key lives until the end of its lease plus the claim's retention (contract
//! rules 3 and 4), so the lease left is `PTTL` minus the retention kept in the value.
//! Only a claim that finds an expired lease (a takeover, rare) runs a script, which
//! decides again atomically: two round trips then.
//!
//! Complete, renew and release are small Lua scripts (one round trip each, loaded when
//! the store connects; `EVALSHA` reloads them after a server restart) that compare the
//! token and rewrite or delete the value. A key that exists is a record the store still
//! keeps (TTL), so no script reads `TIME`. Inspect reads the value's head and
//! `PEXPIRETIME` in a read-only script; force-release is one `DEL`. Redis 7.0 or later
//! (`SET ... NX GET`, `PEXPIRETIME`).

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Script, Value};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use super::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, RecordState, Settlements, Store,
    StoreError, Watch, clamp_forever,
};

/// `ARGV`: `P` and the token, payload, retention ms. Rewrites the in-progress record
/// held by the token as a completed one (state `C`, the creation time made explicit as
/// it was derived from the expiry that changes now, the payload after the fingerprint)
/// with the new expiry, in three calls (each `redis.call` costs about 1 µs of its own).
/// Returns 1, or 0 when fenced.
const COMPLETE: &str = r"
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
const RENEW: &str = r"
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
const RELEASE: &str = r"
if redis.call('GETRANGE', KEYS[1], 0, 32) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'r')
return 1
";

/// The claim that found an expired lease, decided again atomically. `ARGV`: the new
/// in-progress record, its TTL in ms. Returns `{1, takeover}`, `{2, record, lease ms
/// left}` or `{3, record}`.
const TAKEOVER: &str = r"
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
const INSPECT: &str = r"
local h = redis.call('GETRANGE', KEYS[1], 0, 69)
if h == '' then return nil end
local n = tonumber(string.sub(h, 61, 70)) or 0
return {h .. redis.call('GETRANGE', KEYS[1], 70, 69 + n), redis.call('PEXPIRETIME', KEYS[1]), redis.call('STRLEN', KEYS[1]) - 70 - n}
";

/// Bytes before the fingerprint of a record: `P` (in progress) or `C` (completed), the
/// claim's token (32 hex digits), its retention (13 digits), `L` and its lease or `C`
/// and its creation time (13 digits), the fingerprint's length (10 digits).
const HEAD: usize = 70;

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
/// One string value per record at `<prefix>{<record id hex>}` ([`RecordId::to_hex`]):
/// the braces are a Redis Cluster hash tag, and every command touches exactly one key,
/// so the store works unchanged on a cluster. The value: the state (`P` in progress,
/// `C` completed), the claim's token (32 hex digits), the claim's retention in
/// milliseconds (13 digits), then `L` and the lease (13 digits: the claim was made at
/// the key's expiry time minus retention minus lease) or `C` and the time of the claim
/// (milliseconds of the Redis clock; written once the expiry moves), the fingerprint's
/// length (10 digits), the fingerprint, and once completed the payload.
///
/// Expiry is by TTL: a completed record expires with its retention, an in-progress one
/// at the end of its lease plus the claim's retention (an abandoned claim is kept that
/// long so that its owner can still complete it), so the lease left is the key's `PTTL`
/// minus that retention. Needs Redis 7.0 or later. (Records of the hash layout of
/// earlier development versions are not read: a claim on one fails with
/// [`StoreError::is_corrupt`] (Redis says `WRONGTYPE`); flush them before upgrading.)
///
/// # Costs
///
/// A fresh request takes 2 round trips (claim: `SET ... NX PX ... GET` and `PTTL`,
/// pipelined; complete: `EVALSHA`), a replay 1 (the same `SET`, which finds the record,
/// and `PTTL`); a claim that finds an expired lease 2 (the takeover script after it).
/// [`Store::inspect`] and [`Store::force_release`] 1. [`Store::list_in_progress`]
/// `SCAN`s the keys under the prefix (on every primary of a cluster) and reads each
/// record (pipelined): it costs a read per record the store holds, a tool for
/// operators, not for the request path. Redis CPU per request, measured with
/// `INFO commandstats`, is in BENCHMARKS.md (`perf/src/bin/redis_cpu.rs`).
///
/// # Durability across failover
///
/// Redis replicates asynchronously: a completion acknowledged by a primary that fails
/// before its replicas received it is lost, and the retry with that key runs again.
/// [`RedisStoreBuilder::wait_for_replicas`] makes every completion wait (`WAIT`) until
/// that many replicas hold it; a completion they do not acknowledge in time fails with
/// [`StoreError::is_unreplicated`] (it is on the primary, not trusted to survive it).
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    replicas: Option<(usize, Duration)>,
    prefix: String,
    scripts: std::sync::Arc<Scripts>,
    notifier: std::sync::Arc<Notifier>,
}

/// The waiters of this store's records ([`Store::watch`]), woken by the messages the
/// complete and release scripts publish on the record's key as channel name. One
/// pub/sub connection per store, opened at the first watch, subscribed to the pattern
/// of every record key (so that no per-record subscription can race a publish), and
/// opened again at the next watch once it was lost.
struct Notifier {
    /// The server the pub/sub connection goes to (the first node of a cluster: a
    /// publish reaches the subscribers of every node).
    url: String,
    settlements: Settlements,
    listener: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
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
    takeover: Script,
    complete: Script,
    renew: Script,
    release: Script,
    inspect: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            takeover: Script::new(TAKEOVER),
            complete: Script::new(COMPLETE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
            inspect: Script::new(INSPECT),
        }
    }

    fn all(&self) -> [&Script; 5] {
        [
            &self.takeover,
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
    /// Replicas that must acknowledge a completion, and how long to wait for them.
    replicas: Option<(usize, Duration)>,
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
            .field("wait_for_replicas", &self.replicas)
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

    /// Makes every completion wait until `replicas` replicas acknowledge it (Redis
    /// `WAIT`, pipelined with the completion: no extra round trip), for at most
    /// `timeout`. A completion that fewer replicas acknowledged in time fails with
    /// [`StoreError::is_unreplicated`]: it is written on the primary but would be lost
    /// if the primary failed now, so it is reported instead of trusted (the verifier
    /// logs it; the response already computed is still sent).
    ///
    /// What each setting promises, with Redis's asynchronous replication:
    ///
    /// - not set (the default): a completion is acknowledged by the primary alone. If the
    ///   primary fails over before its replicas received it, the new primary does not
    ///   know the request completed, and a retry with the key runs it again.
    /// - `wait_for_replicas(n, timeout)`: a completion that returned `Ok` is held by the
    ///   primary and at least `n` replicas, so it survives the loss of the primary as
    ///   long as one of those replicas is promoted (Redis Sentinel and Cluster promote
    ///   the most up-to-date replica). `WAIT` does not make Redis strongly consistent: a
    ///   replica that acknowledged in memory and then lost power with the primary still
    ///   loses it, unless the replicas keep an append-only file.
    ///
    /// Claims are not waited for: a claim lost in a failover only lets a retry run
    /// while the first attempt still runs, whose completion is then fenced.
    ///
    /// ```no_run
    /// use idemkey::store::RedisStore;
    /// use std::time::Duration;
    /// # async fn demo() -> Result<(), idemkey::store::StoreError> {
    /// let store = RedisStore::builder("redis://10.0.0.1:6379")
    ///     .wait_for_replicas(1, Duration::from_millis(500))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// Connects and loads the scripts.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_configuration`] when the URL is invalid or Redis refuses its
    /// password, user or database number; [`StoreError::is_unavailable`] when Redis
    /// cannot be reached (the message names the host and port tried).
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
            let client = Client::open(url).map_err(|e| {
                StoreError::configuration_from(
                    format!("Redis: the URL {url:?} is invalid ({e})"),
                    e,
                )
            })?;
            let at = client.get_connection_info().addr().to_string();
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(self.response_timeout))
                .set_connection_timeout(Some(self.connection_timeout))
                .set_number_of_retries(self.reconnect_attempts)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            Conn::Single(
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(|e| connect_failed(&at, e))?,
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
            replicas: self.replicas,
            prefix: self.prefix,
            scripts: std::sync::Arc::new(scripts),
            notifier: std::sync::Arc::new(Notifier {
                url: self.urls.first().cloned().unwrap_or_default(),
                settlements: Settlements::default(),
                listener: tokio::sync::Mutex::new(None),
            }),
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
            replicas: None,
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

    /// The record id of a key of this store (`<prefix>{<64 hex digits>}`).
    fn id_of(&self, key: &str) -> Option<RecordId> {
        id_of(&self.prefix, key)
    }

    /// Starts the pub/sub listener unless it runs; returns once it is subscribed.
    async fn listen(&self) -> Result<(), StoreError> {
        let mut listener = self.notifier.listener.lock().await;
        if listener.as_ref().is_some_and(|l| !l.is_finished()) {
            return Ok(());
        }
        let client = Client::open(self.notifier.url.as_str())
            .map_err(|e| unavailable("reading the URL (pub/sub)", e))?;
        let mut pubsub = client
            .get_async_pubsub()
            .await
            .map_err(|e| unavailable("connecting for pub/sub", e))?;
        pubsub
            .psubscribe(self.pattern())
            .await
            .map_err(|e| unavailable("subscribing to settled records", e))?;
        // Not the store itself: the listener must not keep it (and so itself) alive;
        // the notifier's drop ends it.
        let (prefix, notifier) = (
            self.prefix.clone(),
            std::sync::Arc::downgrade(&self.notifier),
        );
        *listener = Some(tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let Some(notifier) = notifier.upgrade() else {
                    return;
                };
                if let Some(id) = id_of(&prefix, msg.get_channel_name()) {
                    notifier.settlements.notify(&id);
                }
            }
            tracing::debug!(
                "the Redis pub/sub connection of the store's waiters closed; the next watch opens it again"
            );
            // Whoever still waits looks again at its own time (the lease end at the
            // latest).
        }));
        Ok(())
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
        fenced_unless(written == 1)
    }

    /// The completion script and `WAIT` in one pipeline (one round trip, on the node of
    /// the record: `WAIT` counts the replicas holding this connection's writes).
    async fn complete_and_wait(
        &self,
        id: &RecordId,
        args: &[&[u8]],
        (replicas, timeout): (usize, Duration),
    ) -> Result<(), StoreError> {
        let key = self.key(id);
        let mut invocation = self.scripts.complete.key(&key);
        for arg in args {
            invocation.arg(*arg);
        }
        let mut pipe = ::redis::pipe();
        pipe.invoke_script(&invocation)
            .cmd("WAIT")
            .arg(replicas)
            .arg(
                u64::try_from(timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            );
        let mut conn = self.conn.clone();
        let mut reply = pipe.query_async::<(i64, i64)>(&mut conn).await;
        if matches!(&reply, Err(e) if e.code() == Some("NOSCRIPT")) {
            // The server restarted since the store connected: load the script, once.
            self.scripts
                .complete
                .prepare_invoke()
                .key(&key)
                .load_async(&mut conn)
                .await
                .map_err(|e| unavailable("loading the Lua scripts", e))?;
            reply = pipe.query_async(&mut conn).await;
        }
        let (written, acked) =
            reply.map_err(|e| unavailable("completing a record (and WAIT)", e))?;
        fenced_unless(written == 1)?;
        let acked = usize::try_from(acked).unwrap_or(0);
        if acked < replicas {
            return Err(StoreError::unreplicated(acked, replicas, timeout));
        }
        Ok(())
    }
}

fn fenced_unless(written: bool) -> Result<(), StoreError> {
    if written {
        Ok(())
    } else {
        Err(StoreError::fenced())
    }
}

/// A failed connection to the Redis at `at` (host:port): a configuration error when
/// Redis answered the connection's setup with a refusal (a wrong password or user, a
/// database number out of range) or the client's settings are invalid; otherwise
/// unavailable, naming the address tried.
fn connect_failed(at: &str, e: RedisError) -> StoreError {
    match e.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig | ErrorKind::Server(_) => {
            StoreError::configuration_from(
                format!(
                    "Redis at {at} refused the connection's setup ({e}); check the password, \
                     user and database number in the URL (a database is 0 to one less than \
                     the server's `databases` setting, 16 by default)"
                ),
                e,
            )
        }
        _ => StoreError::unavailable(format!("Redis: connecting to {at} failed ({e})"), e),
    }
}

fn unavailable(what: &str, e: RedisError) -> StoreError {
    StoreError::unavailable(format!("Redis: {what} failed ({e})"), e)
}

/// A lease or retention in milliseconds, "forever" held to 100 years (13 decimal
/// digits, the width of the record's fields; Lua numbers stay exact integers).
fn millis(d: Duration) -> u64 {
    u64::try_from(clamp_forever(d).as_millis()).unwrap_or(u64::MAX)
}

/// One record as stored (the layout of [`RedisStore`]).
struct Record {
    completed: bool,
    retention: u64,
    /// `Err(lease)` while the claim's time is derived from the key's expiry.
    created: Result<u64, u64>,
    fingerprint: Bytes,
    /// What follows the fingerprint: the payload of a completed record read whole.
    payload: Bytes,
}

/// The value of a new in-progress record.
fn progress_value(req: &ClaimRequest<'_>) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEAD + req.fingerprint.len());
    v.extend_from_slice(
        format!(
            "P{}{:013}L{:013}{:010}",
            req.token.to_hex(),
            millis(req.retention),
            millis(req.lease),
            req.fingerprint.len()
        )
        .as_bytes(),
    );
    v.extend_from_slice(req.fingerprint);
    v
}

/// `P` and the token: the head of the record the token holds.
fn holder(token: FencingToken) -> String {
    format!("P{}", token.to_hex())
}

fn corrupt_record() -> StoreError {
    StoreError::corrupt(
        "a Redis record has an unexpected layout (written by another program, or by the hash layout of an earlier version)",
    )
}

fn number(v: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(corrupt_record)
}

fn decode_record(bytes: &Bytes) -> Result<Record, StoreError> {
    if bytes.len() < HEAD {
        return Err(corrupt_record());
    }
    let completed = match bytes[0] {
        b'P' => false,
        b'C' => true,
        _ => return Err(corrupt_record()),
    };
    let at = number(&bytes[47..60])?;
    let created = match bytes[46] {
        b'L' => Err(at),
        b'C' => Ok(at),
        _ => return Err(corrupt_record()),
    };
    let len = usize::try_from(number(&bytes[60..HEAD])?).map_err(|_| corrupt_record())?;
    let end = HEAD
        .checked_add(len)
        .filter(|end| *end <= bytes.len())
        .ok_or_else(corrupt_record)?;
    Ok(Record {
        completed,
        retention: number(&bytes[33..46])?,
        created,
        fingerprint: bytes.slice(HEAD..end),
        payload: bytes.slice(end..),
    })
}

fn bulk(v: Option<Value>) -> Result<Bytes, StoreError> {
    match v {
        Some(Value::BulkString(b)) => Ok(Bytes::from(b)),
        _ => Err(corrupt_record()),
    }
}

/// Reads the reply of the inspect script for record `id`.
fn decode_info(v: Value, id: RecordId) -> Result<Option<RecordInfo>, StoreError> {
    let bad = || StoreError::corrupt("Redis inspect script returned an unexpected reply");
    let mut items = match v {
        Value::Nil => return Ok(None),
        Value::Array(items) => items.into_iter(),
        _ => return Err(bad()),
    };
    let head = bulk(items.next())?;
    let mut int = || match items.next() {
        Some(Value::Int(n)) => Ok(u64::try_from(n).unwrap_or(0)),
        _ => Err(bad()),
    };
    let (expire_at, payload_len) = (int()?, int()?);
    let time = |ms: u64| {
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let record = decode_record(&head)?;
    let (state, expires, payload_len) = if record.completed {
        (RecordState::Completed, expire_at, Some(payload_len))
    } else {
        (
            RecordState::InProgress,
            expire_at.saturating_sub(record.retention),
            None,
        )
    };
    // A derived creation time: before any renewal, the lease ends at the key's expiry
    // minus the retention.
    let lease_end = expire_at.saturating_sub(record.retention);
    let created = record
        .created
        .unwrap_or_else(|lease| lease_end.saturating_sub(lease));
    Ok(Some(RecordInfo {
        id,
        state,
        fingerprint: record.fingerprint,
        created: time(created),
        expires: time(expires),
        payload_len,
    }))
}

/// What a claim found: the record (or nothing, when it wrote its own) and the key's
/// `PTTL` at that moment. `None` for an expired lease (or a key gone since).
fn decode_found(found: Option<Bytes>, pttl: i64) -> Result<Option<Claim>, StoreError> {
    let Some(found) = found else {
        return Ok(Some(Claim::Acquired { takeover: false }));
    };
    let record = decode_record(&found)?;
    if record.completed {
        return Ok(Some(Claim::Completed {
            fingerprint: record.fingerprint,
            payload: record.payload,
        }));
    }
    let left = u64::try_from(pttl)
        .unwrap_or(0)
        .saturating_sub(record.retention);
    Ok((left > 0).then(|| Claim::InProgress {
        fingerprint: record.fingerprint,
        lease_remaining: Duration::from_millis(left),
    }))
}

fn decode_takeover(v: Value) -> Result<Claim, StoreError> {
    let bad = || StoreError::corrupt("Redis takeover script returned an unexpected reply");
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let mut items = items.into_iter();
    match items.next() {
        Some(Value::Int(1)) => Ok(Claim::Acquired {
            takeover: matches!(items.next(), Some(Value::Int(1))),
        }),
        Some(Value::Int(3)) => decode_found(Some(bulk(items.next())?), 0)?.ok_or_else(bad),
        Some(Value::Int(2)) => {
            let record = decode_record(&bulk(items.next())?)?;
            let Some(Value::Int(left)) = items.next() else {
                return Err(bad());
            };
            Ok(Claim::InProgress {
                fingerprint: record.fingerprint,
                lease_remaining: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
            })
        }
        _ => Err(bad()),
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let key = self.key(req.id);
        let value = progress_value(&req);
        let ttl = millis(req.lease)
            .saturating_add(millis(req.retention))
            .max(1);
        let mut pipe = ::redis::pipe();
        pipe.cmd("SET")
            .arg(&key)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(ttl)
            .arg("GET")
            .cmd("PTTL")
            .arg(&key);
        let (found, pttl): (Option<Vec<u8>>, i64) = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| {
                // A pipeline wraps the server's error: its code is in the message.
                if e.code() == Some("WRONGTYPE") || e.to_string().contains("WRONGTYPE") {
                    corrupt_record()
                } else {
                    unavailable("claiming a record", e)
                }
            })?;
        if let Some(claim) = decode_found(found.map(Bytes::from), pttl)? {
            return Ok(claim);
        }
        let reply: Value = self
            .scripts
            .takeover
            .key(key)
            .arg(value)
            .arg(ttl)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("taking over an expired claim", e))?;
        decode_takeover(reply)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let token = holder(token);
        let retention = millis(retention).max(1).to_string();
        let args: [&[u8]; 3] = [token.as_bytes(), &payload, retention.as_bytes()];
        match self.replicas {
            Some(wait) => self.complete_and_wait(id, &args, wait).await,
            None => {
                self.fenced_write("completing a record", &self.scripts.complete, id, &args)
                    .await
            }
        }
    }

    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let token = holder(token);
        let lease = millis(lease).to_string();
        let args: [&[u8]; 2] = [token.as_bytes(), lease.as_bytes()];
        self.fenced_write("renewing a lease", &self.scripts.renew, id, &args)
            .await
    }

    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let token = holder(token);
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
        let records = self.scan_keys().await?.into_iter().filter_map(|key| {
            // `<prefix>{<64 hex digits>}`: anything else under the prefix is not ours.
            let id = self.id_of(&key)?;
            Some((key, id))
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

    /// Woken by the message the complete and release scripts publish (pub/sub on one
    /// connection per store, subscribed to the pattern of the store's keys: each
    /// instance that has waiters receives a message per completed or released record).
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        // Armed before the listener is known to be subscribed: a message that arrives
        // once it is reaches this watch.
        let watch = self.notifier.settlements.subscribe(id);
        self.listen().await?;
        Ok(Box::new(watch))
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.get_mut().take() {
            listener.abort();
        }
    }
}

/// The record id of a key under `prefix` (`<prefix>{<64 hex digits>}`).
fn id_of(prefix: &str, key: &str) -> Option<RecordId> {
    let hex = key.get(prefix.len() + 1..key.len().checked_sub(1)?)?;
    let mut id = [0_u8; 32];
    hex::decode_to_slice(hex, &mut id).ok()?;
    Some(RecordId::from_bytes(id))
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
