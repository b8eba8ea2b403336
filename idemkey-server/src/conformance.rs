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
//! idemkey::server::conformance::run(|| async { MemoryStore::new() }).await;
//! # }
//! ```
//!
//! Each check is also public on its own, so a failing one can be run alone. A check
//! panics with a message naming the broken contract point, as a test assertion does.
//!
//! # Vectors
//!
//! The vectors that idemkit's backend conformance suite checks (`idemkit.conformance`, Python),
//! each here too: atomic claim ([`claim_is_atomic`]; over several instances of one store,
//! [`claim_is_atomic_across`]), a duplicate claim returning the live record
//! ([`claim_returns_the_live_record`]), wrong-token fencing of complete, renew and release
//! ([`writes_are_fenced_by_token`]), release ([`release_makes_the_record_claimable`]), lease
//! reclaim and the reclaimed owner fenced ([`takeover_after_lease_expiry`],
//! [`concurrent_takeover_is_atomic`]), renew extending a lease ([`renew_extends_the_lease`]) and
//! renew of a fenced owner ([`renew_of_a_fenced_owner_changes_nothing`]), TTL expiry of an
//! abandoned claim ([`abandoned_claim_is_kept_for_its_retention`]) and of a completed record
//! ([`retention_expiry`]), an oversize payload ([`large_payload_round_trips`]) and a concurrent
//! claim storm ([`claim_storm_over_many_records`]). And regressions of bugs users hit in other
//! libraries: a rejected duplicate never frees the live claim it does not own
//! ([`rejected_duplicate_never_frees_the_live_claim`]); cleanup addresses records by their hashed
//! id, never the raw key ([`cleanup_addresses_records_by_hashed_id`]); a sweep racing a completion
//! never makes a settled key answer "in progress" or run again
//! ([`sweep_racing_completions_keeps_them_settled`]).
//!
//! # Time
//!
//! Lease and retention expiry are checked against real time, because a real store keeps
//! its own clock: leases are at most one second, and expiry is awaited by polling with a
//! deadline (ten seconds), never by one long sleep. A check never fails because the
//! machine is slow: "must still be live" is asserted only while the local time elapsed
//! since the write is shorter than the lease or retention, so a stall can only make a
//! check wait longer. A store's clock may count whole milliseconds, so an expiry up to
//! 2 ms early by this machine's clock is accepted.
//!
//! The times a store reports ([`RecordInfo::created`], [`RecordInfo::expires`]) are read
//! by the store's clock; the checks allow [`CLOCK_SKEW`] between that clock and this
//! machine's.
//!
//! # Shared stores
//!
//! [`list_in_progress_is_oldest_first`] lists up to [`LIST_ALL`] in-progress records and
//! expects its own among them: a store shared with other work must hold fewer
//! in-progress records than that.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};

use crate::store::{
    Claim, ClaimRequest, FencingToken, InProcessStore, RecordId, RecordInfo, RecordState, Store,
    StoreError, SweepOptions, SweepReport, Watch,
};

/// How many claims [`claim_is_atomic`] and [`claim_is_atomic_across`] fire at one record at
/// once.
pub const CONCURRENT_CLAIMS: usize = 300;
/// How many records [`claim_storm_over_many_records`] claims at once.
pub const STORM_RECORDS: usize = 24;
/// How many claims [`claim_storm_over_many_records`] fires at each of its records.
pub const STORM_CLAIMS: usize = 12;
/// How many abandoned claims [`sweep_racing_completions_keeps_them_settled`] completes
/// while sweeps run.
pub const RACING_COMPLETIONS: usize = 40;
/// The size of the payload [`large_payload_round_trips`] stores.
pub const LARGE_PAYLOAD: usize = 6 * 1024 * 1024;
/// How far the store's clock may be from this machine's in the checks of reported times.
pub const CLOCK_SKEW: Duration = Duration::from_secs(1);
/// The `limit` with which [`list_in_progress_is_oldest_first`] lists "everything".
pub const LIST_ALL: usize = 10_000;

/// A lease or retention that the checks wait out.
const SHORT: Duration = Duration::from_millis(300);
/// The lease that [`renew_extends_the_lease`] outlives by renewing.
const ONE_SECOND: Duration = Duration::from_secs(1);
/// A lease or retention that does not end during a check.
const LONG: Duration = Duration::from_secs(120);
/// A retention that does not end during a check and differs from [`LONG`], so that a
/// store reporting one for the other is caught.
const RETAIN: Duration = Duration::from_secs(600);
/// How long [`abandoned_claim_is_kept_for_its_retention`] keeps its abandoned claim.
const ABANDONED: Duration = Duration::from_secs(1);
/// How early a lease or retention may end by this machine's clock: a store's clock may
/// count whole milliseconds (Redis `TIME`, SQLite's stored times), so an expiry written
/// and read back can come up to a millisecond early each way.
const CLOCK_RESOLUTION: Duration = Duration::from_millis(2);
/// How far a reported duration may be from the one asked for (store clock resolution,
/// and the time a statement takes between reading the clock twice).
const TOLERANCE: Duration = Duration::from_secs(1);
/// How long a check waits for a lease or retention to end before failing.
const DEADLINE: Duration = Duration::from_secs(10);
/// The pause between two polls.
const POLL: Duration = Duration::from_millis(25);

