//! Redis-specific behaviour: round trips counted by the server, key layout and TTL,
//! unavailability while the server is down.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use idemkey::store::{Claim, ClaimRequest, FencingToken, RecordId, RedisStore, Store};
use redis::AsyncCommands;

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid Redis URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"))
}

/// Calls per command since the server started, from `INFO commandstats` (also used by
/// `store_redis_quota`).
pub(crate) async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The commands the store's Lua scripts call inside Redis (counted by
/// `INFO commandstats` too, but run within the one `EVALSHA` round trip); `set` is also
/// sent by the claim itself, pipelined with `PTTL`.
const INSIDE_SCRIPTS: &[&str] = &[
    "get",
    "set",
    "getrange",
    "setrange",
    "append",
    "pexpire",
    "pexpiretime",
    "pttl",
    "del",
    "strlen",
    "publish",
];

/// Client round trips between two snapshots: each `EVALSHA`, and each claim (its
/// `SET ... NX GET` pipelined with one `PTTL`). Fails if a command ran that neither
/// the claim nor the scripts use.
fn round_trips(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> u64 {
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    for name in after.keys() {
        let d = delta(name);
        assert!(
            d == 0
                || name == "info"
                || name == "evalsha"
                || INSIDE_SCRIPTS.contains(&name.as_str()),
            "the store sent an unexpected command {name} ({d} calls)"
        );
    }
    // The scripts these tests reach (complete) call no PTTL: every PTTL is a claim's.
    delta("evalsha") + delta("pttl")
}

#[tokio::test]
async fn fresh_request_costs_two_round_trips_and_replay_one() {
    let server = support::RedisServer::start();
    let store = RedisStore::connect(server.url())
        .await
        .expect("connect to the private Redis");
    let mut admin = raw(&server.url()).await;
    let id = RecordId::new("t", "k");
    let token = FencingToken::random();
    let lease = Duration::from_secs(30);

    let before = command_calls(&mut admin).await;
    let claim = store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease,
            retention: lease,
        })
        .await
        .expect("claim");
    assert_eq!(claim, Claim::Acquired { takeover: false });
    store
        .complete(&id, token, "response".into(), Duration::from_secs(60))
        .await
        .expect("complete");
    let after_fresh = command_calls(&mut admin).await;
    let fresh = round_trips(&before, &after_fresh);
    assert!(fresh <= 2, "a fresh request took {fresh} round trips");

    let replay = store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease,
            retention: lease,
        })
        .await
        .expect("replay claim");
    assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    let after_replay = command_calls(&mut admin).await;
    let replayed = round_trips(&after_fresh, &after_replay);
    assert!(replayed <= 1, "a replay took {replayed} round trips");
    eprintln!("round trips: fresh request {fresh}, replay {replayed}");
}

/// The key of a record by the layout the store documents: prefix, then the record id
/// in hex, hash-tagged.
fn key_of(prefix: &str, id: &RecordId) -> String {
    format!("{prefix}{{{}}}", id.to_hex())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_several_clients_are_atomic() {
    let url = support::redis_url();
    let prefix = format!("{}:", support::unique("idemkey-test"));
    support::claims_over_four_instances(3, async || {
        RedisStore::builder(&url)
            .prefix(&prefix)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"))
    })
    .await;
}

#[tokio::test]
async fn keys_are_prefixed_hash_tagged_and_expire_by_ttl() {
    let url = support::redis_url();
    let prefix = format!("{}:", support::unique("idemkey-test"));
    let store = RedisStore::builder(&url)
        .prefix(&prefix)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"));
    let mut admin = raw(&url).await;
    let id = RecordId::new("t", &support::unique("k"));
    let key = key_of(&prefix, &id);

    let token = FencingToken::random();
    let (lease, kept) = (Duration::from_secs(30), Duration::from_secs(3600));
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease,
            retention: kept,
        })
        .await
        .expect("claim");
    let ttl: i64 = admin.pttl(&key).await.expect("PTTL");
    assert!(
        ttl > 3_600_000 && ttl <= 3_630_000,
        "an in-progress key lives for lease + retention, got {ttl} ms"
    );
    store
        .renew(&id, token, Duration::from_secs(60))
        .await
        .expect("renew");
    let ttl: i64 = admin.pttl(&key).await.expect("PTTL");
    assert!(
        ttl > 3_630_000 && ttl <= 3_660_000,
        "a renewed key lives for the new lease + the claim's retention, got {ttl} ms"
    );

    let retention = Duration::from_secs(60);
    store
        .complete(&id, token, "p".into(), retention)
        .await
        .expect("complete");
    let ttl: i64 = admin.pttl(&key).await.expect("PTTL");
    assert!(
        ttl > 0 && ttl <= 60_000,
        "a completed key expires with its retention, got {ttl} ms"
    );
    assert_eq!(
        store.sweep().await.expect("sweep"),
        0,
        "Redis expires keys itself"
    );
    assert!(store.force_release(&id).await.expect("force_release"));
    let exists: bool = admin.exists(&key).await.expect("EXISTS");
    assert!(!exists, "force_release deletes the key");
}

