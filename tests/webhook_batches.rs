//! The batch deduper on the real memory store: lease renewal while a handler runs,
//! release on cancellation, items without ids, invalid items.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemkey::server::webhook::{BatchDeduper, KeySource};
use idemkey::store::MemoryStore;
use support::gate::Gate;

fn batch(ids: &[&str]) -> Bytes {
    let events: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| serde_json::json!({"email":"example@test.com","event":"delivered","sg_event_id":id,"timestamp":1_513_299_569}))
        .collect();
    Bytes::from(serde_json::to_vec(&events).expect("serialisable"))
}

async fn ok(_: idemkey::server::webhook::BatchItem) -> Result<(), std::io::Error> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_long_handler_keeps_its_items_by_renewing_the_lease() {
    let dedup = BatchDeduper::sendgrid(MemoryStore::new()).lease(Duration::from_secs(3));
    let body = batch(&["sg_long"]);
    let gate = Gate::default();
    let first = tokio::spawn({
        let (dedup, body, gate) = (dedup.clone(), body.clone(), gate.clone());
        async move {
            dedup
                .process(&body, |_| {
                    let gate = gate.clone();
                    async move {
                        gate.pass().await;
                        Ok::<_, std::io::Error>(())
                    }
                })
                .await
                .expect("first batch")
        }
    });
    gate.wait_entered(1).await; // the handler started
    // Ten times the lease passes while the handler runs, half a second at a time:
    // renewals (every third of the lease) keep the claim.
    for _ in 0..60 {
        tokio::time::advance(Duration::from_millis(500)).await;
        tokio::task::yield_now().await;
    }
    let dup = dedup.process(&body, ok).await.expect("duplicate batch");
    assert_eq!((dup.processed(), dup.in_progress()), (0, 1));
    assert!(!dup.is_settled(), "answer 409 so the sender retries");
    gate.open(1);
    let first = first.await.expect("first task");
    assert_eq!(first.processed(), 1);
    let retry = dedup.process(&body, ok).await.expect("retry");
    assert_eq!((retry.duplicates(), retry.is_settled()), (1, true));
}

#[tokio::test]
async fn a_cancelled_delivery_releases_its_item() {
    let dedup = BatchDeduper::sendgrid(MemoryStore::new());
    let body = batch(&["sg_cancelled"]);
    let gate = Gate::default(); // never opened: the handler hangs
    let hung = tokio::spawn({
        let (dedup, body, gate) = (dedup.clone(), body.clone(), gate.clone());
        async move {
            let _ = dedup
                .process(&body, |_| {
                    let gate = gate.clone();
                    async move {
                        gate.pass().await;
                        std::future::pending::<Result<(), std::io::Error>>().await
                    }
                })
                .await;
        }
    });
    gate.wait_entered(1).await; // the handler started
    hung.abort(); // the sender hung up
    let _ = hung.await;
    let runs = AtomicU64::new(0);
    // The release is spawned when the delivery is dropped; a bounded number of retries
    // lets it run.
    for _ in 0..100 {
        let o = dedup
            .process(&body, |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::io::Error>(()) }
            })
            .await
            .expect("redelivery");
        if o.processed() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the redelivery processed the item"
    );
}

#[tokio::test]
async fn items_without_ids_always_run_and_invalid_items_are_refused() {
    let dedup = BatchDeduper::new(MemoryStore::new(), KeySource::json_pointer("/id"));
    let body = Bytes::from_static(br#"[{"id":"a"},{"no_id":true},{"id":"a"}]"#);
    let o = dedup.process(&body, ok).await.expect("processed");
    assert_eq!((o.processed(), o.without_id(), o.duplicates()), (1, 1, 1));
    let o = dedup.process(&body, ok).await.expect("processed");
    assert_eq!((o.processed(), o.without_id(), o.duplicates()), (0, 1, 2));
    let bad = Bytes::from_static(br#"[{"id":"b"},{"id":{"nested":1}}]"#);
    let e = dedup
        .process(&bad, ok)
        .await
        .expect_err("an object is not an id");
    assert!(e.is_invalid_batch());
    assert_eq!(e.item_index(), Some(1));
    assert_eq!(e.outcome().processed(), 1, "item 0 was done before");
    assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
}
