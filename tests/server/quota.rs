//! Quotas of new keys per scope: a flood from one scope gets `429 quota-exceeded` while
//! another is served, the refused key runs once after the wait, replays and in-progress
//! answers never spend quota, the cap on claims in progress, one limit for two engines
//! over one Redis, and bad settings refused.
//!
//! The per-process buckets read tokio's clock: the HTTP tests pause it and advance it
//! by the `Retry-After` they were given. Their rate is one key an hour, so that the
//! clock's own advances while a request is on the wire (a paused clock jumps to the
//! next timer when the runtime idles) never refill a token.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use idemkey::IdempotencyKey;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::extract::HeaderScope;
use idemkey::server::policy::Quota;
use idemkey::server::{Claimed, Engine, IdempotencyLayer};
use idemkey::store::{MemoryStore, RecordState, RedisStore};
use support::gate::Gate;
use support::verifier::{Answer, http};

const HOUR: Duration = Duration::from_secs(3600);

/// One new key an hour, bursts of `burst`.
fn hourly(burst: u32) -> Quota {
    Quota::per_second(1.0 / 3600.0)
        .and_then(|q| q.burst(burst))
        .expect("a valid quota")
}

/// How many times the handler ran, per key.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, u32>>>);

impl Runs {
    fn of(&self, key: &str) -> u32 {
        self.0.lock().expect("runs").get(key).copied().unwrap_or(0)
    }
    fn total(&self) -> u32 {
        self.0.lock().expect("runs").values().sum()
    }
}

/// `POST /charges` behind a layer scoped by `X-Agent` with `quota`, counting runs per
/// key; handlers wait at `gate` when one is given.
async fn serve(
    engine: Engine,
    quota: Quota,
    gate: Option<Gate>,
) -> (idemkey::testing::TestServer, Runs) {
    let runs = Runs::default();
    let app = Router::new()
        .route(
            "/charges",
            post({
                let runs = runs.clone();
                move |headers: http::HeaderMap| {
                    let (runs, gate) = (runs.clone(), gate.clone());
                    async move {
                        let key = headers["idempotency-key"]
                            .to_str()
                            .expect("ascii")
                            .to_owned();
                        if let Some(gate) = gate {
                            gate.pass().await;
                        }
                        *runs.0.lock().expect("runs").entry(key.clone()).or_default() += 1;
                        format!("charged {key}")
                    }
                }
            }),
        )
        .layer(
            IdempotencyLayer::new(engine)
                .scope(HeaderScope::new(http::HeaderName::from_static("x-agent")))
                .quota(quota),
        );
    (support::serve(app).await, runs)
}

async fn charge(server: &idemkey::testing::TestServer, agent: &str, key: &str) -> Answer {
    let resp = http()
        .post(server.url("/charges"))
        .header("x-agent", agent)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("the verifier answers");
    Answer::read(resp).await
}

fn assert_quota_exceeded(a: &Answer, retry_after: &str) {
    assert_eq!(a.status, 429, "{a:?}");
    assert!(a.problem_type().ends_with("quota-exceeded"), "{a:?}");
    assert_eq!(a.retry_after(), Some(retry_after), "{a:?}");
    assert!(!a.replayed());
}

#[tokio::test(start_paused = true)]
async fn a_flood_over_its_quota_is_refused_while_another_scope_is_served_and_the_key_runs_once_after_the_wait()
 {
    let engine = Engine::new(MemoryStore::new());
    let (server, runs) = serve(engine.clone(), hourly(3), None).await;

    for i in 0..3 {
        assert_eq!(
            charge(&server, "flooder", &format!("f-{i}")).await.status,
            200
        );
    }
    // Over the burst: a token is an hour away.
    for i in 3..10 {
        assert_quota_exceeded(&charge(&server, "flooder", &format!("f-{i}")).await, "3600");
    }
    // Another agent has its own bucket, and its records are its own.
    for i in 0..3 {
        let a = charge(&server, "quiet", &format!("q-{i}")).await;
        assert_eq!(
            (a.status.as_u16(), &a.body[..]),
            (200, format!("charged q-{i}").as_bytes())
        );
    }
    for i in 0..3 {
        let info = engine
            .inspect("quiet", &format!("q-{i}"))
            .await
            .expect("inspect")
            .expect("recorded");
        assert_eq!(info.state, RecordState::Completed);
    }
    // Nothing was recorded for a refused key, and the handler never ran for it.
    assert!(
        engine
            .inspect("flooder", "f-3")
            .await
            .expect("inspect")
            .is_none()
    );
    assert_eq!(runs.total(), 6);

    // After the wait, the refused key runs, exactly once.
    tokio::time::advance(HOUR).await;
    let first = charge(&server, "flooder", "f-3").await;
    assert_eq!((first.status.as_u16(), first.replayed()), (200, false));
    let again = charge(&server, "flooder", "f-3").await;
    assert_eq!((again.status.as_u16(), again.replayed()), (200, true));
    assert_eq!(again.body, first.body);
    assert_eq!(runs.of("f-3"), 1);
    // And the bucket is empty again.
    assert_quota_exceeded(&charge(&server, "flooder", "f-4").await, "3600");
}

