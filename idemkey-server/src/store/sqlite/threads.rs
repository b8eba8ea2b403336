//! The SQLite store's connections (rusqlite), each served by a thread of its own: the
//! reading connections, and the one writing connection.
//!
//! On sqlx every statement went to its connection's worker thread and back, and the
//! pool returned the connection through a task: a replay cost 5 times the bare
//! handler's CPU, nearly half of it futex calls and switches, and a fresh request 1.7
//! times what the same statements cost on rusqlite. Here the request hands its
//! statement to a connection's thread through a channel and waits on a oneshot for the
//! answer, one hand-off each way: measured with `load`'s SQL floor
//! (`LOAD_SQL_FLOOR=rusqlite-threads`, `BENCHMARKS.md`, "Stores"). No runtime thread
//! waits for the file or for a disk sync, which a statement on the request's own thread
//! would. The threads of a group take statements from one queue, the first free thread
//! the next, as a pool hands out its first free connection: a long read (a large stored
//! response) holds up only its own thread.
//!
//! A request waits for a thread to take its statement at most the store's busy timeout
//! (as it waited for a pooled connection), then gets unavailable, and the statement
//! never runs; once taken, the statement runs to its end (a lock it waits for is
//! bounded by SQLite's own busy timeout), and its answer is the request's, so a write
//! the request was told failed was not made (short of a panic after its commit). A
//! statement whose request went away (cancelled) before a thread took it is skipped;
//! one already running finishes, and the thread's connection serves the next. A
//! statement that panics ends with an error, not its thread. [`Threads::close`] lets
//! the threads run the statements queued before it, then ends them and closes their
//! connections, and every caller of it waits for that; statements after it fail
//! unavailable at once, as on a closed sqlx pool.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::super::StoreError;
use super::super::sql::RecordRow;

/// A statement for the connection of a thread.
type Job = Box<dyn FnOnce(&mut rusqlite::Connection) + Send>;

/// What a group of the store's connections is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The one writing connection (in memory, the one connection, which reads too).
    Writing,
    /// The reading connections.
    Reading,
}

impl Role {
    /// The role's name, for the threads' names and errors.
    fn name(self) -> &'static str {
        match self {
            Role::Writing => "writing",
            Role::Reading => "reading",
        }
    }

    /// Why a statement waited longer than the busy timeout for a connection of this
    /// role, and what to raise.
    fn when_busy(self) -> &'static str {
        match self {
            Role::Writing => {
                "SQLite writes one statement at a time, and the writes queued ahead took \
                 that long (or another process held the file's write lock); raise \
                 busy_timeout"
            }
            Role::Reading => {
                "every reading connection was busy; raise max_connections or busy_timeout"
            }
        }
    }
}

/// A group of connections, each with its thread, and the queue they take statements
/// from.
pub(super) struct Threads {
    /// The queue's one sender; `None` once closed, which ends the threads when they
    /// have emptied the queue.
    queue: Mutex<Option<flume::Sender<Job>>>,
    /// The threads, joined by [`Threads::close`]; held while they are joined, so that
    /// a second caller waits for the first's join.
    threads: tokio::sync::Mutex<Vec<JoinHandle<()>>>,
    /// How long a request waits for a thread to take its statement: the store's busy
    /// timeout.
    timeout: Duration,
    /// What the connections are for.
    role: Role,
}

impl Threads {
    /// `n` threads (at least 1), each with a connection for `role` to the database at
    /// `path`; a statement waits for a lock, and a request for a thread to take its
    /// statement, at most `busy_timeout`.
    pub(super) async fn open(
        role: Role,
        n: usize,
        path: &Path,
        busy_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let path = path.to_owned();
        let name = role.name();
        // Opening a file blocks: not on a runtime thread.
        tokio::task::spawn_blocking(move || {
            let connections = (0..n.max(1))
                .map(|_| connect(&path, busy_timeout, role))
                .collect::<Result<Vec<_>, _>>()?;
            let (queue, jobs) = flume::unbounded();
            let mut threads = Vec::with_capacity(connections.len());
            for (i, mut conn) in connections.into_iter().enumerate() {
                let jobs = jobs.clone();
                // On an error, dropping the queue ends the threads started so far.
                let thread = std::thread::Builder::new()
                    .name(format!("idemkey-sqlite-{name}-{i}"))
                    .spawn(move || serve(&mut conn, &jobs))
                    .map_err(|e| {
                        StoreError::unavailable(format!("SQLite: starting a {name} thread"), e)
                    })?;
                threads.push(thread);
            }
            Ok(Self {
                queue: Mutex::new(Some(queue)),
                threads: tokio::sync::Mutex::new(threads),
                timeout: busy_timeout,
                role,
            })
        })
        .await
        .map_err(|e| {
            StoreError::unavailable(format!("SQLite: opening the {name} connections"), e)
        })?
    }

