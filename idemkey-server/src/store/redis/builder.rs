//! [`RedisStoreBuilder`]: the store's settings, and connecting (one server, or a
//! cluster from its seed nodes).

use std::time::Duration;

use ::redis::Client;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;

use super::conn::{Conn, connect_failed, unavailable};
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
