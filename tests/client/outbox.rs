//! The client outbox in one process: the journal conformance suite on every journal,
//! and sending, recording, resuming and the transactional outbox against the real
//! verifier (the examples' charge app) on 127.0.0.1.

use crate::support;

use std::time::{Duration, SystemTime};

use http::header;
use idemkey::client::outbox::{
    Enqueued, Journal, MemoryJournal, Outbox, OutboxExt, PostgresJournal, Resumed, SqliteJournal,
};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use idemkey::testing::{Fault, FaultProxy, journal_conformance};
use support::apps::ChargeApp;

const BEARER: &str = "Bearer sk_test_in_process";

async fn postgres_journal(table: &str) -> PostgresJournal {
    let url = support::postgres_url();
    PostgresJournal::builder(&url)
        .table(table)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_journal_conforms() {
    journal_conformance::run(|| async { MemoryJournal::new() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_journal_conforms() {
    let dir = support::TempDir::new("idemkey-outbox");
    let journal = SqliteJournal::open(dir.path().join("outbox.db"))
        .await
        .expect("open the journal");
    journal_conformance::run(|| {
        let journal = journal.clone();
        async move { journal }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_journal_conforms() {
    let table = support::unique("idemkey_outbox_test");
    let journal = postgres_journal(&table).await;
    journal_conformance::run(|| {
        let journal = journal.clone();
        async move { journal }
    })
    .await;
    support::drop_postgres_table(&table).await;
}

/// The charge app behind the verifier, and the app (for its counts).
async fn charge_server() -> (idemkey::testing::TestServer, ChargeApp) {
    let app = ChargeApp::new();
    let server =
        support::serve(app.router(IdempotencyLayer::new(Engine::new(MemoryStore::new())))).await;
    (server, app)
}

fn outbox(journal: impl Journal) -> Outbox {
    Outbox::builder(journal)
        .credentials(|_op, headers| {
            headers.insert(header::AUTHORIZATION, BEARER.parse().expect("header value"));
        })
        .build()
}

fn charge(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    order: &str,
    amount: u64,
) -> reqwest_middleware::RequestBuilder {
    client
        .post(url)
        .header(header::AUTHORIZATION, BEARER)
        .json(&serde_json::json!({"amount": amount, "order": order}))
}

#[tokio::test]
async fn an_operation_is_sent_once_and_its_outcome_recorded() {
    let (server, app) = charge_server().await;
    let client = support::client::builder(3).build();
    let journal = MemoryJournal::new();
    let outbox = outbox(journal.clone());
    let url = server.url("/v1/charges");

    let first = charge(&client, &url, "o-1", 100)
        .outbox(&outbox, "charge:o-1")
        .send()
        .await
        .expect("sent");
    assert_eq!(first.status, 200);
    assert!(!first.replayed);
    let again = charge(&client, &url, "o-1", 100)
        .outbox(&outbox, "charge:o-1")
        .send()
        .await
        .expect("the recorded outcome");
    assert_eq!(
        again, first,
        "a completed operation is answered from the journal"
    );
    assert_eq!(app.executions().count(), 1);

    let op = journal
        .get("charge:o-1")
        .await
        .expect("get")
        .expect("recorded");
    assert_eq!(
        op.key,
        outbox.key_for("charge:o-1"),
        "the key is derived from the id"
    );
    assert!(
        op.headers.get(header::AUTHORIZATION).is_none(),
        "credentials are not kept"
    );
    assert_eq!(
        op.headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
    assert_eq!(
        outbox.outcome("charge:o-1").await.expect("outcome"),
        Some(first)
    );
}

/// Sends 8 charges at once through `outbox`; right after each send, `outcome(id)`
/// returns the outcome the send returned and `pending()` does not list it (the
/// outcome's commit is not awaited by the send: read-your-writes). Then `flush`.
async fn outcomes_are_read_back_right_after_the_send(outbox: &Outbox, run: &str) {
    let (server, app) = charge_server().await;
    let client = support::client::builder(3).build();
    let url = server.url("/v1/charges");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (outbox, client, url) = (outbox.clone(), client.clone(), url.clone());
        let id = format!("charge:{run}:{i}");
        tasks.spawn(async move {
            let outcome = charge(&client, &url, &id, 100)
                .outbox(&outbox, id.as_str())
                .send()
                .await
                .expect("sent");
            assert_eq!(
                outbox.outcome(&id).await.expect("outcome"),
                Some(outcome),
                "{id}: outcome(id) right after the send"
            );
            let pending = outbox.pending().await.expect("pending");
            assert!(
                !pending.iter().any(|op| op.id == id),
                "{id}: pending() right after the send lists it"
            );
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("caller");
    }
    outbox.flush().await.expect("flush");
    assert_eq!(app.executions().count(), 8);
}

#[tokio::test]
async fn memory_outcomes_are_read_back_right_after_the_send() {
    outcomes_are_read_back_right_after_the_send(&outbox(MemoryJournal::new()), "memory").await;
}

#[tokio::test]
async fn sqlite_outcomes_are_read_back_right_after_the_send_and_durable_after_flush() {
    let dir = support::TempDir::new("idemkey-outbox");
    let path = dir.path().join("outbox.db");
    let journal = SqliteJournal::open(&path).await.expect("open");
    outcomes_are_read_back_right_after_the_send(&outbox(journal), "sqlite").await;
    // After the flush, another journal on the file (another process's view) has them.
    let reopened = outbox(SqliteJournal::open(&path).await.expect("reopen"));
    for i in 0..8 {
        let id = format!("charge:sqlite:{i}");
        assert!(
            reopened.outcome(&id).await.expect("outcome").is_some(),
            "{id} is on disk after flush"
        );
    }
    assert!(reopened.pending().await.expect("pending").is_empty());
}

#[tokio::test]
async fn postgres_outcomes_are_read_back_right_after_the_send() {
    let table = support::unique("idemkey_outbox_test");
    let journal = postgres_journal(&table).await;
    outcomes_are_read_back_right_after_the_send(&outbox(journal.clone()), "postgres").await;
    assert!(journal.pending(100).await.expect("pending").is_empty());
    support::drop_postgres_table(&table).await;
}

#[tokio::test]
async fn the_same_id_with_a_different_body_is_refused_before_sending() {
    let (server, app) = charge_server().await;
    let client = support::client::builder(3).build();
    let outbox = outbox(MemoryJournal::new());
    let url = server.url("/v1/charges");
    charge(&client, &url, "o-2", 100)
        .outbox(&outbox, "charge:o-2")
        .send()
        .await
        .expect("sent");
    let err = charge(&client, &url, "o-2", 200)
        .outbox(&outbox, "charge:o-2")
        .send()
        .await
        .expect_err("a different body under the same id");
    assert!(err.is_operation_reused(), "{err}");
    assert_eq!(err.kind_str(), "operation_reused");
    assert_eq!(app.executions().count(), 1, "nothing more was sent");
}

#[tokio::test]
async fn a_lost_response_is_retried_with_the_same_key_and_recorded_as_replayed() {
    let (server, app) = charge_server().await;
    let proxy = FaultProxy::start(server.addr(), |shot| {
        if shot.key_attempt == 0 {
            Fault::LoseResponse
        } else {
            Fault::None
        }
    })
    .await
    .expect("proxy");
    let client = support::client::builder(3).build();
    let outbox = outbox(MemoryJournal::new());
    let outcome = charge(&client, &proxy.url("/v1/charges"), "o-3", 100)
        .outbox(&outbox, "charge:o-3")
        .send()
        .await
        .expect("sent");
    assert_eq!(
        (outcome.status.as_u16(), outcome.replayed, outcome.attempts),
        (200, true, 2)
    );
    assert_eq!(app.executions().count(), 1);
}

#[tokio::test]
async fn an_unknown_outcome_stays_pending_and_resume_finishes_it_with_the_key() {
    let (server, app) = charge_server().await;
    // Every answer to the first two sends is lost; the client gives up after 1 retry.
    let proxy = FaultProxy::start(server.addr(), |shot| {
        if shot.key_attempt < 2 {
            Fault::LoseResponse
        } else {
            Fault::None
        }
    })
    .await
    .expect("proxy");
    let client = support::client::builder(1).build();
    let journal = MemoryJournal::new();
    let outbox = outbox(journal.clone());
    let err = charge(&client, &proxy.url("/v1/charges"), "o-4", 100)
        .outbox(&outbox, "charge:o-4")
        .send()
        .await
        .expect_err("both answers lost");
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(err.key(), Some(&outbox.key_for("charge:o-4")));
    let pending = outbox.pending().await.expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(outbox.outcome("charge:o-4").await.expect("outcome"), None);

    let report = outbox.resume(&client).await.expect("resume");
    assert_eq!(
        (report.done(), report.pending(), report.expired()),
        (1, 0, 0)
    );
    let Resumed::Done(outcome) = &report.operations[0].1 else {
        panic!("resumed: {:?}", report.operations);
    };
    assert!(
        outcome.replayed,
        "the server had executed it: the resend gets the replay"
    );
    assert_eq!(
        app.executions().count(),
        1,
        "executed once across the resend"
    );
    let op = journal
        .get("charge:o-4")
        .await
        .expect("get")
        .expect("recorded");
    assert_eq!(op.attempts, 2, "the send and the resume");
    assert!(outbox.pending().await.expect("pending").is_empty());
}

#[tokio::test]
async fn an_expired_operation_is_reported_and_not_sent() {
    let (server, app) = charge_server().await;
    let client = support::client::builder(1).build();
    let journal = MemoryJournal::new();
    let outbox = Outbox::builder(journal.clone())
        .retention(Duration::from_secs(3600))
        .build();
    let request = charge(&client, &server.url("/v1/charges"), "o-5", 100)
        .build()
        .expect("request");
    let mut op = outbox.prepare("charge:o-5", request).expect("prepare");
    op.created = SystemTime::now() - Duration::from_secs(2 * 3600);
    outbox.enqueue(op).await.expect("enqueue");
    let report = outbox.resume(&client).await.expect("resume");
    assert_eq!(
        (report.done(), report.pending(), report.expired()),
        (0, 0, 1)
    );
    let err = outbox
        .deliver(&client, "charge:o-5")
        .await
        .expect_err("expired");
    assert!(err.is_expired(), "{err}");
    assert_eq!(app.executions().count(), 0, "never sent");
    assert_eq!(
        outbox.pending().await.expect("pending").len(),
        1,
        "left for the application"
    );
}

#[tokio::test]
async fn the_resumer_finishes_pending_operations_in_the_background() {
    let (server, app) = charge_server().await;
    let client = support::client::builder(1).build();
    let journal = MemoryJournal::new();
    let outbox = outbox(journal.clone());
    for i in 0..3 {
        let request = charge(
            &client,
            &server.url("/v1/charges"),
            &format!("o-6-{i}"),
            100,
        )
        .build()
        .expect("request");
        outbox
            .enqueue(
                outbox
                    .prepare(&format!("charge:o-6-{i}"), request)
                    .expect("prepare"),
            )
            .await
            .expect("enqueue");
    }
    let resumer = outbox.spawn_resumer(client.clone(), Duration::from_millis(20));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !outbox.pending().await.expect("pending").is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the resumer finished nothing in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    resumer.stop();
    assert_eq!(app.executions().count(), 3);
}

#[tokio::test]
async fn a_streaming_body_is_refused_before_anything_is_recorded() {
    let client = support::client::builder(1).build();
    let journal = MemoryJournal::new();
    let outbox = Outbox::new(journal.clone());
    let err = client
        .post("http://127.0.0.1:9/v1/charges")
        .body(reqwest::Body::wrap(http_body_util::Full::new(
            bytes::Bytes::from_static(b"x"),
        )))
        .outbox(&outbox, "charge:stream")
        .send()
        .await
        .expect_err("a stream cannot be kept");
    assert!(err.is_invalid_request(), "{err}");
    assert_eq!(journal.get("charge:stream").await.expect("get"), None);
}

/// 64 enqueues arriving together share one commit (one WAL sync): on a current-thread
/// runtime every task queues its write before the writer task runs again.
#[tokio::test(flavor = "current_thread")]
async fn sqlite_enqueues_arriving_together_share_a_commit() {
    let dir = support::TempDir::new("idemkey-outbox");
    let journal = SqliteJournal::open(dir.path().join("outbox.db"))
        .await
        .expect("open");
    let outbox = Outbox::new(journal.clone());
    let client = reqwest_middleware::ClientWithMiddleware::from(reqwest::Client::new());
    let before = journal.commits();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let outbox = outbox.clone();
        let request = client
            .post("http://127.0.0.1:9/")
            .body(format!("{i}"))
            .build()
            .expect("request");
        tasks.spawn(async move {
            let op = outbox
                .prepare(&format!("op:{i}"), request)
                .expect("prepare");
            outbox.enqueue(op).await.expect("enqueue");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    let commits = journal.commits() - before;
    assert!(commits <= 2, "64 enqueues took {commits} commits");
    assert_eq!(
        outbox.pending().await.expect("pending").len(),
        64,
        "all durable"
    );
}

/// Operation `id`, a POST of `body`, as an outbox prepares it (not recorded anywhere).
fn prepared(id: &str, body: impl Into<reqwest::Body>) -> idemkey::client::outbox::Operation {
    let request = reqwest::Client::new()
        .post("http://127.0.0.1:9/v1/charges")
        .body(body)
        .build()
        .expect("request");
    Outbox::new(MemoryJournal::new())
        .prepare(id, request)
        .expect("prepare")
}

/// A SQLite and a PostgreSQL test of `$check(journal, commits, run)`, each on a journal
/// of its own, on a current-thread runtime: writes joined together are all queued
/// before the writer task runs.
macro_rules! on_sql_journals {
    ($check:ident: $sqlite:ident, $postgres:ident) => {
        #[tokio::test(flavor = "current_thread")]
        async fn $sqlite() {
            let dir = support::TempDir::new("idemkey-outbox");
            let journal = SqliteJournal::open(dir.path().join("outbox.db"))
                .await
                .expect("open");
            let counter = journal.clone();
            $check(journal, || counter.commits(), "s").await;
        }

        #[tokio::test(flavor = "current_thread")]
        async fn $postgres() {
            let table = support::unique("idemkey_outbox_test");
            let journal = postgres_journal(&table).await;
            let counter = journal.clone();
            $check(journal, || counter.commits(), "p").await;
            support::drop_postgres_table(&table).await;
        }
    };
}

/// Enqueues queued together whose bodies sum above the writer's budget (16 MiB of body
/// bytes per batch) are cut into several batches, and all succeed: three 6 MiB bodies
/// in one batch would be 18 MiB. On a current-thread runtime every enqueue is queued
/// before the writer task runs, so without the budget they share one commit.
async fn bodies_above_the_batch_budget_take_several_commits(
    journal: impl Journal,
    commits: impl Fn() -> u64,
    run: &str,
) {
    let prepare = |name: &str, fill: u8| prepared(&format!("{run}:{name}"), vec![fill; 6 << 20]);
    let (a, b, c) = (prepare("a", b'a'), prepare("b", b'b'), prepare("c", b'c'));
    let before = commits();
    let (first, second, third) = tokio::join!(
        journal.enqueue(&a),
        journal.enqueue(&b),
        journal.enqueue(&c)
    );
    for (name, enqueued) in [("a", first), ("b", second), ("c", third)] {
        assert_eq!(enqueued.expect(name), Enqueued::Inserted, "{name}");
    }
    let commits = commits() - before;
    assert!(commits >= 2, "18 MiB of bodies took {commits} commit(s)");
    let stored = journal.get(&c.id).await.expect("get").expect("c stored");
    assert!(stored.same_request(&c), "c's body comes back unchanged");
}

on_sql_journals!(bodies_above_the_batch_budget_take_several_commits:
    sqlite_bodies_above_the_batch_budget_take_several_commits,
    postgres_bodies_above_the_batch_budget_take_several_commits);

/// Writes on one operation queued together land in one batch, and each gets the answer
/// it would get alone in queue order (the writer runs the k-th write of each operation
/// in round k): a second enqueue finds the first, an attempt counts, an outcome is
/// recorded, and a later enqueue finds the outcome. All in one commit. On a
/// current-thread runtime every write is queued before the writer task runs.
async fn writes_on_one_operation_in_one_batch_keep_their_order(
    journal: impl Journal,
    commits: impl Fn() -> u64,
    run: &str,
) {
    let prepare = |id: &str| prepared(id, format!("{{\"op\":\"{id}\"}}"));
    let (a, b) = (prepare(&format!("{run}:a")), prepare(&format!("{run}:b")));
    let outcome = idemkey::client::outbox::Outcome {
        status: http::StatusCode::CREATED,
        replayed: false,
        attempts: 1,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::from_static(b"{\"id\":\"ch_1\"}"),
        body_truncated: false,
        completed: SystemTime::now(),
    };
    let before = commits();
    let (first, second, attempt, completed, third, other) = tokio::join!(
        journal.enqueue(&a),
        journal.enqueue(&a),
        journal.begin_attempt(&a.id),
        journal.complete(&a.id, &outcome),
        journal.enqueue(&a),
        journal.enqueue(&b),
    );
    assert_eq!(commits() - before, 1, "one batch, one commit");
    assert_eq!(first.expect("first"), Enqueued::Inserted);
    match second.expect("second") {
        Enqueued::Existing(op) => {
            assert_eq!(
                (op.attempts, op.outcome.is_none()),
                (0, true),
                "as first stored"
            );
        }
        Enqueued::Inserted => panic!("the second enqueue of one id inserted it again"),
    }
    assert_eq!(attempt.expect("attempt"), Some(1));
    assert!(completed.expect("complete"), "the outcome was recorded");
    match third.expect("third") {
        Enqueued::Existing(op) => {
            assert_eq!(op.attempts, 1, "after the attempt");
            let recorded = op.outcome.expect("after the outcome");
            assert_eq!(
                (recorded.status, recorded.body),
                (outcome.status, outcome.body)
            );
        }
        Enqueued::Inserted => panic!("the third enqueue of one id inserted it again"),
    }
    assert_eq!(other.expect("other"), Enqueued::Inserted);
    assert_eq!(
        journal.pending(10).await.expect("pending").len(),
        1,
        "b only"
    );
}

on_sql_journals!(writes_on_one_operation_in_one_batch_keep_their_order:
    sqlite_writes_on_one_operation_in_one_batch_keep_their_order,
    postgres_writes_on_one_operation_in_one_batch_keep_their_order);

/// The transactional outbox on SQLite: an operation enqueued in a rolled-back
/// transaction never existed; a committed one is delivered.
#[tokio::test]
async fn sqlite_enqueue_in_commits_or_rolls_back_with_the_application() {
    let dir = support::TempDir::new("idemkey-outbox");
    let path = dir.path().join("app.db");
    let journal = SqliteJournal::open(&path).await.expect("open");
    let app_db = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("app pool");
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .execute(&app_db)
        .await
        .expect("orders");
    let (server, app) = charge_server().await;
    let client = support::client::builder(1).build();
    let outbox = outbox(journal.clone());
    let op = |id: &str| {
        let request = charge(&client, &server.url("/v1/charges"), id, 100)
            .build()
            .expect("request");
        outbox.prepare(id, request).expect("prepare")
    };

    let mut tx = app_db.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders (id) VALUES ('a')")
        .execute(&mut *tx)
        .await
        .expect("order");
    journal
        .enqueue_in(&mut tx, &op("charge:a"))
        .await
        .expect("enqueue_in");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        journal.get("charge:a").await.expect("get"),
        None,
        "rolled back with the order"
    );

    let mut tx = app_db.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders (id) VALUES ('b')")
        .execute(&mut *tx)
        .await
        .expect("order");
    journal
        .enqueue_in(&mut tx, &op("charge:b"))
        .await
        .expect("enqueue_in");
    tx.commit().await.expect("commit");
    let outcome = outbox
        .deliver(&client, "charge:b")
        .await
        .expect("delivered");
    assert_eq!(outcome.status, 200);
    assert_eq!(app.executions().count(), 1);
}

/// The transactional outbox on PostgreSQL, as on SQLite.
#[tokio::test]
async fn postgres_enqueue_in_commits_or_rolls_back_with_the_application() {
    let table = support::unique("idemkey_outbox_test");
    let orders = format!("{table}_orders");
    let journal = postgres_journal(&table).await;
    let app_db = support::postgres_admin(&support::postgres_url()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{orders}\" (id TEXT PRIMARY KEY)"
    )))
    .execute(&app_db)
    .await
    .expect("orders");
    let insert = |id: &str| format!("INSERT INTO \"{orders}\" (id) VALUES ('{id}')");
    let (server, app) = charge_server().await;
    let client = support::client::builder(1).build();
    let outbox = outbox(journal.clone());
    let op = |id: &str| {
        let request = charge(&client, &server.url("/v1/charges"), id, 100)
            .build()
            .expect("request");
        outbox.prepare(id, request).expect("prepare")
    };

    let mut tx = app_db.begin().await.expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(insert("a")))
        .execute(&mut *tx)
        .await
        .expect("order");
    journal
        .enqueue_in(&mut tx, &op("charge:a"))
        .await
        .expect("enqueue_in");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        journal.get("charge:a").await.expect("get"),
        None,
        "rolled back with the order"
    );

    let mut tx = app_db.begin().await.expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(insert("b")))
        .execute(&mut *tx)
        .await
        .expect("order");
    journal
        .enqueue_in(&mut tx, &op("charge:b"))
        .await
        .expect("enqueue_in");
    tx.commit().await.expect("commit");
    let outcome = outbox
        .deliver(&client, "charge:b")
        .await
        .expect("delivered");
    assert_eq!(outcome.status, 200);
    assert_eq!(app.executions().count(), 1);

    support::drop_postgres_table(&table).await;
    support::drop_postgres_table(&orders).await;
}
