//! The SQLite store's reads of the request path on rusqlite connections, each served by
//! a thread of its own.
//!
//! A claim first reads the live record; a replay ends there. On sqlx each read went to
//! its connection's worker thread and back, and the pool returned the connection
//! through a task: a replay cost 5 times the bare handler's CPU, nearly half of it
//! futex calls and switches. Here the request hands its read to a reading thread
//! through a channel and waits on a oneshot for the answer, one hand-off each way:
//! measured with `load`'s SQL floor (`LOAD_SQL_FLOOR=rusqlite-threads`, `BENCHMARKS.md`,
//! "Stores"). A reading thread never holds a runtime thread while it waits for the
//! file, which a read on the request's own thread would. The threads take reads from
//! one queue, the first free thread the next read, as a pool hands out its first free
//! connection: a long read (a large stored response) holds up only its own thread.
//!
//! A read of a WAL database waits for no writer: it sees the last commit as of its
//! start. A request cancelled while its read runs leaves the read to finish; the
//! thread's connection serves the next one. A job that panics ends its read with an
//! error, not the thread. [`Readers::close`] ends the threads (and closes their
//! connections) once the reads queued before it have run; reads after it fail
//! unavailable, as on a closed sqlx pool.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::Duration;

use super::super::StoreError;
use super::super::sql::ClaimRow;

/// A read for the connection of a reading thread.
type Job = Box<dyn FnOnce(&mut rusqlite::Connection) + Send>;

/// What a reading thread is sent.
enum Message {
    Read(Job),
    Close,
}

/// The store's reading threads and the queue they take reads from.
pub(super) struct Readers {
    queue: flume::Sender<Message>,
    threads: usize,
}

impl Readers {
    /// `n` reading threads (at least 1) on the database at `path`, each with its
    /// connection: `busy_timeout` as the store's (a read waits for a lock only while
    /// the WAL is reset or recovered).
    pub(super) async fn open(
        path: &Path,
        n: usize,
        busy_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let path = path.to_owned();
        // Opening a file blocks: not on a runtime thread.
        tokio::task::spawn_blocking(move || {
            let threads = n.max(1);
            let connections = (0..threads)
                .map(|_| connect(&path, busy_timeout))
                .collect::<Result<Vec<_>, _>>()?;
            let (queue, reads) = flume::unbounded();
            for (i, mut conn) in connections.into_iter().enumerate() {
                let reads = reads.clone();
                std::thread::Builder::new()
                    .name(format!("idemkey-sqlite-reader-{i}"))
                    .spawn(move || serve(&mut conn, &reads))
                    .map_err(|e| StoreError::unavailable("SQLite: starting a reading thread", e))?;
            }
            Ok(Self { queue, threads })
        })
        .await
        .map_err(|e| StoreError::unavailable("SQLite: opening the reading connections", e))?
    }

    /// `read`'s answer from the next reading thread's connection.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = answer.send(read(conn));
        });
        let gone = || {
            StoreError::unavailable(
                "SQLite: reading a record failed",
                "the store's reading connections are closed",
            )
        };
        self.queue.send(Message::Read(job)).map_err(|_| gone())?;
        answered.await.map_err(|_| {
            StoreError::unavailable(
                "SQLite: reading a record failed",
                "its reading thread dropped the read: the store was closed, or the read panicked",
            )
        })?
    }

    /// Ends every reading thread once the reads queued before have been taken,
    /// closing its connection: each thread ends at the first `Close` it takes.
    pub(super) fn close(&self) {
        for _ in 0..self.threads {
            let _ = self.queue.send(Message::Close);
        }
    }
}

/// A reading thread: runs each read it takes on `conn` until it takes a `Close`, or the
/// store is dropped.
fn serve(conn: &mut rusqlite::Connection, reads: &flume::Receiver<Message>) {
    while let Ok(Message::Read(job)) = reads.recv() {
        // A panic drops the job's answer channel: its request gets an error.
        let _ = catch_unwind(AssertUnwindSafe(|| job(conn)));
    }
}

/// A reading connection to `path`, as the store's sqlx connections are opened.
fn connect(path: &Path, busy_timeout: Duration) -> Result<rusqlite::Connection, StoreError> {
    let opening = |e| StoreError::unavailable(format!("SQLite: opening {}", path.display()), e);
    let conn = rusqlite::Connection::open(path).map_err(opening)?;
    conn.busy_timeout(busy_timeout).map_err(opening)?;
    Ok(conn)
}

/// `e` as the store reports a failed read.
pub(super) fn read_failed(e: rusqlite::Error) -> StoreError {
    StoreError::unavailable(format!("SQLite: reading a record failed ({e})"), e)
}

impl ClaimRow for rusqlite::Row<'_> {
    fn boolean(&self, column: &str) -> Result<bool, String> {
        self.get(column).map_err(|e| e.to_string())
    }

    fn integer(&self, column: &str) -> Result<i64, String> {
        self.get(column).map_err(|e| e.to_string())
    }

    /// A BLOB, or TEXT as its bytes, as sqlx reads either (SQLite's columns take any
    /// type: a table written by another tool may hold TEXT).
    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, String> {
        use rusqlite::types::ValueRef;
        match self.get_ref(column).map_err(|e| e.to_string())? {
            ValueRef::Null => Ok(None),
            ValueRef::Blob(b) | ValueRef::Text(b) => Ok(Some(b.to_vec())),
            other => Err(format!(
                "{} in column {column}, where bytes were expected",
                other.data_type()
            )),
        }
    }
}
