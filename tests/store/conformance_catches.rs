//! The conformance suite fails stores that break the contract: each test wraps the
//! memory store with one defect and expects the check for it to panic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idemkey::store::{
    Claim, ClaimRequest, FencingToken, InProcessStore, MemoryStore, RecordId, RecordInfo,
    RecordState, Store, StoreError,
};
use idemkey::testing::conformance;
use tokio::time::Instant;

/// Which defect a [`Broken`] store has.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Defect {
    /// None: the wrapper itself passes the checks.
    None,
    /// Reports success for writes that were fenced (and so wrote nothing).
    SilentFencing,
    /// Lets the second claim on a record win too, as a read-then-write store would.
    DoubleWin,
    /// Never reports a takeover.
    NoTakeoverFlag,
    /// Fences an owner as soon as its lease ends, although nobody took the record over
    /// (contract v1): the only outcome there is would be lost.
    FencesAtLeaseEnd,
    /// Removes an abandoned claim at the end of its lease, ignoring its retention.
    DropsAbandoned,
    /// Keeps an abandoned claim forever, ignoring its retention.
    KeepsAbandoned,
    /// Reports an in-progress record's `expires` as lease + retention (when it will be
    /// removed) instead of the end of its lease.
    ExpiresAtRemoval,
    /// Force-releases by ending the lease at once: the owner may still complete.
    ForceReleaseEndsLease,
    /// Lists the newest claim first.
    ListsNewestFirst,
    /// Lists only records whose lease is live: stuck keys stay hidden.
    ListsLiveOnly,
    /// Ignores `limit`.
    ListsUnlimited,
    /// Refuses a fenced owner's renew but extends the new owner's lease with it.
    FencedRenewExtends,
    /// Gives a record to the token of a claim that lost to a live lease (an upsert that
    /// always writes the token), so the loser's release deletes the owner's claim.
    LoserTakesToken,
    /// Cleans up by an address other than the record's hashed id.
    ForceReleaseByOtherAddress,
    /// Sweeps from a snapshot of expired claims taken before a pause, writing the
    /// snapshot back over records completed meanwhile.
    SweepRestoresSnapshot,
    /// Keeps completed records forever, ignoring their retention.
    IgnoresRetention,
    /// Stores at most 1 MiB of a payload.
    TruncatesLargePayloads,
}

/// What the wrapper remembers of a record's last winning claim.
#[derive(Clone)]
struct Owner {
    token: FencingToken,
    retention: Duration,
    lease_end: Instant,
}

struct Broken {
    inner: MemoryStore,
    defect: Defect,
    claims: AtomicUsize,
    owners: Mutex<HashMap<RecordId, Owner>>,
}

