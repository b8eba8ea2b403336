//! The SQL stores' side of the transactional inbox (`PostgresStore::once_in`,
//! `SqliteStore::once_in`): the two statements each store runs on the caller's
//! connection. The control flow that claims, runs the effect and records its value is
//! the verifier's (`server/inbox.rs`), beside the function-level API it mirrors: the
//! stores know rows, not what the engine writes into them.

use std::time::Duration;

use sqlx::{Connection, Database};

use super::{Claim, RecordId, StoreError};

/// How long the inbox keeps a processed message's record unless configured otherwise:
/// 7 days, as for webhooks, since brokers and producers redeliver well past a day
/// (a consumer down over a weekend, a replayed stream).
pub(crate) const DEFAULT_INBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A store's inbox statements, run on the caller's connection.
pub(crate) trait InboxSql: Sync {
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