/// Runs every check, each against a store made by `factory`; for a store that answers
/// in process ([`Store::in_process`]), every check again with its claims and completions
/// made through that path, as the engine makes them.
///
/// Panics on the first check that fails, naming the broken contract point.
pub async fn run<F, Fut, S>(mut factory: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
    S: Store,
{
    let in_process = factory().await.in_process().is_some();
    for through_in_process in [false, true] {
        if through_in_process && !in_process {
            break;
        }
        let store = async || -> Arc<dyn Store> {
            let store: Arc<dyn Store> = Arc::new(factory().await);
            if through_in_process {
                Arc::new(InProcessPath(store))
            } else {
                store
            }
        };
        run_checks(store).await;
    }
}

/// Every check, each against a store made by `store`.
async fn run_checks(mut store: impl AsyncFnMut() -> Arc<dyn Store>) {
    claim_returns_the_live_record(&store().await).await;
    writes_are_fenced_by_token(&store().await).await;
    claim_is_atomic(&store().await).await;
    takeover_after_lease_expiry(&store().await).await;
    expired_owner_can_still_complete(&store().await).await;
    concurrent_takeover_is_atomic(&store().await).await;
    release_makes_the_record_claimable(&store().await).await;
    renew_extends_the_lease(&store().await).await;
    retention_expiry(&store().await).await;
    abandoned_claim_is_kept_for_its_retention(&store().await).await;
    sweep_keeps_live_records(&store().await).await;
    inspect_shows_the_record(&store().await).await;
    force_release_removes_any_record(&store().await).await;
    list_in_progress_is_oldest_first(&store().await).await;
    large_payload_round_trips(&store().await).await;
    scopes_are_isolated(&store().await).await;
    huge_durations_mean_forever(&store().await).await;
    renew_of_a_fenced_owner_changes_nothing(&store().await).await;
    claim_storm_over_many_records(&store().await).await;
    rejected_duplicate_never_frees_the_live_claim(&store().await).await;
    cleanup_addresses_records_by_hashed_id(&store().await).await;
    sweep_racing_completions_keeps_them_settled(&store().await).await;
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
    claim_is_atomic_across(std::slice::from_ref(store)).await;
}

/// [`claim_is_atomic`] with the claims spread over several instances of one store, in
/// turn: pools or clients of their own to one database, as several verifier processes
/// hold them, so that the claim's atomicity is the database's and not one pool's or one
/// process's. The record is completed through the first instance.
///
/// ```
/// use std::sync::Arc;
/// use idemkey::store::{MemoryStore, Store};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A memory store lives in one process: its instances are handles to one store.
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let instances = [Arc::clone(&store), Arc::clone(&store), store];
/// idemkey::server::conformance::claim_is_atomic_across(&instances).await;
/// # }
/// ```
///
/// # Panics
///
/// When the check fails, as every check does, and when `stores` is empty.
pub async fn claim_is_atomic_across(stores: &[Arc<dyn Store>]) {
    let id = fresh_id();
    // Refuses an empty `stores`, so there is a first instance below.
    let results = race(stores, id, CONCURRENT_CLAIMS, LONG).await;
    let winners: Vec<_> = results
        .iter()
        .filter(|(_, _, c)| matches!(c, Claim::Acquired { .. }))
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {CONCURRENT_CLAIMS} concurrent claims must win, {} did (through {} \
         instance(s) of the store)",
        winners.len(),
        stores.len()
    );
    let &(winner, winner_token, ref won) = winners[0];
    assert_eq!(
        *won,
        Claim::Acquired { takeover: false },
        "the winner of a fresh record takes nothing over"
    );
    let winner_fp = fingerprint_of(winner);
    for (_, _, c) in results.iter().filter(|(i, _, _)| *i != winner) {
        expect_in_progress(c.clone(), &winner_fp, "a losing concurrent claim");
    }

    let payload = Bytes::from(format!("winner {winner}"));
    complete(&stores[0], &id, winner_token, payload.clone(), LONG).await;
    for (_, _, c) in race(stores, id, CONCURRENT_CLAIMS, LONG).await {
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
    let (at, takeover) = take_over(
        store,
        &id,
        (b"fresh", fresh, LONG),
        b"stale",
        Instant::now() + DEADLINE,
        &format!("a lease of {SHORT:?} was still live after {DEADLINE:?}: expiry is broken"),
    )
    .await;
    assert!(
        takeover,
        "a claim over an expired lease must report takeover: true"
    );
    assert!(
        at - started + CLOCK_RESOLUTION >= SHORT,
        "the lease was taken over before it could have expired"
    );

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

/// An owner whose lease expired and that nobody took over can still complete (the next
/// claim then gets the completed record: a replay, not a takeover), renew (its lease is
/// live again) and release (the next claim executes anew): fencing stops a stale owner
/// from overwriting a new one, not from recording the only outcome there is.
pub async fn expired_owner_can_still_complete(store: &Arc<dyn Store>) {
    let [done, renewed, released] = [fresh_id(), fresh_id(), fresh_id()];
    let owners = [(); 3].map(|()| FencingToken::random());
    for (id, owner) in [&done, &renewed, &released].into_iter().zip(owners) {
        expect_acquired(claim(store, id, b"fp", owner, SHORT).await, false, "claim");
    }
    // The store took the claims before they returned, so their leases have ended by any
    // clock once this much time has passed here.
    let claimed = Instant::now();
    tokio::time::sleep_until(claimed + SHORT + POLL).await;

    let payload = Bytes::from_static(b"recorded after the lease");
    store
        .complete(&done, owners[0], payload.clone(), LONG)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "an owner whose lease expired and that nobody took over must still complete: {e}"
            )
        });
    expect_completed(
        claim(store, &done, b"next", FencingToken::random(), LONG).await,
        b"fp",
        &payload,
        "the claim after an expired owner completed (a replay, not a takeover)",
    );

    store
        .renew(&renewed, owners[1], LONG)
        .await
        .unwrap_or_else(|e| {
            panic!("an owner whose lease expired and that nobody took over must still renew: {e}")
        });
    expect_in_progress(
        claim(store, &renewed, b"next", FencingToken::random(), LONG).await,
        b"fp",
        "a claim after an expired owner renewed its lease",
    );
    complete(store, &renewed, owners[1], Bytes::from_static(b"ok"), LONG).await;

    store
        .release(&released, owners[2])
        .await
        .unwrap_or_else(|e| {
            panic!("an owner whose lease expired and that nobody took over must still release: {e}")
        });
    expect_acquired(
        claim(store, &released, b"next", FencingToken::random(), LONG).await,
        false,
        "a claim after an expired owner released",
    );
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
        let results = race(std::slice::from_ref(store), id, 50, LONG).await;
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
                    Instant::now() - completing + CLOCK_RESOLUTION >= SHORT,
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

