//! Durability of completions across a Redis failover (`RedisStoreBuilder::wait_for_replicas`):
//! completions under load, the primary lost (SIGKILL, or a forced `CLUSTER FAILOVER`),
//! a replica promoted, and every request whose completion returned `Ok` asked again
//! there. With the option none runs again; without it the test prints how many did (a
//! figure of Redis's asynchronous replication, not a failure).
//!
//! Every server is private, on free ports, killed by its pid when the test ends (the
//! support guards' `Drop`, also on a panic).

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkey::store::{Claim, ClaimRequest, FencingToken, RecordId, RedisStore, Store};
use tokio::task::JoinSet;

/// Concurrent clients of the load.
const CLIENTS: usize = 8;
/// Requests each client makes at most (the load stops earlier when the store fails).
const PER_CLIENT: usize = 2_000;
/// Completed requests after which the primary is lost.
const LOSE_AFTER: usize = 400;
const LEASE: Duration = Duration::from_secs(60);
/// How long a completion waits for its replica: short, as the test cuts the replica off
/// and the load goes on through the cut.
const WAIT: Duration = Duration::from_millis(200);
/// Requests made while the replica is cut off, before the primary is killed.
const WHILE_CUT: usize = 40;

/// What the load saw.
#[derive(Default)]
struct Outcomes {
    /// Completions that returned `Ok`.
    acked: Vec<RecordId>,
    /// Completions reported unreplicated (not trusted, not counted).
    unreplicated: usize,
    /// Completions fenced: their claim was lost in the failover (claims are not
    /// waited for), so the completion was refused, not acknowledged.
    fenced: usize,
}

fn request(id: &RecordId, token: FencingToken) -> ClaimRequest<'_> {
    ClaimRequest {
        id,
        fingerprint: b"fp",
        token,
        lease: LEASE,
        retention: LEASE,
    }
}

