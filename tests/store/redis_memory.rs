//! No silent eviction on Redis: the store refuses a Redis whose `maxmemory-policy`
//! evicts keys (unless told to allow it, by the builder or the URL), reads the policy
//! from `INFO memory` where `CONFIG` is refused, counts and warns about evicted keys,
//! and a full `noeviction` Redis answers new keys as unavailable (503) while every
//! record it holds still replays and no handler runs twice.
//!
//! Every server is private (`redis-server` on a free port, started with the setting
//! under test, killed by its pid when the test ends).

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idemkey::store::{
    Claim, ClaimRequest, FencingToken, RecordId, RedisStore, RedisStoreBuilder, Store, StoreError,
};
use support::RedisServer;
use support::apps::{self, ChargeApp};
use tracing_subscriber::layer::SubscriberExt;

/// The policies that evict keys; every record has a TTL, so `volatile-*` evict records
/// too.
const EVICTING: &[&str] = &["allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-ttl"];

/// A builder for `url` that does not look at memory by itself (the tests look).
fn builder(url: &str) -> RedisStoreBuilder {
    RedisStore::builder(url).memory_check_interval(None)
}

/// Asserts that `err` is the refusal of `policy`: a configuration error that names the
/// policy, says why and names both overrides.
fn assert_refused(err: &dyn std::fmt::Display, is_configuration: bool, policy: &str) {
    let msg = err.to_string();
    assert!(is_configuration, "a configuration error: {msg}");
    assert!(
        msg.contains(&format!("maxmemory-policy {policy}")),
        "names the policy: {msg}"
    );
    assert!(
        msg.contains("retry of that request execute again"),
        "says why: {msg}"
    );
    assert!(
        msg.contains("maxmemory-policy noeviction"),
        "says what to set: {msg}"
    );
    assert!(
        msg.contains("allow_eviction(true)") && msg.contains("?allow_eviction=true"),
        "names both overrides: {msg}"
    );
}

async fn refused_by_builder(url: &str) -> StoreError {
    builder(url)
        .connect()
        .await
        .expect_err("an evicting Redis is refused")
}

#[tokio::test]
async fn evicting_policies_are_refused_by_the_builder_and_by_open() {
    for policy in EVICTING {
        let server = RedisServer::start_with_args(&["--maxmemory-policy", policy]);
        let err = refused_by_builder(&server.url()).await;
        assert_refused(&err, err.is_configuration(), policy);
        assert!(!err.is_unavailable(), "{err}");

        let err = idemkey::store::open(&server.url())
            .await
            .err()
            .expect("open refuses an evicting Redis");
        assert_refused(&err, err.is_configuration(), policy);
        assert!(!err.is_unavailable() && !err.is_unsupported(), "{err}");
    }
}

#[tokio::test]
async fn noeviction_is_accepted() {
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let store = builder(&server.url())
        .connect()
        .await
        .expect("noeviction is accepted");
    let nodes = store.check_memory().await.expect("INFO");
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].policy.as_deref(), Some("noeviction"), "{nodes:?}");
    assert!(!nodes[0].policy_evicts());
    idemkey::store::open(&server.url())
        .await
        .expect("open accepts noeviction");
}

#[tokio::test]
async fn eviction_is_allowed_knowingly_by_the_builder_or_the_url() {
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    let (logs, _guard) = capture_logs();

    let store = builder(&server.url())
        .allow_eviction(true)
        .connect()
        .await
        .expect("allowed by the builder");
    claim_once(&store).await;
    assert!(
        logs.warnings()
            .iter()
            .any(|w| w.contains("allkeys-lru") && w.contains("allow it")),
        "a warning says eviction is allowed: {:?}",
        logs.warnings()
    );

    let url = format!("{}/?allow_eviction=true", server.url());
    let store = idemkey::store::open(&url)
        .await
        .expect("allowed by the URL parameter");
    let id = RecordId::new("t", &support::unique("k"));
    let claim = store
        .claim(request(&id, FencingToken::random()))
        .await
        .expect("the parameter is taken out of the URL the client reads");
    assert_eq!(claim, Claim::Acquired { takeover: false });
    builder(&url)
        .connect()
        .await
        .expect("the builder reads the URL parameter too");

    // The builder's own setting wins over the URL's.
    let err = builder(&url)
        .allow_eviction(false)
        .connect()
        .await
        .expect_err("refused by the builder's setting");
    assert_refused(&err, err.is_configuration(), "allkeys-lru");

    let err = idemkey::store::open(&format!("{}/?allow_eviction=yes", server.url()))
        .await
        .err()
        .expect("an invalid value");
    assert!(
        err.is_configuration() && err.to_string().contains("allow_eviction=\"yes\""),
        "{err}"
    );
}

