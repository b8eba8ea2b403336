//! The connections of the MySQL store's request path (claim, complete, renew,
//! release): a pool that checks a connection only when it has sat idle, and never as
//! it takes one back. (The PostgreSQL store's request path shares tokio-postgres
//! clients instead: `postgres/session.rs`. The tests below run this pool over
//! PostgreSQL connections, whose backends `pg_stat_activity` names.)
//!
//! sqlx's pool pings every connection it takes back (sqlx-core 0.9
//! `src/pool/connection.rs`, `Floating::return_to_pool`: an unconditional
//! `raw.ping()`, with no option to turn it off), so each statement cost two round
//! trips. This pool is deadpool's generic `managed::Pool` over sqlx connections:
//! `create` opens one, `recycle` pings one that sat idle for more than
//! [`CHECK_AFTER_IDLE`] and hands any other out as it is. The check of a busy pool's
//! connections is their use: a statement that fails on a broken connection fails its
//! request with the store's unavailable answer (503), and the connection is closed.
//!
//! What sqlx's ping on return did besides is done here by [`Pooled`]: a connection
//! goes back to the pool only when its statement ran to the end, successfully or with
//! an error that leaves the session usable (the database's own error, no row).
//! A request dropped while its statement is in flight (the client went away, a
//! timeout) closes the connection instead, as does an I/O or protocol error: sqlx
//! itself says such a connection "is likely to be left in an inconsistent state"
//! (the comment above that ping). Closing costs the next request a new connection, at
//! a cancellation only.
//!
//! Connections age out as in the store's sqlx pool (sqlx's defaults, sqlx-core 0.9
//! `src/pool/options.rs`): one idle for [`IDLE_TIMEOUT`] is closed by a reaper task,
//! one older than [`MAX_LIFETIME`] is closed when it would next be handed out, so that
//! a quiet service does not hold the database's sessions and a long-lived one moves
//! to a database's new address or settings in bounded time.
//!
//! Everything else (migrations, sweeps, the admin operations) stays on the store's sqlx
//! pool; the two pools share the store's connection budget
//! ([`split_budget`](super::sql::split_budget)).

use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use sqlx::{ConnectOptions, Connection};

use super::StoreError;
use super::sql::{Ageing, CHECK_AFTER_IDLE, describe};

/// Opens and checks the connections of a [`RequestPool`].
pub(crate) struct Manager<C: Connection> {
    options: <C as Connection>::Options,
    ageing: Ageing,
}

impl<C: Connection> managed::Manager for Manager<C> {
    type Type = C;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<C, sqlx::Error> {
        self.options.connect().await
    }

    /// A ping only for a connection last handed out more than [`CHECK_AFTER_IDLE`]
    /// ago; one that fails it, or has outlived [`Ageing`], is closed, and the pool
    /// takes or opens another.
    async fn recycle(&self, conn: &mut C, metrics: &Metrics) -> RecycleResult<sqlx::Error> {
        if !self.ageing.keeps(metrics.last_used(), metrics.age()) {
            return Err(RecycleError::message(
                "the connection reached its maximum lifetime or idle time",
            ));
        }
        if metrics.last_used() <= CHECK_AFTER_IDLE {
            return Ok(());
        }
        conn.ping().await.map_err(RecycleError::Backend)
    }
}

/// The request path's connections of one store (cheap to clone: clones share them).
pub(crate) struct RequestPool<C: Connection> {
    pool: managed::Pool<Manager<C>>,
    acquire_timeout: Duration,
}

impl<C: Connection> Clone for RequestPool<C> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            acquire_timeout: self.acquire_timeout,
        }
    }
}

impl<C: Connection + 'static> RequestPool<C> {
    /// A pool of at most `size` connections made with `options` (none opened yet); a
    /// request waits at most `acquire_timeout` for one, including the time to open it.
    ///
    /// Must be called within a Tokio runtime: it starts the task that closes idle
    /// connections, which ends when the pool is dropped.
    pub(crate) fn new(
        options: <C as Connection>::Options,
        size: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::with_ageing(options, size, acquire_timeout, Ageing::default())
    }

    pub(crate) fn with_ageing(
        options: <C as Connection>::Options,
        size: u32,
        acquire_timeout: Duration,
        ageing: Ageing,
    ) -> Result<Self, StoreError> {
        let pool = managed::Pool::builder(Manager { options, ageing })
            .max_size(usize::try_from(size).unwrap_or(usize::MAX))
            .build()
            .map_err(|e| {
                StoreError::configuration(format!("the request path's connection pool: {e}"))
            })?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            StoreError::configuration(
                "the request path's connection pool must be made within a Tokio runtime",
            )
        })?;
        runtime.spawn(reap_idle(pool.weak(), ageing));
        Ok(Self {
            pool,
            acquire_timeout,
        })
    }

    /// Opens the first connection now, so that a wrong URL or an unreachable server is
    /// found when the store connects; the driver's error as it came, or sqlx's
    /// `PoolTimedOut` when the server did not answer within the acquire timeout.
    pub(crate) async fn open_one(&self) -> Result<(), sqlx::Error> {
        match tokio::time::timeout(self.acquire_timeout, self.pool.get()).await {
            Ok(Ok(_returned)) => Ok(()),
            Ok(Err(PoolError::Backend(e))) => Err(e),
            Ok(Err(other)) => Err(sqlx::Error::Protocol(format!(
                "the connection pool failed: {other}"
            ))),
            // The server took the connection and did not answer within the timeout.
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        }
    }

    /// A connection for one statement of `what` (a description such as "PostgreSQL:
    /// claiming a record"), within the acquire timeout.
    ///
    /// # Errors
    ///
    /// Unavailable: no connection came free in time, or a new one could not be opened.
    pub(crate) async fn get(&self, what: &str) -> Result<Pooled<C>, StoreError> {
        match tokio::time::timeout(self.acquire_timeout, self.pool.get()).await {
            Ok(Ok(conn)) => Ok(Pooled { conn: Some(conn) }),
            Ok(Err(PoolError::Backend(e))) => Err(StoreError::unavailable(
                format!(
                    "{what} failed: opening a connection failed ({})",
                    describe(&e)
                ),
                e,
            )),
            Ok(Err(e)) => Err(StoreError::unavailable(
                format!("{what} failed: the connection pool failed ({e})"),
                e.to_string(),
            )),
            Err(_) => {
                let size = self.pool.status().max_size;
                Err(StoreError::unavailable(
                    format!(
                        "{what} failed: none of the {size} request connections came free \
                         within {:?}; raise max_connections or acquire_timeout, or look \
                         for what holds the database's locks",
                        self.acquire_timeout
                    ),
                    "timed out waiting for a connection",
                ))
            }
        }
    }
}

