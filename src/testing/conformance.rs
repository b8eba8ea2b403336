//! The store conformance suite: the [store contract](crate::store) as executable checks.
//!
//! Every store in this crate (memory, SQLite, Redis, PostgreSQL, MySQL/MariaDB,
//! DynamoDB) runs this suite in CI.
//! A third-party [`Store`] runs it from its own tests with [`run`], giving a factory that
//! makes a store (or hands out the same one: every check uses record ids of its own, so a
//! shared store is fine):
//!
//! ```
//! use idemkey::store::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! idemkey::testing::conformance::run(|| async { MemoryStore::new() }).await;
//! # }
//! ```
//!
//! Each check is also public on its own, so a failing one can be run alone. A check
//! panics with a message naming the broken contract point, as a test assertion does.
//!
//! # Time
//!
//! Lease and retention expiry are checked against real time, because a real store keeps
//! its own clock: leases are at most one second, and expiry is awaited by polling with a
//! deadline (ten seconds), never by one long sleep. A check never fails because the
//! machine is slow: "must still be live" is asserted only while the local time elapsed
//! since the write is shorter than the lease or retention, so a stall can only make a
//! check wait longer.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};

use crate::store::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// How many claims [`claim_is_atomic`] fires at one record at once.
pub const CONCURRENT_CLAIMS: usize = 300;
/// The size of the payload [`large_payload_round_trips`] stores.
pub const LARGE_PAYLOAD: usize = 6 * 1024 * 1024;

/// A lease or retention that the checks wait out.
const SHORT: Duration = Duration::from_millis(300);
/// The lease that [`renew_extends_the_lease`] outlives by renewing.
const ONE_SECOND: Duration = Duration::from_secs(1);
/// A lease or retention that does not end during a check.
const LONG: Duration = Duration::from_secs(120);
/// How long a check waits for a lease or retention to end before failing.
const DEADLINE: Duration = Duration::from_secs(10);
/// The pause between two polls.
const POLL: Duration = Duration::from_millis(25);

/// Runs every check, each against a store made by `factory`.
///
/// Panics on the first check that fails, naming the broken contract point.
pub async fn run<F, Fut, S>(mut factory: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
    S: Store,
{
    let mut store = async || -> Arc<dyn Store> {
        let store: Arc<dyn Store> = Arc::new(factory().await);
        store
    };
    claim_returns_the_live_record(&store().await).await;
    writes_are_fenced_by_token(&store().await).await;
    claim_is_atomic(&store().await).await;
    takeover_after_lease_expiry(&store().await).await;
    expired_owner_is_fenced(&store().await).await;
    concurrent_takeover_is_atomic(&store().await).await;
    release_makes_the_record_claimable(&store().await).await;
    renew_extends_the_lease(&store().await).await;
    retention_expiry(&store().await).await;
    sweep_keeps_live_records(&store().await).await;
    large_payload_round_trips(&store().await).await;
    scopes_are_isolated(&store().await).await;
    huge_durations_mean_forever(&store().await).await;
}

/// A claim that finds a live record returns it in the same call: the owner's fingerprint
/// and remaining lease while in progress, the fingerprint and payload once completed.
pub async fn claim_returns_the_live_record(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    let fp = b"fp\0owner\xff".as_slice();
    expect_acquired(
        claim(store, &id, fp, owner, LONG).await,
        false,
        "first claim",
    );

    match claim(store, &id, b"other", FencingToken::random(), LONG).await {
        Claim::InProgress {
            fingerprint,
            lease_remaining,
        } => {
            assert_eq!(
                fingerprint, fp,
                "a claim on an in-progress record must return the owner's fingerprint"
            );
            assert!(
                lease_remaining > Duration::ZERO && lease_remaining <= LONG,
                "lease_remaining must be within the owner's lease, got {lease_remaining:?}"
            );
        }
        other => panic!("a claim on an in-progress record must be InProgress, got {other:?}"),
    }

    let payload = Bytes::from_static(b"payload\0with\xffbinary");
    complete(store, &id, owner, payload.clone(), LONG).await;
    expect_completed(
        claim(store, &id, b"third", FencingToken::random(), LONG).await,
        fp,
        &payload,
        "a claim on a completed record",
    );

    // An empty payload is a payload, not an absent one.
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(claim(store, &id, b"", owner, LONG).await, false, "claim");
    complete(store, &id, owner, Bytes::new(), LONG).await;
    expect_completed(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"",
        &Bytes::new(),
        "a record completed with an empty payload and fingerprint",
    );
}

/// Complete, renew and release are compare-and-set on the token: with another token, on
/// an absent record, or on a completed record they change nothing and fail fenced.
pub async fn writes_are_fenced_by_token(store: &Arc<dyn Store>) {
    let absent = fresh_id();
    let token = FencingToken::random();
    expect_all_fenced(store, &absent, token, "on an absent record").await;

    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(claim(store, &id, b"fp", owner, LONG).await, false, "claim");
    expect_all_fenced(
        store,
        &id,
        FencingToken::random(),
        "with a token that never held it",
    )
    .await;
    expect_in_progress(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"fp",
        "after fenced writes",
    );

    let payload = Bytes::from_static(b"done");
    complete(store, &id, owner, payload.clone(), LONG).await;
    expect_all_fenced(
        store,
        &id,
        owner,
        "by the owner once the record is completed",
    )
    .await;
    expect_completed(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"fp",
        &payload,
        "after fenced writes on a completed record",
    );
}

/// Of [`CONCURRENT_CLAIMS`] concurrent claims on one absent record exactly one wins and
/// every other sees it in progress; once completed, every concurrent claim sees the
/// completed record.
pub async fn claim_is_atomic(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let results = race(store, id, CONCURRENT_CLAIMS, LONG).await;
    let winners: Vec<_> = results
        .iter()
        .filter(|(_, _, c)| matches!(c, Claim::Acquired { .. }))
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {CONCURRENT_CLAIMS} concurrent claims must win, {} did",
        winners.len()
    );
    let &(winner, winner_token, ref first) = winners[0];
    assert_eq!(
        *first,
        Claim::Acquired { takeover: false },
        "the winner of a fresh record takes nothing over"
    );
    let winner_fp = fingerprint_of(winner);
    for (_, _, c) in results.iter().filter(|(i, _, _)| *i != winner) {
        expect_in_progress(c.clone(), &winner_fp, "a losing concurrent claim");
    }

    let payload = Bytes::from(format!("winner {winner}"));
    complete(store, &id, winner_token, payload.clone(), LONG).await;
    for (_, _, c) in race(store, id, CONCURRENT_CLAIMS, LONG).await {
        expect_completed(
            c,
            &winner_fp,
            &payload,
            "a concurrent claim after completion",
        );
    }
}