/// An abandoned claim (lease expired, nobody took it over) is kept past its lease, for
/// the claim's retention: [`Store::inspect`] still shows it and [`Store::sweep`] leaves
/// it. Once lease + retention have passed it is gone: `inspect` shows nothing, its
/// owner's complete is fenced, and the next claim acquires the record.
pub async fn abandoned_claim_is_kept_for_its_retention(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    let started = Instant::now();
    expect_acquired(
        claim_kept(store, &id, b"abandoned", owner, SHORT, ABANDONED).await,
        false,
        "claim",
    );
    tokio::time::sleep_until(started + SHORT + POLL).await;

    let deadline = started + SHORT + ABANDONED + DEADLINE;
    loop {
        let before = Instant::now();
        store
            .sweep()
            .await
            .unwrap_or_else(|e| panic!("sweep must succeed: {e}"));
        let info = inspect(store, &id).await;
        // The store wrote the claim after `started`: it is surely kept until then.
        let surely_kept = Instant::now() - started + CLOCK_RESOLUTION < SHORT + ABANDONED;
        match info {
            Some(info) => {
                assert_eq!(
                    info.state,
                    RecordState::InProgress,
                    "an abandoned claim is in progress"
                );
                assert!(
                    info.expires <= SystemTime::now() + CLOCK_SKEW,
                    "the lease of an abandoned claim ended: its expires must be in the past"
                );
                assert!(
                    before < deadline,
                    "an abandoned claim kept for {ABANDONED:?} past a lease of {SHORT:?} was \
                     still there after {DEADLINE:?} more: it must be removed once lease + \
                     retention have passed"
                );
            }
            None => {
                assert!(
                    !surely_kept,
                    "an abandoned claim must be kept past its lease for the claim's retention \
                     (it was gone {:?} after the claim, before lease + retention)",
                    Instant::now() - started
                );
                break;
            }
        }
        sleep(POLL).await;
    }
    store
        .complete(&id, owner, Bytes::from_static(b"too late"), LONG)
        .await
        .map_or_else(
            |e| expect_fenced_error(&e, "complete of a claim past lease + retention"),
            |()| panic!("complete of a claim past lease + retention must be fenced"),
        );
    expect_executes(
        claim(store, &id, b"next", FencingToken::random(), LONG).await,
        "a claim past lease + retention (the record counts as absent)",
    );
}

