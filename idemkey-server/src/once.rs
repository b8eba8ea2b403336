//! The function-level API: run an async closure at most once per (scope, key,
//! fingerprint), for queue consumers, jobs and webhook processors.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::engine::{ClaimError, Claimed, Engine};
use super::record::Record;
use crate::IdempotencyKey;
use crate::fingerprint::Fingerprint;
use idemkey_core::protocol::retry_after::whole_seconds;

/// An operation settled by [`Engine::once`]: the closure's value, and whether it was
/// replayed from the store rather than computed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled<T> {
    pub(crate) value: T,
    pub(crate) replayed: bool,
}

impl<T> Settled<T> {
    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, owned.
    pub fn into_value(self) -> T {
        self.value
    }

    /// `true` when the closure did not run now: the value was recorded by an earlier
    /// run with the same key and fingerprint.
    pub fn is_replayed(&self) -> bool {
        self.replayed
    }
}

/// Why [`Engine::once`] gave no value. The kind is queried with `is_*()`.
pub struct OnceError<E> {
    kind: Kind<E>,
}

enum Kind<E> {
    InProgress {
        retry_after: Duration,
    },
    KeyReused,
    QuotaExceeded {
        retry_after: Duration,
    },
    Unavailable(ClaimError),
    /// The store is at its bound and refused the new key.
    Full(ClaimError),
    /// The transactional inbox's own statements failed (its transaction is the
    /// caller's, so there is no engine advice to retry).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    Store(crate::store::StoreError),
    Failed(E),
    Encode(serde_json::Error),
    Decode(String),
}

impl<E> OnceError<E> {
    fn new(kind: Kind<E>) -> Self {
        Self { kind }
    }

    /// The transactional inbox found the key held by a running [`Engine::once`] or
    /// layer request (with the same fingerprint).
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn in_progress(retry_after: Duration) -> Self {
        Self::new(Kind::InProgress { retry_after })
    }