/// An in-progress record whose lease ended is taken over by the next claim (whatever its
/// fingerprint); the stale owner's complete, renew and release are then fenced and change
/// nothing.
pub async fn takeover_after_lease_expiry(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let stale = FencingToken::random();
    let started = Instant::now();
    expect_acquired(
        claim(store, &id, b"stale", stale, SHORT).await,
        false,
        "claim",
    );

    let fresh = FencingToken::random();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let before = Instant::now();
        match claim(store, &id, b"fresh", fresh, LONG).await {
            Claim::Acquired { takeover } => {
                assert!(
                    takeover,
                    "a claim over an expired lease must report takeover: true"
                );
                assert!(
                    Instant::now() - started >= SHORT,
                    "the lease was taken over before it could have expired"
                );
                break;
            }
            Claim::InProgress { fingerprint, .. } => {
                assert_eq!(fingerprint, b"stale".as_slice(), "in progress by the owner");
                assert!(
                    before < deadline,
                    "a lease of {SHORT:?} was still live after {DEADLINE:?}: expiry is broken"
                );
            }
            other => panic!("an in-progress record cannot be {other:?}"),
        }
        sleep(POLL).await;
    }

    expect_all_fenced(store, &id, stale, "by the owner whose lease was taken over").await;
    expect_in_progress(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"fresh",
        "after a takeover",
    );
    let payload = Bytes::from_static(b"by the new owner");
    complete(store, &id, fresh, payload.clone(), LONG).await;
    expect_completed(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"fresh",
        &payload,
        "after the new owner completed",
    );
}

/// An owner whose lease ended is fenced at once, before any other claim took the record
/// over: its complete, renew and release change nothing (a store that checks only the
/// token would let it complete a record that counts as absent), and the next claim
/// acquires the record.
pub async fn expired_owner_is_fenced(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(claim(store, &id, b"fp", owner, SHORT).await, false, "claim");
    // The store took the claim before it returned, so its lease has ended by any clock
    // once this much time has passed here.
    let claimed = Instant::now();
    tokio::time::sleep_until(claimed + SHORT + POLL).await;
    expect_all_fenced(store, &id, owner, "by an owner whose lease ended").await;
    match claim(store, &id, b"next", FencingToken::random(), LONG).await {
        Claim::Acquired { .. } => {}
        other => panic!("a record whose lease ended counts as absent, got {other:?}"),
    }
}

