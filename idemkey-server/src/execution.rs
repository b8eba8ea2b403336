//! A claimed key: the operation runs while its lease is renewed, then its outcome is
//! recorded (at once, or in the background through a store outage) or the key released.

use std::borrow::BorrowMut;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::engine::Config as EngineConfig;
use super::telemetry::{Ended, EngineStore, ServerMetrics};
use crate::store::{FencingToken, RecordId, StoreError, clamp_forever};

/// The first pause between two attempts to record an outcome; it doubles up to
/// [`RECORD_RETRY_CAP`].
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(20);
/// The longest pause between two attempts to record an outcome through a store outage:
/// once the store is back, the outcome is recorded within about this long.
const RECORD_RETRY_CAP: Duration = Duration::from_secs(1);

/// A claimed key: run the operation, then complete or release.
///
/// Dropping an execution that was neither completed nor released releases the key in
/// the background (when a tokio runtime is running), so that a retry executes again; a
/// crashed process leaves the lease to expire instead.
///
/// # An outcome is not given up because the store blinked
///
/// Once the operation ran, its outcome is the only one there is: losing it would let
/// the next request with the key run the operation again once the lease ends. So
/// [`Execution::complete`] and [`Execution::complete_or_defer`] keep trying while the
/// store is unavailable, with a pause that doubles from 20 ms up to 1 s, for as long as
/// the retention lasts (the store keeps an abandoned claim for its retention past the
/// lease, and its owner may still complete it while nobody took it over). They stop at
/// once when the key was taken over ([`StoreError::is_fenced`]: the other owner's
/// outcome wins).
///
/// What remains: a retry that arrives **after the lease ended and before the outcome
/// is recorded** (the store still down, or back for less than a pause) takes the key
/// over and runs the operation again; the late recording is then fenced. A longer
/// lease ([`EngineBuilder::lease`](super::EngineBuilder::lease)) narrows that window:
/// duplicates get `409 in-progress` until the lease ends. The process must live until
/// the recording ends ([`Engine::wait_for_recordings`](super::Engine::wait_for_recordings)
/// before it exits).
pub struct Execution {
    /// The engine's store, lease, retention, recordings and metrics: one shared count.
    engine: Arc<EngineConfig>,
    id: RecordId,
    token: FencingToken,
    takeover: bool,
    lost: bool,
    done: bool,
    /// The scope's in-progress slot under a quota's cap, given back when the outcome
    /// is known (complete, release) or the execution is dropped.
    slot: Option<crate::quota::Permit>,
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("id", &self.id)
            .field("token", &self.token)
            .field("takeover", &self.takeover)
            .field("lease", &self.engine.lease)
            .field("retention", &self.engine.retention)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl Execution {
    pub(super) fn new(
        engine: Arc<EngineConfig>,
        id: RecordId,
        token: FencingToken,
        takeover: bool,
    ) -> Self {
        Self {
            engine,
            id,
            token,
            takeover,
            lost: false,
            done: false,
            slot: None,
        }
    }

    fn store(&self) -> &EngineStore {
        &self.engine.store
    }

    fn metrics(&self) -> &ServerMetrics {
        &self.engine.metrics
    }

    /// Holds `slot` (an in-progress slot of the scope's quota) until the outcome is
    /// known or this execution is dropped.
    pub(crate) fn hold(&mut self, slot: crate::quota::Permit) {
        self.slot = Some(slot);
    }

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

    /// Drives `fut` to completion while renewing the lease every third of it. If a
    /// renewal finds the key taken over, renewing stops and [`Execution::is_lost`]
    /// turns `true`; `fut` still runs to its end.
    pub fn run<F: Future>(&mut self, fut: F) -> impl Future<Output = F::Output> {
        Run::new(self, fut).map(|(_, out)| out)
    }

    /// [`Execution::run`] for an execution the future owns, handed back with the output.
    pub(crate) fn run_owned<F: Future>(self, fut: F) -> Run<Self, F> {
        Run::new(self, fut)
    }

    /// Renews the lease every third of it until the key is found taken over (then it
    /// returns) or the future is dropped.
    fn renewals(&self) -> impl Future<Output = ()> + Send + 'static {
        let store = self.store().clone();
        let (id, token) = (self.id, self.token);
        let (lease, every) = (self.engine.lease, self.engine.renew_every);
        async move {
            loop {
                tokio::time::sleep(every).await;
                match store.get().renew(&id, token, lease).await {
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
        }
    }

    /// Renews the lease in a spawned task until the returned guard is dropped: for an
    /// operation that goes on outside [`Execution::run`] (a response body the layer
    /// streams to its caller). `None` without a runtime.
    pub(crate) fn renew_in_background(&self) -> Option<RenewGuard> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        Some(RenewGuard(rt.spawn(self.renewals())))
    }

    /// Completes the key with `payload`, kept for the retention period and handed to
    /// every later request with the same key and fingerprint as
    /// [`Claimed::Replay`](super::Claimed::Replay), and waits until it is recorded.
    ///
    /// Through a store outage this waits as long as the outage lasts (up to the
    /// retention; see the [type docs](Execution#an-outcome-is-not-given-up-because-the-store-blinked)).
    /// A caller that must not wait for the store, such as an HTTP response already
    /// computed, uses [`Execution::complete_or_defer`].
    ///
    /// # Errors
    /// [`StoreError::is_fenced`] when the key was taken over (this owner's lease
    /// expired and another request claimed it): the other owner's outcome wins. The
    /// last [`StoreError::is_unavailable`] when the store was still unavailable when
    /// the retention ran out. Any other store error (a corrupt record) at once.
    pub async fn complete(mut self, payload: Bytes) -> Result<(), StoreError> {
        self.done = true;
        self.slot = None;
        let recorder = self.recorder();
        let first = recorder.attempt(&payload).await;
        let result = recorder.persist(payload, first).await;
        ended(self.metrics(), result.as_ref().map(|()| Ended::Recorded));
        result
    }

    /// Completes the key with `payload` (as [`Execution::complete`]) without waiting for
    /// a store that is down: one attempt now; if the store is unavailable, the outcome
    /// moves to a spawned task that owns it and goes on trying, and this returns
    /// [`Completion::Deferred`] at once. On the happy path nothing is spawned and the
    /// record is in the store when this returns ([`Completion::Recorded`]).
    ///
    /// The layer answers its caller so: a store outage of minutes does not hold the
    /// response for minutes. Wait for deferred recordings with [`Recording::wait`], or
    /// all of an engine's with [`Engine::wait_for_recordings`](super::Engine::wait_for_recordings)
    /// (before a process exits, and in tests).
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::{Claimed, Completion, Engine};
    /// use idemkey::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(MemoryStore::new());
    /// let (key, fp) = (IdempotencyKey::new("order-7")?, Fingerprint::of_bytes(b"ship 7"));
    /// let Claimed::Execute(exec) = engine.claim("", &key, &fp).await? else { unreachable!() };
    /// match exec.complete_or_defer("shipped".into()).await? {
    ///     Completion::Recorded => {}
    ///     Completion::Deferred(recording) => recording.wait().await?, // the store was down
    /// }
    /// assert_eq!(engine.pending_recordings(), 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::is_fenced`] when the key was taken over, and any error other than
    /// unavailability, from the first attempt. Errors of the background attempts are
    /// logged and returned by [`Recording::wait`].
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async` block holds `self` and `payload` once; an `async fn` keeps a second copy"
    )]
    pub fn complete_or_defer(
        mut self,
        payload: Bytes,
    ) -> impl Future<Output = Result<Completion, StoreError>> + Send {
        async move {
            self.done = true;
            self.slot = None;
            // The first attempt borrows this execution's parts: the owned copy a
            // background recording needs (a shared count) is made only when it is needed.
            let first = attempt(&self.engine, &self.id, self.token, &payload).await;
            self.completed_or_deferred(payload, first)
        }
    }

    /// [`Execution::complete_or_defer`] at once, for a store that answers in process
    /// ([`Store::in_process`](crate::store::Store::in_process)); the execution and the
    /// payload handed back, untouched, for a store that does not.
    pub(crate) fn complete_or_defer_now(mut self, payload: Bytes) -> CompletedNow {
        let engine = &self.engine;
        let Some(first) =
            engine
                .store
                .complete_now(&self.id, self.token, &payload, engine.retention)
        else {
            return CompletedNow::Later(self, payload);
        };
        counted(engine, &payload, &first);
        self.done = true;
        self.slot = None;
        CompletedNow::Settled(self.completed_or_deferred(payload, first))
    }

    /// What the first attempt to record `payload` makes of the completion: recorded,
    /// deferred to a spawned task while the store is unavailable, or failed; counted.
    fn completed_or_deferred(
        &self,
        payload: Bytes,
        first: Result<(), StoreError>,
    ) -> Result<Completion, StoreError> {
        let result = match first {
            Ok(()) => Ok(Completion::Recorded),
            Err(e) if e.is_unavailable() => {
                tracing::warn!(record = %self.id, error = %e, "recording the outcome failed; the caller is answered and the outcome is recorded in the background once the store is back");
                Ok(Completion::Deferred(self.recorder().spawn(payload, Err(e))))
            }
            Err(e) => Err(e),
        };
        ended(
            self.metrics(),
            result.as_ref().map(|c| match c {
                Completion::Recorded => Ended::Recorded,
                Completion::Deferred(_) => Ended::Deferred,
            }),
        );
        result
    }

    fn recorder(&self) -> Recorder {
        Recorder {
            engine: Arc::clone(&self.engine),
            id: self.id,
            token: self.token,
        }
    }

    /// Releases the key without an outcome: the next request executes again.
    ///
    /// # Errors
    /// [`StoreError::is_fenced`] when the key was already taken over; other store errors
    /// leave the key to its lease.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async` block holds `self` once; an `async fn` keeps a second copy"
    )]
    pub fn release(mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            self.done = true;
            self.slot = None;
            let result = self.store().get().release(&self.id, self.token).await;
            ended(self.metrics(), result.as_ref().map(|()| Ended::Released));
            result
        }
    }
}