    /// The key was used with another fingerprint.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn key_reused() -> Self {
        Self::new(Kind::KeyReused)
    }

    /// The transactional inbox's statements failed.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn store(e: crate::store::StoreError) -> Self {
        Self::new(Kind::Store(e))
    }

    /// The closure failed.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn failed(e: E) -> Self {
        Self::new(Kind::Failed(e))
    }

    /// The closure's value could not be serialised.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn encode(e: serde_json::Error) -> Self {
        Self::new(Kind::Encode(e))
    }

    /// Another run with this key is in progress: retry after [`OnceError::retry_after`]
    /// (requeue the message).
    pub fn is_in_progress(&self) -> bool {
        matches!(self.kind, Kind::InProgress { .. })
    }

    /// The key was used with a different fingerprint: a different operation reused it.
    pub fn is_key_reused(&self) -> bool {
        matches!(self.kind, Kind::KeyReused)
    }

    /// The scope is over its [quota](super::EngineBuilder::quota) of new keys (or of
    /// runs in progress): nothing ran and nothing was recorded; retry with the same key
    /// after [`OnceError::retry_after`] (requeue the message with that delay).
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::{Engine, policy::Quota};
    /// use idemkey::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::builder(MemoryStore::new()).quota(Quota::per_minute(1)?).build();
    /// let fp = Fingerprint::of_bytes(b"m");
    /// engine.once("queue-a", &IdempotencyKey::new("m-1")?, &fp, || async { Ok::<_, std::io::Error>(1) }).await?;
    /// let e = engine.once("queue-a", &IdempotencyKey::new("m-2")?, &fp, || async { Ok::<_, std::io::Error>(2) }).await.unwrap_err();
    /// assert!(e.is_quota_exceeded());
    /// assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(60)));
    /// # Ok(()) }
    /// ```
    pub fn is_quota_exceeded(&self) -> bool {
        matches!(self.kind, Kind::QuotaExceeded { .. })
    }

    /// The store failed; nothing ran (with the transactional inbox: nothing of the
    /// claim or the effect stays in the transaction). Retry later.
    pub fn is_store_unavailable(&self) -> bool {
        matches!(self.kind, Kind::Unavailable(_) | Kind::Store(_))
    }

    /// The store is at its bound (records or bytes) and refused this new key; nothing
    /// ran. Retry after [`OnceError::retry_after`] (requeue the message), when expired
    /// records were swept; keys recorded before are still replayed.
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::Engine;
    /// use idemkey::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(MemoryStore::builder().max_records(1).build()?);
    /// let fp = Fingerprint::of_bytes(b"job");
    /// let run = || async { Ok::<_, std::io::Error>(1) };
    /// engine.once("jobs", &IdempotencyKey::new("job-1")?, &fp, run).await?;
    /// let err = engine.once("jobs", &IdempotencyKey::new("job-2")?, &fp, run).await.expect_err("full");
    /// assert!(err.is_store_full() && !err.is_store_unavailable());
    /// assert!(err.retry_after().is_some());
    /// assert!(engine.once("jobs", &IdempotencyKey::new("job-1")?, &fp, run).await?.is_replayed());
    /// # Ok(()) }
    /// ```
    pub fn is_store_full(&self) -> bool {
        matches!(self.kind, Kind::Full(_))
    }

    /// The closure ran and failed; the key was released, so a retry runs it again.
    pub fn is_failed(&self) -> bool {
        matches!(self.kind, Kind::Failed(_))
    }

    /// The closure's value could not be serialised: it ran, but its result was not
    /// recorded and the key was released.
    pub fn is_encode(&self) -> bool {
        matches!(self.kind, Kind::Encode(_))
    }

    /// A recorded value could not be read back as the requested type (the type changed
    /// since it was recorded, or the key was used by the HTTP layer).
    pub fn is_decode(&self) -> bool {
        matches!(self.kind, Kind::Decode(_))
    }

    /// When to retry an `in-progress`, `quota-exceeded`, `store-unavailable` or
    /// `store-full` error: the engine's advice ([`Claimed::InProgress`],
    /// [`Claimed::QuotaExceeded`], [`ClaimError::retry_after`]) in whole seconds, rounded
    /// up, at least 1 s.
    pub fn retry_after(&self) -> Option<Duration> {
        let advised = match &self.kind {
            Kind::InProgress { retry_after } | Kind::QuotaExceeded { retry_after } => *retry_after,
            Kind::Unavailable(e) | Kind::Full(e) => e.retry_after(),
            Kind::Store(_) => Duration::from_secs(1),
            _ => return None,
        };
        Some(Duration::from_secs(whole_seconds(advised)))
    }

    /// The closure's error, when it failed.
    pub fn failure(&self) -> Option<&E> {
        match &self.kind {
            Kind::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// The closure's error, owned, when it failed.
    pub fn into_failure(self) -> Option<E> {
        match self.kind {
            Kind::Failed(e) => Some(e),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::InProgress { .. } => f.write_str(
                "another run with this key is in progress; retry after the advised time to receive its value",
            ),
            Kind::KeyReused => f.write_str(
                "this key was already used with a different fingerprint (another operation); use a new key for a new operation",
            ),
            Kind::QuotaExceeded { .. } => f.write_str(
                "this scope is over its quota of new keys; nothing ran or was recorded: retry with the same key after the advised time",
            ),
            Kind::Unavailable(e) | Kind::Full(e) => write!(f, "{e}"),
            Kind::Store(e) => write!(f, "{e}"),
            Kind::Failed(e) => write!(
                f,
                "the operation failed (its key was released, a retry runs it again): {e}"
            ),
            Kind::Encode(e) => write!(
                f,
                "the operation ran, but its result could not be serialised to be recorded (the key was released): {e}"
            ),
            Kind::Decode(e) => write!(
                f,
                "the recorded result of this key cannot be read as the requested type: {e}; was the key used for another operation?"
            ),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for OnceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::InProgress { retry_after } => f
                .debug_struct("OnceError::InProgress")
                .field("retry_after", retry_after)
                .finish(),
            Kind::KeyReused => f.write_str("OnceError::KeyReused"),
            Kind::QuotaExceeded { retry_after } => f
                .debug_struct("OnceError::QuotaExceeded")
                .field("retry_after", retry_after)
                .finish(),
            Kind::Unavailable(e) => f.debug_tuple("OnceError::Unavailable").field(e).finish(),
            Kind::Full(e) => f.debug_tuple("OnceError::Full").field(e).finish(),
            Kind::Store(e) => f.debug_tuple("OnceError::Unavailable").field(e).finish(),
            Kind::Failed(e) => f.debug_tuple("OnceError::Failed").field(e).finish(),
            Kind::Encode(e) => f.debug_tuple("OnceError::Encode").field(e).finish(),
            Kind::Decode(e) => f.debug_tuple("OnceError::Decode").field(e).finish(),
        }
    }
}

impl<E> std::error::Error for OnceError<E>
where
    E: std::error::Error + 'static,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Unavailable(e) | Kind::Full(e) => Some(e),
            Kind::Store(e) => Some(e),
            Kind::Failed(e) => Some(e),
            Kind::Encode(e) => Some(e),
            Kind::InProgress { .. }
            | Kind::KeyReused
            | Kind::QuotaExceeded { .. }
            | Kind::Decode(_) => None,
        }
    }
}

