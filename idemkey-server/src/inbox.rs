//! The transactional inbox: the function-level API ([`Engine::once`]) run in the
//! caller's own database transaction, so that the claim, the effect's writes and the
//! recorded value commit together (`PostgresStore::once_in`, `SqliteStore::once_in`).
//!
//! The control flow lives here, beside `once.rs` whose answers it gives; each store
//! supplies its two statements (claim and record) through its `InboxSql`, and knows
//! nothing of the verifier.
//!
//! [`Engine::once`]: super::Engine::once

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Connection, Database};

use super::record::Record;
use super::{OnceError, Settled, once};
use crate::IdempotencyKey;
use crate::fingerprint::Fingerprint;
#[cfg(feature = "postgres")]
use crate::store::PostgresStore;
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
use crate::store::sql::unavailable;
use crate::store::{Claim, InboxSql, RecordId};
#[cfg(feature = "postgres")]
use sqlx::postgres::PgConnection;
#[cfg(feature = "sqlite")]
use sqlx::sqlite::SqliteConnection;

#[cfg(feature = "postgres")]
impl PostgresStore {
    /// The transactional inbox: runs `f` at most once per (`scope`, `key`,
    /// `fingerprint`) *inside the caller's transaction*, and records its value in that
    /// same transaction, so that the claim, `f`'s writes and the result commit together
    /// or not at all. Later calls with the same three get the recorded value back
    /// ([`Settled::is_replayed`]) without running `f`.
    ///
    /// Pass the transaction as `&mut *tx`, and run every write of the effect on the
    /// connection `f` is given (the same transaction). Commit after `once_in` returns
    /// (then acknowledge the message); if the process dies before the commit, or the
    /// transaction is rolled back, nothing of it stays and the redelivered message runs
    /// `f` again, once. Records live in the store's table, addressed like the engine's
    /// ([`RecordId::new`]`(scope, key)`), for [`PostgresStoreBuilder::inbox_retention`](crate::store::PostgresStoreBuilder::inbox_retention).
    ///
    /// The claim is `INSERT ... ON CONFLICT (id) DO NOTHING`, then `SELECT ... FOR
    /// UPDATE` when the row exists. A concurrent duplicate in another transaction
    /// therefore **waits** on the row until the first transaction ends: after a commit
    /// it gets the recorded value (a replay), after a rollback it claims the key and
    /// runs `f` itself. It never runs `f` while the first may still commit. This holds
    /// at the default isolation `READ COMMITTED`; under `REPEATABLE READ` or
    /// `SERIALIZABLE` the waiting duplicate fails with a serialisation error
    /// ([`OnceError::is_store_unavailable`]) instead: roll back and redeliver.
    ///
    /// `f` and the claim run in a savepoint: when `f` fails (or its value cannot be
    /// serialised, or a statement fails) the savepoint is rolled back, so the claim and
    /// `f`'s writes are undone and the transaction stays usable. When `conn` is not in a
    /// transaction, `once_in` opens one and commits it before returning.
    ///
    /// Exactly once holds for the writes `f` makes through the connection. Anything
    /// else `f` does (an email, an HTTP call) is still at least once: it may happen and
    /// then be rolled back with the transaction.
    ///
    /// # Errors
    /// [`OnceError`]: key reused with another fingerprint; in progress when a running
    /// [`Engine::once`](crate::Engine::once) or layer request holds the key
    /// (inbox claims are never visible in progress); store unavailable when a
    /// statement fails (roll the transaction back); `f` failed; the value could not be
    /// recorded or read back.
    ///
    /// ```no_run
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::store::PostgresStore;
    /// # async fn demo(store: PostgresStore, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let key = IdempotencyKey::new("msg-0001")?;
    /// let fp = Fingerprint::of_bytes(b"charge acct-1 250");
    /// let mut tx = pool.begin().await?;
    /// let balance = store
    ///     .once_in(&mut *tx, "charges", &key, &fp, async |conn| {
    ///         sqlx::query_scalar::<_, i64>(
    ///             "UPDATE accounts SET balance = balance + 250 WHERE id = 1 RETURNING balance",
    ///         )
    ///         .fetch_one(&mut *conn)
    ///         .await
    ///     })
    ///     .await?;
    /// tx.commit().await?; // claim, charge and result, together; then ack the message
    /// println!("balance {} (replayed: {})", balance.value(), balance.is_replayed());
    /// # Ok(()) }
    /// ```
    pub async fn once_in<T, E, F>(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        f: F,
    ) -> Result<Settled<T>, OnceError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    {
        once_in(self, conn, scope, key, fingerprint, f).await
    }
}