/// [`Store::inspect`] shows a record by its [`RecordId`] (never by the raw key): `None`
/// for an absent id; while in progress, the claim's fingerprint, `created` (now, by the
/// store's clock) and `expires` (the end of the lease, not of the retention); once
/// completed, the payload's size and `expires` at the end of the retention, `created`
/// unchanged; `None` again once the retention ended. An abandoned claim (lease ended,
/// nobody took it over) is shown in progress with `expires` in the past.
pub async fn inspect_shows_the_record(store: &Arc<dyn Store>) {
    assert_eq!(
        inspect(store, &fresh_id()).await,
        None,
        "inspect of an absent id must be None"
    );
    let id = fresh_id();
    let owner = FencingToken::random();
    let fp = b"fp\0inspect\xff".as_slice();
    let before = SystemTime::now();
    expect_acquired(
        claim_kept(store, &id, fp, owner, LONG, RETAIN).await,
        false,
        "claim",
    );
    let after = SystemTime::now();
    let info = inspect(store, &id)
        .await
        .unwrap_or_else(|| panic!("inspect of an in-progress record must show it"));
    assert_eq!(info.id, id, "inspect shows the record asked for");
    assert_eq!(info.state, RecordState::InProgress, "inspect of a claim");
    assert_eq!(
        info.fingerprint, fp,
        "inspect shows the claim's fingerprint"
    );
    assert_eq!(
        info.payload_len, None,
        "an in-progress record has no payload"
    );
    assert!(
        info.created + CLOCK_SKEW >= before && info.created <= after + CLOCK_SKEW,
        "created must be the time of the claim: {:?} is not between {before:?} and {after:?}",
        info.created
    );
    expect_about(
        &info,
        LONG,
        "an in-progress record's expires is the end of its lease",
    );
    let other_scope = RecordId::new("idemkey-conformance-other", "x");
    assert_eq!(
        inspect(store, &other_scope).await,
        None,
        "another id is absent"
    );

    let payload = Bytes::from(vec![7_u8; 1234]);
    complete(store, &id, owner, payload, RETAIN).await;
    let completed = SystemTime::now();
    let done = inspect(store, &id)
        .await
        .unwrap_or_else(|| panic!("inspect of a completed record must show it"));
    assert_eq!(done.state, RecordState::Completed, "inspect after complete");
    assert_eq!(
        done.payload_len,
        Some(1234),
        "payload_len is the payload's size"
    );
    assert_eq!(done.fingerprint, fp, "the completed request's fingerprint");
    assert_eq!(
        done.created, info.created,
        "created is the time of the claim; completing does not change it"
    );
    assert!(
        done.expires + TOLERANCE >= info.created + RETAIN
            && done.expires <= completed + RETAIN + CLOCK_SKEW,
        "a completed record's expires is the end of its retention ({RETAIN:?} after the \
         complete), got {:?} after the claim",
        done.expires
            .duration_since(done.created)
            .unwrap_or_default()
    );

    // An abandoned claim (lease ended, nobody took it over) is still shown, in
    // progress, with its lease end in the past: a stuck key an operator can find.
    let id = fresh_id();
    let claimed = Instant::now();
    expect_acquired(
        claim_kept(store, &id, b"stuck", FencingToken::random(), SHORT, RETAIN).await,
        false,
        "claim",
    );
    tokio::time::sleep_until(claimed + SHORT + POLL).await;
    let stuck = inspect(store, &id)
        .await
        .unwrap_or_else(|| panic!("inspect must show an abandoned claim until lease + retention"));
    assert_eq!(
        (stuck.state, stuck.payload_len),
        (RecordState::InProgress, None),
        "an abandoned claim is shown in progress"
    );
    assert!(
        stuck.expires <= SystemTime::now() + CLOCK_SKEW,
        "an abandoned claim's expires is its lease end, in the past: {:?}",
        stuck.expires
    );

    // A completed record past its retention is not shown.
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(claim(store, &id, b"fp", owner, LONG).await, false, "claim");
    let completing = Instant::now();
    complete(store, &id, owner, Bytes::from_static(b"brief"), SHORT).await;
    let deadline = completing + SHORT + DEADLINE;
    while inspect(store, &id).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "inspect still showed a record {DEADLINE:?} after its retention of {SHORT:?} ended"
        );
        sleep(POLL).await;
    }
    assert!(
        Instant::now() - completing + CLOCK_RESOLUTION >= SHORT,
        "inspect showed nothing before the retention ended"
    );
}

/// [`Store::force_release`] removes a record whatever its state or token: an in-progress
/// one (its owner's complete, renew and release are fenced afterwards, and the next claim
/// acquires the record) and a completed one (the next claim executes anew). It returns
/// `true` when it removed a record, `false` for an absent id.
pub async fn force_release_removes_any_record(store: &Arc<dyn Store>) {
    assert!(
        !force_release(store, &fresh_id()).await,
        "force_release of an absent id must return false"
    );

    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(
        claim(store, &id, b"stuck", owner, LONG).await,
        false,
        "claim",
    );
    assert!(
        force_release(store, &id).await,
        "force_release of an in-progress record must return true"
    );
    assert_eq!(
        inspect(store, &id).await,
        None,
        "a force-released record is gone"
    );
    assert!(
        !force_release(store, &id).await,
        "a second force_release finds nothing: false"
    );
    expect_all_fenced(store, &id, owner, "by the owner of a force-released record").await;
    let next = FencingToken::random();
    expect_executes(
        claim(store, &id, b"next", next, LONG).await,
        "the claim after a force_release",
    );
    expect_all_fenced(
        store,
        &id,
        owner,
        "by the owner of a force-released record, once re-claimed",
    )
    .await;
    expect_in_progress(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"next",
        "the new owner's record after the old owner's fenced writes",
    );
    complete(store, &id, next, Bytes::from_static(b"new"), LONG).await;

    assert!(
        force_release(store, &id).await,
        "force_release of a completed record must return true"
    );
    expect_executes(
        claim(store, &id, b"again", FencingToken::random(), LONG).await,
        "the claim after force_release of a completed record (it executes anew)",
    );
}