#[async_trait::async_trait]
impl Store for Broken {
    async fn claim(&self, mut req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let n = self.claims.fetch_add(1, Ordering::SeqCst);
        let owner = Owner {
            token: req.token,
            retention: req.retention,
            lease_end: Instant::now()
                .checked_add(req.lease)
                .unwrap_or_else(Instant::now),
        };
        let id = *req.id;
        let (token, retention) = (req.token, req.retention);
        match self.defect {
            Defect::DropsAbandoned => req.retention = Duration::ZERO,
            Defect::KeepsAbandoned => req.retention = Duration::MAX,
            _ => {}
        }
        let claim = self.inner.claim(req).await?;
        if matches!(claim, Claim::Acquired { .. }) {
            self.owners().insert(id, owner);
        }
        if let (Defect::LoserTakesToken, Claim::InProgress { fingerprint, .. }) =
            (self.defect, &claim)
        {
            self.inner.force_release(&id).await?;
            let taken = self
                .inner
                .claim(ClaimRequest {
                    id: &id,
                    fingerprint,
                    token,
                    lease: Duration::from_secs(120),
                    retention,
                })
                .await?;
            assert!(matches!(taken, Claim::Acquired { .. }), "{taken:?}");
        }
        Ok(match (self.defect, claim) {
            (Defect::DoubleWin, Claim::InProgress { .. }) if n % 100 == 1 => {
                Claim::Acquired { takeover: false }
            }
            (Defect::NoTakeoverFlag, Claim::Acquired { .. }) => Claim::Acquired { takeover: false },
            (_, c) => c,
        })
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.lease_check(id, token)?;
        let (payload, retention) = match self.defect {
            Defect::IgnoresRetention => (payload, Duration::MAX),
            Defect::TruncatesLargePayloads => {
                (payload.slice(..payload.len().min(1 << 20)), retention)
            }
            _ => (payload, retention),
        };
        let r = self.inner.complete(id, token, payload, retention).await;
        self.silence(r)
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.lease_check(id, token)?;
        if let (Defect::FencedRenewExtends, Some(holder)) = (self.defect, self.owner(id))
            && holder.token != token
        {
            let _ = self.inner.renew(id, holder.token, lease).await;
            return Err(StoreError::fenced());
        }
        let r = self.inner.renew(id, token, lease).await;
        if r.is_ok()
            && let Some(o) = self.owners().get_mut(id)
        {
            o.lease_end = Instant::now().checked_add(lease).unwrap_or(o.lease_end);
        }
        self.silence(r)
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.lease_check(id, token)?;
        let r = self.inner.release(id, token).await;
        self.silence(r)
    }
    async fn sweep(&self) -> Result<u64, StoreError> {
        if self.defect == Defect::SweepRestoresSnapshot {
            let now = std::time::SystemTime::now();
            let expired: Vec<RecordInfo> = self
                .inner
                .list_in_progress(usize::MAX)
                .await?
                .into_iter()
                .filter(|r| r.expires <= now)
                .collect();
            tokio::time::sleep(Duration::from_millis(2)).await;
            for snapshot in expired {
                let now = self.inner.inspect(&snapshot.id).await?;
                if now.is_some_and(|r| r.state == RecordState::Completed) {
                    self.inner.force_release(&snapshot.id).await?;
                    let lease = Duration::from_secs(120);
                    self.inner
                        .claim(ClaimRequest {
                            id: &snapshot.id,
                            fingerprint: &snapshot.fingerprint,
                            token: FencingToken::random(),
                            lease,
                            retention: lease,
                        })
                        .await?;
                }
            }
        }
        self.inner.sweep().await
    }
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        let mut info = self.inner.inspect(id).await?;
        if let (Defect::ExpiresAtRemoval, Some(i)) = (self.defect, info.as_mut())
            && i.state == RecordState::InProgress
        {
            i.expires += self.owner(id).map_or(Duration::ZERO, |o| o.retention);
        }
        Ok(info)
    }
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        if self.defect == Defect::ForceReleaseByOtherAddress {
            return self
                .inner
                .force_release(&RecordId::new("", &id.to_hex()))
                .await;
        }
        if self.defect == Defect::ForceReleaseEndsLease
            && let Some(o) = self.owner(id)
            && self.inner.renew(id, o.token, Duration::ZERO).await.is_ok()
        {
            return Ok(true);
        }
        self.inner.force_release(id).await
    }
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        let all = self.inner.list_in_progress(usize::MAX).await?;
        let now = std::time::SystemTime::now();
        Ok(match self.defect {
            Defect::ListsNewestFirst => all.into_iter().rev().take(limit).collect(),
            Defect::ListsLiveOnly => all
                .into_iter()
                .filter(|r| r.expires > now)
                .take(limit)
                .collect(),
            Defect::ListsUnlimited => all,
            _ => all.into_iter().take(limit).collect(),
        })
    }
}

impl Broken {
    fn store(defect: Defect) -> Arc<dyn Store> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            defect,
            claims: AtomicUsize::new(0),
            owners: Mutex::default(),
        })
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Owner>> {
        self.owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn owner(&self, id: &RecordId) -> Option<Owner> {
        self.owners().get(id).cloned()
    }

    /// [`Defect::FencesAtLeaseEnd`]: the last owner's writes fail once its lease ended.
    fn lease_check(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let expired = self
            .owner(id)
            .is_some_and(|o| o.token == token && Instant::now() >= o.lease_end);
        if self.defect == Defect::FencesAtLeaseEnd && expired {
            return Err(StoreError::fenced());
        }
        Ok(())
    }

    fn silence(&self, r: Result<(), StoreError>) -> Result<(), StoreError> {
        match (self.defect, r) {
            (Defect::SilentFencing, Err(e)) if e.is_fenced() => Ok(()),
            (_, r) => r,
        }
    }
}

#[tokio::test]
#[should_panic(expected = "must be fenced")]
async fn catches_writes_that_ignore_fencing() {
    conformance::writes_are_fenced_by_token(&Broken::store(Defect::SilentFencing)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "concurrent claims must win")]
async fn catches_a_claim_that_is_not_atomic() {
    conformance::claim_is_atomic(&Broken::store(Defect::DoubleWin)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "concurrent claims must win")]
async fn catches_a_claim_atomic_only_within_one_instance() {
    // Four memory stores are four maps: each one's claim is atomic, the four together
    // are not, as four clients of a store that locks in the client would not be.
    crate::support::claims_over_four_instances(1, async || idemkey::store::MemoryStore::new())
        .await;
}