/// Concurrent claims on an expired lease: exactly one takes it over.
pub async fn concurrent_takeover_is_atomic(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let stale = FencingToken::random();
    expect_acquired(
        claim(store, &id, b"stale", stale, SHORT).await,
        false,
        "claim",
    );
    sleep(SHORT).await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let before = Instant::now();
        let results = race(store, id, 50, LONG).await;
        let won: Vec<_> = results
            .iter()
            .filter(|(_, _, c)| matches!(c, Claim::Acquired { .. }))
            .collect();
        assert!(
            won.len() <= 1,
            "{} concurrent claims took one expired lease over",
            won.len()
        );
        if let Some((_, _, c)) = won.first() {
            assert_eq!(*c, Claim::Acquired { takeover: true }, "takeover flag");
            break;
        }
        assert!(
            before < deadline,
            "a lease of {SHORT:?} was still live after {DEADLINE:?}: expiry is broken"
        );
        sleep(POLL).await;
    }
    expect_all_fenced(
        store,
        &id,
        stale,
        "by the owner after a concurrent takeover",
    )
    .await;
}

/// A released record is claimable again at once (not a takeover); the released token is
/// fenced, also once a new owner holds the record.
pub async fn release_makes_the_record_claimable(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let first = FencingToken::random();
    expect_acquired(claim(store, &id, b"one", first, LONG).await, false, "claim");
    store
        .release(&id, first)
        .await
        .unwrap_or_else(|e| panic!("the owner's release must succeed: {e}"));
    expect_all_fenced(store, &id, first, "by a released token (record absent)").await;

    let second = FencingToken::random();
    expect_acquired(
        claim(store, &id, b"two", second, LONG).await,
        false,
        "a claim after a release",
    );
    expect_all_fenced(store, &id, first, "by a released token (record re-claimed)").await;
    let payload = Bytes::from_static(b"second");
    complete(store, &id, second, payload.clone(), LONG).await;
    expect_completed(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"two",
        &payload,
        "after release and re-claim",
    );
}

/// Renewing moves the lease end to `lease` from now: the record outlives its first lease.
pub async fn renew_extends_the_lease(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(
        claim(store, &id, b"fp", owner, ONE_SECOND).await,
        false,
        "claim",
    );
    let claimed = Instant::now();
    let renewing = Instant::now();
    store
        .renew(&id, owner, LONG)
        .await
        .unwrap_or_else(|e| panic!("the owner's renew within its lease must succeed: {e}"));

    // Wait until the first lease has surely ended by any clock, then look.
    tokio::time::sleep_until(claimed + ONE_SECOND + POLL).await;
    match claim(store, &id, b"x", FencingToken::random(), LONG).await {
        Claim::InProgress {
            fingerprint,
            lease_remaining,
        } => {
            assert_eq!(fingerprint, b"fp".as_slice(), "owner's fingerprint");
            let since_renew = Instant::now() - renewing;
            assert!(
                lease_remaining > ONE_SECOND || since_renew >= LONG - ONE_SECOND,
                "after renewing to {LONG:?}, {lease_remaining:?} left is too little"
            );
        }
        other => panic!("a renewed lease must outlive the first one, got {other:?}"),
    }
    store
        .renew(&id, FencingToken::random(), LONG)
        .await
        .map_or_else(
            |e| expect_fenced_error(&e, "renew by another token"),
            |()| panic!("renew by another token must be fenced"),
        );
    complete(store, &id, owner, Bytes::from_static(b"ok"), LONG).await;
}

/// A completed record is returned until its retention ends, then counts as absent: the
/// next claim acquires it without a takeover.
pub async fn retention_expiry(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(claim(store, &id, b"fp", owner, LONG).await, false, "claim");
    let completing = Instant::now();
    let payload = Bytes::from_static(b"kept briefly");
    complete(store, &id, owner, payload.clone(), SHORT).await;

    let next = FencingToken::random();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let before = Instant::now();
        match claim(store, &id, b"next", next, LONG).await {
            Claim::Acquired { takeover } => {
                assert!(!takeover, "an expired completed record is not a takeover");
                assert!(
                    Instant::now() - completing >= SHORT,
                    "a completed record expired before its retention ended"
                );
                break;
            }
            other => {
                expect_completed(other, b"fp", &payload, "a record within retention");
                assert!(
                    before < deadline,
                    "a retention of {SHORT:?} had not ended after {DEADLINE:?}"
                );
            }
        }
        sleep(POLL).await;
    }
    expect_all_fenced(store, &id, owner, "by the owner of an expired record").await;
    complete(store, &id, next, Bytes::from_static(b"again"), LONG).await;
}