/// [`Store::list_in_progress`] lists in-progress records, abandoned ones (expired lease)
/// included and completed ones never, oldest claim first, and honours `limit`.
pub async fn list_in_progress_is_oldest_first(store: &Arc<dyn Store>) {
    assert!(
        list(store, 0).await.is_empty(),
        "list_in_progress(0) must be empty"
    );
    let (expiring, older, newest, done) = (fresh_id(), fresh_id(), fresh_id(), fresh_id());
    let token = FencingToken::random;
    expect_acquired(
        claim(store, &expiring, b"expiring", token(), SHORT).await,
        false,
        "claim",
    );
    let claimed = Instant::now();
    for (id, fp) in [(&older, b"older"), (&newest, b"newer")] {
        // Apart by more than the resolution of any store's clock.
        sleep(POLL).await;
        expect_acquired(claim(store, id, fp, token(), LONG).await, false, "claim");
    }
    let done_owner = token();
    expect_acquired(
        claim(store, &done, b"done", done_owner, LONG).await,
        false,
        "claim",
    );
    complete(store, &done, done_owner, Bytes::from_static(b"p"), LONG).await;
    tokio::time::sleep_until(claimed + SHORT + POLL).await;

    let all = list(store, LIST_ALL).await;
    expect_sorted(&all, "list_in_progress");
    for info in &all {
        assert_eq!(
            (info.state, info.payload_len),
            (RecordState::InProgress, None),
            "list_in_progress must list in-progress records only, got {info:?}"
        );
    }
    assert!(
        all.iter().all(|r| r.id != done),
        "list_in_progress must not list a completed record"
    );
    let position = |id: &RecordId, what: &str| {
        all.iter()
            .position(|r| r.id == *id)
            .unwrap_or_else(|| panic!("list_in_progress must list {what}"))
    };
    let mine = [
        position(
            &expiring,
            "an in-progress record whose lease expired (a stuck key)",
        ),
        position(&older, "an in-progress record"),
        position(&newest, "an in-progress record"),
    ];
    assert!(
        mine[0] < mine[1] && mine[1] < mine[2],
        "list_in_progress must list the oldest claim first (positions {mine:?} for three \
         claims made in order)"
    );
    assert!(
        all[mine[0]].expires <= SystemTime::now() + CLOCK_SKEW,
        "the expired-lease record is listed with its lease end in the past"
    );
    for k in 1..=3 {
        let first = list(store, k).await;
        expect_sorted(&first, "list_in_progress with a limit");
        assert_eq!(
            first.len(),
            k,
            "list_in_progress({k}) must return {k} records when the store holds more"
        );
        let kth_mine = &all[mine[k - 1]];
        assert!(
            first[k - 1].created <= kth_mine.created,
            "list_in_progress({k}) must return the {k} oldest claims: its last is newer than \
             an in-progress record it left out"
        );
    }
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
        claim_kept(store, &id, b"fp", owner, Duration::MAX, Duration::MAX).await,
        false,
        "claim",
    );
    assert!(
        inspect(store, &id)
            .await
            .is_some_and(|i| i.expires > SystemTime::now() + LONG),
        "inspect of a lease of Duration::MAX must show it, expiring far ahead"
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

/// Renew by an owner whose lease was taken over is fenced and changes nothing: in
/// particular it does not extend the new owner's lease, which still ends on time (the
/// next claim takes it over), and it does not give the record back to the fenced owner.
pub async fn renew_of_a_fenced_owner_changes_nothing(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let stale = FencingToken::random();
    expect_acquired(
        claim(store, &id, b"stale", stale, SHORT).await,
        false,
        "claim",
    );
    let fresh = FencingToken::random();
    let (taken, _) = take_over(
        store,
        &id,
        (b"fresh", fresh, SHORT),
        b"stale",
        Instant::now() + DEADLINE,
        &format!("a lease of {SHORT:?} was still live after {DEADLINE:?}: expiry is broken"),
    )
    .await;
    store.renew(&id, stale, LONG).await.map_or_else(
        |e| expect_fenced_error(&e, "renew by an owner whose lease was taken over"),
        |()| panic!("renew by an owner whose lease was taken over must be fenced"),
    );
    expect_in_progress(
        claim(store, &id, b"x", FencingToken::random(), LONG).await,
        b"fresh",
        "the new owner's record after the fenced owner's renew",
    );
    // The new owner's lease of SHORT must end on time: the fenced renew did not move it.
    let next = FencingToken::random();
    let (_, takeover) = take_over(
        store,
        &id,
        (b"next", next, LONG),
        b"fresh",
        taken + SHORT + DEADLINE,
        &format!(
            "the new owner's lease of {SHORT:?} was still live {DEADLINE:?} after it should \
             have ended: the fenced owner's renew extended it"
        ),
    )
    .await;
    assert!(takeover, "taking over the new owner's expired lease");
    expect_all_fenced(
        store,
        &id,
        stale,
        "by the first fenced owner, after a second takeover",
    )
    .await;
    complete(store, &id, next, Bytes::from_static(b"third"), LONG).await;
}

/// [`STORM_RECORDS`] records, [`STORM_CLAIMS`] claims on each, all fired at once and
/// interleaved: exactly one claim wins each record, every other sees its own record's
/// winner in progress (never another record's); once the winners completed (at once,
/// concurrently), a second storm sees each record's own payload.
pub async fn claim_storm_over_many_records(store: &Arc<dyn Store>) {
    let ids: Vec<RecordId> = (0..STORM_RECORDS).map(|_| fresh_id()).collect();
    let storm = async |ids: &[RecordId]| {
        let gate = Arc::new(tokio::sync::Barrier::new(ids.len() * STORM_CLAIMS));
        let mut tasks = JoinSet::new();
        for i in 0..STORM_CLAIMS {
            for (r, id) in ids.iter().enumerate() {
                let (store, gate, id) = (Arc::clone(store), Arc::clone(&gate), *id);
                tasks.spawn(async move {
                    let (fp, token) = (storm_fingerprint(r, i), FencingToken::random());
                    gate.wait().await;
                    (r, i, token, claim(&store, &id, &fp, token, LONG).await)
                });
            }
        }
        let mut out = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            out.push(joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
        }
        out
    };
    let results = storm(&ids).await;
    let mut winners = vec![None; STORM_RECORDS];
    for (r, i, token, c) in &results {
        if matches!(c, Claim::Acquired { .. }) {
            assert!(
                winners[*r].replace((*i, *token)).is_none(),
                "two claims of a storm on {STORM_RECORDS} records won record {r}"
            );
        }
    }
    let winners: Vec<(usize, FencingToken)> = winners
        .into_iter()
        .enumerate()
        .map(|(r, w)| w.unwrap_or_else(|| panic!("no claim of the storm won record {r}")))
        .collect();
    for (r, i, _, c) in &results {
        if *i != winners[*r].0 {
            expect_in_progress(
                c.clone(),
                &storm_fingerprint(*r, winners[*r].0),
                "a losing claim of a storm (its own record's winner)",
            );
        }
    }
    let mut completions = JoinSet::new();
    for (r, (_, token)) in winners.iter().enumerate() {
        let (store, id, token) = (Arc::clone(store), ids[r], *token);
        completions.spawn(async move {
            complete(&store, &id, token, Bytes::from(format!("record {r}")), LONG).await;
        });
    }
    while let Some(joined) = completions.join_next().await {
        joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
    for (r, _, _, c) in storm(&ids).await {
        expect_completed(
            c,
            &storm_fingerprint(r, winners[r].0),
            &Bytes::from(format!("record {r}")),
            "a claim of a storm after the winners completed",
        );
    }
}

fn storm_fingerprint(record: usize, claimer: usize) -> Vec<u8> {
    format!("record {record} claimer {claimer}").into_bytes()
}

/// A duplicate claim that was rejected (it found the record in progress, with the
/// owner's fingerprint or another) gets nothing from it: its token's release, complete
/// and renew are fenced, the owner's claim stays live and is the owner's to complete.
/// (A store that let a losing claim write its token, as an upsert that always sets the
/// token does, would let the duplicate's cleanup delete the claim it does not own.)
pub async fn rejected_duplicate_never_frees_the_live_claim(store: &Arc<dyn Store>) {
    let id = fresh_id();
    let owner = FencingToken::random();
    expect_acquired(
        claim(store, &id, b"owner", owner, LONG).await,
        false,
        "claim",
    );
    for fp in [b"owner".as_slice(), b"other body"] {
        let duplicate = FencingToken::random();
        expect_in_progress(
            claim(store, &id, fp, duplicate, LONG).await,
            b"owner",
            "a duplicate claim",
        );
        store.release(&id, duplicate).await.map_or_else(
            |e| expect_fenced_error(&e, "release by a rejected duplicate"),
            |()| {
                panic!(
                    "release by a rejected duplicate must be fenced: it deleted the live claim \
                     it does not own"
                )
            },
        );
        expect_all_fenced(store, &id, duplicate, "by a rejected duplicate").await;
        match claim(store, &id, b"x", FencingToken::random(), LONG).await {
            Claim::InProgress {
                fingerprint,
                lease_remaining,
            } => {
                assert_eq!(
                    fingerprint,
                    b"owner".as_slice(),
                    "after a rejected duplicate's writes the owner's claim is still live"
                );
                assert!(lease_remaining > Duration::ZERO, "with its lease");
            }
            other => panic!(
                "after a rejected duplicate's writes the owner's claim must still be in \
                 progress, got {other:?}"
            ),
        }
    }
    let payload = Bytes::from_static(b"the owner's");
    complete(store, &id, owner, payload.clone(), LONG).await;
    expect_completed(
        claim(store, &id, b"owner", FencingToken::random(), LONG).await,
        b"owner",
        &payload,
        "the owner's completion after rejected duplicates",
    );
}

/// Cleanup addresses records by their hashed id ([`RecordId`] of scope and key), never
/// by the raw key: a request claimed through the [`Engine`](crate::Engine) is
/// found by [`Store::inspect`] and [`Store::list_in_progress`] under
/// `RecordId::new(scope, key)`, [`Engine::force_release`](crate::Engine::force_release)
/// of the same key in another scope (or of the raw key as a scope-less key's id) removes
/// nothing, and cleanup by the id the store lists removes the record (its owner is then
/// fenced, and the key executes anew).
pub async fn cleanup_addresses_records_by_hashed_id(store: &Arc<dyn Store>) {
    use crate::IdempotencyKey;
    use crate::fingerprint::Fingerprint;
    use crate::{Claimed, Engine};

    let engine = Engine::new(Arc::clone(store));
    let raw = uuid::Uuid::new_v4().to_string();
    let key = IdempotencyKey::new(raw.clone())
        .unwrap_or_else(|e| panic!("a UUID is a valid idempotency key: {e}"));
    let (scope, fp) = (
        "idemkey-conformance-cleanup",
        Fingerprint::of_bytes(b"body"),
    );
    let Ok(Claimed::Execute(running)) = engine.claim(scope, &key, &fp).await else {
        panic!("the engine's first claim of a fresh key must execute");
    };
    let hashed = RecordId::new(scope, &raw);
    assert!(
        inspect(store, &hashed).await.is_some(),
        "the record of a key must be at RecordId::new(scope, key)"
    );
    let listed = list(store, LIST_ALL).await;
    assert!(
        listed.iter().any(|r| r.id == hashed),
        "list_in_progress must list the record under its hashed id"
    );
    for (other_scope, what) in [
        ("idemkey-conformance-elsewhere", "another scope"),
        ("", "no scope"),
    ] {
        let removed = engine
            .force_release(other_scope, &raw)
            .await
            .unwrap_or_else(|e| panic!("force_release failed: {e}"));
        assert!(
            !removed,
            "force_release of the key in {what} must remove nothing: records are addressed \
             by the hash of scope and key"
        );
    }
    assert!(
        inspect(store, &hashed).await.is_some(),
        "cleanup elsewhere left the record"
    );
    assert!(
        force_release(store, &hashed).await,
        "cleanup by the hashed id the store lists must remove the record"
    );
    assert_eq!(
        inspect(store, &hashed).await,
        None,
        "a record removed by its hashed id is gone"
    );
    running
        .complete(Bytes::from_static(b"late"))
        .await
        .map_or_else(
            |e| expect_fenced_error(&e, "complete by the owner of a cleaned-up record"),
            |()| panic!("complete by the owner of a cleaned-up record must be fenced"),
        );
    let Ok(Claimed::Execute(again)) = engine.claim(scope, &key, &fp).await else {
        panic!("the key of a cleaned-up record must execute anew");
    };
    again
        .complete(Bytes::from_static(b"ok"))
        .await
        .unwrap_or_else(|e| panic!("the new owner's complete must succeed: {e}"));
}

/// Sweeps racing completions: [`RACING_COMPLETIONS`] abandoned claims (lease expired,
/// kept for their retention: what a sweep looks at) are completed one after the other
/// while another task sweeps without pause. Every completion that returned `Ok` is
/// settled for good: a claim right after it, and claims after the sweeps stopped, get
/// the completed record, never "in progress" and never a fresh claim.
pub async fn sweep_racing_completions_keeps_them_settled(store: &Arc<dyn Store>) {
    let records: Vec<(RecordId, FencingToken)> = (0..RACING_COMPLETIONS)
        .map(|_| (fresh_id(), FencingToken::random()))
        .collect();
    for (id, owner) in &records {
        expect_acquired(
            claim(store, id, b"racing", *owner, SHORT).await,
            false,
            "claim",
        );
    }
    let claimed = Instant::now();
    tokio::time::sleep_until(claimed + SHORT + POLL).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (store, stop) = (Arc::clone(store), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut sweeps = 0_u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                store
                    .sweep()
                    .await
                    .unwrap_or_else(|e| panic!("sweep must succeed: {e}"));
                sweeps += 1;
                tokio::task::yield_now().await;
            }
            sweeps
        })
    };
    let expect_settled = async |id: &RecordId, r: usize, when: &str| match claim(
        store,
        id,
        b"retry",
        FencingToken::random(),
        LONG,
    )
    .await
    {
        Claim::Completed { payload, .. } => {
            assert_eq!(
                payload,
                Bytes::from(format!("done {r}")),
                "the stored payload"
            );
        }
        Claim::InProgress { .. } => panic!(
            "a completed record answered \"in progress\" {when}: a sweep racing the \
                 completion undid it"
        ),
        Claim::Acquired { .. } => panic!(
            "a completed record was claimed anew {when}: a sweep racing the completion \
                 removed it"
        ),
    };
    for (r, (id, owner)) in records.iter().enumerate() {
        complete(store, id, *owner, Bytes::from(format!("done {r}")), LONG).await;
        expect_settled(id, r, "right after its completion, while sweeps ran").await;
        // Spread the completions over the sweeps (a sweep reads, then writes).
        sleep(POLL / 5).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sweeps = sweeper
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    assert!(sweeps > 0, "the sweeper ran");
    store
        .sweep()
        .await
        .unwrap_or_else(|e| panic!("sweep must succeed: {e}"));
    for (r, (id, _)) in records.iter().enumerate() {
        expect_settled(id, r, "after the sweeps").await;
    }
}

