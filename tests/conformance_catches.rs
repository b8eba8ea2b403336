//! The conformance suite fails stores that break the contract: each test wraps the
//! memory store with one defect and expects the check for it to panic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idemkey::store::{Claim, ClaimRequest, FencingToken, MemoryStore, RecordId, Store, StoreError};
use idemkey::testing::conformance;

/// Which defect a [`Broken`] store has.
#[derive(Clone, Copy)]
enum Defect {
    /// Reports success for writes that were fenced (and so wrote nothing).
    SilentFencing,
    /// Lets the second claim on a record win too, as a read-then-write store would.
    DoubleWin,
    /// Never reports a takeover.
    NoTakeoverFlag,
    /// Checks the token but not the lease: an owner whose lease ended can still write
    /// while nobody else claimed the record.
    TokenOnly,
}

struct Broken {
    inner: MemoryStore,
    defect: Defect,
    claims: AtomicUsize,
    /// The last winning token and fingerprint per record ([`Defect::TokenOnly`]).
    owners: Mutex<HashMap<RecordId, (FencingToken, Vec<u8>)>>,
}

#[async_trait::async_trait]
impl Store for Broken {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let n = self.claims.fetch_add(1, Ordering::SeqCst);
        let (id, token, fingerprint) = (*req.id, req.token, req.fingerprint.to_vec());
        let claim = self.inner.claim(req).await?;
        if matches!(claim, Claim::Acquired { .. }) {
            self.owners_mut().insert(id, (token, fingerprint));
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
        if matches!(self.defect, Defect::TokenOnly) {
            self.revive(id, token).await;
        }
        let r = self.inner.complete(id, token, payload, retention).await;
        self.silence(r)
    }
    async fn renew(
        &self,
        id: &RecordId,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let r = self.inner.renew(id, token, lease).await;
        self.silence(r)
    }
    async fn release(&self, id: &RecordId, token: FencingToken) -> Result<(), StoreError> {
        let r = self.inner.release(id, token).await;
        self.silence(r)
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

    fn owners_mut(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, (FencingToken, Vec<u8>)>> {
        self.owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What a token-only store does for the last owner: writes even though its lease
    /// ended (modelled by claiming the expired record again with the owner's token).
    async fn revive(&self, id: &RecordId, token: FencingToken) {
        let owner = self.owners_mut().get(id).cloned();
        if let Some((held, fingerprint)) = owner.filter(|(t, _)| *t == token) {
            let again = ClaimRequest {
                id,
                fingerprint: &fingerprint,
                token: held,
                lease: Duration::from_secs(60),
            };
            let _ = self.inner.claim(again).await;
        }
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

#[tokio::test]
#[should_panic(expected = "takeover")]
async fn catches_a_missing_takeover_flag() {
    conformance::takeover_after_lease_expiry(&Broken::store(Defect::NoTakeoverFlag)).await;
}

#[tokio::test]
#[should_panic(expected = "by an owner whose lease ended must be fenced")]
async fn catches_writes_that_ignore_the_lease() {
    conformance::expired_owner_is_fenced(&Broken::store(Defect::TokenOnly)).await;
}

#[tokio::test]
async fn passes_the_unbroken_store() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    conformance::writes_are_fenced_by_token(&store).await;
    conformance::expired_owner_is_fenced(&store).await;
}