/// What [`Execution::complete_or_defer_now`] did.
pub(crate) enum CompletedNow {
    /// Completed (or deferred) as [`Execution::complete_or_defer`] would have.
    Settled(Result<Completion, StoreError>),
    /// Nothing: the store does not answer in process. The execution and the payload,
    /// for [`Execution::complete_or_defer`].
    Later(Execution, Bytes),
}

impl Drop for Execution {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.metrics().execution(Ended::Abandoned);
        let (store, id, token) = (self.store().clone(), self.id, self.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.get().release(&id, token).await {
                    tracing::debug!(record = %id, error = %e, "release of an abandoned claim failed");
                }
            });
        }
    }
}

/// Counts an execution that ended in `metrics`: with `outcome`, or fenced or failed.
fn ended(metrics: &ServerMetrics, result: Result<Ended, &StoreError>) {
    metrics.execution(match result {
        Ok(outcome) => outcome,
        Err(e) if e.is_fenced() => Ended::Fenced,
        Err(_) => Ended::Failed,
    });
}

pin_project_lite::pin_project! {
    /// The future of [`Execution::run`] and [`Execution::run_owned`]: the handler's future
    /// polled in place, the lease renewals made (and boxed) only once it has waited; it
    /// hands back the execution (`E`: borrowed or owned) with the handler's output. A
    /// future of its own rather than an `async fn`, which held the handler's future twice
    /// (its argument, and pinned), and every request's execution is boxed.
    pub(crate) struct Run<E, F> {
        exec: Option<E>,
        #[pin]
        fut: F,
        renew: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    }
}

