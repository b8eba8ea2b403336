//! The framework-free engine: claim, run, complete or release.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use super::Rejection;
use crate::IdempotencyKey;
use crate::fingerprint::Fingerprint;
use crate::store::{Claim, ClaimRequest, FencingToken, RecordId, Store, StoreError};

/// Default lease of a claim: how long a crashed owner blocks its key.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);
/// Default retention of a completed record (API calls).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Default cap of the `Retry-After` of a `409 in-progress`.
pub const DEFAULT_IN_PROGRESS_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Default `Retry-After` of a `503 store-unavailable`.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(2);

/// The verifier's core, independent of any HTTP framework: it claims a key, lets the
/// caller run the operation while it renews the lease, then completes or releases it.
///
/// Cheap to clone (shared configuration). The [tower layer](super::IdempotencyLayer)
/// and the [function-level API](Engine::once) are built on it; use it directly for
/// other transports (gRPC, message queues, a framework without tower).
///
/// ```
/// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
/// use idemkey::server::{Begin, Engine};
/// use idemkey::store::MemoryStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = Engine::new(MemoryStore::new());
/// let key = IdempotencyKey::new("order-42")?;
/// let fp = Fingerprint::of_bytes(b"ship order 42");
///
/// match engine.begin("tenant-a", &key, &fp).await? {
///     Begin::Execute(mut exec) => {
///         let result = exec.run(async { "shipped" }).await; // lease renewed meanwhile
///         exec.complete(result.into()).await?;
///     }
///     Begin::Replay(payload) => println!("already done: {payload:?}"),
///     Begin::Unguarded => unreachable!("only with fail_open"),
/// }
/// assert!(matches!(engine.begin("tenant-a", &key, &fp).await?, Begin::Replay(p) if p == "shipped"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Engine {
    cfg: Arc<Config>,
}

struct Config {
    store: Arc<dyn Store>,
    lease: Duration,
    renew_every: Duration,
    retention: Duration,
    fail_open: bool,
    key_reused_status: StatusCode,
    unavailable_retry_after: Duration,
    in_progress_retry_after: Duration,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("lease", &self.cfg.lease)
            .field("renew_every", &self.cfg.renew_every)
            .field("retention", &self.cfg.retention)
            .field("fail_open", &self.cfg.fail_open)
            .field("key_reused_status", &self.cfg.key_reused_status)
            .finish_non_exhaustive()
    }
}

/// What [`Engine::begin`] decided.
#[derive(Debug)]
pub enum Begin {
    /// This caller owns the key: run the operation (through [`Execution::run`], so the
    /// lease is renewed), then [`Execution::complete`] or [`Execution::release`].
    Execute(Execution),
    /// The key is completed with this fingerprint: the payload given to
    /// [`Execution::complete`] by the request that ran.
    Replay(Bytes),
    /// The store failed and the engine is configured to fail open: run the operation
    /// without protection (nothing is recorded).
    Unguarded,
}

/// Configures an [`Engine`]; start with [`Engine::builder`].
#[must_use]
pub struct EngineBuilder {
    store: Arc<dyn Store>,
    lease: Duration,
    renew_every: Option<Duration>,
    retention: Duration,
    fail_open: bool,
    key_reused_status: StatusCode,
    unavailable_retry_after: Duration,
    in_progress_retry_after: Duration,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// How long a claim holds its key unless renewed (default 5 s). A crashed owner
    /// blocks its key for at most this long; then the next request takes it over.
    /// Values under 1 ms are raised to 1 ms.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// How often a running operation renews its lease (default a third of the lease).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// How long a completed record is kept and replayed (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// When the store fails, run the operation unprotected instead of answering
    /// `503 store-unavailable` (default: fail closed). Choose it only where a duplicate
    /// execution is cheaper than an outage.
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// Stripe-compatible mode: a key reused with a different request gets `400`
    /// instead of `422`.
    pub fn stripe_compatible(mut self) -> Self {
        self.key_reused_status = StatusCode::BAD_REQUEST;
        self
    }

    /// The status of `key-reused` answers (default `422`).
    pub fn key_reused_status(mut self, status: StatusCode) -> Self {
        self.key_reused_status = status;
        self
    }

    /// The longest `Retry-After` of `409 in-progress` answers (default 1 s).
    ///
    /// A `409` advises the remaining lease of the running request, capped by this: the
    /// owner renews its lease while it runs, so the remaining lease stays close to the
    /// full lease and says little about when the answer will be ready. Set
    /// `Duration::MAX` to advise the remaining lease as it is.
    pub fn in_progress_retry_after(mut self, max: Duration) -> Self {
        self.in_progress_retry_after = max;
        self
    }

    /// The `Retry-After` of `503 store-unavailable` answers (default 2 s).
    pub fn unavailable_retry_after(mut self, after: Duration) -> Self {
        self.unavailable_retry_after = after;
        self
    }