#[tokio::test]
#[should_panic(expected = "takeover")]
async fn catches_a_missing_takeover_flag() {
    conformance::takeover_after_lease_expiry(&Broken::store(Defect::NoTakeoverFlag)).await;
}

#[tokio::test]
#[should_panic(expected = "nobody took over must still complete")]
async fn catches_an_expired_owner_fenced_although_nobody_took_over() {
    conformance::expired_owner_can_still_complete(&Broken::store(Defect::FencesAtLeaseEnd)).await;
}

#[tokio::test]
#[should_panic(expected = "must be kept past its lease for the claim's retention")]
async fn catches_an_abandoned_claim_dropped_at_its_lease_end() {
    conformance::abandoned_claim_is_kept_for_its_retention(&Broken::store(Defect::DropsAbandoned))
        .await;
}

#[tokio::test]
#[should_panic(expected = "must be removed once lease + retention have passed")]
async fn catches_an_abandoned_claim_kept_forever() {
    conformance::abandoned_claim_is_kept_for_its_retention(&Broken::store(Defect::KeepsAbandoned))
        .await;
}

#[tokio::test]
#[should_panic(expected = "expires is the end of its lease")]
async fn catches_inspect_reporting_the_removal_time_as_the_lease_end() {
    conformance::inspect_shows_the_record(&Broken::store(Defect::ExpiresAtRemoval)).await;
}

#[tokio::test]
#[should_panic(expected = "a force-released record is gone")]
async fn catches_a_force_release_that_only_ends_the_lease() {
    conformance::force_release_removes_any_record(&Broken::store(Defect::ForceReleaseEndsLease))
        .await;
}

#[tokio::test]
#[should_panic(expected = "oldest claim first")]
async fn catches_a_list_newest_first() {
    conformance::list_in_progress_is_oldest_first(&Broken::store(Defect::ListsNewestFirst)).await;
}

#[tokio::test]
#[should_panic(expected = "must list an in-progress record whose lease expired")]
async fn catches_a_list_that_hides_stuck_keys() {
    conformance::list_in_progress_is_oldest_first(&Broken::store(Defect::ListsLiveOnly)).await;
}

#[tokio::test]
#[should_panic(expected = "list_in_progress(1) returned 3 records")]
async fn catches_a_list_that_ignores_its_limit() {
    conformance::list_in_progress_is_oldest_first(&Broken::store(Defect::ListsUnlimited)).await;
}