#[tokio::test]
async fn where_config_is_renamed_the_policy_is_read_from_info() {
    let evicting = RedisServer::start_with_args(&[
        "--maxmemory-policy",
        "volatile-ttl",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    assert!(
        support::redis_cli(evicting.port(), &["config", "get", "maxmemory"]).contains("unknown"),
        "CONFIG is renamed away on this server"
    );
    let err = refused_by_builder(&evicting.url()).await;
    assert_refused(&err, err.is_configuration(), "volatile-ttl");

    let fine = RedisServer::start_with_args(&[
        "--maxmemory-policy",
        "noeviction",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    builder(&fine.url())
        .connect()
        .await
        .expect("noeviction read from INFO is accepted");
}

#[tokio::test]
async fn where_an_acl_denies_config_the_policy_is_read_from_info() {
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    let port = server.port();
    for (user, rules) in [
        ("noconfig", vec!["-config"]),
        ("noconfignoinfo", vec!["-config", "-info"]),
    ] {
        let mut args = vec!["acl", "setuser", user, "on", ">pw", "~*", "&*", "+@all"];
        args.extend(rules);
        let reply = support::redis_cli(port, &args);
        assert!(reply.contains("OK"), "ACL SETUSER {user}: {reply}");
    }

    let err = refused_by_builder(&format!("redis://noconfig:pw@127.0.0.1:{port}")).await;
    assert_refused(&err, err.is_configuration(), "allkeys-lru");

    // Neither CONFIG nor INFO: the store cannot tell, connects, and warns.
    let (logs, _guard) = capture_logs();
    let store = builder(&format!("redis://noconfignoinfo:pw@127.0.0.1:{port}"))
        .connect()
        .await
        .expect("a Redis that hides its policy is accepted, with a warning");
    claim_once(&store).await;
    assert!(
        logs.warnings()
            .iter()
            .any(|w| w.contains("cannot tell its maxmemory-policy")),
        "a warning says the policy is unknown: {:?}",
        logs.warnings()
    );
    assert!(store.check_memory().await.expect("refused INFO").is_empty());
}

#[tokio::test]
async fn every_primary_of_a_cluster_is_checked() {
    let cluster = support::RedisCluster::start();
    let urls = cluster.urls();
    RedisStore::cluster(urls.clone())
        .memory_check_interval(None)
        .connect()
        .await
        .expect("a cluster on noeviction is accepted");

    // One primary evicts: the store names it.
    let last = urls.last().expect("three nodes");
    let port: u16 = last
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("a port");
    let reply = support::redis_cli(port, &["config", "set", "maxmemory-policy", "allkeys-lfu"]);
    assert!(reply.contains("OK"), "CONFIG SET: {reply}");
    let err = RedisStore::cluster(urls.clone())
        .memory_check_interval(None)
        .connect()
        .await
        .expect_err("a cluster with an evicting primary is refused");
    assert_refused(&err, err.is_configuration(), "allkeys-lfu");
    assert!(
        err.to_string().contains(&format!(":{port}")),
        "names the node: {err}"
    );
    let store = RedisStore::cluster(urls)
        .memory_check_interval(None)
        .allow_eviction(true)
        .connect()
        .await
        .expect("allowed");
    assert_eq!(store.check_memory().await.expect("INFO").len(), 3);
}

/// A full `noeviction` Redis: filling it with claims ends in an error that is
/// unavailable and says Redis is full and what to do; every record written before
/// still replays (through the store and through the verifier), a new key gets 503 with
/// Retry-After, and no handler ran twice.
#[tokio::test]
async fn a_full_noeviction_redis_refuses_new_keys_and_keeps_replaying() {
    let server =
        RedisServer::start_with_args(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    let store = builder(&server.url())
        .connect()
        .await
        .expect("connect to the private Redis");
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let app = ChargeApp::new();
    let verifier = apps::spawn_app(Arc::clone(&shared), &app).await;
    let client = reqwest::Client::new();

    let keys: Vec<String> = (0..10).map(|i| support::unique(&format!("k{i}"))).collect();
    let mut first = Vec::new();
    for key in &keys {
        let reply = apps::charge(&client, verifier.addr(), key).await;
        assert_eq!(reply.status, 200, "before Redis is full: {reply:?}");
        first.push(reply.body);
    }

    // Records of 32 KiB, completed while there is room.
    let payload = Bytes::from(vec![b'x'; 32 * 1024]);
    let mut completed = Vec::new();
    for i in 0..5 {
        let id = RecordId::new("big", &i.to_string());
        let token = FencingToken::random();
        let claim = store.claim(request(&id, token)).await.expect("room left");
        assert_eq!(claim, Claim::Acquired { takeover: false });
        store
            .complete(&id, token, payload.clone(), Duration::from_secs(3600))
            .await
            .expect("room left");
        completed.push(id);
    }

    // Flood: claims on new keys until Redis refuses one (bounded: 2 MB hold far fewer
    // than 100 000 claims).
    let mut claimed = Vec::new();
    let mut refused = None;
    for i in 0..100_000 {
        let id = RecordId::new("flood", &i.to_string());
        match store.claim(request(&id, FencingToken::random())).await {
            Ok(Claim::Acquired { .. }) => claimed.push(id),
            Ok(other) => panic!("a fresh id found a record: {other:?}"),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let err = refused.expect("Redis refused a claim within 100 000");
    assert!(err.is_unavailable(), "a full Redis is unavailable: {err}");
    let msg = err.to_string();
    for says in [
        "Redis is full",
        "`maxmemory`",
        "noeviction",
        "raise `maxmemory`",
        "shorten the retention",
    ] {
        assert!(msg.contains(says), "the error says {says:?}: {msg}");
    }
    assert!(
        !claimed.is_empty(),
        "claims were written before Redis was full"
    );
    eprintln!("{} claims, then: {msg}", claimed.len());

    // Every record written before is intact and replays, although a full Redis
    // refuses the claim's `SET`.
    for id in &completed {
        let claim = store
            .claim(request(id, FencingToken::random()))
            .await
            .expect("a completed record replays while Redis is full");
        assert_eq!(
            claim,
            Claim::Completed {
                fingerprint: Bytes::from_static(b"fp"),
                payload: payload.clone()
            }
        );
    }
    for id in [claimed.first(), claimed.last()].into_iter().flatten() {
        let claim = store
            .claim(request(id, FencingToken::random()))
            .await
            .expect("a running record answers while Redis is full");
        assert!(matches!(claim, Claim::InProgress { .. }), "{claim:?}");
    }
    let new = store
        .claim(request(
            &RecordId::new("flood", "new"),
            FencingToken::random(),
        ))
        .await
        .expect_err("a new key is refused while Redis is full");
    assert!(
        new.is_unavailable() && new.to_string().contains("Redis is full"),
        "{new}"
    );

    // Through the verifier: replays of the earlier requests, 503 for a new key, and no
    // handler ran twice.
    for (key, body) in keys.iter().zip(&first) {
        let reply = apps::charge(&client, verifier.addr(), key).await;
        assert_eq!(reply.status, 200, "a replay while Redis is full: {reply:?}");
        assert!(reply.replayed(), "{reply:?}");
        assert_eq!(&reply.body, body, "the same response");
    }
    let reply = apps::charge(&client, verifier.addr(), &support::unique("new")).await;
    assert_eq!(
        reply.status, 503,
        "a new key while Redis is full: {reply:?}"
    );
    assert!(reply.retry_after().is_some(), "{reply:?}");
    assert_eq!(
        app.executions().count(),
        keys.len() as u64,
        "each charge ran once; none for the refused key"
    );
}

/// Evictions are seen: on a Redis allowed to evict, filled past `maxmemory`, a look at
/// its memory reports the evicted keys (and the metric), with a warning; a policy
/// changed at runtime is warned about too.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn evicted_keys_are_counted_and_warned_about() {
    let server =
        RedisServer::start_with_args(&["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]);
    let metrics = support::telemetry::Metrics::capture();
    let (logs, _guard) = capture_logs();
    let store = builder(&server.url())
        .allow_eviction(true)
        .connect()
        .await
        .expect("allowed");
    let before = store.check_memory().await.expect("INFO");
    assert_eq!(before[0].evicted_since_last_check, 0, "{before:?}");

    fill(&server.url()).await;

    let after = store.check_memory().await.expect("INFO");
    let node = &after[0];
    assert!(node.evicted_since_last_check > 0, "{after:?}");
    assert_eq!(node.policy.as_deref(), Some("allkeys-lru"));
    assert_eq!(node.maxmemory, Some(2 * 1024 * 1024));
    let evicted = node.evicted_keys.expect("INFO stats has evicted_keys");
    let counted = metrics.snapshot().counter(
        "idemkey_store_redis_evicted_keys_total",
        &[("node", node.node.as_str())],
    );
    assert_eq!(counted, evicted, "the metric is the server's evicted_keys");
    assert!(
        logs.warnings()
            .iter()
            .any(|w| w.contains("Redis evicted") && w.contains("allkeys-lru")),
        "a warning says keys were evicted: {:?}",
        logs.warnings()
    );

    // A policy changed at runtime, before anything is evicted.
    let runtime = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let store = builder(&runtime.url()).connect().await.expect("noeviction");
    let reply = support::redis_cli(
        runtime.port(),
        &["config", "set", "maxmemory-policy", "volatile-lru"],
    );
    assert!(reply.contains("OK"), "{reply}");
    let nodes = store.check_memory().await.expect("INFO");
    assert!(nodes[0].policy_evicts(), "{nodes:?}");
    assert!(
        logs.warnings()
            .iter()
            .any(|w| w.contains("changed to an evicting one")),
        "a warning says the policy changed: {:?}",
        logs.warnings()
    );
}

/// The store looks at memory by itself: with an interval set, evictions on a Redis
/// allowed to evict are warned about without anyone calling `check_memory` (waited for,
/// bounded: the look runs in a task on this test's thread, where the logs are
/// captured).
#[tokio::test]
async fn the_store_looks_at_memory_by_itself() {
    let server = RedisServer::start_with_args(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        "allkeys-random",
    ]);
    let (logs, _guard) = capture_logs();
    let store = RedisStore::builder(server.url())
        .allow_eviction(true)
        .memory_check_interval(Some(Duration::from_millis(20)))
        .connect()
        .await
        .expect("allowed");
    fill(&server.url()).await;
    let evicted = || {
        logs.warnings()
            .iter()
            .any(|w| w.contains("Redis evicted") && w.contains("allkeys-random"))
    };
    for _ in 0..500 {
        if evicted() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        evicted(),
        "the periodic look warned about evicted keys: {:?}",
        logs.warnings()
    );
    drop(store);
}

/// Writes 100 keys of 64 KiB (6.4 MB) into the Redis at `url`.
async fn fill(url: &str) {
    let mut admin = redis::Client::open(url)
        .expect("URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let filler = vec![b'f'; 64 * 1024];
    for i in 0..100 {
        let () = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&filler)
            .query_async(&mut admin)
            .await
            .expect("an evicting Redis makes room");
    }
}

fn request(id: &RecordId, token: FencingToken) -> ClaimRequest<'_> {
    ClaimRequest {
        id,
        fingerprint: b"fp",
        token,
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
    }
}

/// One claim on a fresh id, acquired: the store works.
async fn claim_once(store: &RedisStore) {
    let id = RecordId::new("t", &support::unique("k"));
    let claim = store
        .claim(request(&id, FencingToken::random()))
        .await
        .expect("claim");
    assert_eq!(claim, Claim::Acquired { takeover: false });
}

/// The warnings logged on this thread (message and fields, as text).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<String>>>);

impl Logs {
    fn warnings(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

struct Text<'a>(&'a mut String);

impl tracing::field::Visit for Text<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logs {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = String::new();
            event.record(&mut Text(&mut text));
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(text);
        }
    }
}

/// Captures the warnings logged on this thread until the guard drops.
fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::registry().with(logs.clone());
    (logs, tracing::subscriber::set_default(subscriber))
}