    /// The engine.
    #[must_use]
    pub fn build(self) -> Engine {
        let renew_every = self
            .renew_every
            .unwrap_or(self.lease / 3)
            .clamp(Duration::from_millis(1), self.lease);
        Engine {
            cfg: Arc::new(Config {
                store: self.store,
                lease: self.lease,
                renew_every,
                retention: self.retention,
                fail_open: self.fail_open,
                key_reused_status: self.key_reused_status,
                unavailable_retry_after: self.unavailable_retry_after,
                in_progress_retry_after: self.in_progress_retry_after,
            }),
        }
    }
}

impl Engine {
    /// An engine over `store` with the defaults: lease 5 s renewed every 1.7 s,
    /// retention 24 h, fail closed, `422` on a reused key.
    #[must_use]
    pub fn new(store: impl Store) -> Self {
        Self::builder(store).build()
    }

    /// Configure an engine over `store`.
    ///
    /// ```
    /// use idemkey::server::Engine;
    /// use idemkey::store::MemoryStore;
    /// use std::time::Duration;
    /// let engine = Engine::builder(MemoryStore::new())
    ///     .lease(Duration::from_secs(5))
    ///     .retention(Duration::from_secs(7 * 24 * 3600))
    ///     .stripe_compatible()
    ///     .build();
    /// assert_eq!(engine.lease(), Duration::from_secs(5));
    /// ```
    pub fn builder(store: impl Store) -> EngineBuilder {
        Self::builder_shared(Arc::new(store))
    }

    /// [`Engine::builder`] over a store that is already shared.
    pub(crate) fn builder_shared(store: Arc<dyn Store>) -> EngineBuilder {
        EngineBuilder {
            store,
            lease: DEFAULT_LEASE,
            renew_every: None,
            retention: DEFAULT_RETENTION,
            fail_open: false,
            key_reused_status: StatusCode::UNPROCESSABLE_ENTITY,
            unavailable_retry_after: DEFAULT_UNAVAILABLE_RETRY_AFTER,
            in_progress_retry_after: DEFAULT_IN_PROGRESS_RETRY_AFTER,
        }
    }

    /// The store records are kept in.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.cfg.store
    }

    /// The lease of a claim.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.cfg.lease
    }

    /// The default retention of completed records.
    #[must_use]
    pub fn retention(&self) -> Duration {
        self.cfg.retention
    }

    /// Claims `key` within `scope` for a request with `fingerprint`.
    ///
    /// # Errors
    /// A [`Rejection`]: `key-reused` when the key is held or completed with another
    /// fingerprint, `in-progress` (with the remaining lease as `Retry-After`, capped by
    /// [`EngineBuilder::in_progress_retry_after`]) when
    /// another request holds it, `store-unavailable` when the store failed (unless the
    /// engine fails open).
    pub async fn begin(
        &self,
        scope: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<Begin, Rejection> {
        let id = RecordId::new(scope, key.as_str());
        self.begin_id(id, fingerprint.as_bytes()).await
    }

    pub(crate) async fn begin_id(
        &self,
        id: RecordId,
        fingerprint: &[u8],
    ) -> Result<Begin, Rejection> {
        match self.claim(id, fingerprint).await {
            Ok(Claimed::Execute(execution)) => Ok(Begin::Execute(execution)),
            Ok(Claimed::InProgress {
                fingerprint: held,
                lease_remaining,
            }) => Err(if held != fingerprint {
                Rejection::key_reused(self.cfg.key_reused_status)
            } else {
                Rejection::in_progress(lease_remaining.min(self.cfg.in_progress_retry_after))
            }),
            Ok(Claimed::Completed {
                fingerprint: held,
                payload,
            }) => {
                if held == fingerprint {
                    Ok(Begin::Replay(payload))
                } else {
                    Err(Rejection::key_reused(self.cfg.key_reused_status))
                }
            }
            Err(e) if self.cfg.fail_open => {
                tracing::warn!(error = %e, "idempotency store failed; running unguarded (fail-open)");
                Ok(Begin::Unguarded)
            }
            Err(e) => {
                tracing::warn!(error = %e, "idempotency store failed; answering 503 (fail-closed)");
                Err(Rejection::store_unavailable(
                    self.cfg.unavailable_retry_after,
                ))
            }
        }
    }

    /// Claims `id` and returns the store's answer as it is, before the rules of
    /// [`Engine::begin`] (fingerprint match, fail-open) apply: for callers with rules of
    /// their own, such as the webhook batch deduper.
    pub(crate) async fn claim(
        &self,
        id: RecordId,
        fingerprint: &[u8],
    ) -> Result<Claimed, StoreError> {
        let token = FencingToken::random();
        let claim = self
            .cfg
            .store
            .claim(ClaimRequest {
                id: &id,
                fingerprint,
                token,
                lease: self.cfg.lease,
                retention: self.cfg.retention,
            })
            .await?;
        Ok(match claim {
            Claim::Acquired { takeover } => {
                if takeover {
                    tracing::info!(record = %id, "took over a key whose owner's lease expired");
                }
                Claimed::Execute(Execution {
                    engine: self.clone(),
                    id,
                    token,
                    takeover,
                    retention: self.cfg.retention,
                    lost: false,
                    done: false,
                })
            }
            Claim::InProgress {
                fingerprint,
                lease_remaining,
            } => Claimed::InProgress {
                fingerprint,
                lease_remaining,
            },
            Claim::Completed {
                fingerprint,
                payload,
            } => Claimed::Completed {
                fingerprint,
                payload,
            },
        })
    }
}