/// Claims `id` (fingerprint, token, lease) every [`POLL`] until the claim takes over
/// the lease of the owner with fingerprint `holder`; panics with `stuck` once
/// `deadline` has passed. Returns when it took over, and its takeover flag.
/// A store whose claims and completions go through its in-process path
/// ([`Store::in_process`]), as the engine's do, and everything else through the store.
struct InProcessPath(Arc<dyn Store>);

impl InProcessPath {
    fn now(&self) -> &dyn InProcessStore {
        self.0
            .in_process()
            .expect("a store that answered in process once answers in process")
    }
}

#[async_trait::async_trait]
impl Store for InProcessPath {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.now().claim_now(&req)
    }
    fn in_process(&self) -> Option<&dyn InProcessStore> {
        self.0.in_process()
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.now().complete_now(id, token, payload, retention)
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.0.renew(id, token, lease).await
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.0.release(id, token).await
    }
    async fn sweep(&self) -> Result<u64, StoreError> {
        self.0.sweep().await
    }
    async fn sweep_pass(&self, options: &SweepOptions) -> Result<SweepReport, StoreError> {
        self.0.sweep_pass(options).await
    }
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        self.0.inspect(id).await
    }
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        self.0.force_release(id).await
    }
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        self.0.list_in_progress(limit).await
    }
    async fn watch(&self, id: &RecordId) -> Result<Box<dyn Watch>, StoreError> {
        self.0.watch(id).await
    }
}

