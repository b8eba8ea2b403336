//! The verifier over each store, under loopback HTTP load, against the bare handler.
//!
//! One app per store (the charge handler behind the idempotency layer, as in
//! `examples/charge_server.rs`) on 127.0.0.1; each iteration sends `CONCURRENCY`
//! concurrent `POST /v1/charges` over keep-alive connections:
//!
//! - `bare`: the same handler without the layer (the baseline);
//! - `<store>/fresh`: a new key per request (claim, handler, complete);
//! - `<store>/replay`: one completed key (claim returns the stored reply).
//!
//! Needs Redis, PostgreSQL and MariaDB (or MySQL) as the tests do (`IDEMKEY_REDIS_URL`,
//! `IDEMKEY_POSTGRES_URL`, `IDEMKEY_MYSQL_URL`). Run: `cargo bench -p perf --bench stores --
//! --warm-up-time 1 --measurement-time 3`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::{MemoryStore, MySqlStore, PostgresStore, RedisStore, SqliteStore, Store};

const CONCURRENCY: usize = 16;

async fn charge(body: bytes::Bytes) -> (http::StatusCode, String) {
    let id = uuid::Uuid::new_v4();
    (
        http::StatusCode::CREATED,
        format!("{{\"charge\":\"{id}\",\"request_bytes\":{}}}", body.len()),
    )
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn app(store: Option<Arc<dyn Store>>) -> SocketAddr {
    let router = Router::new().route("/v1/charges", post(charge));
    match store {
        None => serve(router).await,
        Some(store) => {
            let engine = Engine::builder(store)
                .retention(Duration::from_secs(600))
                .build();
            serve(router.layer(IdempotencyLayer::new(engine))).await
        }
    }
}

async fn send(client: &reqwest::Client, addr: SocketAddr, key: &str) {
    let resp = client
        .post(format!("http://{addr}/v1/charges"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":1000,"currency":"eur"}"#)
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), 201, "the verifier must answer 201");
    resp.bytes().await.expect("body");
}

async fn burst(client: &reqwest::Client, addr: SocketAddr, key: Option<&str>) {
    let sends = (0..CONCURRENCY).map(|_| async {
        let fresh;
        let key = match key {
            Some(k) => k,
            None => {
                fresh = uuid::Uuid::new_v4().to_string();
                &fresh
            }
        };
        send(client, addr, key).await;
    });
    futures_util::future::join_all(sends).await;
}

async fn stores() -> Vec<(&'static str, Arc<dyn Store>)> {
    let redis_url =
        std::env::var("IDEMKEY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let pg_url = std::env::var("IDEMKEY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let redis = RedisStore::builder(&redis_url)
        .prefix(format!("idemkey-bench-{}:", uuid::Uuid::new_v4().simple()))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {redis_url} must be reachable: {e}"));
    let pg = PostgresStore::builder(&pg_url)
        .table("idemkey_bench")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {pg_url} must be reachable: {e}"));
    pg.migrate().await.expect("create the bench table");
    let admin = sqlx::PgPool::connect(&pg_url)
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {pg_url} must be reachable: {e}"));
    sqlx::raw_sql("TRUNCATE idemkey_bench")
        .execute(&admin)
        .await
        .expect("empty the bench table");
    admin.close().await;
    let mysql_url = std::env::var("IDEMKEY_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let mysql = MySqlStore::builder(&mysql_url)
        .table("idemkey_bench")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the MySQL/MariaDB at {mysql_url} must be reachable: {e}"));
    mysql.migrate().await.expect("create the bench table");
    let admin = sqlx::MySqlPool::connect(&mysql_url)
        .await
        .unwrap_or_else(|e| panic!("the MySQL/MariaDB at {mysql_url} must be reachable: {e}"));
    sqlx::raw_sql("TRUNCATE idemkey_bench")
        .execute(&admin)
        .await
        .expect("empty the bench table");
    admin.close().await;
    let dir = std::env::temp_dir().join(format!("idemkey-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let sqlite = SqliteStore::open(dir.join("bench.db"))
        .await
        .expect("open the SQLite file");
    vec![
        ("memory", Arc::new(MemoryStore::new())),
        ("sqlite", Arc::new(sqlite)),
        ("redis", Arc::new(redis)),
        ("postgres", Arc::new(pg)),
        ("mysql", Arc::new(mysql)),
    ]
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()
        .expect("HTTP client");
    let mut group = c.benchmark_group("charge_server");
    group.throughput(Throughput::Elements(CONCURRENCY as u64));

    let bare = rt.block_on(app(None));
    group.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| burst(&client, bare, None));
    });
    for (name, store) in rt.block_on(stores()) {
        let addr = rt.block_on(app(Some(store)));
        group.bench_function(format!("{name}/fresh"), |b| {
            b.to_async(&rt).iter(|| burst(&client, addr, None));
        });
        let key = uuid::Uuid::new_v4().to_string();
        rt.block_on(send(&client, addr, &key));
        group.bench_function(format!("{name}/replay"), |b| {
            b.to_async(&rt).iter(|| burst(&client, addr, Some(&key)));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
