//! Two receiver instances sharing the real Redis process each event once between them.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::join_all;
use http::StatusCode;
use idemkey::server::webhook::BatchDeduper;
use idemkey::store::{RedisStore, Store};
use support::serve;
use support::webhook::*;

/// A Redis store on the shared server under `prefix` (unique per test).
async fn redis(prefix: &str) -> RedisStore {
    let url = support::redis_url();
    RedisStore::builder(&url)
        .prefix(prefix)
        .connect()
        .await
        .unwrap_or_else(|e| {
            panic!("the Redis at {url} must be reachable (set IDEMKEY_REDIS_URL): {e}")
        })
}

/// Removes the test's keys from the shared Redis (records would otherwise stay for their
/// 7-day retention).
async fn cleanup(prefix: &str) {
    let url = support::redis_url();
    let mut conn = redis::Client::open(url.as_str())
        .expect("valid Redis URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} must be reachable: {e}"));
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_on_one_redis_process_each_event_once() {
    let prefix = format!("{}:", support::unique("idemkey_webhooks"));
    let (app_a, stats_a) = receiver::app(Arc::new(redis(&prefix).await), None);
    let (app_b, stats_b) = receiver::app(Arc::new(redis(&prefix).await), None);
    let (a, b) = (serve(app_a).await, serve(app_b).await);
    let client = reqwest::Client::new();

    // 200 concurrent deliveries of one Stripe event, alternating between the instances,
    // plus a second event delivered 50 times to each.
    let evt = stripe_event("evt_shared_redis", Some("acct_1"), 1);
    let other = stripe_event("evt_second", None, 1);
    let sends = (0..300).map(|i| {
        let base = if i % 2 == 0 { &a } else { &b };
        let body = if i < 200 { evt.clone() } else { other.clone() };
        let (client, url) = (client.clone(), base.url("/webhooks/stripe"));
        async move { deliver(&client, &url, &headers(&[]), &body).await }
    });
    let answers = join_all(sends).await;
    for ans in &answers {
        match ans.status {
            StatusCode::OK => {}
            StatusCode::CONFLICT => assert!(ans.headers.contains_key("retry-after")),
            other => panic!("unexpected {other}: {:?}", ans.body),
        }
    }
    assert_eq!(
        stats_a.processed() + stats_b.processed(),
        2,
        "each event once across both instances (a: {}, b: {})",
        stats_a.processed(),
        stats_b.processed()
    );
    // Retries after the dust settles are replays, whichever instance gets them.
    for base in [&a, &b] {
        let r = deliver(&client, &base.url("/webhooks/stripe"), &headers(&[]), &evt).await;
        assert_eq!((r.status, r.replayed()), (StatusCode::OK, true));
    }
    cleanup(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batches_on_two_instances_run_each_item_once() {
    let prefix = format!("{}:", support::unique("idemkey_batches"));
    let one: Arc<dyn Store> = Arc::new(redis(&prefix).await);
    let two: Arc<dyn Store> = Arc::new(redis(&prefix).await);
    let instances = [BatchDeduper::sendgrid(one), BatchDeduper::sendgrid(two)];
    let events: Vec<serde_json::Value> = (0..25)
        .map(|i| serde_json::json!({"email":"example@test.com","event":"delivered","sg_event_id":format!("sg_{i}"),"timestamp":1_513_299_569}))
        .collect();
    let body = Bytes::from(serde_json::to_vec(&events).expect("serialisable"));
    let seen = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let runs = (0..40).map(|i| {
        let dedup = instances[i % 2].clone();
        let (body, seen) = (body.clone(), seen.clone());
        tokio::spawn(async move {
            dedup
                .process(&body, |item| {
                    let seen = seen.clone();
                    async move {
                        let id = item
                            .key()
                            .map(|k| k.as_str().to_owned())
                            .unwrap_or_default();
                        tokio::task::yield_now().await;
                        *seen.lock().expect("not poisoned").entry(id).or_default() += 1;
                        Ok::<_, std::io::Error>(())
                    }
                })
                .await
                .expect("the batch is processed")
        })
    });
    for r in join_all(runs).await {
        r.expect("task ran");
    }
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(seen.len(), 25);
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    cleanup(&prefix).await;
}
