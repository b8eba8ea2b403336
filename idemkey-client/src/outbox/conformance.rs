//! The outbox journal conformance suite: the [journal contract](crate::outbox::Journal)
//! as executable checks (feature `conformance`; through the facade with `test-util`,
//! `idemkey::testing::journal_conformance`).
//!
//! Every journal in this crate (memory, SQLite, PostgreSQL) runs this suite in CI. A
//! third-party [`Journal`] runs it from its own tests with [`run`], giving a factory that
//! makes a journal (or hands out the same one: every check uses operation ids of its
//! own, so a shared journal is fine):
//!
//! ```
//! use idemkey::client::outbox::MemoryJournal;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! idemkey::client::outbox::conformance::run(|| async { MemoryJournal::new() }).await;
//! # }
//! ```
//!
//! Each check is also public on its own. A check panics with a message naming the broken
//! contract point, as a test assertion does.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use tokio::task::JoinSet;

use crate::IdempotencyKey;
use crate::outbox::{Enqueued, Journal, Operation, Outcome};

/// How many enqueues of one id [`enqueue_is_atomic`] fires at once.
pub const CONCURRENT_ENQUEUES: usize = 64;

/// Runs every check, each on a journal from `make`.
pub async fn run<J, F, Fut>(make: F)
where
    J: Journal,
    F: Fn() -> Fut,
    Fut: Future<Output = J>,
{
    enqueue_records_every_field(make().await).await;
    enqueue_is_atomic(make().await).await;
    enqueue_with_an_outcome_is_completed(make().await).await;
    attempts_count_on_pending_only(make().await).await;
    first_outcome_wins(make().await).await;
    pending_lists_pending_oldest_first(make().await).await;
    absent_operations_are_absent(make().await).await;
    deferred_outcomes_are_read_back_at_once(make().await).await;
}

/// An id no other check (or run) uses.
fn unique(base: &str) -> String {
    format!("{base}:{}", uuid::Uuid::new_v4().simple())
}

/// A time to the millisecond, as journals keep it.
fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// An operation with repeated headers, an opaque header value and a binary body.
fn operation(id: &str, created: SystemTime) -> Operation {
    let mut headers = HeaderMap::new();
    headers.append("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-tag", HeaderValue::from_static("a"));
    headers.append("x-tag", HeaderValue::from_static("b"));
    headers.append(
        "x-opaque",
        HeaderValue::from_bytes(b"\xe9t\xe9").expect("opaque bytes are a header value"),
    );
    Operation {
        id: id.to_owned(),
        key: IdempotencyKey::v5(&uuid::Uuid::nil(), id.as_bytes()),
        method: Method::POST,
        url: "https://api.example/v1/charges?expand=customer".to_owned(),
        headers,
        body: Bytes::from_static(b"{\"amount\":100}\0\xff"),
        created,
        attempts: 1,
        outcome: None,
    }
}

fn outcome(body: &'static [u8]) -> Outcome {
    let mut headers = HeaderMap::new();
    headers.append("content-type", HeaderValue::from_static("application/json"));
    headers.append("idempotent-replayed", HeaderValue::from_static("true"));
    Outcome {
        status: StatusCode::CREATED,
        replayed: true,
        attempts: 3,
        headers,
        body: Bytes::from_static(body),
        body_truncated: true,
        completed: at_ms(1_700_000_123_456),
    }
}

/// Whether `pending` lists the operation `id`.
async fn is_listed_pending(journal: &impl Journal, id: &str) -> bool {
    journal
        .pending(10_000)
        .await
        .expect("pending")
        .iter()
        .any(|p| p.id == id)
}

/// Contract 1 and 5: a new operation is inserted, and read back with every field
/// unchanged; a second enqueue of its id returns it as stored.
pub async fn enqueue_records_every_field(journal: impl Journal) {
    let op = operation(&unique("fields"), at_ms(1_700_000_000_123));
    assert_eq!(
        journal.enqueue(&op).await.expect("enqueue"),
        Enqueued::Inserted,
        "a new id is inserted"
    );
    let read = journal.get(&op.id).await.expect("get").expect("recorded");
    assert_eq!(read, op, "every field comes back unchanged");
    let mut other = operation(&op.id, at_ms(1_800_000_000_000));
    other.body = Bytes::from_static(b"different");
    assert_eq!(
        journal.enqueue(&other).await.expect("enqueue again"),
        Enqueued::Existing(Box::new(op.clone())),
        "a second enqueue returns the stored operation, unchanged"
    );
    let mut empty = operation(&unique("empty"), at_ms(1));
    empty.headers = HeaderMap::new();
    empty.body = Bytes::new();
    journal.enqueue(&empty).await.expect("enqueue");
    assert_eq!(
        journal.get(&empty.id).await.expect("get"),
        Some(empty),
        "empty headers and body"
    );
}

/// Contract 1: of concurrent enqueues of one id, exactly one inserts.
pub async fn enqueue_is_atomic(journal: impl Journal) {
    let journal = Arc::new(journal);
    let id = unique("atomic");
    let mut tasks = JoinSet::new();
    for _ in 0..CONCURRENT_ENQUEUES {
        let (journal, op) = (journal.clone(), operation(&id, at_ms(5)));
        tasks.spawn(async move { journal.enqueue(&op).await.expect("enqueue") });
    }
    let mut inserted = 0;
    while let Some(result) = tasks.join_next().await {
        if result.expect("task") == Enqueued::Inserted {
            inserted += 1;
        }
    }
    assert_eq!(
        inserted, 1,
        "exactly one of {CONCURRENT_ENQUEUES} concurrent enqueues inserts"
    );
}

