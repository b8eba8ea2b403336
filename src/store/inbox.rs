//! The transactional inbox of the SQL stores: claim, effect and result in the caller's
//! own transaction (`PostgresStore::once_in`, `SqliteStore::once_in`).
//!
//! The control flow is shared here; each store supplies its two statements (claim and
//! record) through [`InboxSql`].

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Connection, Database};

use super::sql::unavailable;
use super::{Claim, RecordId, StoreError};
use crate::IdempotencyKey;
use crate::fingerprint::Fingerprint;
use crate::server::record::Record;
use crate::server::{OnceError, Settled, once};

/// How long the inbox keeps a processed message's record unless configured otherwise:
/// 7 days, as for webhooks, since brokers and producers redeliver well past a day
/// (a consumer down over a weekend, a replayed stream).
pub(crate) const DEFAULT_INBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A store's inbox statements, run on the caller's connection.
pub(crate) trait InboxSql {
    /// The store's database.
    type Db: Database<Connection = Self::Conn>;
    /// Its connection.
    type Conn: Connection<Database = Self::Db>;

    /// Claims `id` for `fingerprint` inside the transaction, holding the row until the
    /// transaction ends: [`Claim::Acquired`] (a new row, or an expired one taken over),
    /// or the live row as it stands, once any concurrent transaction that held it
    /// ended.
    fn claim(
        &self,
        conn: &mut Self::Conn,
        id: &RecordId,
        fingerprint: &[u8],
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Records the result of the claimed `id`.
    fn record(
        &self,
        conn: &mut Self::Conn,
        id: &RecordId,
        payload: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// `PostgresStore::once_in` and `SqliteStore::once_in`: claim, run `f`, record, all
/// in a savepoint of the caller's transaction (or in a transaction of its own when
/// `conn` is in none), so that a failure leaves nothing of the three behind.
pub(crate) async fn once_in<S, T, E, F>(
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
