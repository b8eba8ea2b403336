//! The framework-free engine and the function-level API, on the memory store, with time
//! driven by `tokio::time::pause`.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemkey::IdempotencyKey;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::{Claimed, Completion, Engine, Execution};
use idemkey::store::{MemoryStore, RecordId, Store};
use proptest::prelude::*;

const LEASE: Duration = Duration::from_secs(5);

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::new(s).expect("valid key")
}

fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_bytes(s.as_bytes())
}

fn execute(c: Claimed) -> Execution {
    match c {
        Claimed::Execute(e) => e,
        other => panic!("expected to execute, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn crashed_owner_is_taken_over_after_its_lease_and_cannot_write() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone())
        .lease(LEASE)
        .in_progress_retry_after(Duration::MAX)
        .build();
    let (k, f) = (key("job-1"), fp("payload"));

    let dead = execute(engine.claim("s", &k, &f).await.expect("claim"));
    let (id, dead_token) = (dead.record_id(), dead.token());
    assert_eq!(id, RecordId::new("s", "job-1"));
    std::mem::forget(dead); // the process died: no renewal, no release

    tokio::time::advance(Duration::from_secs(3)).await;
    let busy = engine.claim("s", &k, &f).await.expect("still leased");
    assert!(
        matches!(busy, Claimed::InProgress { retry_after } if retry_after == Duration::from_secs(2)),
        "{busy:?}"
    );

    tokio::time::advance(Duration::from_secs(2)).await;
    let heir = execute(engine.claim("s", &k, &f).await.expect("takeover"));
    assert!(heir.is_takeover());
    assert_ne!(heir.token(), dead_token);

    let stale = store
        .complete(
            &id,
            dead_token,
            Bytes::from_static(b"stale"),
            Duration::from_secs(60),
        )
        .await;
    assert!(stale.expect_err("fenced").is_fenced());
    assert!(
        store
            .renew(&id, dead_token, LEASE)
            .await
            .expect_err("fenced")
            .is_fenced()
    );
    assert!(
        store
            .release(&id, dead_token)
            .await
            .expect_err("fenced")
            .is_fenced()
    );

    heir.complete(Bytes::from_static(b"heir"))
        .await
        .expect("complete");
    match engine.claim("s", &k, &f).await.expect("replay") {
        Claimed::Replay(p) => assert_eq!(p, "heir"),
        other => panic!("{other:?}"),
    }
}

fn deferred(c: Completion) -> idemkey::server::Recording {
    match c {
        Completion::Deferred(r) => r,
        Completion::Recorded => panic!("the store was down: the recording is deferred"),
    }
}

/// The store is down when the operation ends and stays down for twelve leases:
/// `complete` waits it out, `complete_or_defer` hands the outcome to a background task
/// at once; both record it once the store is back, and the key is replayed.
#[tokio::test(start_paused = true)]
async fn an_outcome_is_recorded_through_an_outage_longer_than_the_lease() {
    let store = support::verifier::FlakyStore::default();
    let engine = Engine::builder(store.clone()).lease(LEASE).build();
    let f = fp("x");
    let waiting = execute(engine.claim("", &key("waits"), &f).await.expect("claim"));
    let deferring = execute(engine.claim("", &key("defers"), &f).await.expect("claim"));
    store.failing.store(true, Ordering::SeqCst);

    let waited = tokio::spawn(waiting.complete(Bytes::from_static(b"waited")));
    let recording = deferred(
        deferring
            .complete_or_defer(Bytes::from_static(b"deferred"))
            .await
            .expect("an outage defers"),
    );
    assert_eq!(engine.pending_recordings(), 1);
    tokio::time::sleep(12 * LEASE).await;
    assert!(!waited.is_finished(), "complete waits for the store");
    assert!(
        engine.claim("", &key("defers"), &f).await.is_err(),
        "a retry during the outage is refused: nothing runs"
    );

    store.failing.store(false, Ordering::SeqCst);
    waited
        .await
        .expect("task")
        .expect("recorded once the store is back");
    recording
        .wait()
        .await
        .expect("recorded once the store is back");
    assert_eq!(engine.pending_recordings(), 0);
    for (k, payload) in [("waits", "waited"), ("defers", "deferred")] {
        match engine.claim("", &key(k), &f).await.expect("claim") {
            Claimed::Replay(p) => assert_eq!(p, payload),
            other => panic!("{k}: {other:?}"),
        }
    }
}

/// What remains: a retry that arrives after the lease ended and before the background
/// recording succeeded (the store is back, the next attempt not yet made) takes the key
/// over and runs again; the late outcome is then fenced, never written over the new
/// owner's.
#[tokio::test(start_paused = true)]
async fn a_retry_between_the_end_of_the_lease_and_the_recording_runs_again() {
    let store = support::verifier::FlakyStore::default();
    let engine = Engine::builder(store.clone()).lease(LEASE).build();
    let (k, f) = (key("window"), fp("x"));
    let first = execute(engine.claim("", &k, &f).await.expect("claim"));
    store.failing.store(true, Ordering::SeqCst);
    let recording = deferred(
        first
            .complete_or_defer(Bytes::from_static(b"first"))
            .await
            .expect("deferred"),
    );
    tokio::time::sleep(2 * LEASE).await;
    store.failing.store(false, Ordering::SeqCst);
    // Before the background task's next attempt (at most a second away).
    let heir = execute(engine.claim("", &k, &f).await.expect("takeover"));
    assert!(heir.is_takeover());
    let late = recording
        .wait()
        .await
        .expect_err("the late outcome is fenced");
    assert!(late.is_fenced(), "{late}");
    heir.complete(Bytes::from_static(b"second"))
        .await
        .expect("the new owner records");
    match engine.claim("", &k, &f).await.expect("claim") {
        Claimed::Replay(p) => assert_eq!(p, "second"),
        other => panic!("{other:?}"),
    }
}

/// A store that never comes back: the recording gives up once the retention is over
/// (the abandoned claim is gone by then anyway), with the store's error.
#[tokio::test(start_paused = true)]
async fn a_recording_gives_up_after_the_retention() {
    let store = support::verifier::FlakyStore::default();
    let engine = Engine::builder(store.clone())
        .lease(LEASE)
        .retention(Duration::from_secs(60))
        .build();
    let exec = execute(
        engine
            .claim("", &key("never"), &fp("x"))
            .await
            .expect("claim"),
    );
    store.failing.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let recording = deferred(
        exec.complete_or_defer(Bytes::from_static(b"lost"))
            .await
            .expect("deferred"),
    );
    let e = recording.wait().await.expect_err("given up");
    assert!(e.is_unavailable(), "{e}");
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(59)..=Duration::from_secs(60)).contains(&waited),
        "tried for the retention: {waited:?}"
    );
    assert_eq!(engine.pending_recordings(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_running_operation_keeps_its_lease_and_retention_is_separate() {
    let engine = Engine::builder(MemoryStore::new())
        .lease(LEASE)
        .retention(Duration::from_secs(60))
        .build();
    let (k, f) = (key("long"), fp("x"));
    let mut exec = execute(engine.claim("", &k, &f).await.expect("claim"));
    let runner = tokio::spawn(async move {
        exec.run(tokio::time::sleep(Duration::from_secs(30))).await;
        assert!(!exec.is_lost());
        exec.complete(Bytes::from_static(b"done"))
            .await
            .expect("complete");
    });
    // Six leases later the owner still holds the key: renewal works.
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(matches!(
        engine.claim("", &k, &f).await.expect("held"),
        Claimed::InProgress { .. }
    ));
    runner.await.expect("runner");

    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(matches!(
        engine.claim("", &k, &f).await,
        Ok(Claimed::Replay(_))
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = execute(engine.claim("", &k, &f).await.expect("retention over"));
    assert!(!again.is_takeover());
}

#[tokio::test(start_paused = true)]
async fn dropping_an_execution_releases_its_key() {
    let engine = Engine::new(MemoryStore::new());
    let (k, f) = (key("dropped"), fp("x"));
    drop(execute(engine.claim("", &k, &f).await.expect("claim")));
    tokio::task::yield_now().await; // the release runs in the background
    let mut attempts = 0;
    loop {
        attempts += 1;
        match engine.claim("", &k, &f).await {
            Ok(Claimed::Execute(e)) => {
                assert!(!e.is_takeover(), "released, not expired");
                break;
            }
            Ok(Claimed::InProgress { .. }) if attempts < 100 => tokio::task::yield_now().await,
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn once_runs_once_and_replays_the_value() {
    let engine = Engine::new(MemoryStore::new());
    let runs = AtomicU64::new(0);
    let (k, f) = (
        key("msg-1"),
        Fingerprint::of_json(&serde_json::json!({"order": 1})).expect("fp"),
    );
    let run = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(vec![1u32, 2, 3])
    };
    let first = engine.once("q", &k, &f, run).await.expect("first");
    let second = engine.once("q", &k, &f, run).await.expect("second");
    assert!(!first.is_replayed());
    assert!(second.is_replayed());
    assert_eq!(second.into_value(), vec![1, 2, 3]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let reused = engine
        .once("q", &k, &fp("other"), run)
        .await
        .expect_err("another fingerprint");
    assert!(reused.is_key_reused());
    let wrong_type = engine
        .once("q", &k, &f, || async {
            Ok::<_, std::io::Error>("a string".to_owned())
        })
        .await
        .expect_err("recorded as a list");
    assert!(wrong_type.is_decode());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn once_releases_the_key_when_the_closure_fails() {
    let engine = Engine::new(MemoryStore::new());
    let (k, f) = (key("msg-2"), fp("x"));
    let err = engine
        .once("q", &k, &f, || async {
            Err::<u8, _>(std::io::Error::other("db down"))
        })
        .await
        .expect_err("fails");
    assert!(err.is_failed());
    assert_eq!(
        err.failure().map(ToString::to_string),
        Some("db down".into())
    );
    let ok = engine
        .once("q", &k, &f, || async { Ok::<_, std::io::Error>(7u8) })
        .await
        .expect("runs again");
    assert_eq!((*ok.value(), ok.is_replayed()), (7, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_under_concurrency_runs_exactly_once() {
    let engine = Engine::new(MemoryStore::new());
    let runs = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (k, f) = (key("msg-3"), fp("x"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..200 {
        let (engine, runs, gate, k, tx) = (
            engine.clone(),
            runs.clone(),
            gate.clone(),
            k.clone(),
            tx.clone(),
        );
        tokio::spawn(async move {
            let r = engine
                .once("q", &k, &f, || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.expect("gate").forget();
                    Ok::<_, std::io::Error>(42u64)
                })
                .await;
            tx.send(r).expect("receiver alive");
        });
    }
    // Every caller but the one running gets `in-progress` while it waits at the gate.
    for _ in 0..199 {
        let e = rx.recv().await.expect("answer").expect_err("a duplicate");
        assert!(e.is_in_progress(), "{e:?}");
        assert!(e.retry_after().is_some());
    }
    gate.add_permits(1);
    let ran = rx.recv().await.expect("the runner answers").expect("ok");
    assert_eq!((*ran.value(), ran.is_replayed()), (42, false));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------------------
// The engine against a model of the contract.

#[derive(Debug, Clone)]
enum Op {
    Begin { key: u8, fp: u8 },
    Complete { exec: usize, payload: u8 },
    Release { exec: usize },
    Advance { secs: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0u8..2).prop_map(|(key, fp)| Op::Begin { key, fp }),
        2 => (0usize..8, any::<u8>()).prop_map(|(exec, payload)| Op::Complete { exec, payload }),
        1 => (0usize..8).prop_map(|exec| Op::Release { exec }),
        2 => (0u64..8).prop_map(|secs| Op::Advance { secs }),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum ModelState {
    Running { fp: u8, owner: usize, until: u64 },
    Done { fp: u8, payload: u8, until: u64 },
}

#[derive(Debug, PartialEq)]
enum Seen {
    Execute { takeover: bool },
    Replay(u8),
    InProgress,
    KeyReused,
    Ok,
    Fenced,
    Skipped,
}

/// Also how long an abandoned claim is kept past its lease: its owner may complete or
/// release it until then, unless another claim took it over (store contract rule 3).
const RETENTION: u64 = 20;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let engine = Engine::builder(MemoryStore::new())
                .lease(LEASE)
                .retention(Duration::from_secs(RETENTION))
                .build();
            let mut now = 0u64;
            let mut model: HashMap<u8, ModelState> = HashMap::new();
            let mut execs: Vec<(u8, Option<Execution>)> = Vec::new();
            for op in ops {
                let (want, got) = match op {
                    Op::Advance { secs } => {
                        tokio::time::advance(Duration::from_secs(secs)).await;
                        now += secs;
                        continue;
                    }
                    Op::Begin { key: k, fp: f } => {
                        let live = model.get(&k).filter(|s| match s {
                            ModelState::Running { until, .. } | ModelState::Done { until, .. } => *until > now,
                        });
                        let want = match live {
                            None => Seen::Execute {
                                takeover: matches!(model.get(&k), Some(ModelState::Running { .. })),
                            },
                            Some(ModelState::Running { fp, .. }) if *fp == f => Seen::InProgress,
                            Some(ModelState::Done { fp, payload, .. }) if *fp == f => Seen::Replay(*payload),
                            Some(_) => Seen::KeyReused,
                        };
                        let got = match engine.claim("", &key(&format!("k{k}")), &fp(&format!("f{f}"))).await {
                            Ok(Claimed::Execute(e)) => {
                                let seen = Seen::Execute { takeover: e.is_takeover() };
                                model.insert(k, ModelState::Running { fp: f, owner: execs.len(), until: now + LEASE.as_secs() });
                                execs.push((k, Some(e)));
                                seen
                            }
                            Ok(Claimed::Replay(p)) => Seen::Replay(p[0]),
                            Ok(Claimed::Unguarded) => panic!("fail-closed engine"),
                            Ok(Claimed::QuotaExceeded { .. }) => panic!("no quota"),
                            Ok(Claimed::InProgress { .. }) => Seen::InProgress,
                            Ok(Claimed::KeyReused) => Seen::KeyReused,
                            Err(e) => panic!("{e}"),
                        };
                        (want, got)
                    }
                    Op::Complete { exec, .. } | Op::Release { exec }
                        if execs.get(exec).is_none_or(|(_, e)| e.is_none()) =>
                    {
                        (Seen::Skipped, Seen::Skipped)
                    }
                    Op::Complete { exec, payload } => {
                        let (k, e) = &mut execs[exec];
                        let e = e.take().expect("checked above");
                        let owns = matches!(model.get(k), Some(ModelState::Running { owner, until, .. }) if *owner == exec && *until + RETENTION > now);
                        let want = if owns { Seen::Ok } else { Seen::Fenced };
                        let got = match e.complete(Bytes::from(vec![payload])).await {
                            Ok(()) => Seen::Ok,
                            Err(se) if se.is_fenced() => Seen::Fenced,
                            Err(se) => panic!("{se}"),
                        };
                        if owns {
                            let Some(ModelState::Running { fp, .. }) = model.get(k).cloned() else { unreachable!() };
                            model.insert(*k, ModelState::Done { fp, payload, until: now + RETENTION });
                        }
                        (want, got)
                    }
                    Op::Release { exec } => {
                        let (k, e) = &mut execs[exec];
                        let e = e.take().expect("checked above");
                        let owns = matches!(model.get(k), Some(ModelState::Running { owner, until, .. }) if *owner == exec && *until + RETENTION > now);
                        let want = if owns { Seen::Ok } else { Seen::Fenced };
                        let got = match e.release().await {
                            Ok(()) => Seen::Ok,
                            Err(se) if se.is_fenced() => Seen::Fenced,
                            Err(se) => panic!("{se}"),
                        };
                        if owns {
                            model.remove(k);
                        }
                        (want, got)
                    }
                };
                // An expired claim may already be swept (the memory store sweeps in the
                // background): then the store cannot tell a takeover from a fresh claim.
                let swept = want == Seen::Execute { takeover: true }
                    && got == Seen::Execute { takeover: false };
                if !swept {
                    assert_eq!(got, want, "at t={now}s, model {model:?}");
                }
            }
            // Unfinished executions are forgotten, as a crash would: no background release.
            for (_, e) in execs {
                std::mem::forget(e);
            }
        });
    }
}

#[tokio::test]
async fn store_is_reachable_through_the_engine() {
    let engine = Engine::new(MemoryStore::new());
    assert_eq!(engine.store().sweep().await.expect("sweep"), 0);
}