impl Engine {
    /// Runs `f` at most once per (`scope`, `key`, `fingerprint`) and returns its value;
    /// later calls with the same three get the recorded value back (deserialised)
    /// without running `f`.
    ///
    /// `Ok` values are recorded for the engine's retention; an `Err` releases the key,
    /// so the next call runs `f` again. A value is returned as soon as `f` ran: if the
    /// store is down then, its recording goes on in the background
    /// ([`Execution::complete_or_defer`](super::Execution::complete_or_defer); wait for
    /// it with [`Engine::wait_for_recordings`]). The lease is renewed while `f` runs. If this
    /// future is dropped while `f` runs, the key is released (in the background).
    ///
    /// # Errors
    /// [`OnceError`]: in progress elsewhere (requeue after
    /// [`OnceError::retry_after`]), key reused with another fingerprint, store
    /// unavailable or full, `f` failed, or the value could not be recorded or read back.
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::server::Engine;
    /// use idemkey::store::MemoryStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(MemoryStore::new());
    /// let msg = serde_json::json!({"order": 42, "action": "ship"});
    /// let key = IdempotencyKey::new("msg-0001")?;
    /// let fp = Fingerprint::of_json(&msg)?;
    ///
    /// let first = engine.once("orders", &key, &fp, || async { Ok::<_, std::io::Error>(format!("shipment for {}", msg["order"])) }).await?;
    /// let again = engine.once("orders", &key, &fp, || async { Ok::<String, std::io::Error>(unreachable!("replayed")) }).await?;
    /// assert!(!first.is_replayed());
    /// assert!(again.is_replayed());
    /// assert_eq!(first.value(), again.value());
    /// # Ok(()) }
    /// ```
    pub async fn once<T, E, F, Fut>(
        &self,
        scope: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        f: F,
    ) -> Result<Settled<T>, OnceError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let claimed = self.claim(scope, key, fingerprint).await.map_err(|e| {
            OnceError::new(if e.is_store_full() {
                Kind::Full(e)
            } else {
                Kind::Unavailable(e)
            })
        })?;
        let mut exec = match claimed {
            Claimed::Execute(exec) => exec,
            Claimed::Replay(payload) => {
                return decode(payload).map(|value| Settled {
                    value,
                    replayed: true,
                });
            }
            Claimed::InProgress { retry_after } => {
                return Err(OnceError::new(Kind::InProgress { retry_after }));
            }
            Claimed::KeyReused => return Err(OnceError::new(Kind::KeyReused)),
            Claimed::QuotaExceeded { retry_after } => {
                return Err(OnceError::new(Kind::QuotaExceeded { retry_after }));
            }
            Claimed::Unguarded => {
                return match f().await {
                    Ok(value) => Ok(Settled {
                        value,
                        replayed: false,
                    }),
                    Err(e) => Err(OnceError::new(Kind::Failed(e))),
                };
            }
        };
        let value = match exec.run(f()).await {
            Ok(v) => v,
            Err(e) => {
                if let Err(se) = exec.release().await {
                    tracing::warn!(error = %se, "could not release the key of a failed operation");
                }
                return Err(OnceError::new(Kind::Failed(e)));
            }
        };
        let json = match serde_json::to_vec(&value) {
            Ok(j) => j,
            Err(e) => {
                if let Err(se) = exec.release().await {
                    tracing::warn!(error = %se, "could not release the key");
                }
                return Err(OnceError::new(Kind::Encode(e)));
            }
        };
        // Not held for a store outage: a deferred recording goes on in the background.
        if let Err(e) = exec
            .complete_or_defer(Record::Value(Bytes::from(json)).encode())
            .await
        {
            tracing::warn!(error = %e, "the operation ran but its result was not recorded");
        }
        Ok(Settled {
            value,
            replayed: false,
        })
    }
}

pub(crate) fn decode<T: DeserializeOwned, E>(payload: Bytes) -> Result<T, OnceError<E>> {
    let err = |m: String| OnceError::new(Kind::Decode(m));
    match Record::decode(payload).map_err(err)? {
        Record::Value(json) => serde_json::from_slice(&json).map_err(|e| err(e.to_string())),
        _ => Err(err("the record holds an HTTP response".into())),
    }
}
