//! Batched sweeps on the SQL stores, their time budget, and one sweeper at a time.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use idemkey::store::{
    Claim, ClaimRequest, FencingToken, RecordId, Store, SweepOptions, SweepOutcome,
};
use tokio::time::Instant;

/// Abandoned claims that expire a millisecond after they are made (lease 1 ms, no
/// retention), `n` of them, plus `live` claims that stay (lease 1 h).
async fn fill(store: &dyn Store, prefix: &str, n: usize, live: usize) -> Vec<RecordId> {
    let claim = |key: String, lease: Duration| async move {
        let id = RecordId::new(prefix, &key);
        let got = store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: b"f",
                token: FencingToken::random(),
                lease,
                retention: Duration::ZERO,
            })
            .await
            .expect("claim");
        assert!(matches!(got, Claim::Acquired { .. }), "{key} is new");
        id
    };
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        join_all(
            chunk
                .iter()
                .map(|i| claim(format!("old-{i}"), Duration::from_millis(1))),
        )
        .await;
    }
    let live =
        join_all((0..live).map(|i| claim(format!("live-{i}"), Duration::from_secs(3600)))).await;
    // Past the expired claims' lease by the database's clock (the stores read theirs).
    tokio::time::sleep(Duration::from_millis(50)).await;
    live
}

/// Every live record is still there, in progress.
async fn live_records_kept(store: &dyn Store, live: &[RecordId]) {
    for id in live {
        let got = store
            .claim(ClaimRequest {
                id,
                fingerprint: b"f",
                token: FencingToken::random(),
                lease: Duration::from_secs(3600),
                retention: Duration::ZERO,
            })
            .await
            .expect("claim");
        assert!(
            matches!(got, Claim::InProgress { .. }),
            "a live record was swept"
        );
    }
}

/// 2,500 expired records in batches of 1,000: three statements, paced by default (it
/// paused between them), nothing live touched; then a pass with a budget of zero runs
/// exactly one batch and says work is left; then one with a pause ratio of 0 never
/// pauses.
async fn sweeps_in_batches(store: Arc<dyn Store>) {
    let live = fill(store.as_ref(), "batches", 2_500, 20).await;
    let report = store
        .sweep_pass(&SweepOptions::new().batch(1_000))
        .await
        .expect("sweep");
    assert_eq!(report.removed(), 2_500, "{report:?}");
    assert_eq!(report.batches(), 3, "{report:?}");
    assert_eq!(report.outcome(), SweepOutcome::Complete);
    assert_eq!(report.lag(), Some(Duration::ZERO));
    assert!(
        report.paused() > Duration::ZERO && report.paused() < report.duration(),
        "the default pass pauses between its batches: {report:?}"
    );
    live_records_kept(store.as_ref(), &live).await;

    fill(store.as_ref(), "budget", 300, 0).await;
    let options = SweepOptions::new().batch(100).max_duration(Duration::ZERO);
    let report = store.sweep_pass(&options).await.expect("sweep");
    assert_eq!(report.removed(), 100, "{report:?}");
    assert_eq!(report.batches(), 1);
    assert_eq!(report.outcome(), SweepOutcome::BudgetSpent);
    assert!(
        report.lag().is_some_and(|l| l > Duration::ZERO),
        "{report:?}"
    );
    assert_eq!(store.sweep().await.expect("sweep the rest"), 200);
    assert_eq!(store.sweep().await.expect("nothing left"), 0);
    live_records_kept(store.as_ref(), &live).await;

    fill(store.as_ref(), "unpaced", 300, 0).await;
    let options = SweepOptions::new().batch(100).pause_ratio(0.0);
    let report = store.sweep_pass(&options).await.expect("sweep");
    assert_eq!((report.removed(), report.batches()), (300, 4), "{report:?}");
    assert_eq!(report.paused(), Duration::ZERO, "{report:?}");
    live_records_kept(store.as_ref(), &live).await;
}

/// Instances sweeping one table at once: one pass runs, the others are skipped, so no
/// two passes (and no two of their statements) ever overlap; the one that ran removed
/// everything.
async fn one_sweeper_at_a_time(instances: Vec<Arc<dyn Store>>) {
    fill(instances[0].as_ref(), "exclusive", 2_000, 0).await;
    let options = SweepOptions::new().batch(50);
    let passes = join_all(instances.iter().map(|store| async move {
        let started = Instant::now();
        let report = store.sweep_pass(&options).await.expect("sweep");
        (started, Instant::now(), report)
    }))
    .await;
    let ran: Vec<_> = passes
        .iter()
        .filter(|(_, _, r)| r.outcome() != SweepOutcome::Skipped)
        .collect();
    assert!(!ran.is_empty(), "some pass ran: {passes:?}");
    for (i, a) in ran.iter().enumerate() {
        for b in &ran[i + 1..] {
            assert!(
                a.1 <= b.0 || b.1 <= a.0,
                "two passes overlapped: {a:?} and {b:?}"
            );
        }
    }
    let removed: u64 = passes.iter().map(|(_, _, r)| r.removed()).sum();
    assert_eq!(removed, 2_000, "{passes:?}");
    assert!(
        passes
            .iter()
            .filter(|(_, _, r)| r.outcome() == SweepOutcome::Skipped)
            .all(|(_, _, r)| r.removed() == 0)
    );
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread")]
async fn postgres_sweeps_in_batches_one_instance_at_a_time() {
    let table = support::unique("sweep");
    let store: Arc<dyn Store> = Arc::new(support::postgres_store(&table).await);
    sweeps_in_batches(Arc::clone(&store)).await;
    let mut instances = vec![store];
    for _ in 0..3 {
        instances.push(Arc::new(support::postgres_store(&table).await));
    }
    one_sweeper_at_a_time(instances.clone()).await;

    // A session that holds the table's sweep lock (as another instance's pass would)
    // makes an exclusive pass skip, and a non-exclusive one run.
    let admin = support::postgres_admin(&support::postgres_url()).await;
    let mut holder = admin.acquire().await.expect("a connection");
    let name = format!("idemkey.sweep:\"{table}\"");
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(&name)
        .execute(&mut *holder)
        .await
        .expect("take the lock");
    fill(instances[0].as_ref(), "held", 10, 0).await;
    let report = instances[1]
        .sweep_pass(&SweepOptions::new())
        .await
        .expect("sweep");
    assert_eq!(report.outcome(), SweepOutcome::Skipped);
    assert_eq!(report.removed(), 0);
    sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(&name)
        .execute(&mut *holder)
        .await
        .expect("release the lock");
    let report = instances[1]
        .sweep_pass(&SweepOptions::new())
        .await
        .expect("sweep");
    assert_eq!(
        (report.outcome(), report.removed()),
        (SweepOutcome::Complete, 10)
    );
    drop(holder);
    admin.close().await;
    support::drop_postgres_table(&table).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread")]
async fn mysql_sweeps_in_batches_one_instance_at_a_time() {
    let table = support::unique("sweep");
    let store: Arc<dyn Store> = Arc::new(support::mysql_store(&table).await);
    sweeps_in_batches(Arc::clone(&store)).await;
    let mut instances = vec![store];
    for _ in 0..3 {
        instances.push(Arc::new(support::mysql_store(&table).await));
    }
    one_sweeper_at_a_time(instances).await;
    support::drop_mysql_table(&table).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_sweeps_in_batches() {
    let dir = support::TempDir::new("idemkey-sweep");
    let store = idemkey::store::SqliteStore::builder(dir.path().join("records.db"))
        .open()
        .await
        .expect("open");
    sweeps_in_batches(Arc::new(store)).await;
}
