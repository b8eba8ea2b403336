//! SQLite-specific behaviour: records survive a restart and a crash of the process.

use crate::support;

use std::time::Duration;

use idemkey::store::{Claim, ClaimRequest, FencingToken, RecordId, SqliteStore, Store};
use idemkey::testing::conformance;

const LONG: Duration = Duration::from_secs(3600);

/// Claims and completes `id` with `payload`.
async fn complete(store: &dyn Store, id: &RecordId, payload: &'static str) {
    let token = FencingToken::random();
    let claim = store
        .claim(ClaimRequest {
            id,
            fingerprint: b"fp",
            token,
            lease: LONG,
            retention: LONG,
        })
        .await
        .expect("claim");
    assert_eq!(claim, Claim::Acquired { takeover: false });
    store
        .complete(id, token, payload.into(), LONG)
        .await
        .expect("complete");
}

async fn expect_completed(store: &dyn Store, id: &RecordId, payload: &'static str) {
    let claim = store
        .claim(ClaimRequest {
            id,
            fingerprint: b"other",
            token: FencingToken::random(),
            lease: LONG,
            retention: LONG,
        })
        .await
        .expect("claim");
    assert_eq!(
        claim,
        Claim::Completed {
            fingerprint: "fp".into(),
            payload: payload.into()
        },
        "the completed record must survive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_several_stores_on_one_file_are_atomic() {
    // Each store has a writing connection of its own, so SQLite's file lock decides,
    // not one store's writing thread.
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("records.db");
    support::claims_over_four_instances(3, async || {
        SqliteStore::builder(&path).open().await.expect("open")
    })
    .await;
}

#[tokio::test]
async fn records_survive_reopening_the_file() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("records.db");
    let id = RecordId::new("t", "k");
    let held = RecordId::new("t", "held");
    let owner = FencingToken::random();
    {
        let store = SqliteStore::open(&path).await.expect("open");
        complete(&store, &id, "kept").await;
        store
            .claim(ClaimRequest {
                id: &held,
                fingerprint: b"h",
                token: owner,
                lease: LONG,
                retention: LONG,
            })
            .await
            .expect("claim");
        store.close().await;
    }
    let store = SqliteStore::open(&path).await.expect("reopen");
    expect_completed(&store, &id, "kept").await;
    // A lease outlives the restart too, and its owner's token still holds it.
    store
        .renew(&held, owner, LONG)
        .await
        .expect("the lease survived the restart");
    store.close().await;
}

/// Set in the child process of [`completed_records_survive_a_crash`].
const CRASH_PATH: &str = "IDEMKEY_TEST_SQLITE_CRASH_PATH";

/// The child half of [`completed_records_survive_a_crash`]: completes a record, then
/// aborts the process without closing anything. A no-op when run as a plain test.
#[tokio::test]
async fn crash_child() {
    let Ok(path) = std::env::var(CRASH_PATH) else {
        return;
    };
    let store = SqliteStore::open(&path).await.expect("open in the child");
    complete(&store, &RecordId::new("t", "crash"), "durable").await;
    std::process::abort();
}

#[tokio::test]
async fn completed_records_survive_a_crash() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("records.db");
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            &support::test_name(module_path!(), "crash_child"),
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CRASH_PATH, &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run the crashing child");
    assert!(
        !status.success(),
        "the child must have aborted, got {status}"
    );
    assert!(
        dir.path().join("records.db-wal").exists(),
        "the crash left the write-ahead log behind (nothing was checkpointed)"
    );
    let store = SqliteStore::open(&path)
        .await
        .expect("reopen after the crash");
    expect_completed(&store, &RecordId::new("t", "crash"), "durable").await;
    store.close().await;
}

#[tokio::test]
async fn sweep_deletes_expired_rows_and_names_are_checked() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let store = SqliteStore::builder(dir.path().join("r.db"))
        .table("my_records")
        .open()
        .await
        .expect("open");
    let token = FencingToken::random();
    let id = RecordId::new("t", "short");
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease: LONG,
            retention: LONG,
        })
        .await
        .expect("claim");
    store
        .complete(&id, token, "p".into(), Duration::from_millis(50))
        .await
        .expect("complete");
    complete(&store, &RecordId::new("t", "long"), "p").await;
    let mut swept = 0;
    for _ in 0..200 {
        swept += store.sweep().await.expect("sweep");
        if swept > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(swept, 1, "only the expired record is swept");
    store.close().await;

    for bad in ["a.b", "x y", ""] {
        let err = SqliteStore::builder(dir.path().join("r.db"))
            .table(bad)
            .open()
            .await
            .expect_err("invalid table name");
        assert!(err.is_configuration(), "{err}");
    }
}