/// Contract 1 and 5: an operation enqueued with its outcome is stored completed.
pub async fn enqueue_with_an_outcome_is_completed(journal: impl Journal) {
    let mut op = operation(&unique("completed"), at_ms(7));
    op.outcome = Some(outcome(b"{\"id\":\"ch_1\"}"));
    journal.enqueue(&op).await.expect("enqueue");
    assert_eq!(journal.get(&op.id).await.expect("get"), Some(op.clone()));
    assert!(
        !is_listed_pending(&journal, &op.id).await,
        "a completed operation is not pending"
    );
}

/// Contract 2: attempts grow by one on a pending operation, not on a completed one.
pub async fn attempts_count_on_pending_only(journal: impl Journal) {
    let op = operation(&unique("attempts"), at_ms(9));
    journal.enqueue(&op).await.expect("enqueue");
    assert_eq!(
        journal.begin_attempt(&op.id).await.expect("attempt"),
        Some(2)
    );
    assert_eq!(
        journal.begin_attempt(&op.id).await.expect("attempt"),
        Some(3)
    );
    assert!(
        journal
            .complete(&op.id, &outcome(b"x"))
            .await
            .expect("complete")
    );
    assert_eq!(
        journal.begin_attempt(&op.id).await.expect("attempt"),
        None,
        "a completed operation takes no attempt"
    );
    let read = journal.get(&op.id).await.expect("get").expect("recorded");
    assert_eq!(read.attempts, 3, "the attempts before completion are kept");
}

/// Contract 3: the first outcome recorded wins.
pub async fn first_outcome_wins(journal: impl Journal) {
    let op = operation(&unique("first"), at_ms(11));
    journal.enqueue(&op).await.expect("enqueue");
    let first = outcome(b"first");
    assert!(
        journal.complete(&op.id, &first).await.expect("complete"),
        "a pending operation completes"
    );
    let mut second = outcome(b"second");
    second.status = StatusCode::OK;
    assert!(
        !journal.complete(&op.id, &second).await.expect("complete"),
        "a completed operation does not complete again"
    );
    let read = journal.get(&op.id).await.expect("get").expect("recorded");
    assert_eq!(read.outcome, Some(first), "the first outcome is the record");
}

/// Contract 4: pending lists the pending operations, oldest first, up to the limit.
pub async fn pending_lists_pending_oldest_first(journal: impl Journal) {
    let base = unique("pending");
    let ids: Vec<String> = (0..4).map(|i| format!("{base}:{i}")).collect();
    // Enqueued out of order; created times give the order.
    for (i, created) in [(2, 3_000), (0, 1_000), (3, 4_000), (1, 2_000)] {
        journal
            .enqueue(&operation(&ids[i], at_ms(created)))
            .await
            .expect("enqueue");
    }
    assert!(
        journal
            .complete(&ids[1], &outcome(b"done"))
            .await
            .expect("complete")
    );
    let listed: Vec<String> = journal
        .pending(10_000)
        .await
        .expect("pending")
        .into_iter()
        .map(|op| op.id)
        .filter(|id| id.starts_with(&base))
        .collect();
    assert_eq!(
        listed,
        [ids[0].clone(), ids[2].clone(), ids[3].clone()],
        "pending only, oldest first"
    );
    let limited = journal.pending(1).await.expect("pending");
    assert_eq!(limited.len(), 1, "the limit holds");
}

/// Contract 2, 3, 4: an absent id is absent everywhere.
pub async fn absent_operations_are_absent(journal: impl Journal) {
    let id = unique("absent");
    assert_eq!(journal.get(&id).await.expect("get"), None);
    assert_eq!(journal.begin_attempt(&id).await.expect("attempt"), None);
    assert!(
        !journal
            .complete(&id, &outcome(b"x"))
            .await
            .expect("complete")
    );
}

/// Contract 6: an outcome recorded with `complete_deferred` is read back at once (get,
/// pending, begin_attempt, a second enqueue), the first one stays, and `flush` succeeds.
pub async fn deferred_outcomes_are_read_back_at_once(journal: impl Journal) {
    let op = operation(&unique("deferred"), at_ms(13));
    journal.enqueue(&op).await.expect("enqueue");
    let first = outcome(b"deferred");
    assert!(
        journal
            .complete_deferred(&op.id, &first)
            .await
            .expect("complete_deferred"),
        "a pending operation takes a deferred outcome"
    );
    let read = journal.get(&op.id).await.expect("get").expect("recorded");
    assert_eq!(
        read.outcome.as_ref(),
        Some(&first),
        "get returns the deferred outcome at once"
    );
    assert!(
        !is_listed_pending(&journal, &op.id).await,
        "an operation with a deferred outcome is not pending"
    );
    assert_eq!(
        journal.begin_attempt(&op.id).await.expect("attempt"),
        None,
        "an operation with a deferred outcome takes no attempt"
    );
    match journal.enqueue(&op).await.expect("enqueue again") {
        Enqueued::Existing(existing) => assert_eq!(
            existing.outcome.as_ref(),
            Some(&first),
            "a second enqueue returns the deferred outcome"
        ),
        Enqueued::Inserted => panic!("a second enqueue of one id inserted"),
    }
    let mut second = outcome(b"second");
    second.status = StatusCode::OK;
    journal
        .complete_deferred(&op.id, &second)
        .await
        .expect("complete_deferred again");
    journal.flush().await.expect("flush");
    let read = journal.get(&op.id).await.expect("get").expect("recorded");
    assert_eq!(read.outcome, Some(first), "the first outcome is the record");
    assert_eq!(read.attempts, op.attempts, "no attempt was counted");
}