/// Closes the connections that sat idle past `ageing.idle_timeout` (or outlived
/// `ageing.max_lifetime`), looking a few times per idle timeout, until the pool is
/// dropped. A connection closes by being dropped: sqlx then shuts its socket.
async fn reap_idle<C: Connection>(pool: managed::WeakPool<Manager<C>>, ageing: Ageing) {
    loop {
        tokio::time::sleep(ageing.check_every()).await;
        let Some(pool) = pool.upgrade() else { return };
        drop(pool.retain(|_, m| ageing.keeps(m.last_used(), m.age())));
    }
}

/// A connection taken from a [`RequestPool`] for one statement: it goes back by
/// [`Pooled::finish`] when the statement ended in a way that leaves the session usable,
/// and is closed otherwise, also when dropped before (a cancelled request).
pub(crate) struct Pooled<C: Connection> {
    conn: Option<Object<Manager<C>>>,
}

impl<C: Connection> Pooled<C> {
    /// The connection, for the statement.
    pub(crate) fn conn(&mut self) -> &mut C {
        // Present until `finish` or drop, which consume it.
        self.conn
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("a Pooled holds its connection until consumed"))
    }

    /// Ends the statement's use of the connection with its `result`: back to the pool
    /// unless `result` is an error that may have left the session in an unknown state.
    pub(crate) fn finish<T>(mut self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if result.as_ref().err().is_none_or(leaves_session_usable) {
            // Dropping the pool's object returns the connection.
            drop(self.conn.take());
        }
        result
    }
}

impl<C: Connection> Drop for Pooled<C> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Unfinished (cancelled mid-statement) or failed: out of the pool, closed.
            drop(Object::take(conn));
        }
    }
}

/// Errors after which the driver has read the whole answer: the database refused the
/// statement, or the rows were not as expected. Any other (I/O, protocol, TLS, a
/// crashed worker) closes the connection.
fn leaves_session_usable(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Database(_)
            | sqlx::Error::RowNotFound
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::ColumnIndexOutOfBounds { .. }
            | sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::TypeNotFound { .. }
    )
}

#[cfg(test)]
mod tests {
    /// The ageing checks (`sql::ageing_checks`) on PostgreSQL connections, whose
    /// backends `pg_stat_activity` names.
    #[cfg(feature = "postgres")]
    mod ageing {
        use std::str::FromStr;
        use std::time::Duration;

        use sqlx::postgres::{PgConnectOptions, PgConnection};

        use super::super::RequestPool;
        use crate::store::sql::Ageing;
        use crate::store::sql::ageing_checks::{self, AgeingPool, SHORT_IDLE, SHORT_LIFETIME};

        fn pool(ageing: Ageing) -> RequestPool<PgConnection> {
            let url = ageing_checks::url();
            let options = PgConnectOptions::from_str(&url).expect("IDEMKEY_POSTGRES_URL");
            RequestPool::with_ageing(options, 4, Duration::from_secs(10), ageing).expect("a pool")
        }

        impl AgeingPool for RequestPool<PgConnection> {
            async fn backend(&self) -> i32 {
                let mut conn = self.get("test").await.unwrap_or_else(|e| {
                    panic!("PostgreSQL unreachable (set IDEMKEY_POSTGRES_URL): {e}")
                });
                let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(conn.conn())
                    .await;
                conn.finish(pid).expect("pg_backend_pid")
            }

            async fn alive(&self, pid: i32) -> bool {
                let mut conn = self.get("test").await.expect("a connection");
                let n: Result<i64, _> =
                    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                        .bind(pid)
                        .fetch_one(conn.conn())
                        .await;
                conn.finish(n).expect("pg_stat_activity") == 1
            }

            fn size(&self) -> usize {
                self.pool.status().size
            }
        }

        #[tokio::test]
        async fn a_connection_past_its_lifetime_is_replaced() {
            ageing_checks::a_connection_past_its_lifetime_is_replaced(pool(SHORT_LIFETIME)).await;
        }

        #[tokio::test]
        async fn an_idle_connection_is_closed() {
            ageing_checks::an_idle_connection_is_closed(pool(SHORT_IDLE)).await;
        }
    }
}