/// A file in a directory that does not exist is a configuration error that names the
/// directory, not an outage to retry.
#[tokio::test]
async fn a_missing_directory_is_a_configuration_error() {
    let dir = support::TempDir::new("sqlite-missing-dir");
    let missing = dir.path().join("no-such-dir");
    let url = format!("sqlite://{}", missing.join("records.db").display());
    let err = idemkey::store::open(&url)
        .await
        .err()
        .expect("no directory");
    assert!(err.is_configuration() && !err.is_unavailable(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("does not exist") && text.contains("no-such-dir"),
        "{text}"
    );
    assert!(!missing.exists(), "nothing was created");
}

/// A file that is not a SQLite database (another program's file, a path mistyped onto
/// one) is the configuration's fault: retrying will not help, and the file is left as
/// it was.
#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_configuration_error() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("notes.txt");
    let text = "not a database, but somebody's notes\n".repeat(200);
    std::fs::write(&path, &text).expect("write the file");
    let err = idemkey::store::open(&format!("sqlite://{}", path.display()))
        .await
        .err()
        .expect("not a database");
    assert!(err.is_configuration() && !err.is_unavailable(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("not a SQLite database") && message.contains("notes.txt"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).expect("read the file"),
        text,
        "the file is unchanged"
    );
}

/// Each reading connection has a thread of its own, so a pool-sized setting (hundreds,
/// thousands) is refused with the limit, before any file is made.
#[tokio::test]
async fn too_many_reading_connections_is_a_configuration_error() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("many.db");
    for n in [65, u32::MAX] {
        let err = SqliteStore::builder(&path)
            .max_connections(n)
            .open()
            .await
            .expect_err("too many reading connections");
        assert!(err.is_configuration() && !err.is_unavailable(), "{err}");
        assert!(err.to_string().contains("at most 64"), "{err}");
    }
    assert!(!path.exists(), "nothing was created");
    let store = SqliteStore::builder(&path)
        .max_connections(64)
        .open()
        .await
        .expect("64 reading connections");
    store.close().await;
}

/// `sqlite://:memory:` is one in-memory database shared by every request (it used to be
/// one empty database per connection: "no such table" on the readers), and passes the
/// conformance suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_memory_is_one_shared_database() {
    let store = idemkey::store::open("sqlite://:memory:")
        .await
        .expect("opens");
    let id = RecordId::new("s", "k-memory");
    complete(&*store, &id, "done").await;
    // The claim reads before it writes: the reading side sees the table and the record.
    expect_completed(&*store, &id, "done").await;
    conformance::run(|| async { SqliteStore::open(":memory:").await.expect("opens") }).await;
}

/// Opening a file whose table has the schema before contract v2 (no `created`, no
/// `retention`, no in-progress index) upgrades it in place: its rows stay readable and
/// writable, and the store then passes the conformance suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opening_upgrades_a_table_of_the_previous_schema() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("old.db");
    let rows = support::PreviousRows::new();
    let later = i64::try_from(
        (std::time::SystemTime::now() + LONG)
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits");
    {
        let old = sqlx::SqlitePool::connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true),
        )
        .await
        .expect("create a file of the previous version");
        sqlx::raw_sql(
            "CREATE TABLE \"idemkey_records\" (
    id          BLOB    PRIMARY KEY,
    fingerprint BLOB    NOT NULL,
    token       BLOB,
    payload     BLOB,
    taken_over  INTEGER NOT NULL DEFAULT 0,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX \"idemkey_records_expires_at\" ON \"idemkey_records\" (expires_at);",
        )
        .execute(&old)
        .await
        .expect("the previous schema");
        sqlx::query(
            "INSERT INTO idemkey_records (id, fingerprint, token, payload, expires_at) VALUES
  ($1, x'6670', NULL, 'old payload', $4), ($2, x'6670', $3, NULL, $4)",
        )
        .bind(rows.done.as_bytes().to_vec())
        .bind(rows.running.as_bytes().to_vec())
        .bind(rows.owner.to_bytes().to_vec())
        .bind(later)
        .execute(&old)
        .await
        .expect("rows of the previous version");
        old.close().await;
    }
    let upgrading = std::time::SystemTime::now();
    let store = SqliteStore::open(&path)
        .await
        .expect("open upgrades the table");
    rows.expect_upgraded(&store, upgrading).await;
    store.close().await;

    // Opening the upgraded file again changes nothing.
    let store = SqliteStore::open(&path).await.expect("reopen");
    expect_completed(&store, &rows.running, "late").await;
    conformance::run(|| {
        let store = store.clone();
        async move { store }
    })
    .await;
    store.close().await;
}