async fn take_over(
    store: &Arc<dyn Store>,
    id: &RecordId,
    (fp, token, lease): (&[u8], FencingToken, Duration),
    holder: &[u8],
    deadline: Instant,
    stuck: &str,
) -> (Instant, bool) {
    loop {
        let before = Instant::now();
        match claim(store, id, fp, token, lease).await {
            Claim::Acquired { takeover } => return (Instant::now(), takeover),
            Claim::InProgress { fingerprint, .. } => {
                assert_eq!(fingerprint, holder, "in progress by the owner");
                assert!(before < deadline, "{stuck}");
            }
            other => panic!("an in-progress record cannot be {other:?}"),
        }
        sleep(POLL).await;
    }
}

/// A record id no other check (or run) uses.
fn fresh_id() -> RecordId {
    RecordId::new("idemkey-conformance", &uuid::Uuid::new_v4().to_string())
}

/// A claim whose record, if abandoned, is kept for [`LONG`] past its lease.
async fn claim(
    store: &Arc<dyn Store>,
    id: &RecordId,
    fingerprint: &[u8],
    token: FencingToken,
    lease: Duration,
) -> Claim {
    claim_kept(store, id, fingerprint, token, lease, LONG).await
}

async fn claim_kept(
    store: &Arc<dyn Store>,
    id: &RecordId,
    fingerprint: &[u8],
    token: FencingToken,
    lease: Duration,
    retention: Duration,
) -> Claim {
    store
        .claim(ClaimRequest {
            id,
            fingerprint,
            token,
            lease,
            retention,
        })
        .await
        .unwrap_or_else(|e| panic!("claim failed: {e}"))
}