/// [`Store::sweep`] succeeds, removes nothing live, and expired records stay absent
/// after it.
pub async fn sweep_keeps_live_records(store: &Arc<dyn Store>) {
    let live = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(
        claim(store, &live, b"live", owner, LONG).await,
        false,
        "claim",
    );
    let done = fresh_id();
    let done_owner = FencingToken::random();
    expect_acquired(
        claim(store, &done, b"done", done_owner, LONG).await,
        false,
        "claim",
    );
    complete(store, &done, done_owner, Bytes::from_static(b"p"), LONG).await;
    let expiring = fresh_id();
    let expiring_owner = FencingToken::random();
    expect_acquired(
        claim(store, &expiring, b"exp", expiring_owner, LONG).await,
        false,
        "claim",
    );
    complete(
        store,
        &expiring,
        expiring_owner,
        Bytes::from_static(b"p"),
        SHORT,
    )
    .await;
    sleep(SHORT).await;

    let deadline = Instant::now() + DEADLINE;
    loop {
        let before = Instant::now();
        store
            .sweep()
            .await
            .unwrap_or_else(|e| panic!("sweep must succeed: {e}"));
        match claim(store, &expiring, b"n", FencingToken::random(), LONG).await {
            Claim::Acquired { takeover } => {
                assert!(!takeover, "an expired completed record is not a takeover");
                break;
            }
            other => {
                expect_completed(other, b"exp", &Bytes::from_static(b"p"), "within retention");
                assert!(
                    before < deadline,
                    "retention had not ended after {DEADLINE:?}"
                );
            }
        }
        sleep(POLL).await;
    }
    expect_in_progress(
        claim(store, &live, b"x", FencingToken::random(), LONG).await,
        b"live",
        "a live in-progress record after a sweep",
    );
    expect_completed(
        claim(store, &done, b"x", FencingToken::random(), LONG).await,
        b"done",
        &Bytes::from_static(b"p"),
        "a live completed record after a sweep",
    );
    store
        .renew(&live, owner, LONG)
        .await
        .unwrap_or_else(|e| panic!("a sweep must not disturb a live lease: {e}"));
}

/// A payload of [`LARGE_PAYLOAD`] bytes (every byte value, no pattern a store could
/// compress away) is returned byte for byte.
pub async fn large_payload_round_trips(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(claim(store, &id, b"big", owner, LONG).await, false, "claim");
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let payload: Bytes = (0..LARGE_PAYLOAD)
        .map(|_| {
            // xorshift64: cheap bytes without repetition.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_be_bytes()[0]
        })
        .collect();
    complete(store, &id, owner, payload.clone(), LONG).await;
    match claim(store, &id, b"x", FencingToken::random(), LONG).await {
        Claim::Completed {
            fingerprint,
            payload: got,
        } => {
            assert_eq!(fingerprint, b"big".as_slice(), "fingerprint");
            assert!(
                got == payload,
                "a payload of {} bytes came back as {} different bytes",
                payload.len(),
                got.len()
            );
        }
        other => panic!("a completed large record must be Completed, got {other:?}"),
    }
}

/// The same key in two scopes addresses two records that never see each other.
pub async fn scopes_are_isolated(store: &Arc<dyn Store>) {
    let key = uuid::Uuid::new_v4().to_string();
    let a = RecordId::new("tenant-a", &key);
    let b = RecordId::new("tenant-b", &key);
    let (ta, tb) = (FencingToken::random(), FencingToken::random());
    expect_acquired(claim(store, &a, b"a", ta, LONG).await, false, "tenant a");
    expect_acquired(
        claim(store, &b, b"b", tb, LONG).await,
        false,
        "tenant b, same key",
    );
    expect_all_fenced(store, &b, ta, "by another scope's token").await;
    let (pa, pb) = (Bytes::from_static(b"for a"), Bytes::from_static(b"for b"));
    complete(store, &a, ta, pa.clone(), LONG).await;
    complete(store, &b, tb, pb.clone(), LONG).await;
    let other = FencingToken::random();
    expect_completed(
        claim(store, &a, b"", other, LONG).await,
        b"a",
        &pa,
        "scope a",
    );
    expect_completed(
        claim(store, &b, b"", other, LONG).await,
        b"b",
        &pb,
        "scope b",
    );
}

