//! The batch deduper on the real memory store: lease renewal while a handler runs,
//! release on cancellation, items without ids, invalid items, items inside an envelope,
//! retention floors.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemkey::server::extract::KeySource;
use idemkey::server::webhook::BatchDeduper;
use idemkey::store::{MemoryStore, RecordId, Store};
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
    // Every item is identified before any is claimed: one unusable id refuses the whole
    // batch, and item 0 is not run (a retry of the same bytes could not succeed).
    let bad = Bytes::from_static(br#"[{"id":"b"},{"id":{"nested":1}}]"#);
    let runs = AtomicU64::new(0);
    let e = dedup
        .process(&bad, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(()) }
        })
        .await
        .expect_err("an object is not an id");
    assert!(e.is_invalid_batch());
    assert_eq!(e.item_index(), Some(1));
    assert_eq!(
        (e.outcome().processed(), runs.load(Ordering::SeqCst)),
        (0, 0)
    );
    assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
    let fixed = Bytes::from_static(br#"[{"id":"b"}]"#);
    let o = dedup.process(&fixed, ok).await.expect("processed");
    assert_eq!(o.processed(), 1, "item `b` was never recorded");
}

/// Items inside an envelope (Adyen's `notificationItems[].NotificationRequestItem`):
/// found by pointer, handed to the handler without the wrapper, and refused clearly when
/// they are not there.
#[tokio::test]
async fn items_found_by_pointer_and_answers_for_each_case() {
    let dedup = BatchDeduper::new(MemoryStore::new(), KeySource::json_pointer("/id"))
        .items_at("/events")
        .item_at("/event")
        .acknowledge_with(Bytes::from_static(b"thanks"));
    let body = Bytes::from_static(br#"{"events":[{"event":{"id":"a"}},{"event":{"id":"b"}}]}"#);
    let seen = std::sync::Mutex::new(Vec::new());
    let o = dedup
        .process(&body, |item| {
            seen.lock().expect("not poisoned").push(item.json().clone());
            async { Ok::<_, std::io::Error>(()) }
        })
        .await;
    assert_eq!(
        *seen.lock().expect("not poisoned"),
        [
            Bytes::from_static(br#"{"id":"a"}"#),
            Bytes::from_static(br#"{"id":"b"}"#)
        ]
    );
    let resp = dedup.respond(o);
    assert_eq!(resp.status(), http::StatusCode::OK);
    let answer = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("full body")
        .to_bytes();
    assert_eq!(&answer[..], b"thanks");

    for (bad, why) in [
        (&br#"{"other":[]}"#[..], "no array of items at `/events`"),
        (br#"{"events":{}}"#, "not a batch"),
        (br#"{"events":[{"wrapped":{}}]}"#, "no item at `/event`"),
        (b"not json", "not JSON"),
    ] {
        let e = dedup
            .process(&Bytes::copy_from_slice(bad), ok)
            .await
            .expect_err("refused");
        assert!(e.is_invalid_batch() && e.to_string().contains(why), "{e}");
        let resp = dedup.respond::<std::io::Error>(Err(e));
        assert_eq!(resp.status(), http::StatusCode::BAD_REQUEST);
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
    }
}

#[tokio::test]
async fn adyen_keeps_items_31_days_at_least() {
    let floor = Duration::from_secs(31 * 24 * 3600);
    let store = std::sync::Arc::new(MemoryStore::new());
    // Asked to keep items an hour: raised to Adyen's retry window and a day.
    let adyen = BatchDeduper::adyen(store.clone()).retention(Duration::from_secs(3600));
    assert_eq!(
        (adyen.min_retention(), adyen.effective_retention()),
        (floor, floor)
    );
    let body = Bytes::from_static(
        br#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"eventCode":"AUTHORISATION","merchantAccountCode":"M","pspReference":"7914073381342284","success":"true"}}]}"#,
    );
    let key = std::sync::Mutex::new(None);
    dedup_once(&adyen, &body, &key).await;
    let key = key
        .lock()
        .expect("not poisoned")
        .clone()
        .expect("the item has an id");
    let record = store
        .inspect(&RecordId::new("webhook:adyen", key.as_str()))
        .await
        .expect("inspect")
        .expect("the item is recorded");
    // Kept from its completion (just after its claim) for the floor, not the hour asked.
    let kept = record
        .expires
        .duration_since(record.created)
        .expect("expires later");
    assert!(
        kept >= floor && kept < floor + Duration::from_secs(3600),
        "{kept:?}"
    );
    let long = adyen.retention(2 * floor);
    assert_eq!(long.effective_retention(), 2 * floor, "longer is kept");
    assert_eq!(
        BatchDeduper::sendgrid(MemoryStore::new()).effective_retention(),
        idemkey::server::webhook::DEFAULT_WEBHOOK_RETENTION
    );
}

async fn dedup_once(
    dedup: &BatchDeduper,
    body: &Bytes,
    key: &std::sync::Mutex<Option<idemkey::IdempotencyKey>>,
) {
    let o = dedup
        .process(body, |item| {
            *key.lock().expect("not poisoned") = item.key().cloned();
            async { Ok::<_, std::io::Error>(()) }
        })
        .await
        .expect("processed");
    assert_eq!(o.processed(), 1);
}