async fn inspect(store: &Arc<dyn Store>, id: &RecordId) -> Option<RecordInfo> {
    store
        .inspect(id)
        .await
        .unwrap_or_else(|e| panic!("inspect failed: {e}"))
}

async fn force_release(store: &Arc<dyn Store>, id: &RecordId) -> bool {
    store
        .force_release(id)
        .await
        .unwrap_or_else(|e| panic!("force_release failed: {e}"))
}

async fn list(store: &Arc<dyn Store>, limit: usize) -> Vec<RecordInfo> {
    let listed = store
        .list_in_progress(limit)
        .await
        .unwrap_or_else(|e| panic!("list_in_progress failed: {e}"));
    assert!(
        listed.len() <= limit,
        "list_in_progress({limit}) returned {} records",
        listed.len()
    );
    listed
}

fn expect_sorted(listed: &[RecordInfo], what: &str) {
    assert!(
        listed.windows(2).all(|w| w[0].created <= w[1].created),
        "{what} must list the oldest claim first"
    );
}

/// `info.expires` is `d` after `info.created`, within [`TOLERANCE`].
fn expect_about(info: &RecordInfo, d: Duration, what: &str) {
    let got = info
        .expires
        .duration_since(info.created)
        .unwrap_or_default();
    assert!(
        got + TOLERANCE >= d && got <= d + TOLERANCE,
        "{what}: expires must be {d:?} after created, got {got:?}"
    );
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

/// Fires `n` claims at `id` at once, each from its own task with its own token, claimer
/// `i` through `stores[i % stores.len()]`; returns (claimer, token, result) for each.
async fn race(
    stores: &[Arc<dyn Store>],
    id: RecordId,
    n: usize,
    lease: Duration,
) -> Vec<(usize, FencingToken, Claim)> {
    assert!(
        !stores.is_empty(),
        "a race needs at least one store instance to claim through"
    );
    let gate = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = JoinSet::new();
    for (i, store) in (0..n).zip(stores.iter().cycle()) {
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

/// Acquired, with or without a takeover (a store that has removed the record cannot
/// tell).
fn expect_executes(got: Claim, what: &str) {
    assert!(
        matches!(got, Claim::Acquired { .. }),
        "{what} must be Acquired, got {got:?}"
    );
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
