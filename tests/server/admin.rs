//! The admin service over HTTP on 127.0.0.1, mounted in axum under a path of the test's
//! choosing: the in-progress list oldest first, one record by scope and key, and a
//! force-release that lets the next request run while the stuck owner is fenced.

use crate::support;

use axum::Router;
use idemkey::IdempotencyKey;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::admin::AdminService;
use idemkey::server::{Claimed, Engine, IdempotencyLayer};
use idemkey::store::{MemoryStore, RecordId};
use support::apps::{ChargeApp, charge};
use support::verifier::{http, json, problem};

/// The charge app behind a verifier over `engine`, and the admin service on the same
/// engine under `/ops/idem`.
async fn serve(engine: &Engine, app: &ChargeApp) -> idemkey::testing::TestServer {
    let router = app
        .router(IdempotencyLayer::new(engine.clone()))
        .merge(Router::new().nest_service("/ops/idem", AdminService::new(engine.clone())));
    support::serve(router).await
}

async fn stuck(engine: &Engine, scope: &str, key: &str) -> idemkey::server::Execution {
    let key = IdempotencyKey::new(key).expect("valid key");
    match engine
        .claim(scope, &key, &Fingerprint::of_bytes(key.as_str().as_bytes()))
        .await
    {
        Ok(Claimed::Execute(exec)) => exec,
        other => panic!("the first claim of {key:?} executes, got {other:?}"),
    }
}

#[tokio::test]
async fn lists_in_progress_records_oldest_first_as_json() {
    let engine = Engine::new(MemoryStore::new());
    let server = serve(&engine, &ChargeApp::new()).await;
    let _a = stuck(&engine, "t", "first").await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let _b = stuck(&engine, "t", "second").await;

    let resp = http()
        .get(server.url("/ops/idem/in-progress"))
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = json(resp).await;
    let ids: Vec<_> = body["records"]
        .as_array()
        .expect("records is an array")
        .iter()
        .map(|r| r["record_id"].as_str().expect("record_id").to_owned())
        .collect();
    assert_eq!(
        ids,
        [
            RecordId::new("t", "first").to_hex(),
            RecordId::new("t", "second").to_hex()
        ]
    );
    let first = &body["records"][0];
    assert_eq!(first["state"], "in_progress");
    assert_eq!(first["expired"], false);
    assert_eq!(first["payload_len"], serde_json::Value::Null);
    assert_eq!(
        first["fingerprint"],
        hex(Fingerprint::of_bytes(b"first").as_bytes())
    );
    assert!(first["expires_unix_ms"].as_u64() > first["created_unix_ms"].as_u64());

    let one = json(
        http()
            .get(server.url("/ops/idem/in-progress?limit=1"))
            .send()
            .await
            .expect("answers"),
    )
    .await;
    assert_eq!(one["records"].as_array().map(Vec::len), Some(1));
    let bad = http()
        .get(server.url("/ops/idem/in-progress?limit=0"))
        .send()
        .await
        .expect("answers");
    let (status, case, _) = problem(bad).await;
    assert_eq!((status, case.as_str()), (400, "admin-request-invalid"));
}

#[tokio::test]
async fn shows_one_record_by_scope_and_key() {
    let engine = Engine::new(MemoryStore::new());
    let app = ChargeApp::new();
    let server = serve(&engine, &app).await;
    assert_eq!(charge(&http(), server.addr(), "shown-1").await.status, 200);

    let url = server.url("/ops/idem/records?key=shown-1");
    let record = json(http().get(&url).send().await.expect("answers")).await;
    assert_eq!(record["record_id"], RecordId::new("", "shown-1").to_hex());
    assert_eq!(record["state"], "completed");
    assert!(record["payload_len"].as_u64().is_some_and(|n| n > 0));

    let other_scope = http()
        .get(server.url("/ops/idem/records?scope=tenant-b&key=shown-1"))
        .send()
        .await
        .expect("answers");
    let (status, case, _) = problem(other_scope).await;
    assert_eq!((status, case.as_str()), (404, "record-not-found"));
    let no_key = http()
        .get(server.url("/ops/idem/records?scope=x"))
        .send()
        .await
        .expect("answers");
    let (status, case, v) = problem(no_key).await;
    assert_eq!((status, case.as_str()), (400, "admin-request-invalid"));
    assert!(
        v["detail"].as_str().is_some_and(|d| d.contains("`key`")),
        "{v}"
    );
    let put = http().put(&url).send().await.expect("answers");
    assert_eq!(put.headers()["allow"], "GET, DELETE");
    let (status, _, _) = problem(put).await;
    assert_eq!(status, 405);
    let unknown = http()
        .get(server.url("/ops/idem/keys"))
        .send()
        .await
        .expect("answers");
    assert_eq!(problem(unknown).await.0, 404);
}

#[tokio::test]
async fn delete_force_releases_a_stuck_key_and_fences_its_owner() {
    let engine = Engine::new(MemoryStore::new());
    let app = ChargeApp::new();
    let server = serve(&engine, &app).await;
    let owner = stuck(&engine, "", "stuck-9").await;
    // The stuck owner holds the key (with another request's fingerprint): refused.
    assert_eq!(charge(&http(), server.addr(), "stuck-9").await.status, 422);

    let url = server.url("/ops/idem/records?scope=&key=stuck-9");
    let released = json(http().delete(&url).send().await.expect("answers")).await;
    assert_eq!(released["released"], true);
    assert_eq!(released["record"]["state"], "in_progress");
    assert_eq!(charge(&http(), server.addr(), "stuck-9").await.status, 200);
    assert_eq!(app.executions().count(), 1, "the next request ran");
    let late = owner.complete("late".into()).await;
    assert!(
        late.is_err_and(|e| e.is_fenced()),
        "the stuck owner is fenced"
    );

    // Releasing a completed record: the next request runs again.
    assert_eq!(
        json(http().delete(&url).send().await.expect("answers")).await["released"],
        true
    );
    assert_eq!(charge(&http(), server.addr(), "stuck-9").await.status, 200);
    assert_eq!(app.executions().count(), 2);
    let gone = server.url("/ops/idem/records?key=never-used");
    let (status, case, _) = problem(http().delete(&gone).send().await.expect("answers")).await;
    assert_eq!((status, case.as_str()), (404, "record-not-found"));
}

#[tokio::test]
async fn a_failing_store_is_a_503_and_a_missing_operation_a_501() {
    let store = support::verifier::FlakyStore::default();
    let failing = std::sync::Arc::clone(&store.failing);
    let engine = Engine::new(store);
    let server = serve(&engine, &ChargeApp::new()).await;
    // This test store has no `list_in_progress` of its own.
    let list = http()
        .get(server.url("/ops/idem/in-progress"))
        .send()
        .await
        .expect("answers");
    let (status, case, _) = problem(list).await;
    assert_eq!((status, case.as_str()), (501, "operation-unsupported"));

    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let resp = http()
        .get(server.url("/ops/idem/records?key=k"))
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.headers()["retry-after"], "2");
    let (status, case, _) = problem(resp).await;
    assert_eq!((status, case.as_str()), (503, "store-unavailable"));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