/// A claim's read of the live record runs on a reading thread's connection: requests
/// that go away while their reads run leave those reads to finish, and the thread's
/// connection goes on answering (one reading connection here, so every read is its).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_reads_leave_the_reading_connection_serving() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let store = SqliteStore::builder(dir.path().join("cancelled.db"))
        .max_connections(1)
        .open()
        .await
        .expect("open");
    let id = RecordId::new("t", "replayed");
    complete(&store, &id, "stored").await;
    let mut cancelled = 0;
    for _ in 0..500 {
        let mut read = std::pin::pin!(store.claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: LONG,
            retention: LONG,
        }));
        // Polled once (the read is handed to the thread), then dropped.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx)));
        if first.await.is_pending() {
            cancelled += 1;
        }
    }
    assert!(cancelled > 0, "no read was cancelled mid-flight");
    expect_completed(&store, &id, "stored").await;
    store.close().await;
}

/// Closing a store ends its reading threads too: a clone's claim is then answered
/// unavailable, at once, and never served from a connection left open.
#[tokio::test]
async fn a_closed_store_answers_unavailable() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let store = SqliteStore::open(dir.path().join("closed.db"))
        .await
        .expect("open");
    let id = RecordId::new("t", "done");
    complete(&store, &id, "stored").await;
    let clone = store.clone();
    store.close().await;
    let claim = clone
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: LONG,
            retention: LONG,
        })
        .await;
    let err = claim.expect_err("a closed store must not answer");
    assert!(err.is_unavailable(), "{err}");
}

/// Claims racing a close all end: those whose reads were queued before it are answered,
/// the rest are answered unavailable; none waits for a thread that has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_racing_a_close_all_end() {
    let dir = support::TempDir::new("idemkey-sqlite");
    let store = SqliteStore::open(dir.path().join("racing.db"))
        .await
        .expect("open");
    complete(&store, &RecordId::new("t", "done"), "stored").await;
    let claims: Vec<_> = (0..200)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .claim(ClaimRequest {
                        id: &RecordId::new("t", "done"),
                        fingerprint: b"fp",
                        token: FencingToken::random(),
                        lease: LONG,
                        retention: LONG,
                    })
                    .await
            })
        })
        .collect();
    store.close().await;
    for claim in claims {
        match claim.await.expect("the claim's task") {
            Ok(Claim::Completed { payload, .. }) => assert_eq!(payload, "stored"),
            Err(e) => assert!(e.is_unavailable(), "{e}"),
            Ok(other) => panic!("a completed record claimed as {other:?}"),
        }
    }
}

/// The store's writes wait for a write lock another connection holds (another process
/// on the file, the inbox's caller) up to the busy timeout: the claim succeeds once the
/// lock is let go within it, and fails unavailable, having written nothing, when it is
/// held past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_a_lock_held_elsewhere_up_to_the_busy_timeout() {
    use sqlx::Connection;
    let dir = support::TempDir::new("idemkey-sqlite");
    let path = dir.path().join("locked.db");
    let claim = |store: &SqliteStore, key: &'static str| {
        let store = store.clone();
        async move {
            store
                .claim(ClaimRequest {
                    id: &RecordId::new("t", key),
                    fingerprint: b"fp",
                    token: FencingToken::random(),
                    lease: LONG,
                    retention: LONG,
                })
                .await
        }
    };
    let lock = || async {
        let mut other = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("another connection");
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .expect("the write lock");
        other
    };

    let open = |busy_timeout| {
        SqliteStore::builder(&path)
            .busy_timeout(busy_timeout)
            .open()
    };
    let patient = open(Duration::from_secs(60)).await.expect("open");
    let mut other = lock().await;
    let waiting = tokio::spawn(claim(&patient, "waited"));
    // Without the busy timeout the claim would fail at once (`SQLITE_BUSY`); it waits
    // for the lock instead (its read needs none).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the claim waits for the lock");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("let go of the lock");
    let claimed = waiting.await.expect("the claim's task").expect("claimed");
    assert_eq!(claimed, Claim::Acquired { takeover: false });
    patient.close().await;

    let hasty = open(Duration::from_millis(200)).await.expect("reopen");
    let mut other = lock().await;
    let err = claim(&hasty, "refused")
        .await
        .expect_err("the lock is held");
    assert!(err.is_unavailable(), "{err}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("let go of the lock");
    // Whatever the store had queued has run by the time it is closed.
    hasty.close().await;
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM idemkey_records")
        .fetch_one(&mut other)
        .await
        .expect("count the records");
    assert_eq!(records, 1, "the refused claim wrote nothing");
}
