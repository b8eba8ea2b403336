//! The transactional inbox (`PostgresStore::once_in`, `SqliteStore::once_in`): the
//! claim, the effect and the result commit in the caller's transaction, or none of
//! them. Real PostgreSQL (a crash is the server ending the connection's backend
//! between the effect and the commit) and a real SQLite file.

use crate::support;

use std::sync::Arc;

use idemkey::fingerprint::Fingerprint;
use idemkey::server::Engine;
use idemkey::store::{PostgresStore, SqliteStore};
use idemkey::{IdempotencyKey, store::RecordId};
use sqlx::{Connection, PgConnection, SqliteConnection};

/// A PostgreSQL store with its own records table, and an account table beside it
/// (balance, and the number of effects applied), both dropped at the end.
struct PgFixture {
    store: PostgresStore,
    table: String,
    accounts: String,
}

impl PgFixture {
    async fn new() -> Self {
        let table = support::unique("idemkey_inbox");
        let store = support::postgres_store(&table).await;
        let accounts = format!("{table}_acct");
        let admin = support::postgres_admin(&support::postgres_url()).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE \"{accounts}\" (id int PRIMARY KEY, balance bigint NOT NULL, effects bigint NOT NULL);
             INSERT INTO \"{accounts}\" VALUES (1, 0, 0)"
        )))
        .execute(&admin)
        .await
        .expect("create the account table");
        admin.close().await;
        Self {
            store,
            table,
            accounts,
        }
    }

    async fn conn(&self) -> PgConnection {
        let url = support::postgres_url();
        PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"))
    }

    /// The charge, as the effect: adds `amount` and counts one effect.
    async fn charge(&self, conn: &mut PgConnection, amount: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "UPDATE \"{}\" SET balance = balance + $1, effects = effects + 1 WHERE id = 1 RETURNING balance",
            self.accounts
        )))
        .bind(amount)
        .fetch_one(conn)
        .await
    }

    /// (balance, effects) as committed.
    async fn account(&self) -> (i64, i64) {
        let mut conn = self.conn().await;
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT balance, effects FROM \"{}\" WHERE id = 1",
            self.accounts
        )))
        .fetch_one(&mut conn)
        .await
        .expect("read the account")
    }

    /// Whether a committed record exists for (scope, key).
    async fn recorded(&self, scope: &str, key: &str) -> bool {
        let mut conn = self.conn().await;
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\" WHERE id = $1",
            self.table
        )))
        .bind(RecordId::new(scope, key).as_bytes().as_slice())
        .fetch_one(&mut conn)
        .await
        .expect("read the records");
        n == 1
    }

    async fn drop_tables(self) {
        support::drop_postgres_table(&self.accounts).await;
        support::drop_postgres_table(&self.table).await;
    }
}

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::new(s).expect("valid key")
}

#[tokio::test]
async fn postgres_commit_then_replay_runs_the_effect_once() {
    let fx = PgFixture::new().await;
    let (k, fp) = (key("msg-1"), Fingerprint::of_bytes(b"charge 250"));
    let mut conn = fx.conn().await;
    for delivery in 0..3 {
        let mut tx = conn.begin().await.expect("begin");
        let settled = fx
            .store
            .once_in(&mut tx, "charges", &k, &fp, async |c| {
                fx.charge(c, 250).await
            })
            .await
            .expect("once_in");
        tx.commit().await.expect("commit");
        assert_eq!(
            *settled.value(),
            250,
            "delivery {delivery} sees the first result"
        );
        assert_eq!(settled.is_replayed(), delivery > 0);
    }
    assert_eq!(fx.account().await, (250, 1));
    // Same addressing as the engine: `Engine::once` on the same store replays it.
    let engine = Engine::new(fx.store.clone());
    let via_engine = engine
        .once("charges", &k, &fp, || async {
            Err::<i64, _>(std::io::Error::other("must not run: recorded by the inbox"))
        })
        .await
        .expect("engine replay");
    assert!(via_engine.is_replayed());
    assert_eq!(*via_engine.value(), 250);
    // A different operation under the same key is refused, and runs nothing.
    let mut tx = conn.begin().await.expect("begin");
    let other = Fingerprint::of_bytes(b"charge 999");
    let reused = fx
        .store
        .once_in(&mut tx, "charges", &k, &other, async |c| {
            fx.charge(c, 999).await
        })
        .await
        .expect_err("key reused");
    assert!(reused.is_key_reused(), "{reused:?}");
    tx.commit().await.expect("commit");
    assert_eq!(fx.account().await, (250, 1));
    drop(conn);
    fx.drop_tables().await;
}