impl<E, F> Run<E, F> {
    fn new(exec: E, fut: F) -> Self {
        Self {
            exec: Some(exec),
            fut,
            renew: None,
        }
    }
}

impl<E: BorrowMut<Execution>, F: Future> Future for Run<E, F> {
    type Output = (E, F::Output);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(exec) = this.exec.as_mut() else {
            return Poll::Pending; // polled again after it was ready
        };
        // Most handlers answer in their first poll; only arm the renewal timer for those
        // that wait (arming one costs a timer registration and often a driver wake-up).
        if let Poll::Ready(out) = this.fut.poll(cx) {
            return match this.exec.take() {
                Some(exec) => Poll::Ready((exec, out)),
                None => Poll::Pending,
            };
        }
        let exec = exec.borrow_mut();
        if !exec.lost {
            let renew = this.renew.get_or_insert_with(|| Box::pin(exec.renewals()));
            if renew.as_mut().poll(cx).is_ready() {
                // Taken over: renewing stops, the handler runs on to its end.
                exec.lost = true;
                *this.renew = None;
            }
        }
        Poll::Pending
    }
}

/// Renews a lease in the background while it lives ([`Execution::renew_in_background`]).
pub(crate) struct RenewGuard(JoinHandle<()>);

impl Drop for RenewGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How [`Execution::complete_or_defer`] went.
#[derive(Debug)]
#[must_use = "a deferred recording may still fail; wait for it, or let it run detached"]
pub enum Completion {
    /// The outcome is in the store.
    Recorded,
    /// The store was unavailable: the outcome is being recorded in the background.
    /// Dropping the [`Recording`] lets it run on, detached.
    Deferred(Recording),
}

