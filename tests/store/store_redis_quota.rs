//! The Redis store's shared quota ([`Store::claim_charged`]) as a store contract: a new
//! record takes a token in the claim's one round trip, a live record takes none, an
//! empty bucket writes nothing, a takeover is not charged, and an idle bucket expires.

use crate::store_redis::command_calls;
use crate::support;

use std::time::Duration;

use idemkey::store::{
    ChargedClaim, Claim, ClaimRequest, FencingToken, QuotaCharge, RecordId, RedisStore, Store,
};

fn request(id: &RecordId, lease: Duration) -> ClaimRequest<'_> {
    ClaimRequest {
        id,
        fingerprint: b"fp",
        token: FencingToken::random(),
        lease,
        retention: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn a_charged_claim_spends_a_token_only_on_a_new_record_in_one_round_trip() {
    let server = support::RedisServer::start();
    let store = RedisStore::builder(server.url())
        .connect()
        .await
        .expect("the private Redis answers");
    let mut admin = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let bucket = RecordId::new("agent", "");
    // Two tokens, one more every hour.
    let charge = QuotaCharge::new(&bucket, 1.0 / 3600.0, 2);
    let lease = Duration::from_secs(30);
    let (one, two, three) = (
        RecordId::new("agent", "k-1"),
        RecordId::new("agent", "k-2"),
        RecordId::new("agent", "k-3"),
    );

    let before = command_calls(&mut admin).await;
    let first = store
        .claim_charged(request(&one, lease), charge)
        .await
        .expect("claim");
    let after = command_calls(&mut admin).await;
    assert_eq!(
        first,
        ChargedClaim::Claimed(Claim::Acquired { takeover: false })
    );
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert_eq!(delta("evalsha"), 1, "one script, one round trip");
    assert_eq!(delta("pttl"), 0, "no pipelined claim besides");

    // The live record takes no token: in progress, then completed.
    let again = store
        .claim_charged(request(&one, lease), charge)
        .await
        .expect("claim");
    assert!(
        matches!(again, ChargedClaim::Claimed(Claim::InProgress { .. })),
        "{again:?}"
    );
    let Claim::Acquired { .. } = store
        .claim(request(&two, lease))
        .await
        .expect("plain claim")
    else {
        panic!("a new record");
    };
    // (A plain claim is not charged either.)
    let second = store
        .claim_charged(request(&three, lease), charge)
        .await
        .expect("claim");
    assert_eq!(
        second,
        ChargedClaim::Claimed(Claim::Acquired { takeover: false })
    );

    // The bucket is empty: nothing is written, and a token is an hour away.
    let four = RecordId::new("agent", "k-4");
    let over = store
        .claim_charged(request(&four, lease), charge)
        .await
        .expect("claim");
    let ChargedClaim::OverQuota { retry_after } = over else {
        panic!("over quota: {over:?}");
    };
    assert!(
        retry_after > Duration::from_secs(3500) && retry_after <= Duration::from_secs(3600),
        "{retry_after:?}"
    );
    assert!(store.inspect(&four).await.expect("inspect").is_none());
    // A live record is still answered with the bucket empty.
    let live = store
        .claim_charged(request(&one, lease), charge)
        .await
        .expect("claim");
    assert!(
        matches!(live, ChargedClaim::Claimed(Claim::InProgress { .. })),
        "{live:?}"
    );

    // The bucket expires once it would be full again: about two hours from now.
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("idemkey:quota:{{{}}}", bucket.to_hex()))
        .query_async(&mut admin)
        .await
        .expect("pttl");
    assert!(ttl > 3_600_000 && ttl <= 2 * 3_600_000 + 1_000, "{ttl}");
}

#[tokio::test]
async fn a_takeover_of_an_expired_claim_is_not_charged() {
    let server = support::RedisServer::start();
    let store = RedisStore::builder(server.url())
        .connect()
        .await
        .expect("the private Redis answers");
    let bucket = RecordId::new("agent", "");
    let charge = QuotaCharge::new(&bucket, 1.0 / 3600.0, 1);
    let id = RecordId::new("agent", "abandoned");
    let first = store
        .claim_charged(request(&id, Duration::from_millis(1)), charge)
        .await
        .expect("claim");
    assert_eq!(
        first,
        ChargedClaim::Claimed(Claim::Acquired { takeover: false })
    );
    // The bucket is empty now; once the lease ran out, the key is taken over anyway.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match store
            .claim_charged(request(&id, Duration::from_secs(30)), charge)
            .await
            .expect("claim")
        {
            ChargedClaim::Claimed(Claim::Acquired { takeover: true }) => break,
            ChargedClaim::Claimed(Claim::InProgress { .. }) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the 1 ms lease never ended"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => panic!("{other:?}"),
        }
    }
    let other = RecordId::new("agent", "new");
    assert!(matches!(
        store
            .claim_charged(request(&other, Duration::from_secs(30)), charge)
            .await
            .expect("claim"),
        ChargedClaim::OverQuota { .. }
    ));
}

/// A store shared as `Arc<RedisStore>` (one store behind several engines) charges its
/// bucket as the store itself does: the `Arc` forwards `claim_charged` rather than
/// falling back to the trait's default, which refuses shared quotas.
#[tokio::test]
async fn a_shared_arc_of_the_store_charges_its_bucket() {
    let server = support::RedisServer::start();
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(
        RedisStore::builder(server.url())
            .connect()
            .await
            .expect("the private Redis answers"),
    );
    let store = &store; // the `Arc`'s own `Store` impl, not the Redis store's
    let bucket = RecordId::new("agent", "");
    let charge = QuotaCharge::new(&bucket, 1.0 / 3600.0, 1);
    let lease = Duration::from_secs(30);
    let (one, two) = (RecordId::new("agent", "k-1"), RecordId::new("agent", "k-2"));
    let first = Store::claim_charged(store, request(&one, lease), charge)
        .await
        .expect("an Arc of a store with buckets charges them");
    assert_eq!(
        first,
        ChargedClaim::Claimed(Claim::Acquired { takeover: false })
    );
    let second = Store::claim_charged(store, request(&two, lease), charge)
        .await
        .expect("claim");
    assert!(
        matches!(second, ChargedClaim::OverQuota { .. }),
        "one token, spent: {second:?}"
    );
}