#[cfg(feature = "sqlite")]
impl SqliteStore {
    /// The transactional inbox: runs `f` at most once per (`scope`, `key`,
    /// `fingerprint`) inside the caller's transaction on a connection of their own to
    /// this store's file, and records its value in that same transaction: the claim,
    /// `f`'s writes and the result commit together or not at all. Later calls with the
    /// same three get the recorded value back ([`Settled::is_replayed`]).
    ///
    /// Pass the transaction as `&mut *tx` and run every write of the effect on the
    /// connection `f` is given; commit after `once_in` returns (then acknowledge the
    /// message). If the process dies before the commit, or the transaction is rolled
    /// back, nothing of it stays and the redelivery runs `f` again, once. `f` and the
    /// claim run in a savepoint: when `f` fails (or its value cannot be serialised, or a
    /// statement fails) the savepoint is rolled back and the transaction stays usable.
    /// When `conn` is not in a transaction, `once_in` opens one and commits it. Exactly
    /// once holds for the writes `f` makes through the connection; anything else it does
    /// (an email, an HTTP call) is at least once. The PostgreSQL store's `once_in` works
    /// the same way.
    ///
    /// Locking is SQLite's: the claim is the transaction's first write and takes the
    /// database's write lock, so a concurrent duplicate on another connection **waits**
    /// (up to its connection's busy timeout) until the first transaction ends, then
    /// replays its result or, after a rollback, runs `f` itself.
    /// Begin the transaction with `BEGIN IMMEDIATE` (`conn.begin_with("BEGIN
    /// IMMEDIATE")`) when it reads before `once_in`: a deferred transaction whose read
    /// snapshot is older than a concurrent commit cannot upgrade to a write and fails
    /// with `SQLITE_BUSY` ([`OnceError::is_store_unavailable`]).
    ///
    /// ```
    /// use idemkey::{IdempotencyKey, fingerprint::Fingerprint};
    /// use idemkey::store::SqliteStore;
    /// use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("idemkey-inbox-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// let store = SqliteStore::open(dir.join("app.db")).await?;
    /// let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", store.path().display())).await?;
    /// sqlx::raw_sql("CREATE TABLE IF NOT EXISTS shipments (msg TEXT)").execute(&mut conn).await?;
    ///
    /// let key = IdempotencyKey::new("msg-0001")?;
    /// let fp = Fingerprint::of_bytes(b"ship order 42");
    /// for _delivery in 0..2 {
    ///     let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    ///     store
    ///         .once_in(&mut *tx, "orders", &key, &fp, async |c| {
    ///             sqlx::query("INSERT INTO shipments VALUES ('msg-0001')").execute(&mut *c).await?;
    ///             Ok::<_, sqlx::Error>(())
    ///         })
    ///         .await?;
    ///     tx.commit().await?;
    /// }
    /// let shipped: i64 = sqlx::query_scalar("SELECT count(*) FROM shipments").fetch_one(&mut conn).await?;
    /// assert_eq!(shipped, 1);
    /// # drop(conn); store.close().await; std::fs::remove_dir_all(&dir).ok();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`OnceError`]: key reused with another fingerprint; in progress when a running
    /// [`Engine::once`](crate::Engine::once) or layer request holds the key
    /// (inbox claims are never visible in progress); store unavailable when a
    /// statement fails (roll the transaction back); `f` failed; the value could not be
    /// recorded or read back.
    pub async fn once_in<T, E, F>(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        f: F,
    ) -> Result<Settled<T>, OnceError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: AsyncFnOnce(&mut SqliteConnection) -> Result<T, E>,
    {
        once_in(self, conn, scope, key, fingerprint, f).await
    }
}

/// [`PostgresStore::once_in`] and [`SqliteStore::once_in`]: claim, run `f`, record, all
/// in a savepoint of the caller's transaction (or in a transaction of its own when
/// `conn` is in none), so that a failure leaves nothing of the three behind.
async fn once_in<S, T, E, F>(
    sql: &S,
    conn: &mut S::Conn,
    scope: &str,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    f: F,
) -> Result<Settled<T>, OnceError<E>>
where
    S: InboxSql,
    T: Serialize + DeserializeOwned,
    F: AsyncFnOnce(&mut S::Conn) -> Result<T, E>,
{
    let id = RecordId::new(scope, key.as_str());
    let fp = fingerprint.as_bytes();
    let failed = |what: &str, e| OnceError::store(unavailable(what, e));
    let mut sp = conn
        .begin()
        .await
        .map_err(|e| failed("the inbox: opening a savepoint", e))?;
    let claim = match sql.claim(&mut sp, &id, fp).await {
        Ok(claim) => claim,
        Err(e) => {
            undo(sp).await;
            return Err(OnceError::store(e));
        }
    };
    match claim {
        Claim::Acquired { takeover } => {
            if takeover {
                tracing::debug!(record = %id, "the inbox reused an expired record");
            }
        }
        Claim::Completed {
            fingerprint: held,
            payload,
        } if held == fp => {
            undo(sp).await;
            return once::decode(payload).map(|value| Settled {
                value,
                replayed: true,
            });
        }
        Claim::InProgress {
            fingerprint: held,
            lease_remaining,
        } if held == fp => {
            undo(sp).await;
            return Err(OnceError::in_progress(lease_remaining));
        }
        Claim::InProgress { .. } | Claim::Completed { .. } => {
            undo(sp).await;
            return Err(OnceError::key_reused());
        }
    }
    let value = match f(&mut sp).await {
        Ok(value) => value,
        Err(e) => {
            undo(sp).await;
            return Err(OnceError::failed(e));
        }
    };
    let json = match serde_json::to_vec(&value) {
        Ok(json) => json,
        Err(e) => {
            undo(sp).await;
            return Err(OnceError::encode(e));
        }
    };
    let payload: Bytes = Record::Value(Bytes::from(json)).encode();
    if let Err(e) = sql.record(&mut sp, &id, &payload).await {
        undo(sp).await;
        return Err(OnceError::store(e));
    }
    sp.commit()
        .await
        .map_err(|e| failed("the inbox: releasing its savepoint", e))?;
    Ok(Settled {
        value,
        replayed: false,
    })
}

/// Rolls the savepoint back: the claim, the effect's writes and the result go.
async fn undo<DB: Database>(sp: sqlx::Transaction<'_, DB>) {
    if let Err(e) = sp.rollback().await {
        // The connection is broken: so is the caller's transaction, whose commit fails.
        tracing::warn!(error = %e, "the inbox could not roll back its savepoint");
    }
}
