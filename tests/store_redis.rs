//! Redis-specific behaviour: round trips counted by the server, key layout and TTL,
//! unavailability while the server is down.

mod support;

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

/// Calls per command since the server started, from `INFO commandstats`.
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
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
/// `INFO commandstats` too, but run within the one `EVALSHA` round trip).
const INSIDE_SCRIPTS: &[&str] = &["time", "hmget", "hset", "hdel", "del", "pexpireat"];

/// Client round trips between two snapshots: every top-level command except the
/// `INFO` calls that take the snapshots. Fails if a command ran that the scripts do not
/// use and that is not `EVALSHA`.
fn round_trips(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> u64 {
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    let mut trips = 0;
    for name in after.keys() {
        let d = delta(name);
        if d == 0 || name == "info" || INSIDE_SCRIPTS.contains(&name.as_str()) {
            continue;
        }
        assert_eq!(
            name, "evalsha",
            "the store sent an unexpected command {name} ({d} calls)"
        );
        trips += d;
    }
    // Every script reads TIME exactly once: all inner commands came from these scripts.
    assert_eq!(delta("time"), trips, "one TIME per script run");
    trips
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
        })
        .await
        .expect("replay claim");
    assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    let after_replay = command_calls(&mut admin).await;
    let replayed = round_trips(&after_fresh, &after_replay);
    assert!(replayed <= 1, "a replay took {replayed} round trips");
    eprintln!("round trips: fresh request {fresh}, replay {replayed}");
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
    let key = format!("{prefix}{{{}}}", id.to_hex());
    assert_eq!(store.key(&id), key);

    let token = FencingToken::random();
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease: Duration::from_secs(30),
        })
        .await
        .expect("claim");
    let lease_ttl: i64 = admin.pttl(&key).await.expect("PTTL");
    assert!(
        lease_ttl > 30_000,
        "an in-progress key outlives its lease (grace), got {lease_ttl} ms"
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
async fn unreachable_redis_is_unavailable() {
    let url = format!("redis://127.0.0.1:{}", support::free_port());
    let err = RedisStore::connect(&url)
        .await
        .expect_err("nothing listens there");
    assert!(err.is_unavailable(), "{err}");
    let err = RedisStore::connect("not a url")
        .await
        .expect_err("invalid URL");
    assert!(err.is_unavailable(), "{err}");
}