#[tokio::test]
async fn postgres_rollback_leaves_nothing_and_the_redelivery_runs_once() {
    let fx = PgFixture::new().await;
    let (k, fp) = (key("msg-rb"), Fingerprint::of_bytes(b"charge 40"));
    let mut conn = fx.conn().await;
    let mut tx = conn.begin().await.expect("begin");
    let first = fx
        .store
        .once_in(&mut tx, "charges", &k, &fp, async |c| {
            fx.charge(c, 40).await
        })
        .await
        .expect("once_in");
    assert!(!first.is_replayed());
    tx.rollback().await.expect("rollback");
    assert_eq!(fx.account().await, (0, 0), "the effect was rolled back");
    assert!(
        !fx.recorded("charges", "msg-rb").await,
        "and so was the claim"
    );

    // A failing effect rolls its savepoint back: the transaction stays usable, and the
    // key is free for the redelivery.
    let mut tx = conn.begin().await.expect("begin");
    let failed = fx
        .store
        .once_in(&mut tx, "charges", &k, &fp, async |c| {
            fx.charge(c, 40).await?;
            Err::<i64, sqlx::Error>(sqlx::Error::Protocol("the charge was declined".into()))
        })
        .await
        .expect_err("the effect failed");
    assert!(failed.is_failed(), "{failed:?}");
    let again = fx
        .store
        .once_in(&mut tx, "charges", &k, &fp, async |c| {
            fx.charge(c, 40).await
        })
        .await
        .expect("the redelivery in the same transaction");
    assert!(!again.is_replayed());
    tx.commit().await.expect("commit");
    assert_eq!(fx.account().await, (40, 1));
    drop(conn);
    fx.drop_tables().await;
}

#[tokio::test]
async fn postgres_outside_a_transaction_once_in_commits_its_own() {
    let fx = PgFixture::new().await;
    let (k, fp) = (key("msg-own"), Fingerprint::of_bytes(b"charge 9"));
    let mut conn = fx.conn().await;
    for delivery in 0..2 {
        let settled = fx
            .store
            .once_in(&mut conn, "charges", &k, &fp, async |c| {
                fx.charge(c, 9).await
            })
            .await
            .expect("once_in");
        assert_eq!(settled.is_replayed(), delivery > 0);
        // Committed: visible from another connection at once.
        assert_eq!(fx.account().await, (9, 1));
    }
    drop(conn);
    fx.drop_tables().await;
}

#[tokio::test]
async fn postgres_connection_lost_before_commit_leaves_nothing() {
    let fx = PgFixture::new().await;
    let (k, fp) = (key("msg-crash"), Fingerprint::of_bytes(b"charge 7"));
    let mut conn = fx.conn().await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("backend pid");
    let mut tx = conn.begin().await.expect("begin");
    fx.store
        .once_in(&mut tx, "charges", &k, &fp, async |c| fx.charge(c, 7).await)
        .await
        .expect("once_in");
    // The crash: the connection ends between the effect and the commit.
    let mut admin = fx.conn().await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate the backend");
    assert!(ended);
    assert!(tx.commit().await.is_err(), "the commit cannot succeed");
    drop(conn);
    assert_eq!(
        fx.account().await,
        (0, 0),
        "nothing of the effect is visible"
    );
    assert!(!fx.recorded("charges", "msg-crash").await);

    // The redelivery, on a new connection: the effect runs once.
    let mut conn = fx.conn().await;
    for delivery in 0..2 {
        let mut tx = conn.begin().await.expect("begin");
        let settled = fx
            .store
            .once_in(&mut tx, "charges", &k, &fp, async |c| fx.charge(c, 7).await)
            .await
            .expect("once_in");
        tx.commit().await.expect("commit");
        assert_eq!(settled.is_replayed(), delivery > 0);
    }
    assert_eq!(fx.account().await, (7, 1));
    drop((conn, admin));
    fx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_duplicates_wait_and_replay() {
    let fx = Arc::new(PgFixture::new().await);
    const N: usize = 8;
    for (round, first_commits) in [(0, true), (1, false)] {
        let k = key(&format!("msg-dup-{round}"));
        let fp = Fingerprint::of_bytes(format!("charge 100 #{round}").as_bytes());
        // The first transaction claims and holds the row until told to end.
        let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel();
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let (fx, k, fp) = (Arc::clone(&fx), k.clone(), fp);
            tokio::spawn(async move {
                let mut conn = fx.conn().await;
                let mut tx = conn.begin().await.expect("begin");
                fx.store
                    .once_in(&mut tx, "charges", &k, &fp, async |c| {
                        fx.charge(c, 100).await
                    })
                    .await
                    .expect("first once_in");
                claimed_tx.send(()).expect("signal");
                end_rx.await.expect("told to end");
                if first_commits {
                    tx.commit().await.expect("commit");
                } else {
                    tx.rollback().await.expect("rollback");
                }
            })
        };
        claimed_rx.await.expect("the first claimed");
        let mut dups = tokio::task::JoinSet::new();
        let (started_tx, mut started_rx) = tokio::sync::mpsc::channel(N);
        for _ in 0..N {
            let (fx, k, fp, started) = (Arc::clone(&fx), k.clone(), fp, started_tx.clone());
            dups.spawn(async move {
                let mut conn = fx.conn().await;
                let mut tx = conn.begin().await.expect("begin");
                started.send(()).await.expect("signal");
                let settled = fx
                    .store
                    .once_in(&mut tx, "charges", &k, &fp, async |c| {
                        fx.charge(c, 100).await
                    })
                    .await
                    .expect("duplicate once_in");
                tx.commit().await.expect("commit");
                settled.is_replayed()
            });
        }
        for _ in 0..N {
            started_rx.recv().await.expect("a duplicate started");
        }
        // Every duplicate is blocked on the row (or about to be): none can finish
        // while the first transaction is open.
        let admin = support::postgres_admin(&support::postgres_url()).await;
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
                 AND datname = current_database() AND query LIKE 'INSERT INTO \"' || $1 || '\"%'",
            )
            .bind(&fx.table)
            .fetch_one(&admin)
            .await
            .expect("pg_stat_activity");
            if waiting >= i64::try_from(N).expect("small") {
                break;
            }
            assert!(
                dups.try_join_next().is_none(),
                "a duplicate finished while the first was open"
            );
            tokio::task::yield_now().await;
        }
        admin.close().await;
        end_tx.send(()).expect("end the first");
        first.await.expect("first task");
        let replayed = dups.join_all().await;
        let ran = replayed.iter().filter(|r| !**r).count();
        if first_commits {
            assert_eq!(
                ran, 0,
                "round {round}: every duplicate replays the first result"
            );
        } else {
            assert_eq!(
                ran, 1,
                "round {round}: after the rollback, one duplicate runs it"
            );
        }
    }
    assert_eq!(fx.account().await, (200, 2), "one effect per message");
    if let Ok(fx) = Arc::try_unwrap(fx) {
        fx.drop_tables().await;
    }
}