#[tokio::test(start_paused = true)]
async fn replays_and_in_progress_answers_never_spend_quota() {
    let gate = Gate::default();
    let (server, runs) = serve(
        Engine::new(MemoryStore::new()),
        hourly(2),
        Some(gate.clone()),
    )
    .await;

    // One key completes, one stays in progress: the bucket (2) is spent.
    gate.open(1);
    assert_eq!(charge(&server, "a", "done").await.status, 200);
    let running = tokio::spawn({
        let url = server.url("/charges");
        async move {
            http()
                .post(url)
                .header("x-agent", "a")
                .header("idempotency-key", "running")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .expect("answered")
                .status()
        }
    });
    gate.wait_entered(2).await;

    // With the bucket empty, the replay and the in-progress answer are still given.
    for _ in 0..5 {
        let replay = charge(&server, "a", "done").await;
        assert_eq!((replay.status.as_u16(), replay.replayed()), (200, true));
        let dup = charge(&server, "a", "running").await;
        assert_eq!(dup.status, 409, "{dup:?}");
        assert!(dup.problem_type().ends_with("in-progress"));
    }
    assert_quota_exceeded(&charge(&server, "a", "new").await, "3600");
    gate.open(1);
    assert_eq!(running.await.expect("joined"), 200);

    // With the bucket full again, replays and duplicates take nothing from it.
    tokio::time::advance(2 * HOUR).await;
    for _ in 0..5 {
        assert!(charge(&server, "a", "done").await.replayed());
        assert!(charge(&server, "a", "running").await.replayed());
    }
    gate.open(2);
    assert_eq!(charge(&server, "a", "new").await.status, 200);
    assert_eq!(charge(&server, "a", "new-2").await.status, 200);
    assert_quota_exceeded(&charge(&server, "a", "new-3").await, "3600");
    assert_eq!(runs.total(), 4);
}

