//! Redis's memory and the records in it: the `maxmemory-policy` check made when the
//! store connects (an evicting policy is refused unless allowed), the periodic look at
//! `evicted_keys` ([`RedisStore::check_memory`]), and the error a full Redis answers.
//!
//! Why: every record has a TTL, so under `allkeys-*` or any `volatile-*` policy a full
//! Redis silently drops live records, and a retry of a request whose record was
//! dropped runs again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use ::redis::{Cmd, ErrorKind, RedisError, Value};

use super::RedisStore;
use super::conn::{Conn, unavailable};
use crate::store::StoreError;

/// The URL parameter that allows an evicting `maxmemory-policy`
/// ([`RedisStoreBuilder::allow_eviction`](super::RedisStoreBuilder::allow_eviction)).
pub(super) const ALLOW_EVICTION_PARAM: &str = "allow_eviction";

/// How often the store looks at Redis's memory by default ([`RedisStore::check_memory`]).
pub(super) const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// What one Redis server (a primary, in a cluster) says about its memory, as
/// [`RedisStore::check_memory`] read it from `INFO memory` and `INFO stats`.
///
/// A field is `None` when the server's `INFO` does not give it (a managed Redis or a
/// proxy may hide some).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisMemory {
    /// The server, `host:port`.
    pub node: String,
    /// Its `maxmemory-policy` (`noeviction` is the only one under which no record is
    /// dropped before its retention ends).
    pub policy: Option<String>,
    /// Its `maxmemory` in bytes (`0`: no limit).
    pub maxmemory: Option<u64>,
    /// The memory it uses now (`used_memory`), in bytes.
    pub used_memory: Option<u64>,
    /// Keys it evicted since it started (`evicted_keys`, all keys of the server, not
    /// only this store's).
    pub evicted_keys: Option<u64>,
    /// How many more keys it evicted than at the previous look by this store (the
    /// first look is made when the store connects); `0` on the first look at a node.
    pub evicted_since_last_check: u64,
}

impl RedisMemory {
    /// `true` when [`RedisMemory::policy`] evicts keys when memory is full
    /// (`allkeys-*`, `volatile-*`).
    #[must_use]
    pub fn policy_evicts(&self) -> bool {
        self.policy.as_deref().is_some_and(evicts)
    }
}

/// `true` for the policies that evict keys (`allkeys-lru`, `allkeys-lfu`,
/// `allkeys-random`, `volatile-lru`, `volatile-lfu`, `volatile-random`, `volatile-ttl`):
/// every record has a TTL, so the `volatile-*` ones evict records as well.
fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// The state of the look at memory shared by a store's clones and its periodic task.
pub(super) struct MemoryWatch {
    conn: Conn,
    /// The address of a single server (a cluster names its nodes itself).
    at: String,
    allow_eviction: bool,
    /// `evicted_keys` of each node at the previous look.
    seen: Mutex<HashMap<String, u64>>,
}

/// Aborts the periodic look at memory when the last clone of the store is dropped.
pub(super) struct MemoryTask(Option<tokio::task::JoinHandle<()>>);

impl Drop for MemoryTask {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Takes the `allow_eviction` parameter out of `url`: the URL without it (the Redis
/// client does not know it) and its value, if given.
pub(super) fn take_allow_eviction(url: &str) -> Result<(String, Option<bool>), StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut allow = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != ALLOW_EVICTION_PARAM {
            kept.push(pair);
            continue;
        }
        allow = Some(match value {
            "true" => true,
            "false" => false,
            other => {
                return Err(StoreError::configuration(format!(
                    "Redis: the URL parameter {ALLOW_EVICTION_PARAM}={other:?} is neither \
                     `true` nor `false`"
                )));
            }
        });
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, allow))
}

/// `true` when Redis refused to write because it is full (`OOM command not allowed
/// when used memory > 'maxmemory'`), also inside a pipeline or a script.
pub(super) fn is_oom(e: &RedisError) -> bool {
    e.code() == Some("OOM")
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "OOM"))
        || e.to_string()
            .contains("command not allowed when used memory > 'maxmemory'")
}