/// An SQLite store and a connection of the caller's own to its file, with an account.
async fn sqlite_fixture(dir: &support::TempDir) -> (SqliteStore, String) {
    let store = SqliteStore::open(dir.path().join("app.db"))
        .await
        .expect("open the store");
    let url = format!("sqlite://{}", store.path().display());
    let mut conn = SqliteConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, effects INTEGER NOT NULL);
         INSERT INTO accounts VALUES (1, 0, 0)",
    )
    .execute(&mut conn)
    .await
    .expect("create the account table");
    (store, url)
}

async fn sqlite_charge(c: &mut SqliteConnection, amount: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE accounts SET balance = balance + $1, effects = effects + 1 WHERE id = 1 RETURNING balance",
    )
    .bind(amount)
    .fetch_one(c)
    .await
}

async fn sqlite_account(url: &str) -> (i64, i64) {
    let mut conn = SqliteConnection::connect(url).await.expect("connect");
    sqlx::query_as("SELECT balance, effects FROM accounts WHERE id = 1")
        .fetch_one(&mut conn)
        .await
        .expect("read the account")
}

#[tokio::test]
async fn sqlite_commit_replay_and_rollback() {
    let dir = support::TempDir::new("idemkey-inbox");
    let (store, url) = sqlite_fixture(&dir).await;
    let mut conn = SqliteConnection::connect(&url).await.expect("connect");
    let fp = Fingerprint::of_bytes(b"charge 5");
    // Rolled back: nothing stays, and the next delivery runs the effect.
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    store
        .once_in(&mut tx, "charges", &key("m1"), &fp, async |c| {
            sqlite_charge(c, 5).await
        })
        .await
        .expect("once_in");
    tx.rollback().await.expect("rollback");
    assert_eq!(sqlite_account(&url).await, (0, 0));
    for delivery in 0..3 {
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        let settled = store
            .once_in(&mut tx, "charges", &key("m1"), &fp, async |c| {
                sqlite_charge(c, 5).await
            })
            .await
            .expect("once_in");
        tx.commit().await.expect("commit");
        assert_eq!(settled.is_replayed(), delivery > 0);
        assert_eq!(*settled.value(), 5);
    }
    assert_eq!(sqlite_account(&url).await, (5, 1));
    // The engine reads the same record.
    let via_engine = Engine::new(store.clone())
        .once("charges", &key("m1"), &fp, || async {
            Err::<i64, _>(std::io::Error::other("must not run: recorded by the inbox"))
        })
        .await
        .expect("engine replay");
    assert!(via_engine.is_replayed());
    drop(conn);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_duplicates_run_the_effect_once() {
    let dir = support::TempDir::new("idemkey-inbox");
    let (store, url) = sqlite_fixture(&dir).await;
    const N: usize = 8;
    let fp = Fingerprint::of_bytes(b"charge 3");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..N {
        let (store, url, fp) = (store.clone(), url.clone(), fp);
        tasks.spawn(async move {
            let mut conn = SqliteConnection::connect(&url).await.expect("connect");
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
            let settled = store
                .once_in(&mut tx, "charges", &key("dup"), &fp, async |c| {
                    sqlite_charge(c, 3).await
                })
                .await
                .expect("once_in");
            tokio::task::yield_now().await;
            tx.commit().await.expect("commit");
            settled.is_replayed()
        });
    }
    let replayed = tasks.join_all().await;
    assert_eq!(
        replayed.iter().filter(|r| !**r).count(),
        1,
        "one ran, the others replayed"
    );
    assert_eq!(sqlite_account(&url).await, (3, 1));
    store.close().await;
}