/// Lists in-progress records among more keys than one `SCAN` call returns on each of
/// `nodes` (counted by the servers), under a prefix with glob characters (escaped: a
/// store with a prefix the glob would match stays out).
async fn lists_in_progress_across_scan_pages(
    nodes: &[String],
    connect: impl AsyncFn(&str) -> RedisStore,
) {
    let base = support::unique("idemkey-test");
    let prefix = format!("{base}*[x]:");
    let store = connect(&prefix).await;
    let lookalike = connect(&format!("{base}AAAx:")).await;
    let lease = Duration::from_secs(60);
    let claim = move |store: &RedisStore, id: RecordId, token| {
        let store = store.clone();
        async move {
            let claim = store
                .claim(ClaimRequest {
                    id: &id,
                    fingerprint: b"fp",
                    token,
                    lease,
                    retention: lease,
                })
                .await
                .expect("claim");
            assert_eq!(claim, Claim::Acquired { takeover: false });
        }
    };
    claim(
        &lookalike,
        RecordId::new("t", "lookalike"),
        FencingToken::random(),
    )
    .await;
    let mut done = tokio::task::JoinSet::new();
    // Over a thousand keys per node: more than one SCAN page (COUNT 1000) each.
    for i in 0..(1300 * nodes.len()) {
        let store = store.clone();
        done.spawn(async move {
            let (id, token) = (
                RecordId::new("t", &format!("done-{i}")),
                FencingToken::random(),
            );
            claim(&store, id, token).await;
            store
                .complete(&id, token, "p".into(), lease)
                .await
                .expect("complete");
        });
    }
    done.join_all().await;
    let mut running = Vec::new();
    for i in 0..3 {
        let id = RecordId::new("t", &format!("running-{i}"));
        claim(&store, id, FencingToken::random()).await;
        running.push(id);
        // Apart by more than the millisecond of the Redis clock.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut scans = Vec::new();
    for node in nodes {
        scans.push(command_calls(&mut raw(node).await).await);
    }
    let listed = store.list_in_progress(10).await.expect("list_in_progress");
    for (node, before) in nodes.iter().zip(&scans) {
        let after = command_calls(&mut raw(node).await).await;
        let pages =
            after.get("scan").copied().unwrap_or(0) - before.get("scan").copied().unwrap_or(0);
        assert!(
            pages >= 2,
            "{node} answered {pages} SCAN calls: the test needs several pages"
        );
    }
    let ids: Vec<RecordId> = listed.iter().map(|r| r.id).collect();
    assert_eq!(
        ids, running,
        "the three running records, oldest first, nothing else"
    );
    let first = store.list_in_progress(2).await.expect("list_in_progress");
    assert_eq!(first.len(), 2);
    assert_eq!((first[0].id, first[1].id), (running[0], running[1]));
}

#[tokio::test]
async fn list_in_progress_reads_every_scan_page() {
    let server = support::RedisServer::start();
    let url = server.url();
    lists_in_progress_across_scan_pages(std::slice::from_ref(&url), async |prefix| {
        RedisStore::builder(&url)
            .prefix(prefix)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_in_progress_reads_every_scan_page_of_every_cluster_node() {
    let cluster = support::RedisCluster::start();
    let urls = cluster.urls();
    lists_in_progress_across_scan_pages(&urls, async |prefix| {
        RedisStore::cluster(urls.clone())
            .prefix(prefix)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("the private Redis Cluster must be reachable: {e}"))
    })
    .await;
}

#[tokio::test]
async fn outage_is_unavailable_and_recovers() {
    let mut server = support::RedisServer::start();
    let store = RedisStore::connect(server.url())
        .await
        .expect("connect to the private Redis");
    let id = RecordId::new("t", "k");
    let lease = Duration::from_secs(30);
    let token = FencingToken::random();
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease,
            retention: lease,
        })
        .await
        .expect("claim before the outage");

    server.kill();
    for _ in 0..3 {
        let err = store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"fp",
                token,
                lease,
                retention: lease,
            })
            .await
            .expect_err("a claim while Redis is down must fail");
        assert!(err.is_unavailable(), "expected unavailable, got {err}");
        let err = store
            .complete(&id, token, "p".into(), lease)
            .await
            .expect_err("a complete while Redis is down must fail");
        assert!(err.is_unavailable(), "expected unavailable, got {err}");
    }

    server.restart();
    // The store reconnects by itself (bounded: a few attempts), and reloads its scripts.
    let mut claimed = None;
    for _ in 0..100 {
        match store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"fp",
                token,
                lease,
                retention: lease,
            })
            .await
        {
            Ok(c) => {
                claimed = Some(c);
                break;
            }
            Err(e) => assert!(e.is_unavailable(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        claimed.expect("the store must recover once Redis is back"),
        Claim::Acquired { takeover: false },
        "the restarted Redis is empty"
    );
}

#[tokio::test]
async fn unreachable_redis_is_unavailable_and_a_bad_url_is_a_configuration_error() {
    let port = support::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let err = RedisStore::connect(&url)
        .await
        .expect_err("nothing listens there");
    assert!(err.is_unavailable() && !err.is_configuration(), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "names the address tried: {err}"
    );
    let err = RedisStore::connect("not a url")
        .await
        .expect_err("invalid URL");
    assert!(err.is_configuration(), "{err}");

    // The shared Redis has 16 databases (0 to 15): 99 is out of range.
    let url = format!("{}/99", support::redis_url().trim_end_matches('/'));
    let err = RedisStore::connect(&url).await.expect_err("no database 99");
    assert!(err.is_configuration() && !err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("database number"), "{err}");
    let opened = idemkey::store::open(&url)
        .await
        .err()
        .expect("no database 99");
    assert!(opened.is_configuration(), "{opened}");
}

#[tokio::test]
async fn a_completion_no_replica_acknowledges_is_reported_unreplicated() {
    let server = support::RedisServer::start();
    let store = RedisStore::builder(server.url())
        .wait_for_replicas(1, Duration::from_millis(50))
        .connect()
        .await
        .expect("connect to the private Redis");
    let mut admin = raw(&server.url()).await;
    let id = RecordId::new("t", "k");
    let token = FencingToken::random();
    let lease = Duration::from_secs(30);
    let request = |token| ClaimRequest {
        id: &id,
        fingerprint: b"fp",
        token,
        lease,
        retention: lease,
    };
    assert_eq!(
        store.claim(request(token)).await.expect("claim"),
        Claim::Acquired { takeover: false }
    );
    let before = command_calls(&mut admin).await;
    let err = store
        .complete(&id, token, "p".into(), lease)
        .await
        .expect_err("a server without replicas cannot acknowledge");
    assert!(err.is_unreplicated(), "{err}");
    assert!(err.to_string().contains("0 of the 1 replicas"), "{err}");
    let after = command_calls(&mut admin).await;
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert_eq!(
        (delta("evalsha"), delta("wait")),
        (1, 1),
        "the completion and its WAIT"
    );
    // Written on the primary all the same: reported, not undone.
    assert!(matches!(
        store
            .claim(request(FencingToken::random()))
            .await
            .expect("claim"),
        Claim::Completed { .. }
    ));
    // A fenced completion is fenced, whatever the replicas say.
    let err = store
        .complete(&id, token, "again".into(), lease)
        .await
        .expect_err("the record is completed");
    assert!(err.is_fenced(), "{err}");
}

#[tokio::test]
async fn a_key_of_another_type_is_reported_corrupt() {
    let server = support::RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("p:")
        .connect()
        .await
        .expect("connect to the private Redis");
    let mut admin = raw(&server.url()).await;
    let id = RecordId::new("t", "k");
    // The hash layout of earlier development versions.
    let () = admin.hset(key_of("p:", &id), "s", "p").await.expect("HSET");
    let lease = Duration::from_secs(30);
    let err = store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease,
            retention: lease,
        })
        .await
        .expect_err("a hash is not a record");
    assert!(err.is_corrupt(), "{err}");
}