/// The error of a write that a full Redis refused: what happened, that nothing was
/// evicted or executed, and what to do.
pub(super) fn full(what: &str, e: RedisError) -> StoreError {
    StoreError::unavailable(
        format!(
            "Redis: {what} failed: Redis is full (its used memory reached `maxmemory`, and \
             its `maxmemory-policy` is `noeviction`, so it refuses new writes instead of \
             evicting records; the records it holds are kept and still replay) ({e}); \
             raise `maxmemory` (or add shards), shorten the retention of completed \
             records, or remove what else fills this Redis"
        ),
        e,
    )
}

/// `true` when Redis answered a command with a refusal (an unknown or renamed command,
/// an ACL without the permission), rather than failing to answer.
fn refused(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

/// `cmd` on the single server, or on every primary of the cluster: each node's reply
/// by `host:port`.
async fn on_every_primary(
    conn: &Conn,
    at: &str,
    cmd: Cmd,
) -> Result<Vec<(String, Value)>, RedisError> {
    match conn {
        Conn::Single(c) => {
            let reply: Value = cmd.query_async(&mut c.clone()).await?;
            Ok(vec![(at.to_owned(), reply)])
        }
        Conn::Cluster(c) => {
            let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let reply = c.clone().route_command(cmd, all).await?;
            let nodes = match reply {
                Value::Map(nodes) => nodes,
                other => return Ok(vec![(at.to_owned(), other)]),
            };
            Ok(nodes
                .into_iter()
                .map(|(node, reply)| {
                    let node = ::redis::from_redis_value::<String>(node)
                        .unwrap_or_else(|_| "a cluster node".to_owned());
                    (node, reply)
                })
                .collect())
        }
    }
}

/// The fields of an `INFO` reply (`name:value` lines).
fn info_fields(info: &str) -> HashMap<&str, &str> {
    info.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .collect()
}

/// What `INFO memory` and `INFO stats` of each node say ([`RedisMemory`], before the
/// comparison with the previous look). `Ok(None)` when Redis refuses `INFO`.
async fn read_info(conn: &Conn, at: &str) -> Result<Option<Vec<RedisMemory>>, StoreError> {
    let mut cmd = ::redis::cmd("INFO");
    cmd.arg("memory").arg("stats");
    let replies = match on_every_primary(conn, at, cmd).await {
        Ok(replies) => replies,
        Err(e) if refused(&e) => return Ok(None),
        Err(e) => return Err(unavailable("reading INFO memory", e)),
    };
    let mut nodes = Vec::with_capacity(replies.len());
    for (node, reply) in replies {
        let Ok(info) = ::redis::from_redis_value::<String>(reply) else {
            // A node that refused (an error reply in the map) tells nothing.
            return Ok(None);
        };
        let fields = info_fields(&info);
        let number = |name| fields.get(name).and_then(|v| v.parse::<u64>().ok());
        nodes.push(RedisMemory {
            policy: fields.get("maxmemory_policy").map(|p| (*p).to_owned()),
            maxmemory: number("maxmemory"),
            used_memory: number("used_memory"),
            evicted_keys: number("evicted_keys"),
            evicted_since_last_check: 0,
            node,
        });
    }
    Ok(Some(nodes))
}

/// `maxmemory-policy` and `maxmemory` of each node by `CONFIG GET`; `Ok(None)` when
/// Redis refuses `CONFIG` (a managed Redis: an ACL without `+config`, a renamed
/// command).
async fn read_config(conn: &Conn, at: &str) -> Result<Option<Vec<RedisMemory>>, StoreError> {
    let mut cmd = ::redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy").arg("maxmemory");
    let replies = match on_every_primary(conn, at, cmd).await {
        Ok(replies) => replies,
        Err(e) if refused(&e) => return Ok(None),
        Err(e) => return Err(unavailable("reading maxmemory-policy (CONFIG GET)", e)),
    };
    let mut nodes = Vec::with_capacity(replies.len());
    for (node, reply) in replies {
        let Ok(config) = ::redis::from_redis_value::<HashMap<String, String>>(reply) else {
            return Ok(None);
        };
        nodes.push(RedisMemory {
            policy: config.get("maxmemory-policy").cloned(),
            maxmemory: config.get("maxmemory").and_then(|v| v.parse().ok()),
            used_memory: None,
            evicted_keys: None,
            evicted_since_last_check: 0,
            node,
        });
    }
    Ok(Some(nodes))
}

/// The refusal of an evicting policy: which, why, and how to override it knowingly.
fn evicting_policy(node: &RedisMemory, policy: &str) -> StoreError {
    let limit = match node.maxmemory {
        Some(0) => " (`maxmemory` is 0, no limit, today; the policy evicts as soon as one \
                    is set)"
            .to_owned(),
        Some(bytes) => format!(" (`maxmemory` {bytes} bytes)"),
        None => String::new(),
    };
    StoreError::configuration(format!(
        "Redis at {} runs with `maxmemory-policy {policy}`{limit}: when it is full it \
         evicts keys, idempotency records among them (each has a TTL), and a record \
         evicted before its retention ends lets a retry of that request execute again. \
         Set `maxmemory-policy noeviction` on this Redis (a full Redis then refuses new \
         requests with 503, and never drops a record), or, if losing records is \
         acceptable here, allow it knowingly: `RedisStoreBuilder::allow_eviction(true)`, \
         or `?{ALLOW_EVICTION_PARAM}=true` in the store's URL",
        node.node
    ))
}

impl MemoryWatch {
    /// Reads the policy of the server (of every primary of a cluster): by `CONFIG GET`,
    /// or where Redis refuses `CONFIG`, from `INFO memory`. Refuses an evicting policy
    /// unless `allow_eviction`; accepts with a warning when neither tells it. Takes the
    /// first reading of `evicted_keys`.
    pub(super) async fn connect(
        conn: Conn,
        at: String,
        allow_eviction: bool,
    ) -> Result<Arc<Self>, StoreError> {
        let watch = Arc::new(Self {
            conn,
            at,
            allow_eviction,
            seen: Mutex::new(HashMap::new()),
        });
        let config = read_config(&watch.conn, &watch.at).await?;
        let info = watch.look().await?;
        let (nodes, via) = match (config, info) {
            (Some(config), _) => (config, "CONFIG GET"),
            (None, Some(info)) => (info, "INFO memory"),
            (None, None) => {
                tracing::warn!(
                    redis = %watch.at,
                    "Redis refused both CONFIG GET and INFO memory, so the store cannot tell \
                     its maxmemory-policy: make sure it is `noeviction` (an evicting policy \
                     drops records before their retention ends, and a retry of such a \
                     request executes again)"
                );
                return Ok(watch);
            }
        };
        for node in &nodes {
            match node.policy.as_deref() {
                Some("noeviction") => {}
                Some(policy) if evicts(policy) => {
                    if !allow_eviction {
                        return Err(evicting_policy(node, policy));
                    }
                    tracing::warn!(
                        redis = %node.node,
                        policy,
                        "Redis evicts keys when full (maxmemory-policy {policy}) and the \
                         store was told to allow it: a record evicted before its retention \
                         ends lets a retry execute again; watch evicted_keys"
                    );
                }
                Some(policy) => tracing::warn!(
                    redis = %node.node,
                    policy,
                    "Redis runs an unknown maxmemory-policy {policy:?} (read by {via}): the \
                     store accepts it, make sure it never evicts keys"
                ),
                None => tracing::warn!(
                    redis = %node.node,
                    "Redis did not say its maxmemory-policy (read by {via}): make sure it is \
                     `noeviction`"
                ),
            }
        }
        Ok(watch)
    }

    /// Starts the periodic look at memory, every `interval`.
    pub(super) fn spawn(self: &Arc<Self>, interval: Duration) -> MemoryTask {
        let watch = Arc::clone(self);
        MemoryTask(Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // the first tick is now: connect just looked
            loop {
                ticks.tick().await;
                if let Err(e) = watch.look().await {
                    tracing::debug!("looking at Redis's memory failed: {e}");
                }
            }
        })))
    }

    /// One look: `INFO memory` and `INFO stats` of every node; the growth of
    /// `evicted_keys` since the previous look is counted, reported as the metric and
    /// warned about. `Ok(None)` when Redis refuses `INFO`.
    async fn look(&self) -> Result<Option<Vec<RedisMemory>>, StoreError> {
        let Some(mut nodes) = read_info(&self.conn, &self.at).await? else {
            return Ok(None);
        };
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for node in &mut nodes {
            let Some(evicted) = node.evicted_keys else {
                continue;
            };
            #[cfg(feature = "metrics")]
            metrics::counter!(
                idemkey_core::telemetry::STORE_REDIS_EVICTED_KEYS,
                "node" => node.node.clone()
            )
            .absolute(evicted);
            // A restarted server counts from 0 again: growth is what is above the last
            // reading, or everything when the count went down.
            let before = seen.insert(node.node.clone(), evicted);
            node.evicted_since_last_check = match before {
                Some(before) if evicted >= before => evicted - before,
                Some(_) => evicted,
                None => 0,
            };
            if node.evicted_since_last_check > 0 {
                tracing::warn!(
                    redis = %node.node,
                    evicted = node.evicted_since_last_check,
                    policy = node.policy.as_deref().unwrap_or("unknown"),
                    "Redis evicted {} keys since the store last looked (maxmemory-policy {}): \
                     idempotency records may be among them, and a retry of a request whose \
                     record was evicted executes again; set maxmemory-policy noeviction and \
                     give Redis more memory{}",
                    node.evicted_since_last_check,
                    node.policy.as_deref().unwrap_or("unknown"),
                    if self.allow_eviction {
                        " (the store was told to allow eviction)"
                    } else {
                        " (its policy was changed since the store connected)"
                    }
                );
            } else if node.policy_evicts() && !self.allow_eviction && before.is_some() {
                tracing::warn!(
                    redis = %node.node,
                    policy = node.policy.as_deref().unwrap_or("unknown"),
                    "Redis's maxmemory-policy was changed to an evicting one since the store \
                     connected: when full it will evict idempotency records, and a retry of a \
                     request whose record was evicted executes again; set it back to \
                     noeviction"
                );
            }
        }
        Ok(Some(nodes))
    }
}