#[tokio::test(start_paused = true)]
async fn the_cap_on_claims_in_progress_refuses_new_keys_until_one_ends() {
    let gate = Gate::default();
    let quota = Quota::in_progress_only(1).expect("valid");
    let (server, runs) = serve(Engine::new(MemoryStore::new()), quota, Some(gate.clone())).await;

    let first = tokio::spawn({
        let url = server.url("/charges");
        async move {
            http()
                .post(url)
                .header("x-agent", "a")
                .header("idempotency-key", "k-1")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .expect("answered")
                .status()
        }
    });
    gate.wait_entered(1).await;
    // The scope's one slot is taken: a new key waits; a duplicate is told it runs.
    assert_quota_exceeded(&charge(&server, "a", "k-2").await, "1");
    assert_eq!(charge(&server, "a", "k-1").await.status, 409);
    // Another scope has its own slots.
    gate.open(2);
    assert_eq!(charge(&server, "b", "k-2").await.status, 200);
    assert_eq!(first.await.expect("joined"), 200);
    // The slot was given back when the first request ended.
    gate.open(1);
    assert_eq!(charge(&server, "a", "k-2").await.status, 200);
    assert_eq!(runs.total(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_in_progress_slot_is_given_back_on_every_path() {
    let quota = Quota::in_progress_only(1).expect("valid");
    let engine = Engine::builder(MemoryStore::new()).quota(quota).build();
    let fp = Fingerprint::of_bytes(b"x");
    let key = |k: &str| IdempotencyKey::new(k).expect("key");
    let new_key_runs = |engine: Engine, k: &'static str| async move {
        match engine.claim("s", &key(k), &fp).await.expect("claim") {
            Claimed::Execute(exec) => {
                exec.release().await.expect("release");
                true
            }
            Claimed::QuotaExceeded { .. } => false,
            other => panic!("{other:?}"),
        }
    };

    // Completed.
    let Claimed::Execute(exec) = engine.claim("s", &key("a"), &fp).await.expect("claim") else {
        panic!("new key")
    };
    assert!(!new_key_runs(engine.clone(), "probe").await);
    exec.complete("done".into()).await.expect("complete");
    assert!(new_key_runs(engine.clone(), "probe").await);

    // Failed (released), through the function API.
    let failed = engine
        .once("s", &key("b"), &fp, || async {
            Err::<u8, _>(std::io::Error::other("no"))
        })
        .await;
    assert!(failed.expect_err("failed").is_failed());
    assert!(new_key_runs(engine.clone(), "probe").await);

    // Panicked.
    let panicked = tokio::spawn({
        let engine = engine.clone();
        async move {
            engine
                .once("s", &key("c"), &fp, || async {
                    panic!("the operation panicked");
                    #[allow(unreachable_code)]
                    Ok::<u8, std::io::Error>(0)
                })
                .await
        }
    })
    .await;
    assert!(panicked.expect_err("panicked").is_panic());
    assert!(new_key_runs(engine.clone(), "probe").await);

    // Cancelled: the caller stopped waiting.
    let cancelled = tokio::time::timeout(
        Duration::from_secs(1),
        engine.once("s", &key("d"), &fp, || {
            std::future::pending::<Result<u8, std::io::Error>>()
        }),
    )
    .await;
    assert!(cancelled.is_err());
    assert!(new_key_runs(engine.clone(), "probe").await);
}

#[tokio::test]
async fn two_engines_on_one_redis_enforce_one_limit() {
    let prefix = format!("{}:", support::unique("quota"));
    let quota = hourly(4).shared();
    let mut servers = Vec::new();
    for _ in 0..2 {
        // Each instance its own connection, as two processes would have.
        let store = RedisStore::builder(support::redis_url())
            .prefix(prefix.clone())
            .connect()
            .await
            .expect("the shared Redis answers");
        servers.push(serve(Engine::new(store), quota, None).await);
    }
    let [(one, runs_one), (two, runs_two)] = <[_; 2]>::try_from(servers).ok().expect("two");

    assert_eq!(charge(&one, "agent", "k-1").await.status, 200);
    assert_eq!(charge(&two, "agent", "k-2").await.status, 200);
    assert_eq!(charge(&one, "agent", "k-3").await.status, 200);
    assert_eq!(charge(&two, "agent", "k-4").await.status, 200);
    // Four new keys between them: both refuse the fifth.
    for server in [&one, &two] {
        let a = charge(server, "agent", "k-5").await;
        assert_eq!(a.status, 429, "{a:?}");
        assert!(a.problem_type().ends_with("quota-exceeded"));
        let secs: u64 = a
            .retry_after()
            .expect("Retry-After")
            .parse()
            .expect("seconds");
        assert!((1..=3600).contains(&secs), "{secs}");
    }
    // Replays through either instance spend nothing and are served.
    for server in [&one, &two] {
        for k in ["k-1", "k-2"] {
            assert!(charge(server, "agent", k).await.replayed());
        }
    }
    // Another agent's bucket is its own.
    assert_eq!(charge(&two, "other", "k-1").await.status, 200);
    assert_eq!(runs_one.total() + runs_two.total(), 5);

    let redis = redis::Client::open(support::redis_url()).expect("url");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .expect("keys");
    // Five records and two buckets, each bucket with a TTL.
    assert_eq!(
        keys.iter().filter(|k| k.contains("quota:")).count(),
        2,
        "{keys:?}"
    );
    for k in keys.iter().filter(|k| k.contains("quota:")) {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(k)
            .query_async(&mut conn)
            .await
            .expect("pttl");
        assert!(ttl > 0, "{k}: {ttl}");
    }
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .expect("clean up");
}

#[tokio::test]
async fn a_shared_quota_on_a_store_without_buckets_fails_closed_and_says_why() {
    let engine = Engine::builder(MemoryStore::new())
        .quota(hourly(10).shared())
        .build();
    let err = engine
        .claim(
            "s",
            &IdempotencyKey::new("k").expect("key"),
            &Fingerprint::of_bytes(b"x"),
        )
        .await
        .expect_err("no buckets in a memory store");
    assert!(err.store_error().is_configuration(), "{err}");
    assert!(err.to_string().contains("use a per-process quota"), "{err}");
    assert!(
        engine
            .store()
            .inspect(&idemkey::store::RecordId::new("s", "k"))
            .await
            .expect("inspect")
            .is_none()
    );
}

#[test]
fn bad_settings_are_refused_with_a_clear_error() {
    for (rate, what) in [
        (0.0, "0"),
        (-5.0, "-5"),
        (f64::NAN, "NaN"),
        (f64::INFINITY, "inf"),
    ] {
        let e = Quota::per_second(rate).expect_err("refused");
        let msg = e.to_string();
        assert!(msg.contains(what) && msg.contains("above zero"), "{msg}");
    }
    let burst = Quota::per_second(60)
        .and_then(|q| q.burst(0))
        .expect_err("refused");
    assert!(burst.to_string().contains("burst of 0"), "{burst}");
    let cap = Quota::per_second(60)
        .and_then(|q| q.max_in_progress(0))
        .expect_err("refused");
    assert!(cap.to_string().contains("0 claims in progress"), "{cap}");
    assert!(Quota::in_progress_only(0).is_err());
    let q = Quota::per_second(60)
        .and_then(|q| q.burst(300))
        .expect("AdCP's quota");
    assert_eq!(
        (q.rate_per_second(), q.burst_size()),
        (Some(60.0), Some(300))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_quota_on_a_redis_cluster_is_one_limit_and_replays_give_their_token_back() {
    let cluster = support::RedisCluster::start();
    let prefix = format!("{}:", support::unique("quota"));
    let mut engines = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::cluster(cluster.urls())
            .prefix(prefix.clone())
            .connect()
            .await
            .unwrap_or_else(|e| panic!("the private Redis Cluster must be reachable: {e}"));
        engines.push(Engine::builder(store).quota(hourly(3).shared()).build());
    }
    let (one, two) = (&engines[0], &engines[1]);
    let fp = Fingerprint::of_bytes(b"x");
    let key = |k: &str| IdempotencyKey::new(k).expect("key");

    let Claimed::Execute(exec) = one.claim("agent", &key("k-1"), &fp).await.expect("claim") else {
        panic!("a new key runs")
    };
    exec.complete("done".into()).await.expect("complete");
    // Replays while the bucket has tokens: each takes one and gives it back.
    for engine in [one, two, one] {
        let replay = engine
            .claim("agent", &key("k-1"), &fp)
            .await
            .expect("claim");
        assert!(matches!(replay, Claimed::Replay(_)), "{replay:?}");
    }
    for (engine, k) in [(two, "k-2"), (one, "k-3")] {
        let claimed = engine.claim("agent", &key(k), &fp).await.expect("claim");
        assert!(matches!(claimed, Claimed::Execute(_)), "{k}: {claimed:?}");
    }
    // Three new keys between them: the fourth is refused by both.
    for engine in [one, two] {
        let refused = engine
            .claim("agent", &key("k-4"), &fp)
            .await
            .expect("claim");
        assert!(
            matches!(refused, Claimed::QuotaExceeded { .. }),
            "{refused:?}"
        );
    }
    // With the bucket empty, the replay is still answered.
    let replay = two.claim("agent", &key("k-1"), &fp).await.expect("claim");
    assert!(matches!(replay, Claimed::Replay(_)), "{replay:?}");
    assert!(
        one.inspect("agent", "k-4")
            .await
            .expect("inspect")
            .is_none()
    );
}

#[tokio::test]
async fn a_slot_is_held_while_a_disconnected_callers_handler_runs_on_and_freed_when_it_ends_or_panics()
 {
    let gate = Gate::default();
    let runs = Runs::default();
    let app = Router::new()
        .route(
            "/charges",
            post({
                let (runs, gate) = (runs.clone(), gate.clone());
                move |headers: http::HeaderMap| {
                    let (runs, gate) = (runs.clone(), gate.clone());
                    async move {
                        let key = headers["idempotency-key"]
                            .to_str()
                            .expect("ascii")
                            .to_owned();
                        assert!(key != "boom", "the handler panicked");
                        gate.pass().await;
                        *runs.0.lock().expect("runs").entry(key.clone()).or_default() += 1;
                        format!("charged {key}")
                    }
                }
            }),
        )
        .layer(
            IdempotencyLayer::new(Engine::new(MemoryStore::new()))
                .scope(HeaderScope::new(http::HeaderName::from_static("x-agent")))
                .quota(Quota::in_progress_only(1).expect("valid")),
        );
    let server = support::serve(app).await;

    // The caller goes away while its handler runs: the handler goes on, holding the slot.
    let caller = tokio::spawn({
        let url = server.url("/charges");
        async move {
            http()
                .post(url)
                .header("x-agent", "a")
                .header("idempotency-key", "left")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
        }
    });
    gate.wait_entered(1).await;
    caller.abort();
    let _ = caller.await;
    assert_quota_exceeded(&charge(&server, "a", "next").await, "1");
    // It ends, is recorded, and gives the slot back.
    gate.open(1);
    let mut tries = 0;
    let replay = loop {
        let a = charge(&server, "a", "left").await;
        if a.status != 409 {
            break a;
        }
        tries += 1;
        assert!(
            tries < 2000,
            "the detached handler's outcome was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(replay.replayed(), "{replay:?}");
    gate.open(1);
    assert_eq!(charge(&server, "a", "next").await.status, 200);

    // A handler that panics gives its slot back too.
    let boom = http()
        .post(server.url("/charges"))
        .header("x-agent", "a")
        .header("idempotency-key", "boom")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await;
    assert!(boom.is_err() || boom.is_ok_and(|r| r.status().is_server_error()));
    gate.open(1);
    assert_eq!(charge(&server, "a", "after-boom").await.status, 200);
    assert_eq!((runs.of("left"), runs.of("next"), runs.total()), (1, 1, 3));
}