/// An outcome being recorded in the background by a task that owns it (see
/// [`Execution::complete_or_defer`]). Dropping the handle detaches it; the task runs on
/// until the outcome is recorded, the key was taken over, or the retention ran out.
#[derive(Debug)]
pub struct Recording {
    task: JoinHandle<Result<(), StoreError>>,
}

impl Recording {
    /// Waits until the background task ends.
    ///
    /// # Errors
    /// As [`Execution::complete`]: fenced (taken over), unavailable until the retention
    /// ran out, or another store error; unavailable too if the task was cancelled (the
    /// runtime shut down).
    pub async fn wait(self) -> Result<(), StoreError> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(StoreError::unavailable(
                "recording an outcome in the background (the task did not finish)",
                e,
            )),
        }
    }
}

/// The count of an engine's background recordings, shared by the engines derived from
/// it, so that a process (or a test) can wait until they ended.
#[derive(Debug)]
pub(super) struct Recordings {
    pending: watch::Sender<usize>,
}

impl Default for Recordings {
    fn default() -> Self {
        Self {
            pending: watch::Sender::new(0),
        }
    }
}

impl Recordings {
    pub(super) fn pending(&self) -> usize {
        *self.pending.borrow()
    }

    pub(super) async fn wait_idle(&self) {
        let mut rx = self.pending.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot see it closed.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// One pending background recording: counted from its spawn until its task ends (or is
/// dropped with the runtime).
struct Pending(Arc<Recordings>);

impl Pending {
    fn new(recordings: Arc<Recordings>) -> Self {
        recordings.pending.send_modify(|n| *n += 1);
        Self(recordings)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.pending.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// What recording an outcome needs, owned, so that a background task can take it.
struct Recorder {
    engine: Arc<EngineConfig>,
    id: RecordId,
    token: FencingToken,
}

/// One attempt to record `payload` as the outcome of the claim `token` holds on `id`.
#[allow(
    clippy::manual_async_fn,
    reason = "an `async` block holds the arguments once; an `async fn` keeps a second copy"
)]
fn attempt<'a>(
    engine: &'a EngineConfig,
    id: &'a RecordId,
    token: FencingToken,
    payload: &'a Bytes,
) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
    async move {
        let result = engine
            .store
            .complete(id, token, payload.clone(), engine.retention)
            .await;
        counted(engine, payload, &result);
        result
    }
}

/// Counts `payload` as stored when the attempt to record it succeeded.
fn counted(engine: &EngineConfig, payload: &Bytes, result: &Result<(), StoreError>) {
    if result.is_ok() {
        engine.metrics.stored_bytes(payload.len());
    }
}

impl Recorder {
    async fn attempt(&self, payload: &Bytes) -> Result<(), StoreError> {
        attempt(&self.engine, &self.id, self.token, payload).await
    }

    /// Goes on from the result of the last attempt while the store is unavailable: a
    /// pause doubling from 20 ms to 1 s between attempts, for up to the retention.
    async fn persist(
        &self,
        payload: Bytes,
        mut last: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let give_up = tokio::time::Instant::now().checked_add(clamp_forever(self.engine.retention));
        let mut pause = RECORD_RETRY_FIRST;
        let mut attempts = 1_u64;
        loop {
            match last {
                Err(e) if e.is_unavailable() => {
                    let now = tokio::time::Instant::now();
                    if give_up.is_some_and(|at| now + pause >= at) {
                        tracing::error!(record = %self.id, attempts, error = %e, "gave up recording an outcome: the store was unavailable for the whole retention; a retry with this key runs again");
                        return Err(e);
                    }
                    tracing::debug!(record = %self.id, attempts, error = %e, "recording the outcome failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2).min(RECORD_RETRY_CAP);
                    attempts += 1;
                    last = self.attempt(&payload).await;
                }
                Ok(()) => {
                    if attempts > 1 {
                        tracing::info!(record = %self.id, attempts, "recorded the outcome once the store answered again");
                    }
                    return Ok(());
                }
                Err(e) => {
                    if e.is_fenced() && attempts > 1 {
                        tracing::warn!(record = %self.id, attempts, "could not record the outcome: while the store was away, another request took the key over after this one's lease ended (or an earlier attempt whose answer was lost recorded it); the other outcome wins");
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Moves the recording to a spawned task that owns `payload`, counted in
    /// [`Recordings`] until it ends.
    fn spawn(self, payload: Bytes, last: Result<(), StoreError>) -> Recording {
        let pending = Pending::new(Arc::clone(&self.engine.recordings));
        let task = tokio::spawn(async move {
            let _pending = pending;
            self.persist(payload, last).await
        });
        Recording { task }
    }
}