#[tokio::test]
#[should_panic(expected = "the fenced owner's renew extended it")]
async fn catches_a_fenced_renew_that_extends_the_new_owners_lease() {
    conformance::renew_of_a_fenced_owner_changes_nothing(&Broken::store(
        Defect::FencedRenewExtends,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "two claims of a storm")]
async fn catches_a_claim_storm_with_two_winners() {
    conformance::claim_storm_over_many_records(&Broken::store(Defect::DoubleWin)).await;
}

#[tokio::test]
#[should_panic(expected = "it deleted the live claim it does not own")]
async fn catches_a_rejected_duplicate_that_frees_the_live_claim() {
    conformance::rejected_duplicate_never_frees_the_live_claim(&Broken::store(
        Defect::LoserTakesToken,
    ))
    .await;
}

#[tokio::test]
#[should_panic(expected = "cleanup by the hashed id the store lists must remove the record")]
async fn catches_cleanup_by_another_address() {
    conformance::cleanup_addresses_records_by_hashed_id(&Broken::store(
        Defect::ForceReleaseByOtherAddress,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "a sweep racing the completion undid it")]
async fn catches_a_sweep_that_undoes_a_racing_completion() {
    conformance::sweep_racing_completions_keeps_them_settled(&Broken::store(
        Defect::SweepRestoresSnapshot,
    ))
    .await;
}

#[tokio::test]
#[should_panic(expected = "had not ended after")]
async fn catches_a_retention_that_never_ends() {
    conformance::retention_expiry(&Broken::store(Defect::IgnoresRetention)).await;
}

#[tokio::test]
#[should_panic(expected = "came back as")]
async fn catches_a_truncated_large_payload() {
    conformance::large_payload_round_trips(&Broken::store(Defect::TruncatesLargePayloads)).await;
}

/// The wrapper without a defect passes every check the defects above fail, so each
/// catch is the defect's doing.
#[tokio::test]
async fn passes_the_unbroken_store() {
    let store = Broken::store(Defect::None);
    conformance::renew_of_a_fenced_owner_changes_nothing(&store).await;
    conformance::rejected_duplicate_never_frees_the_live_claim(&store).await;
    conformance::cleanup_addresses_records_by_hashed_id(&store).await;
    conformance::retention_expiry(&store).await;
    conformance::large_payload_round_trips(&store).await;
    conformance::writes_are_fenced_by_token(&store).await;
    conformance::takeover_after_lease_expiry(&store).await;
    conformance::expired_owner_can_still_complete(&store).await;
    conformance::abandoned_claim_is_kept_for_its_retention(&store).await;
    conformance::inspect_shows_the_record(&store).await;
    conformance::force_release_removes_any_record(&store).await;
    conformance::list_in_progress_is_oldest_first(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_unbroken_store_under_concurrency() {
    let store = Broken::store(Defect::None);
    conformance::claim_is_atomic(&store).await;
    conformance::claim_storm_over_many_records(&store).await;
    conformance::sweep_racing_completions_keeps_them_settled(&store).await;
}

/// A memory store reached through [`Store::in_process`] as well as through its `async`
/// methods, counting the calls of each path; with `double_win`, its in-process claim lets
/// a claim on a live record win (its `async` claim stays right).
struct TwoPaths {
    inner: MemoryStore,
    double_win: bool,
    async_calls: AtomicUsize,
    in_process_calls: AtomicUsize,
}

impl TwoPaths {
    fn new(double_win: bool) -> Self {
        Self {
            inner: MemoryStore::new(),
            double_win,
            async_calls: AtomicUsize::new(0),
            in_process_calls: AtomicUsize::new(0),
        }
    }

    fn now(&self) -> &dyn InProcessStore {
        self.inner
            .in_process()
            .expect("the memory store answers in process")
    }
}

impl InProcessStore for TwoPaths {
    fn claim_now(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.in_process_calls.fetch_add(1, Ordering::SeqCst);
        Ok(match self.now().claim_now(req)? {
            Claim::InProgress { .. } if self.double_win => Claim::Acquired { takeover: false },
            claim => claim,
        })
    }
    fn complete_now(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.in_process_calls.fetch_add(1, Ordering::SeqCst);
        self.now().complete_now(id, token, payload, retention)
    }
}

#[async_trait::async_trait]
impl Store for TwoPaths {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.async_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(req).await
    }
    fn in_process(&self) -> Option<&dyn InProcessStore> {
        Some(self)
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: FencingToken,
        payload: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.async_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.complete(id, token, payload, retention).await
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.renew(id, token, lease).await
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        self.inner.release(id, token).await
    }
    async fn sweep(&self) -> Result<u64, StoreError> {
        self.inner.sweep().await
    }
    async fn inspect(&self, id: &RecordId) -> Result<Option<RecordInfo>, StoreError> {
        self.inner.inspect(id).await
    }
    async fn force_release(&self, id: &RecordId) -> Result<bool, StoreError> {
        self.inner.force_release(id).await
    }
    async fn list_in_progress(&self, limit: usize) -> Result<Vec<RecordInfo>, StoreError> {
        self.inner.list_in_progress(limit).await
    }
}

/// A store whose `async` methods keep the contract but whose in-process path does not
/// is caught: `run` checks both paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "a claim on an in-progress record must be InProgress")]
async fn catches_a_broken_in_process_path() {
    conformance::run(|| async { TwoPaths::new(true) }).await;
}

/// The engine claims and completes through the store's in-process path, and a replay
/// claims through it too: no `async` call of the store on the request path.
#[tokio::test]
async fn the_engine_takes_the_in_process_path() {
    use idemkey::IdempotencyKey;
    use idemkey::fingerprint::Fingerprint;
    use idemkey::server::{Claimed, Engine};

    let store = Arc::new(TwoPaths::new(false));
    let engine = Engine::new(Arc::clone(&store));
    let (key, fp) = (
        IdempotencyKey::new("order-1").expect("a valid key"),
        Fingerprint::of_bytes(b"charge 1"),
    );
    let Claimed::Execute(exec) = engine.claim("", &key, &fp).await.expect("claims") else {
        panic!("a new key runs");
    };
    exec.complete("charged".into()).await.expect("completes");
    let replay = engine.claim("", &key, &fp).await.expect("claims");
    assert!(matches!(replay, Claimed::Replay(p) if p == "charged"));
    assert_eq!(store.in_process_calls.load(Ordering::SeqCst), 3);
    assert_eq!(store.async_calls.load(Ordering::SeqCst), 0);
}
