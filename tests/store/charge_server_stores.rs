//! `examples/charge_server.rs --store <url>` over every store: the real binary, killed
//! (SIGKILL, by its pid) after a charge and started again; the restarted server replays
//! the charge from the store instead of charging again.

use crate::support;

use std::process::Command;

use support::examples::ExampleServer;

/// `charge_server --store <store>`.
struct ChargeServer(ExampleServer);

impl ChargeServer {
    fn start(store: &str) -> Self {
        Self(ExampleServer::start("charge_server", &["--store", store]))
    }

    fn url(&self, path: &str) -> String {
        self.0.url(path)
    }

    fn kill(&mut self) {
        self.0.kill();
    }
}

async fn charge(server: &ChargeServer, key: &str) -> (u16, bool, bytes::Bytes) {
    let resp = reqwest::Client::new()
        .post(server.url("/v1/charges"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":1250}"#)
        .send()
        .await
        .expect("POST /v1/charges");
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (
        resp.status().as_u16(),
        replayed,
        resp.bytes().await.expect("body"),
    )
}

async fn executions(server: &ChargeServer) -> u64 {
    let body = reqwest::get(server.url("/stats"))
        .await
        .expect("GET /stats")
        .bytes()
        .await
        .expect("stats body");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("stats JSON");
    v["executions"].as_u64().expect("executions count")
}

/// Charges once, replays, kills the server, starts it again: with a durable or shared
/// store the new process replays without executing.
async fn survives_a_restart(store: &str) {
    let key = uuid::Uuid::new_v4().to_string();
    let mut server = ChargeServer::start(store);
    let (status, replayed, first) = charge(&server, &key).await;
    assert_eq!((status, replayed), (200, false), "{store}: first charge");
    let (status, replayed, again) = charge(&server, &key).await;
    assert_eq!((status, replayed), (200, true), "{store}: retry");
    assert_eq!(again, first, "{store}: the replay is byte-identical");
    assert_eq!(executions(&server).await, 1, "{store}");
    server.kill();

    let server = ChargeServer::start(store);
    let (status, replayed, after) = charge(&server, &key).await;
    assert_eq!(
        (status, replayed),
        (200, true),
        "{store}: replayed after a restart"
    );
    assert_eq!(after, first, "{store}: the same reply after a restart");
    assert_eq!(
        executions(&server).await,
        0,
        "{store}: nothing charged again"
    );
}

#[tokio::test]
async fn charge_server_on_sqlite() {
    let dir = support::TempDir::new("idemkey-charge");
    survives_a_restart(&format!(
        "sqlite://{}",
        dir.path().join("charges.db").display()
    ))
    .await;
}

#[tokio::test]
async fn charge_server_on_redis() {
    survives_a_restart(&support::redis_url()).await;
}

#[tokio::test]
async fn charge_server_on_postgres() {
    survives_a_restart(&support::postgres_url()).await;
}

#[tokio::test]
async fn charge_server_on_memory_forgets_on_restart() {
    let key = uuid::Uuid::new_v4().to_string();
    let mut server = ChargeServer::start("memory");
    assert_eq!(charge(&server, &key).await.0, 200);
    assert!(charge(&server, &key).await.1, "replayed while running");
    server.kill();
    let server = ChargeServer::start("memory");
    let (status, replayed, _) = charge(&server, &key).await;
    assert_eq!(
        (status, replayed),
        (200, false),
        "memory records die with the process"
    );
}

#[tokio::test]
async fn charge_server_rejects_unknown_stores() {
    let out = Command::new(support::examples::binary("charge_server"))
        .args(["--addr", "127.0.0.1:0", "--store", "oracle://db/app"])
        .output()
        .expect("run charge_server");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown store URL"), "{err}");
}
