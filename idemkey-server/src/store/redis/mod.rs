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

mod admin;
mod builder;
mod codec;
mod conn;
mod memory;
mod quota;
mod scripts;

use std::time::Duration;

use ::redis::{Client, Script, Value};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use self::admin::READS_IN_FLIGHT;
use self::codec::{
    corrupt_record, decode_found, decode_takeover, fenced_unless, holder, millis, progress_value,
};
use self::conn::{Conn, unavailable};
use self::scripts::Scripts;
use super::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, RecordState, Settlements, Store,
    StoreError, Watch,
};

pub use self::builder::RedisStoreBuilder;
pub use self::memory::RedisMemory;

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
/// # When Redis is full
///
/// Every record has a TTL (lease plus retention while in progress, the retention once
/// completed), so what bounds the memory the records take is the rate of new keys
/// times the retention, against Redis's `maxmemory`. What a full Redis does depends on
/// its `maxmemory-policy`:
///
/// - `noeviction` (Redis's default; the one to use): Redis refuses writes while its
///   used memory is over `maxmemory`. A claim on a new key fails with
///   [`StoreError::is_unavailable`] (the verifier answers 503 with `Retry-After`, and
///   runs no handler), and the message says that Redis is full and what to do (raise
///   `maxmemory`, shorten the retention, or remove what else fills it). Nothing is
///   evicted: a completed record still replays (the claim reads it when Redis refuses
///   its `SET`), a running one still answers in progress, and room comes back as
///   records expire.
/// - any evicting policy (`allkeys-lru`, `allkeys-lfu`, `allkeys-random`,
///   `volatile-lru`, `volatile-lfu`, `volatile-random`, `volatile-ttl`; every record has
///   a TTL, so `volatile-*` evict records too): Redis silently drops records to make
///   room, and a retry of a request whose record was dropped executes again. So
///   [`RedisStoreBuilder::connect`] refuses such a Redis with
///   [`StoreError::is_configuration`] (and [`open`](crate::store::open) with
///   [`OpenError::is_configuration`](crate::store::OpenError::is_configuration)), the
///   message naming the policy, unless told to allow it:
///   [`RedisStoreBuilder::allow_eviction`], or `?allow_eviction=true` in the URL.
///
/// The policy is read with `CONFIG GET`; where Redis refuses `CONFIG` (a managed Redis:
/// an ACL without `+config`, a renamed command) from the `maxmemory_policy` field of
/// `INFO memory`. When Redis refuses both, the store connects and logs a warning. On a
/// cluster every primary the client knows when it connects is checked.
///
/// After connecting, the store looks at `INFO memory` and `INFO stats` every minute
/// ([`RedisStoreBuilder::memory_check_interval`], [`RedisStore::check_memory`]): with the
/// `metrics` feature it sets the counter `idemkey_store_redis_evicted_keys_total` to the
/// server's `evicted_keys`, and it logs a warning when that count grows (eviction
/// allowed, or a policy changed at runtime) or when the policy was changed to an
/// evicting one. Alert on: `evicted_keys` (or that counter) growing at all;
/// `used_memory` near `maxmemory` (Redis's own metrics); and 503s or
/// `idemkey_store_errors_total{store="redis",error="unavailable"}` whose log says
/// "Redis is full".
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
    /// The look at Redis's memory ([`RedisStore::check_memory`]).
    memory: std::sync::Arc<memory::MemoryWatch>,
    /// The periodic look, ended when the last clone is dropped.
    _memory_task: std::sync::Arc<Option<memory::MemoryTask>>,
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
            allow_eviction: None,
            memory_check: Some(memory::DEFAULT_CHECK_INTERVAL),
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

    /// Connects to `url` with the default settings (and `?allow_eviction=true`, when
    /// the URL has it: [`RedisStoreBuilder::allow_eviction`]).
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`]: [`StoreError::is_configuration`] when the URL
    /// is invalid, Redis refuses its credentials or database, or Redis runs an evicting
    /// `maxmemory-policy`; [`StoreError::is_unavailable`] when Redis cannot be reached.
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

    /// A claim that a full Redis refused (`OOM`: `SET` is refused whether or not the key
    /// exists): reads the record instead (`GET` and `PTTL`, which a full Redis still
    /// serves), so that a completed record still replays and a running one still
    /// answers in progress. A new key, or an expired lease to take over, fails with
    /// the full error: nothing is written, nothing evicted.
    async fn claim_when_full(
        &self,
        key: String,
        oom: ::redis::RedisError,
    ) -> Result<Claim, StoreError> {
        let mut pipe = ::redis::pipe();
        pipe.cmd("GET").arg(&key).cmd("PTTL").arg(&key);
        let (found, pttl): (Option<Vec<u8>>, i64) = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("reading a record (Redis is full)", e))?;
        match found {
            Some(found) => match decode_found(Some(Bytes::from(found)), pttl)? {
                Some(claim) => Ok(claim),
                None => Err(memory::full("taking over an expired claim", oom)),
            },
            None => Err(memory::full("claiming a record", oom)),
        }
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
        let reply: Result<(Option<Vec<u8>>, i64), _> =
            pipe.query_async(&mut self.conn.clone()).await;
        let (found, pttl) = match reply {
            Ok(found) => found,
            // A full Redis refuses the `SET` even when the key exists: read instead.
            Err(e) if memory::is_oom(&e) => return self.claim_when_full(key, e).await,
            // A pipeline wraps the server's error: its code is in the message.
            Err(e) if e.code() == Some("WRONGTYPE") || e.to_string().contains("WRONGTYPE") => {
                return Err(corrupt_record());
            }
            Err(e) => return Err(unavailable("claiming a record", e)),
        };
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

    /// The claim's script charges the scope's bucket too (one round trip; see
    /// `quota.rs`).
    async fn claim_charged(
        &self,
        req: ClaimRequest<'_>,
        charge: super::QuotaCharge<'_>,
    ) -> Result<super::ChargedClaim, StoreError> {
        self.claim_charged_impl(req, charge).await
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