/// Runs claim + complete on fresh ids from [`CLIENTS`] tasks until each has made
/// [`PER_CLIENT`] requests or `stop` says so; calls `lose` once (in its own task) when
/// [`LOSE_AFTER`] completions were acknowledged. A client stops at its first store
/// failure while the primary is lost, then goes on once `lose` returned (the cluster
/// fails over and serves again).
async fn load<F, Fut>(store: RedisStore, tag: &str, lose: F) -> Outcomes
where
    F: FnOnce(Arc<AtomicUsize>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let lose = Arc::new(Mutex::new(Some(lose)));
    let (lost_tx, lost_rx) = tokio::sync::watch::channel(false);
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for c in 0..CLIENTS {
        let (store, outcomes, lose) = (store.clone(), Arc::clone(&outcomes), Arc::clone(&lose));
        let finished = Arc::clone(&finished);
        let (tag, lost_tx, lost_rx) = (tag.to_owned(), lost_tx.clone(), lost_rx.clone());
        tasks.spawn(async move {
            for i in 0..PER_CLIENT {
                let id = RecordId::new(&tag, &format!("{c}-{i}"));
                let token = FencingToken::random();
                let done = match store.claim(request(&id, token)).await {
                    Ok(Claim::Acquired { .. }) => {
                        store.complete(&id, token, "done".into(), LEASE).await
                    }
                    Ok(other) => panic!("a fresh id cannot be {other:?}"),
                    Err(e) => Err(e),
                };
                let acked = {
                    let mut o = outcomes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    match done {
                        Ok(()) => o.acked.push(id),
                        Err(e) if e.is_unreplicated() => o.unreplicated += 1,
                        Err(e) if e.is_fenced() => o.fenced += 1,
                        Err(e) => assert!(e.is_unavailable(), "{e}"),
                    }
                    o.acked.len()
                };
                finished.fetch_add(1, Ordering::SeqCst);
                if acked >= LOSE_AFTER {
                    let lose = lose
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take();
                    if let Some(lose) = lose {
                        let (lost_tx, finished) = (lost_tx.clone(), Arc::clone(&finished));
                        tokio::spawn(async move {
                            lose(finished).await;
                            let _ = lost_tx.send(true);
                        });
                    }
                }
                if *lost_rx.borrow() && acked >= LOSE_AFTER && i % 50 == 49 {
                    // Lost and recovered: enough load after the failover.
                    break;
                }
            }
        });
    }
    tasks.join_all().await;
    let mut lost_rx = lost_rx;
    // The loss ran (bounded: its own steps are bounded).
    let _ = tokio::time::timeout(Duration::from_secs(30), lost_rx.wait_for(|l| *l)).await;
    Arc::into_inner(outcomes)
        .expect("the load's tasks ended")
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How many acknowledged completions `verifier` does not know: a claim there executes
/// them again (or finds the claim without its completion: in progress, so the retry
/// waits out the lease and then executes again).
async fn executed_again(verifier: &RedisStore, acked: &[RecordId]) -> usize {
    let mut again = 0;
    for id in acked {
        let mut claim = None;
        // The promoted node may still be settling: a bounded retry on unavailability.
        for _ in 0..100 {
            match verifier.claim(request(id, FencingToken::random())).await {
                Ok(c) => {
                    claim = Some(c);
                    break;
                }
                Err(e) => assert!(e.is_unavailable(), "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match claim.expect("the promoted Redis must answer") {
            Claim::Completed { .. } => {}
            Claim::Acquired { .. } | Claim::InProgress { .. } => again += 1,
        }
    }
    again
}

/// Primary and replica; completions under load; the replica cut off from the primary
/// (`REPLICAOF` a dead port: it keeps its data and stops receiving, as a replica
/// lagging behind; on loopback a live one lags by microseconds only, so a kill would
/// rarely catch a completion in flight); [`WHILE_CUT`] more requests; SIGKILL of the
/// primary; `REPLICAOF NO ONE` on the replica; the verifier pointed at it.
async fn primary_killed(wait: bool) -> (usize, Outcomes) {
    let primary = Arc::new(Mutex::new(support::RedisServer::start()));
    let replica = support::RedisServer::start_replica_of(
        &primary
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let url = primary
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .url();
    let mut builder = RedisStore::builder(&url).response_timeout(Duration::from_secs(3));
    if wait {
        builder = builder.wait_for_replicas(1, WAIT);
    }
    let store = builder
        .connect()
        .await
        .expect("connect to the private primary");
    let killer = Arc::clone(&primary);
    let replica_port = replica.port();
    let outcomes = load(store, "failover", move |finished| async move {
        let dead = support::free_port().to_string();
        let cut = support::redis_cli(replica_port, &["replicaof", "127.0.0.1", &dead]);
        assert!(cut.contains("OK"), "REPLICAOF to a dead port: {cut}");
        let at_cut = finished.load(Ordering::SeqCst);
        for _ in 0..400 {
            if finished.load(Ordering::SeqCst) >= at_cut + WHILE_CUT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        // SIGKILL, by the child's pid.
        killer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .kill();
    })
    .await;
    let promoted = support::redis_cli(replica.port(), &["replicaof", "no", "one"]);
    assert!(promoted.contains("OK"), "REPLICAOF NO ONE: {promoted}");
    let verifier = RedisStore::connect(replica.url())
        .await
        .expect("connect to the promoted replica");
    let again = executed_again(&verifier, &outcomes.acked).await;
    (again, outcomes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_replica_survives_the_primary_killed() {
    let (again, outcomes) = primary_killed(true).await;
    assert!(
        outcomes.acked.len() >= LOSE_AFTER,
        "the load completed {} requests",
        outcomes.acked.len()
    );
    assert_eq!(
        again,
        0,
        "with wait_for_replicas(1), {again} of {} acknowledged completions were lost in the \
         failover and their requests ran again",
        outcomes.acked.len()
    );
    assert!(
        outcomes.unreplicated > 0,
        "the completions made while the replica was cut off must be reported unreplicated"
    );
    eprintln!(
        "wait_for_replicas(1): {} completions acknowledged, 0 ran again; {} reported \
         unreplicated, {} fenced (claim lost)",
        outcomes.acked.len(),
        outcomes.unreplicated,
        outcomes.fenced
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_waiting_the_primary_killed_may_lose_completions() {
    let (again, outcomes) = primary_killed(false).await;
    assert_eq!(
        outcomes.unreplicated, 0,
        "nothing waits, nothing is reported"
    );
    eprintln!(
        "without wait_for_replicas: {again} of {} acknowledged completions ran again after \
         the primary was killed and its lagging replica promoted",
        outcomes.acked.len()
    );
}

/// A Redis Cluster of 3 primaries with a replica each; completions under load; a
/// forced `CLUSTER FAILOVER FORCE` on the replica of the node that holds the most
/// records; every acknowledged completion asked again through the cluster.
async fn cluster_failover(wait: bool) -> (usize, Outcomes) {
    let cluster = Arc::new(support::RedisCluster::start_with_replicas(1));
    let urls = cluster.urls();
    let mut builder = RedisStore::cluster(urls.clone()).reconnect_attempts(5);
    if wait {
        builder = builder.wait_for_replicas(1, WAIT);
    }
    let store = builder
        .connect()
        .await
        .expect("connect to the private cluster");
    let nodes = Arc::clone(&cluster);
    let outcomes = load(store, "cluster-failover", move |_| async move {
        let replica = nodes.replicas()[0];
        let answer = support::redis_cli(replica, &["cluster", "failover", "force"]);
        assert!(answer.contains("OK"), "CLUSTER FAILOVER FORCE: {answer}");
        // Bounded: until the replica is a primary and the cluster serves.
        for _ in 0..400 {
            let role = support::redis_cli(replica, &["info", "replication"]);
            let state = support::redis_cli(replica, &["cluster", "info"]);
            if role.contains("role:master") && state.contains("cluster_state:ok") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the replica did not take over within 10 s");
    })
    .await;
    let verifier = RedisStore::cluster(urls)
        .reconnect_attempts(5)
        .connect()
        .await
        .expect("connect to the cluster after the failover");
    let again = executed_again(&verifier, &outcomes.acked).await;
    drop(cluster);
    (again, outcomes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_replica_survives_a_cluster_failover() {
    let (again, outcomes) = cluster_failover(true).await;
    assert!(
        outcomes.acked.len() >= LOSE_AFTER,
        "the load completed requests"
    );
    assert_eq!(
        again,
        0,
        "with wait_for_replicas(1), {again} of {} acknowledged completions were lost in the \
         cluster failover",
        outcomes.acked.len()
    );
    eprintln!(
        "cluster, wait_for_replicas(1): {} acknowledged, 0 ran again, {} reported \
         unreplicated, {} fenced (claim lost)",
        outcomes.acked.len(),
        outcomes.unreplicated,
        outcomes.fenced
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_waiting_a_cluster_failover_may_lose_completions() {
    let (again, outcomes) = cluster_failover(false).await;
    eprintln!(
        "cluster, without wait_for_replicas: {again} of {} acknowledged completions ran again \
         after a forced failover ({} fenced: claim lost)",
        outcomes.acked.len(),
        outcomes.fenced
    );
}