impl RedisStore {
    /// Looks at Redis's memory now (`INFO memory` and `INFO stats`, on every primary of
    /// a cluster): the policy, `maxmemory`, `used_memory` and `evicted_keys` of each
    /// server, and how many keys it evicted since the store's previous look. The store
    /// also looks by itself every minute (see
    /// [`RedisStoreBuilder::memory_check_interval`](super::RedisStoreBuilder::memory_check_interval)).
    ///
    /// Each look sets the counter `idemkey_store_redis_evicted_keys_total` (feature
    /// `metrics`, label `node`) to the server's `evicted_keys`, and logs a warning when
    /// it grew: a record evicted before its retention ends lets a retry execute again.
    /// It also warns when the policy was changed to an evicting one since the store
    /// connected.
    ///
    /// ```no_run
    /// use idemkey::store::RedisStore;
    /// # async fn demo() -> Result<(), idemkey::store::StoreError> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// for node in store.check_memory().await? {
    ///     assert_eq!(node.evicted_since_last_check, 0, "{node:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::is_unavailable`] when Redis cannot be reached; an empty list when
    /// it refuses `INFO`.
    pub async fn check_memory(&self) -> Result<Vec<RedisMemory>, StoreError> {
        Ok(self.memory.look().await?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::{evicts, take_allow_eviction};

    #[test]
    fn the_parameter_leaves_the_url() {
        let cases = [
            ("redis://h:1", "redis://h:1", None),
            ("redis://h/?allow_eviction=true", "redis://h/", Some(true)),
            (
                "redis://h/0?protocol=resp3&allow_eviction=false",
                "redis://h/0?protocol=resp3",
                Some(false),
            ),
            (
                "redis://h/?allow_eviction=true&protocol=resp3",
                "redis://h/?protocol=resp3",
                Some(true),
            ),
        ];
        for (url, left, allow) in cases {
            let (got, got_allow) = take_allow_eviction(url).expect(url);
            assert_eq!((got.as_str(), got_allow), (left, allow), "{url}");
        }
        let err = take_allow_eviction("redis://h/?allow_eviction=yes").expect_err("invalid");
        assert!(
            err.is_configuration() && err.to_string().contains("\"yes\""),
            "{err}"
        );
    }

    #[test]
    fn which_policies_evict() {
        for p in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(evicts(p), "{p}");
        }
        assert!(!evicts("noeviction"));
    }
}