/// A claim as the store answered it, with a won claim already wrapped in an
/// [`Execution`] (lease renewal, fenced completion, release on drop).
pub(crate) enum Claimed {
    /// This caller owns the key.
    Execute(Execution),
    /// Another claim holds a live lease.
    InProgress {
        fingerprint: Bytes,
        lease_remaining: Duration,
    },
    /// The record is completed.
    Completed { fingerprint: Bytes, payload: Bytes },
}

/// A claimed key: run the operation, then complete or release.
///
/// Dropping an execution that was neither completed nor released releases the key in
/// the background (when a tokio runtime is running), so that a retry executes again; a
/// crashed process leaves the lease to expire instead.
#[derive(Debug)]
pub struct Execution {
    engine: Engine,
    id: RecordId,
    token: FencingToken,
    takeover: bool,
    retention: Duration,
    lost: bool,
    done: bool,
}

impl Execution {
    /// `true` when this claim took the key over from an owner whose lease expired (that
    /// owner may have done part of the work).
    #[must_use]
    pub fn is_takeover(&self) -> bool {
        self.takeover
    }

    /// The fencing token of this claim.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The record's address.
    #[must_use]
    pub fn record_id(&self) -> RecordId {
        self.id
    }

    /// `true` once a renewal found the key taken over: completing will fail fenced.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Keep the completed record for `retention` instead of the engine's default.
    pub fn set_retention(&mut self, retention: Duration) {
        self.retention = retention;
    }

    /// Drives `fut` to completion while renewing the lease every third of it. If a
    /// renewal finds the key taken over, renewing stops and [`Execution::is_lost`]
    /// turns `true`; `fut` still runs to its end.
    pub async fn run<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        // Most handlers answer in their first poll; only arm the renewal timer for those
        // that wait (arming one costs a timer registration and often a driver wake-up).
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = first {
            return out;
        }
        if !self.lost {
            let store = self.engine.cfg.store.clone();
            let (id, token) = (self.id, self.token);
            let (lease, every) = (self.engine.cfg.lease, self.engine.cfg.renew_every);
            let renew = async move {
                loop {
                    tokio::time::sleep(every).await;
                    match store.renew(&id, token, lease).await {
                        Ok(()) => {}
                        Err(e) if e.is_fenced() => {
                            tracing::warn!(record = %id, "lease lost while running: another request took the key over");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(record = %id, error = %e, "lease renewal failed; will retry")
                        }
                    }
                }
            };
            tokio::select! {
                biased;
                out = &mut fut => return out,
                () = renew => self.lost = true,
            }
        }
        fut.await
    }

    /// Completes the key with `payload`, kept for the retention period and handed to
    /// every later request with the same key and fingerprint as [`Begin::Replay`].
    ///
    /// # Errors
    /// [`StoreError::is_fenced`] when the key was taken over (this owner's lease
    /// expired): the other owner's outcome wins. A store that is unavailable is asked
    /// again, with a doubling pause from 20 ms, for up to half the lease (the operation
    /// already ran: losing its outcome would run it a second time after the lease);
    /// if it still fails, the outcome is not recorded and the key is released by its
    /// lease.
    pub async fn complete(mut self, payload: Bytes) -> Result<(), StoreError> {
        self.done = true;
        let store = &self.engine.cfg.store;
        let give_up = tokio::time::Instant::now() + self.engine.cfg.lease / 2;
        let mut pause = Duration::from_millis(20);
        loop {
            let result = store
                .complete(&self.id, self.token, payload.clone(), self.retention)
                .await;
            match result {
                Err(e) if e.is_unavailable() && tokio::time::Instant::now() + pause < give_up => {
                    tracing::warn!(record = %self.id, error = %e, "recording the outcome failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2);
                }
                other => return other,
            }
        }
    }

    /// Releases the key without an outcome: the next request executes again.
    ///
    /// # Errors
    /// [`StoreError::is_fenced`] when the key was already taken over; other store errors
    /// leave the key to its lease.
    pub async fn release(mut self) -> Result<(), StoreError> {
        self.done = true;
        self.engine.cfg.store.release(&self.id, self.token).await
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (store, id, token) = (self.engine.cfg.store.clone(), self.id, self.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.release(&id, token).await {
                    tracing::debug!(record = %id, error = %e, "release of an abandoned claim failed");
                }
            });
        }
    }
}