    /// `job`'s answer from the first free thread's connection, if one takes it within
    /// the busy timeout; `what` the request does, for errors ("claiming a record").
    pub(super) async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        job: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let failed = |why: &str| StoreError::unavailable(format!("SQLite: {what} failed"), why);
        let (answer, mut answered) = tokio::sync::oneshot::channel();
        // Set by whichever comes first: the thread taking the job, or the request
        // giving up on it.
        let taken = Arc::new(AtomicBool::new(false));
        let job: Job = {
            let taken = Arc::clone(&taken);
            Box::new(move |conn| {
                // Its request went away, or gave up waiting: nobody would read the answer.
                if !answer.is_closed() && !taken.swap(true, Ordering::AcqRel) {
                    let _ = answer.send(job(conn));
                }
            })
        };
        {
            let queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            let queue = queue
                .as_ref()
                .ok_or_else(|| failed("the store is closed"))?;
            queue
                .send(job)
                .map_err(|_| failed("the store's connection threads ended"))?;
        }
        let answer = match tokio::time::timeout(self.timeout, &mut answered).await {
            Ok(answer) => answer,
            // A thread took it: the statement runs to its end, so wait for its answer.
            Err(_) if taken.swap(true, Ordering::AcqRel) => answered.await,
            Err(_) => {
                return Err(StoreError::unavailable(
                    format!(
                        "SQLite: {what} waited longer than the busy timeout ({:?}) for a \
                         {} connection, and was not run: {}",
                        self.timeout,
                        self.role.name(),
                        self.role.when_busy(),
                    ),
                    "timed out",
                ));
            }
        };
        answer.unwrap_or_else(|_| Err(failed("the statement panicked on its connection's thread")))
    }

    /// Closes the queue, lets the threads run the statements queued before, then waits
    /// for them to end, each closing its connection.
    pub(super) async fn close(&self) {
        drop(
            self.queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let mut threads = self.threads.lock().await;
        let joining = std::mem::take(&mut *threads);
        // Joining blocks: not on a runtime thread.
        let _ = tokio::task::spawn_blocking(move || {
            for thread in joining {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// A connection's thread: runs each statement it takes on `conn` until the queue is
/// closed and empty, or the store dropped.
fn serve(conn: &mut rusqlite::Connection, jobs: &flume::Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        // A panic drops the job's answer channel: its request gets an error.
        let _ = catch_unwind(AssertUnwindSafe(|| job(conn)));
    }
}

/// A connection for `role` to `path`: every connection waits for a lock at most
/// `busy_timeout`; the writing connection puts the file in WAL mode (kept in the file;
/// an in-memory database keeps its own journal) and syncs each commit to disk
/// (`synchronous = FULL`).
fn connect(
    path: &Path,
    busy_timeout: Duration,
    role: Role,
) -> Result<rusqlite::Connection, StoreError> {
    let opening = |e| opening_failed(path, e);
    let conn = rusqlite::Connection::open(path).map_err(opening)?;
    conn.busy_timeout(busy_timeout).map_err(opening)?;
    if role == Role::Writing {
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(opening)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(opening)?;
    }
    Ok(conn)
}

/// A connection to `path` that could not be opened: a configuration error when the file
/// is not a SQLite database (retrying will not change that), unavailable otherwise.
fn opening_failed(path: &Path, e: rusqlite::Error) -> StoreError {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
        return StoreError::configuration_from(
            format!(
                "SQLite: {} is not a SQLite database ({e}); point the store at its database \
                 file, or at a new path where it creates one",
                path.display()
            ),
            e,
        );
    }
    StoreError::unavailable(
        format!("SQLite: opening {} failed ({e})", path.display()),
        e,
    )
}

/// The error of a statement of `what` the request does ("claiming a record").
pub(super) fn failed(what: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::unavailable(format!("SQLite: {what} failed ({e})"), e)
}

impl RecordRow for rusqlite::Row<'_> {
    fn boolean(&self, column: &str) -> Result<bool, String> {
        self.get(column).map_err(|e| e.to_string())
    }

    fn integer(&self, column: &str) -> Result<Option<i64>, String> {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use std::path::Path;

    use super::{Role, Threads};

    /// One writing thread on an in-memory database, giving up on a statement after
    /// `timeout`.
    async fn one_thread(timeout: Duration) -> Arc<Threads> {
        let threads = Threads::open(Role::Writing, 1, Path::new(":memory:"), timeout).await;
        Arc::new(threads.expect("one thread"))
    }

    /// A statement that holds its thread until the returned sender is used, put on
    /// `threads`: once a thread took it, its request's task (answered 1) and the sender.
    async fn hold(
        threads: &Arc<Threads>,
    ) -> (
        tokio::task::JoinHandle<Result<i32, super::super::super::StoreError>>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (started, taken) = tokio::sync::oneshot::channel();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let request = tokio::spawn({
            let threads = Arc::clone(threads);
            async move {
                threads
                    .run("a long statement", move |_| {
                        let _ = started.send(());
                        let _ = held.recv();
                        Ok(1)
                    })
                    .await
            }
        });
        taken
            .await
            .expect("a thread takes the statement within the timeout");
        (request, release)
    }

    /// A statement a thread took runs to its end and its request gets the answer, even
    /// past the timeout; one still queued when its request's timeout passes is never
    /// run, even once the thread is free (so a write reported failed was not made).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_taken_statement_answers_and_one_given_up_never_runs() {
        let timeout = Duration::from_millis(500);
        let threads = one_thread(timeout).await;
        let (first, release) = hold(&threads).await;
        // The first request's timeout passes while its statement runs.
        tokio::time::sleep(timeout + Duration::from_millis(100)).await;
        assert!(
            !first.is_finished(),
            "the first request waits for its answer"
        );

        let ran = Arc::new(AtomicBool::new(false));
        let second = {
            let ran = Arc::clone(&ran);
            threads.run("the second", move |_| {
                ran.store(true, Ordering::SeqCst);
                Ok(2)
            })
        };
        let err = second
            .await
            .expect_err("the thread stays busy past the timeout");
        assert!(err.is_unavailable(), "{err}");
        assert!(err.to_string().contains("was not run"), "{err}");

        release.send(()).expect("the first statement waits");
        assert_eq!(first.await.expect("the first task").expect("answered"), 1);
        // Queued after the second: by its answer the second was skipped or run.
        assert_eq!(
            threads.run("the third", |_| Ok(3)).await.expect("answered"),
            3
        );
        assert!(!ran.load(Ordering::SeqCst), "a statement given up on ran");
        threads.close().await;
    }

    /// Every caller of `close` waits for the threads to end (their connections closed,
    /// the WAL checkpointed), not only the first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_close_waits_for_the_threads() {
        let threads = one_thread(Duration::from_secs(60)).await;
        let (running, release) = hold(&threads).await;
        let closes: Vec<_> = (0..2)
            .map(|_| {
                let threads = Arc::clone(&threads);
                tokio::spawn(async move { threads.close().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            closes.iter().all(|close| !close.is_finished()),
            "a close returned while a thread still ran"
        );
        release.send(()).expect("the statement waits");
        running.await.expect("its task").expect("answered");
        for close in closes {
            close.await.expect("the close's task");
        }
    }

    /// Many requests whose timeouts pass about when the thread takes their statements:
    /// each statement that ran answered its request, and none whose request was told
    /// it was not run ran, whichever of the two came first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_runs_exactly_when_its_request_is_answered_by_it() {
        const REQUESTS: usize = 20_000;
        let threads = one_thread(Duration::from_micros(300)).await;
        let ran: Arc<Vec<AtomicBool>> =
            Arc::new((0..REQUESTS).map(|_| AtomicBool::new(false)).collect());
        let requests: Vec<_> = (0..REQUESTS)
            .map(|i| {
                let (threads, ran) = (Arc::clone(&threads), Arc::clone(&ran));
                tokio::spawn(async move {
                    threads
                        .run("a request", move |_| {
                            ran[i].store(true, Ordering::SeqCst);
                            Ok(i)
                        })
                        .await
                })
            })
            .collect();
        let (mut answered, mut given_up) = (0, 0);
        for (i, request) in requests.into_iter().enumerate() {
            match request.await.expect("the request's task") {
                Ok(n) => {
                    assert_eq!(n, i);
                    answered += 1;
                }
                Err(e) => {
                    assert!(e.to_string().contains("was not run"), "{e}");
                    given_up += 1;
                }
            }
        }
        // Every statement queued before this one was run or skipped by now.
        threads.close().await;
        let ran = ran.iter().filter(|r| r.load(Ordering::SeqCst)).count();
        assert!(
            answered > 0 && given_up > 0,
            "{answered} answered, {given_up} given up on"
        );
        assert_eq!(ran, answered, "statements given up on ran");
    }
}
