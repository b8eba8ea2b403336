//! The DynamoDB store against moto's DynamoDB-compatible server (installed from PyPI by
//! `support::moto`, started on a free port per test): the conformance suite, the table
//! helper and `open`, payloads over DynamoDB's item limit, TTL attributes, expired items
//! that DynamoDB has not deleted yet, claims from several clients, answers lost on the
//! wire (`testing::FaultProxy`), and the requests per fresh request and per replay.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idemkey::store::aws_sdk_dynamodb::primitives::Blob;
use idemkey::store::aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, TimeToLiveStatus,
};
use idemkey::store::{Claim, ClaimRequest, DynamoStore, FencingToken, RecordId, Store};
use idemkey::testing::{Fault, FaultProxy, conformance};
use support::moto::MotoServer;

const LONG: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_store_conforms() {
    let moto = MotoServer::start();
    let store = support::dynamo_store(&moto, "idemkey_conformance").await;
    conformance::run(|| {
        let store = store.clone();
        async move { store }
    })
    .await;
}

async fn claim(store: &DynamoStore, id: &RecordId, fp: &[u8], token: FencingToken) -> Claim {
    store
        .claim(ClaimRequest {
            id,
            fingerprint: fp,
            token,
            lease: LONG,
            retention: LONG,
        })
        .await
        .expect("claim")
}

/// The raw item of record `id`.
async fn raw_item(
    store: &DynamoStore,
    id: &RecordId,
) -> std::collections::HashMap<String, AttributeValue> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("id", AttributeValue::B(Blob::new(id.as_bytes().as_slice())))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
        .expect("the record's item")
}

fn number(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> u64 {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("`{name}` is a number: {item:?}"))
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits")
}

/// Chunk items (52-byte keys) in the table.
async fn chunk_items(store: &DynamoStore) -> usize {
    let mut n = 0;
    let mut start = None;
    loop {
        let page = store
            .client()
            .scan()
            .table_name(store.table())
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("Scan");
        n += page
            .items()
            .iter()
            .filter(|i| {
                i.get("id")
                    .and_then(|v| v.as_b().ok())
                    .map(|b| b.as_ref().len())
                    == Some(52)
            })
            .count();
        start = page.last_evaluated_key;
        if start.is_none() {
            return n;
        }
    }
}