/// A lease or retention of [`Duration::MAX`] ("keep forever") is accepted and keeps the
/// record live; it does not overflow the store's clock arithmetic.
pub async fn huge_durations_mean_forever(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(
        claim(store, &id, b"fp", owner, Duration::MAX).await,
        false,
        "claim",
    );
    store
        .renew(&id, owner, Duration::MAX)
        .await
        .unwrap_or_else(|e| panic!("renew to Duration::MAX must succeed: {e}"));
    match claim(store, &id, b"x", FencingToken::random(), LONG).await {
        Claim::InProgress {
            lease_remaining, ..
        } => assert!(lease_remaining > LONG, "a lease of Duration::MAX is long"),
        other => panic!("a lease of Duration::MAX must be live, got {other:?}"),
    }
    let payload = Bytes::from_static(b"forever");
    complete(store, &id, owner, payload.clone(), Duration::MAX).await;
    expect_completed(
        claim(store, &id, b"x", FencingToken::random(), Duration::MAX).await,
        b"fp",
        &payload,
        "a record kept for Duration::MAX",
    );
}

/// A record id no other check (or run) uses.
fn fresh_id() -> RecordId {
    RecordId::new("idemkey-conformance", &uuid::Uuid::new_v4().to_string())
}

async fn claim(
    store: &Arc<dyn Store>,
    id: &RecordId,
    fingerprint: &[u8],
    token: FencingToken,
    lease: Duration,
) -> Claim {
    store
        .claim(ClaimRequest {
            id,
            fingerprint,
            token,
            lease,
        })
        .await
        .unwrap_or_else(|e| panic!("claim failed: {e}"))
}

async fn complete(
    store: &Arc<dyn Store>,
    id: &RecordId,
    token: FencingToken,
    payload: Bytes,
    retention: Duration,
) {
    store
        .complete(id, token, payload, retention)
        .await
        .unwrap_or_else(|e| panic!("the owner's complete must succeed: {e}"));
}

/// The fingerprint claimer `i` of [`race`] uses.
fn fingerprint_of(i: usize) -> Vec<u8> {
    format!("claimer {i}").into_bytes()
}

/// Fires `n` claims at `id` at once, each from its own task with its own token; returns
/// (claimer, token, result) for each.
async fn race(
    store: &Arc<dyn Store>,
    id: RecordId,
    n: usize,
    lease: Duration,
) -> Vec<(usize, FencingToken, Claim)> {
    let gate = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let (store, gate) = (Arc::clone(store), Arc::clone(&gate));
        tasks.spawn(async move {
            let (fp, token) = (fingerprint_of(i), FencingToken::random());
            gate.wait().await;
            (i, token, claim(&store, &id, &fp, token, lease).await)
        });
    }
    let mut out = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        out.push(joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
    }
    out
}

fn expect_acquired(got: Claim, takeover: bool, what: &str) {
    assert_eq!(got, Claim::Acquired { takeover }, "{what}");
}

fn expect_in_progress(got: Claim, fp: &[u8], what: &str) {
    match got {
        Claim::InProgress { fingerprint, .. } => {
            assert_eq!(fingerprint, fp, "{what}: the owner's fingerprint");
        }
        other => panic!("{what}: expected InProgress, got {other:?}"),
    }
}

fn expect_completed(got: Claim, fp: &[u8], payload: &Bytes, what: &str) {
    match got {
        Claim::Completed {
            fingerprint,
            payload: got,
        } => {
            assert_eq!(
                fingerprint, fp,
                "{what}: the completing request's fingerprint"
            );
            assert_eq!(&got, payload, "{what}: the stored payload");
        }
        other => panic!("{what}: expected Completed, got {other:?}"),
    }
}

fn expect_fenced_error(e: &StoreError, what: &str) {
    assert!(e.is_fenced(), "{what}: expected a fenced error, got: {e}");
}

/// Complete, renew and release with `token` must all be fenced.
async fn expect_all_fenced(store: &Arc<dyn Store>, id: &RecordId, token: FencingToken, what: &str) {
    let results = [
        (
            "complete",
            store
                .complete(id, token, Bytes::from_static(b"stale"), LONG)
                .await,
        ),
        ("renew", store.renew(id, token, LONG).await),
        ("release", store.release(id, token).await),
    ];
    for (op, r) in results {
        match r {
            Ok(()) => panic!("{op} {what} must be fenced, but it succeeded"),
            Err(e) => expect_fenced_error(&e, &format!("{op} {what}")),
        }
    }
}
