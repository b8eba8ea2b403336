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
//! start. A request waits for its answer at most the store's busy timeout (as it waited
//! for a pooled connection), then gets unavailable. A read whose request went away
//! (cancelled, or out of time) before a thread took it is skipped; one already running
//! finishes, and the thread's connection serves the next. A read that panics ends with
//! an error, not its thread. [`Readers::close`] lets the threads run the reads queued
//! before it, then ends them and closes their connections; reads after it fail
//! unavailable at once, as on a closed sqlx pool.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::super::StoreError;
use super::super::sql::ClaimRow;

/// A read for the connection of a reading thread.
type Job = Box<dyn FnOnce(&mut rusqlite::Connection) + Send>;

/// The store's reading threads and the queue they take reads from.
pub(super) struct Readers {
    /// The queue's one sender; `None` once closed, which ends the threads when they
    /// have emptied the queue.
    queue: Mutex<Option<flume::Sender<Job>>>,
    /// The threads, joined by [`Readers::close`].
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// How long a request waits for its answer: the store's busy timeout.
    timeout: Duration,
}

impl Readers {
    /// `n` reading threads (at least 1) on the database at `path`, each with its
    /// connection; a read waits for a lock (only while the WAL is reset or recovered)
    /// and a request for its answer at most `busy_timeout`.
    pub(super) async fn open(
        path: &Path,
        n: usize,
        busy_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let path = path.to_owned();
        // Opening a file blocks: not on a runtime thread.
        tokio::task::spawn_blocking(move || {
            let connections = (0..n.max(1))
                .map(|_| connect(&path, busy_timeout))
                .collect::<Result<Vec<_>, _>>()?;
            let (queue, reads) = flume::unbounded();
            let mut threads = Vec::with_capacity(connections.len());
            for (i, mut conn) in connections.into_iter().enumerate() {
                let reads = reads.clone();
                // On an error, dropping the queue ends the threads started so far.
                let thread = std::thread::Builder::new()
                    .name(format!("idemkey-sqlite-reader-{i}"))
                    .spawn(move || serve(&mut conn, &reads))
                    .map_err(|e| StoreError::unavailable("SQLite: starting a reading thread", e))?;
                threads.push(thread);
            }
            Ok(Self {
                queue: Mutex::new(Some(queue)),
                threads: Mutex::new(threads),
                timeout: busy_timeout,
            })
        })
        .await
        .map_err(|e| StoreError::unavailable("SQLite: opening the reading connections", e))?
    }

    /// `read`'s answer from the first free reading thread's connection, within the
    /// busy timeout.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let failed = |why: &str| StoreError::unavailable("SQLite: reading a record failed", why);
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // Its request went away: nobody would read the answer.
            if !answer.is_closed() {
                let _ = answer.send(read(conn));
            }
        });
        {
            let queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            let queue = queue
                .as_ref()
                .ok_or_else(|| failed("the store is closed"))?;
            queue
                .send(job)
                .map_err(|_| failed("the store's reading threads ended"))?;
        }
        match tokio::time::timeout(self.timeout, answered).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(failed("the read panicked on its reading thread")),
            Err(_) => Err(StoreError::unavailable(
                format!(
                    "SQLite: reading a record took longer than the busy timeout ({:?}): every \
                     reading connection was busy; raise max_connections or busy_timeout",
                    self.timeout
                ),
                "timed out",
            )),
        }
    }

    /// Closes the queue, lets the threads run the reads queued before, then waits for
    /// them to end, each closing its connection.
    pub(super) async fn close(&self) {
        drop(
            self.queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        // Joining blocks: not on a runtime thread.
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// A reading thread: runs each read it takes on `conn` until the queue is closed and
/// empty, or the store dropped.
fn serve(conn: &mut rusqlite::Connection, reads: &flume::Receiver<Job>) {
    while let Ok(job) = reads.recv() {
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