#[tokio::test]
async fn open_creates_the_table_and_serves_claims() {
    let moto = MotoServer::start();
    let url = format!(
        "dynamodb://local:s%2Fcret@idemkey_open?region=us-east-1&endpoint={}",
        moto.url()
    );
    let store = idemkey::store::open(&url).await.expect("open dynamodb://");
    let (id, token) = (RecordId::new("open", "k"), FencingToken::random());
    let claim = store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token,
            lease: LONG,
            retention: LONG,
        })
        .await
        .expect("claim");
    assert_eq!(claim, Claim::Acquired { takeover: false });
    store.release(&id, token).await.expect("release");
    // The table and its TTL were set up.
    let client = support::dynamo_client(&moto);
    let ttl = client
        .describe_time_to_live()
        .table_name("idemkey_open")
        .send()
        .await
        .expect("DescribeTimeToLive");
    let ttl = ttl.time_to_live_description().expect("a TTL description");
    assert_eq!(ttl.attribute_name(), Some("ttl"));
    assert_eq!(ttl.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));
    // Opening again finds the table.
    idemkey::store::open(&url).await.expect("open again");

    for (bad, says) in [
        ("dynamodb://a:b@t?region=x", "table name"),
        ("dynamodb://a:b@table_x?regoin=x", "unknown parameter"),
        ("dynamodb://table_x?region=x", "no credentials"),
        ("dynamodb://nocolon@table_x?region=x", "KEY_ID:SECRET"),
    ] {
        let err = idemkey::store::open(bad).await.err().expect("a bad URL");
        assert!(
            err.is_unavailable() && err.to_string().contains(says),
            "{bad}: {err}"
        );
    }
    let nobody = format!(
        "dynamodb://a:b@table_x?region=eu-west-1&endpoint=http://127.0.0.1:{}",
        support::free_port()
    );
    let err = idemkey::store::open(&nobody)
        .await
        .err()
        .expect("nothing listens there");
    assert!(err.is_unavailable(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_is_idempotent_and_checks_the_key() {
    let moto = MotoServer::start();
    let store = DynamoStore::builder(support::dynamo_client(&moto))
        .table("idemkey_concurrent")
        .build()
        .expect("store");
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.create_table().await })
        })
        .collect();
    for run in runs {
        run.await.expect("join").expect("concurrent create_table");
    }
    store.create_table().await.expect("create_table again");

    // A table of that name with another key is refused, not used.
    let client = support::dynamo_client(&moto);
    client
        .create_table()
        .table_name("someone_elses")
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("definition"),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .expect("key"),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("CreateTable");
    let other = DynamoStore::builder(client)
        .table("someone_elses")
        .build()
        .expect("store");
    let err = other.create_table().await.expect_err("a table keyed by pk");
    assert!(
        err.is_unavailable() && err.to_string().contains("keyed by `id`"),
        "{err}"
    );
    // A claim on a missing table says what to do.
    let missing = DynamoStore::builder(support::dynamo_client(&moto))
        .table("no_such_table")
        .build()
        .expect("store");
    let err = missing
        .claim(ClaimRequest {
            id: &RecordId::new("t", "k"),
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: LONG,
            retention: LONG,
        })
        .await
        .expect_err("no table");
    assert!(
        err.is_unavailable() && err.to_string().contains("create_table"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_over_the_item_limit_are_kept_in_chunks() {
    let moto = MotoServer::start();
    let store = support::dynamo_store(&moto, "idemkey_chunks").await;
    const CHUNK: usize = 256 * 1024;
    let mut expected_chunks = 0;
    for (size, chunks) in [(CHUNK, 0), (CHUNK + 1, 2), (3 * CHUNK + 17, 4), (0, 0)] {
        let id = RecordId::new("chunks", &size.to_string());
        let owner = FencingToken::random();
        assert_eq!(
            claim(&store, &id, b"fp", owner).await,
            Claim::Acquired { takeover: false }
        );
        let payload: Bytes = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        store
            .complete(&id, owner, payload.clone(), LONG)
            .await
            .unwrap_or_else(|e| panic!("complete {size} bytes: {e}"));
        expected_chunks += chunks;
        assert_eq!(chunk_items(&store).await, expected_chunks, "{size} bytes");
        match claim(&store, &id, b"x", FencingToken::random()).await {
            Claim::Completed {
                fingerprint,
                payload: got,
            } => {
                assert_eq!(fingerprint, b"fp".as_slice());
                assert!(got == payload, "{size} bytes came back as {}", got.len());
            }
            other => panic!("{size} bytes: {other:?}"),
        }
        let item = raw_item(&store, &id).await;
        assert_eq!(number(&item, "payload_len"), size as u64);
        assert_eq!(item.contains_key("payload"), chunks == 0, "{item:?}");
    }

    // A fenced completion leaves no chunks behind.
    let id = RecordId::new("chunks", "fenced");
    claim(&store, &id, b"fp", FencingToken::random()).await;
    let big = Bytes::from(vec![7u8; 2 * CHUNK + 1]);
    let err = store
        .complete(&id, FencingToken::random(), big, LONG)
        .await
        .expect_err("not the owner");
    assert!(err.is_fenced(), "{err}");
    assert_eq!(
        chunk_items(&store).await,
        expected_chunks,
        "chunks of a fenced completion"
    );

    // A chunked record's chunks go with it when it is force-released; its size shows.
    let id = RecordId::new("chunks", &(3 * CHUNK + 17).to_string());
    let info = store
        .inspect(&id)
        .await
        .expect("inspect")
        .expect("a record");
    assert_eq!(info.payload_len, Some(3 * CHUNK as u64 + 17));
    assert!(store.force_release(&id).await.expect("force_release"));
    assert_eq!(
        chunk_items(&store).await,
        expected_chunks - 4,
        "the chunks of a force-released record"
    );
    assert_eq!(
        claim(&store, &id, b"fp", FencingToken::random()).await,
        Claim::Acquired { takeover: false },
        "the next claim executes anew"
    );
}

#[tokio::test]
async fn items_carry_a_ttl_and_expired_items_count_as_absent() {
    let moto = MotoServer::start();
    let store = support::dynamo_store(&moto, "idemkey_ttl").await;
    let (id, owner) = (RecordId::new("ttl", "k"), FencingToken::random());
    let before = now_ms();
    claim(&store, &id, b"fp", owner).await;
    let item = raw_item(&store, &id).await;
    let (expires, keep, ttl) = (
        number(&item, "expires"),
        number(&item, "keep_until"),
        number(&item, "ttl"),
    );
    assert!(
        expires >= before + 600_000 && expires <= now_ms() + 600_000,
        "lease end {expires}"
    );
    assert_eq!(
        keep,
        expires + 600_000,
        "an abandoned claim is kept for the claim's retention"
    );
    assert_eq!(ttl, keep.div_ceil(1000), "TTL in seconds");
    // A renewal moves the lease and keeps the retention past it.
    store
        .renew(&id, owner, Duration::from_secs(1200))
        .await
        .expect("renew");
    let item = raw_item(&store, &id).await;
    let renewed = number(&item, "expires");
    assert!(renewed >= expires + 600_000, "the lease moved: {renewed}");
    assert_eq!(number(&item, "keep_until"), renewed + 600_000);
    assert_eq!(number(&item, "ttl"), renewed.div_ceil(1000) + 600);

    store
        .complete(
            &id,
            owner,
            Bytes::from_static(b"done"),
            Duration::from_secs(3600),
        )
        .await
        .expect("complete");
    let item = raw_item(&store, &id).await;
    let expires = number(&item, "expires");
    assert_eq!(number(&item, "keep_until"), expires);
    assert_eq!(number(&item, "ttl"), expires.div_ceil(1000));
    assert!(
        !item.contains_key("token"),
        "a completed record has no owner"
    );

    // Items DynamoDB has not deleted yet (TTL deletes within days) count as absent by
    // their `expires`: a completed one is claimed afresh, an in-progress one taken over.
    for (state, takeover) in [("completed", false), ("in_progress", true)] {
        let id = RecordId::new("ttl", state);
        let past = now_ms() - 1000;
        let mut put = store
            .client()
            .put_item()
            .table_name(store.table())
            .item("id", AttributeValue::B(Blob::new(id.as_bytes().as_slice())))
            .item("state", AttributeValue::S(state.into()))
            .item("fingerprint", AttributeValue::B(Blob::new("old")))
            .item("created", AttributeValue::N((past - 5000).to_string()))
            .item("expires", AttributeValue::N(past.to_string()))
            .item("keep_until", AttributeValue::N(past.to_string()))
            .item("ttl", AttributeValue::N((past / 1000).to_string()));
        put = if state == "completed" {
            put.item("payload", AttributeValue::B(Blob::new("stale")))
                .item("payload_len", AttributeValue::N("5".into()))
        } else {
            put.item(
                "token",
                AttributeValue::B(Blob::new(FencingToken::random().to_bytes().as_slice())),
            )
        };
        put.send().await.expect("PutItem");
        assert_eq!(
            claim(&store, &id, b"new", FencingToken::random()).await,
            Claim::Acquired { takeover },
            "an expired {state} item"
        );
    }
}

#[tokio::test]
async fn a_claim_repeated_with_its_own_token_is_acquired() {
    // What an SDK retry of a claim whose answer was lost looks like to the store.
    let moto = MotoServer::start();
    let store = support::dynamo_store(&moto, "idemkey_repeat").await;
    let (id, owner) = (RecordId::new("repeat", "k"), FencingToken::random());
    for _ in 0..2 {
        assert_eq!(
            claim(&store, &id, b"fp", owner).await,
            Claim::Acquired { takeover: false }
        );
    }
    assert!(matches!(
        claim(&store, &id, b"fp", FencingToken::random()).await,
        Claim::InProgress { .. }
    ));
    store
        .complete(&id, owner, Bytes::from_static(b"once"), LONG)
        .await
        .expect("the owner completes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_several_clients_are_atomic() {
    let moto = MotoServer::start();
    // Makes the table; each instance then has an SDK client of its own.
    let _table = support::dynamo_store(&moto, "idemkey_race").await;
    support::claims_over_four_instances(2, async || {
        DynamoStore::builder(support::dynamo_client(&moto))
            .table("idemkey_race")
            .build()
            .expect("store")
    })
    .await;
}

/// A store whose requests go through a [`FaultProxy`] in front of moto that loses the
/// next answer when told to (the request is executed; its caller never hears).
struct Lossy {
    proxy: FaultProxy,
    lose_next: Arc<AtomicBool>,
    store: DynamoStore,
}

impl Lossy {
    async fn start(moto: &MotoServer, table: &str) -> Self {
        use idemkey::store::aws_sdk_dynamodb::{Client, config::Credentials};
        let upstream = moto
            .url()
            .trim_start_matches("http://")
            .parse()
            .expect("moto's address");
        let lose_next = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&lose_next);
        let proxy = FaultProxy::start(upstream, move |_| {
            if flag.swap(false, Ordering::SeqCst) {
                Fault::LoseResponse
            } else {
                Fault::None
            }
        })
        .await
        .expect("start the fault proxy");
        let config = DynamoStore::sdk_config("us-east-1")
            .endpoint_url(proxy.url(""))
            .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
            .build();
        let store = DynamoStore::builder(Client::from_conf(config))
            .table(table)
            .build()
            .expect("store");
        Self {
            proxy,
            lose_next,
            store,
        }
    }

    fn lose_next_answer(&self) {
        self.lose_next.store(true, Ordering::SeqCst);
    }

    /// Requests that went through so far.
    fn requests(&self) -> u64 {
        self.proxy.stats().attempts
    }
}

#[tokio::test]
async fn a_retried_claim_or_completion_whose_answer_was_lost_succeeds() {
    let moto = MotoServer::start();
    let direct = support::dynamo_store(&moto, "idemkey_lossy").await;
    let lossy = Lossy::start(&moto, "idemkey_lossy").await;
    let (store, proxy) = (&lossy.store, &lossy.proxy);
    let (id, owner) = (RecordId::new("lossy", "k"), FencingToken::random());

    lossy.lose_next_answer();
    // moto wrote the claim; its answer was lost; the SDK sent it again, and the second
    // attempt's condition failed on the claim's own item.
    assert_eq!(
        claim(store, &id, b"fp", owner).await,
        Claim::Acquired { takeover: false },
        "the retried claim recognises its own success"
    );
    assert_eq!(proxy.stats().lost_responses, 1, "one answer was lost");
    assert_eq!(lossy.requests(), 2, "and the claim was sent again");

    lossy.lose_next_answer();
    store
        .complete(&id, owner, Bytes::from_static(b"the outcome"), LONG)
        .await
        .expect("the retried completion recognises its own success");
    assert_eq!(proxy.stats().lost_responses, 2, "another answer was lost");
    match claim(&direct, &id, b"x", FencingToken::random()).await {
        Claim::Completed { payload, .. } => assert_eq!(payload, "the outcome"),
        other => panic!("the record must be completed: {other:?}"),
    }
    // A second completion by the owner is still fenced.
    let err = store
        .complete(&id, owner, Bytes::from_static(b"again"), LONG)
        .await
        .expect_err("completed already");
    assert!(err.is_fenced(), "{err}");
}

#[tokio::test]
async fn requests_per_fresh_request_and_per_replay() {
    let moto = MotoServer::start();
    support::dynamo_store(&moto, "idemkey_counted").await;
    let lossy = Lossy::start(&moto, "idemkey_counted").await;
    let store = &lossy.store;
    // Claim (PutItem) and complete (UpdateItem); a replay is the claim alone. A 1 MiB
    // payload adds its four chunks of 256 KiB: written (PutItem) before the completion,
    // read (GetItem) after the claim.
    for (key, size, fresh, replay) in [("small", 1000, 2, 1), ("1 MiB", 1 << 20, 6, 5)] {
        let (id, owner) = (RecordId::new("counted", key), FencingToken::random());
        let start = lossy.requests();
        claim(store, &id, b"fp", owner).await;
        store
            .complete(&id, owner, Bytes::from(vec![1u8; size]), LONG)
            .await
            .expect("complete");
        assert_eq!(lossy.requests() - start, fresh, "a fresh request, {key}");
        let start = lossy.requests();
        assert!(matches!(
            claim(store, &id, b"fp", FencingToken::random()).await,
            Claim::Completed { .. }
        ));
        assert_eq!(lossy.requests() - start, replay, "a replay, {key}");
    }
    let (id, owner) = (RecordId::new("counted", "running"), FencingToken::random());
    claim(store, &id, b"fp", owner).await;
    let start = lossy.requests();
    assert!(matches!(
        claim(store, &id, b"fp", FencingToken::random()).await,
        Claim::InProgress { .. }
    ));
    assert_eq!(
        lossy.requests() - start,
        1,
        "a duplicate of a running request"
    );
}
