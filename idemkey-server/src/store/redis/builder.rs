//! [`RedisStoreBuilder`]: the store's settings, and connecting (one server, or a
//! cluster from its seed nodes).

use std::time::Duration;

use ::redis::Client;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;

use super::conn::{Conn, connect_failed, unavailable};
use super::memory::{MemoryWatch, take_allow_eviction};
use super::scripts::Scripts;
use super::{Notifier, RedisStore};
use crate::store::{Settlements, StoreError};

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`].
#[derive(Clone)]
pub struct RedisStoreBuilder {
    /// One URL, or the seed nodes of a cluster.
    pub(super) urls: Vec<String>,
    pub(super) cluster: bool,
    pub(super) prefix: String,
    pub(super) response_timeout: Duration,
    pub(super) connection_timeout: Duration,
    pub(super) reconnect_attempts: usize,
    /// Replicas that must acknowledge a completion, and how long to wait for them.
    pub(super) replicas: Option<(usize, Duration)>,
    /// Whether an evicting `maxmemory-policy` is accepted: `None` leaves it to the URL's
    /// `allow_eviction` parameter (default: refused).
    pub(super) allow_eviction: Option<bool>,
    /// How often the store looks at Redis's memory (`None`: only when asked).
    pub(super) memory_check: Option<Duration>,
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
            .field("allow_eviction", &self.allow_eviction)
            .field("memory_check_interval", &self.memory_check)
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

    /// Accepts a Redis whose `maxmemory-policy` evicts keys (`allkeys-*`, `volatile-*`),
    /// which [`connect`](Self::connect) otherwise refuses (default `false`; the URL
    /// parameter `?allow_eviction=true` does the same, and this setting, when made,
    /// wins over it).
    ///
    /// Every record has a TTL, so under any of those policies a full Redis drops live
    /// records to make room, and a retry of a request whose record was dropped executes
    /// again: the failure idempotency keys exist to prevent. Allow it only for a Redis
    /// that never fills (and watch `evicted_keys`:
    /// [`RedisStore::check_memory`], the metric `idemkey_store_redis_evicted_keys_total`),
    /// or where a second execution is acceptable. The store logs a warning when it
    /// connects to such a Redis, and each time it sees `evicted_keys` grow.
    ///
    /// ```no_run
    /// use idemkey::store::RedisStore;
    /// # async fn demo() -> Result<(), idemkey::store::StoreError> {
    /// // A cache Redis (allkeys-lru) with room to spare; evictions are alerted on.
    /// let store = RedisStore::builder("redis://cache.internal:6379")
    ///     .allow_eviction(true)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = Some(allow);
        self
    }

    /// How often the store looks at Redis's memory by itself ([`RedisStore::check_memory`]:
    /// one `INFO memory stats` per server, every primary of a cluster), to report
    /// evicted keys (the metric, a warning) and a policy changed at runtime (default
    /// every 60 s; `None`: only when [`RedisStore::check_memory`] is called). The look
    /// runs in a task of the Tokio runtime that connects the store, until the last
    /// clone of the store is dropped.
    #[must_use]
    pub fn memory_check_interval(mut self, interval: Option<Duration>) -> Self {
        self.memory_check = interval.filter(|i| !i.is_zero());
        self
    }

    /// Connects, checks Redis's `maxmemory-policy` and loads the scripts.
    ///
    /// The policy is read with `CONFIG GET maxmemory-policy maxmemory`; where Redis
    /// refuses `CONFIG` (a managed Redis: an ACL without `+config`, a renamed command),
    /// from the `maxmemory_policy` field of `INFO memory`. On a cluster, every primary
    /// the client knows when it connects is checked. `noeviction` is accepted; an
    /// evicting policy is refused unless [`allow_eviction`](Self::allow_eviction) (or
    /// the URL's `?allow_eviction=true`). When Redis refuses both commands, the store
    /// connects and logs a warning: it cannot tell, and refusing would lock out proxies
    /// and managed services that hide both.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_configuration`] when the URL is invalid, Redis refuses its
    /// password, user or database number, or Redis runs an evicting `maxmemory-policy`
    /// and eviction was not allowed (the message names the policy and the override);
    /// [`StoreError::is_unavailable`] when Redis cannot be reached (the message names
    /// the host and port tried).
    pub async fn connect(mut self) -> Result<RedisStore, StoreError> {
        let mut allowed_by_url = None;
        for url in &mut self.urls {
            let (bare, allow) = take_allow_eviction(url)?;
            *url = bare;
            allowed_by_url = allowed_by_url.or(allow);
        }
        let allow_eviction = self.allow_eviction.or(allowed_by_url).unwrap_or(false);
        let at;
        let mut conn = if self.cluster {
            at = "the Redis Cluster".to_owned();
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
            at = client.get_connection_info().addr().to_string();
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
        let memory = MemoryWatch::connect(conn.clone(), at, allow_eviction).await?;
        let memory_task = self.memory_check.map(|every| memory.spawn(every));
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
            memory,
            _memory_task: std::sync::Arc::new(memory_task),
            notifier: std::sync::Arc::new(Notifier {
                url: self.urls.first().cloned().unwrap_or_default(),
                settlements: Settlements::default(),
                listener: tokio::sync::Mutex::new(None),
            }),
        })
    }
}
