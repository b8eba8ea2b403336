//! The `idemkey` command line, run as the built binary: `check` against the examples'
//! charge app (every case passes) and against small servers broken one way each (that
//! case fails, and only it); `proxy` in front of a Python API with no idempotency of its
//! own, driven by stripe-node through `--faults` (and, as the control, the same faults
//! with `--no-verify`, where lost answers run twice); `--audit`; `GET /metrics` (with
//! `metrics`); a graceful shutdown; `inspect`, `release`, `stuck` and `sweep` on a SQLite
//! store; `sizing` against `idemkey::store::sizing`.

// The integration tests' tree of the facade (tests/support/ at the repository's root):
// the examples' charge app, the peers, the private servers.
#[path = "../../../tests/support/mod.rs"]
mod support;
// The built binary, one-shot and as a proxy.
mod process;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::{ClaimRequest, FencingToken, MemoryStore, RecordId, Store};
use process::{self as cli, Proxy};
use support::apps::ChargeApp;
use support::peers::{PythonVerifier, node_client_retrying};

const CHARGE: &str = r#"{"amount":100}"#;

/// `idemkey check <url>` with bodies the charge app (and the broken servers) know: slow
/// (`delay_ms`) and failing (`fail`), and two tenants.
async fn check(url: &str) -> (u8, serde_json::Value, String) {
    let out = cli::run(
        &[
            "check",
            url,
            "--data",
            CHARGE,
            "--slow-data",
            r#"{"amount":100,"delay_ms":400}"#,
            "--fail-data",
            r#"{"amount":100,"fail":true}"#,
            "--auth",
            "Bearer tenant-a",
            "--auth",
            "Bearer tenant-b",
            "--json",
        ],
        "",
    )
    .await;
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check printed no JSON ({e}):\n{}", cli::describe(&out)));
    let code = u8::try_from(out.status.code().expect("an exit code")).expect("a byte");
    (code, report, cli::describe(&out))
}

fn verdicts(report: &serde_json::Value) -> HashMap<String, String> {
    report["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            (
                c["case"].as_str().expect("name").to_owned(),
                c["verdict"].as_str().expect("verdict").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_the_charge_server() {
    let app = ChargeApp::new();
    let server =
        support::serve(app.router(IdempotencyLayer::new(Engine::new(MemoryStore::new())))).await;
    let (code, report, output) = check(&server.url("/v1/charges")).await;
    let verdicts = verdicts(&report);
    assert_eq!(verdicts.len(), 7, "{output}");
    assert!(
        verdicts.values().all(|v| v == "pass"),
        "{verdicts:?}\n{output}"
    );
    assert_eq!((code, report["failed"].as_u64()), (0, Some(0)), "{output}");
}

/// The one way a [`Mini`] server is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    Nothing,
    /// Runs every request again instead of replaying.
    Replay,
    /// Replays the stored response to a different body.
    KeyReuse,
    /// Runs a duplicate of a running request alongside it.
    Concurrent,
    /// Runs requests without a key.
    MissingKey,
    /// Takes any key.
    InvalidKey,
    /// One key space for every tenant.
    Tenants,
    /// Stores and replays 5xx answers.
    ServerError,
}

#[derive(Clone)]
enum Entry {
    Running(Bytes),
    Done(Bytes, StatusCode, String),
}

/// A small idempotent charge endpoint written by hand, correct but for `broken`.
#[derive(Clone)]
struct Mini {
    broken: Broken,
    records: Arc<Mutex<HashMap<(String, String), Entry>>>,
    executions: Arc<Mutex<u64>>,
}

async fn mini(State(m): State<Mini>, headers: HeaderMap, body: Bytes) -> Response {
    let fields: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let key = headers
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let Some(key) = key else {
        if m.broken == Broken::MissingKey {
            return execute(&m, &fields).await.into_response();
        }
        return (StatusCode::BAD_REQUEST, "missing key").into_response();
    };
    let valid = key.len() <= 255 && key.bytes().all(|b| b.is_ascii_graphic());
    if !valid && m.broken != Broken::InvalidKey {
        return (StatusCode::BAD_REQUEST, "invalid key").into_response();
    }
    let scope = match m.broken {
        Broken::Tenants => String::new(),
        _ => headers
            .get("authorization")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default(),
    };
    let id = (scope, key);
    let found = m.records.lock().expect("records").get(&id).cloned();
    match found {
        Some(Entry::Done(stored, status, answer))
            if (stored == body || m.broken == Broken::KeyReuse) && m.broken != Broken::Replay =>
        {
            return (status, [("idempotent-replayed", "true")], answer).into_response();
        }
        // Broken::Replay runs it again.
        Some(Entry::Done(stored, ..)) if stored == body => {}
        Some(Entry::Running(stored)) if stored == body && m.broken != Broken::Concurrent => {
            return (StatusCode::CONFLICT, [("retry-after", "1")], "in progress").into_response();
        }
        // Broken::Concurrent runs it alongside.
        Some(Entry::Running(stored)) if stored == body => {}
        Some(_) => return (StatusCode::UNPROCESSABLE_ENTITY, "key reused").into_response(),
        None => {}
    }
    m.records
        .lock()
        .expect("records")
        .insert(id.clone(), Entry::Running(body.clone()));
    let (status, answer) = execute(&m, &fields).await;
    let mut records = m.records.lock().expect("records");
    if status.is_server_error() && m.broken != Broken::ServerError {
        records.remove(&id);
    } else {
        records.insert(id, Entry::Done(body, status, answer.clone()));
    }
    (status, answer).into_response()
}

async fn execute(m: &Mini, fields: &serde_json::Value) -> (StatusCode, String) {
    if let Some(ms) = fields["delay_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if fields["fail"] == true {
        return (StatusCode::INTERNAL_SERVER_ERROR, "failed".into());
    }
    let n = {
        let mut e = m.executions.lock().expect("count");
        *e += 1;
        *e
    };
    (
        StatusCode::OK,
        format!(r#"{{"id":"ch_{n}","amount":{}}}"#, fields["amount"]),
    )
}

async fn serve_mini(broken: Broken) -> idemkey::testing::TestServer {
    let state = Mini {
        broken,
        records: Arc::default(),
        executions: Arc::default(),
    };
    support::serve(
        axum::Router::new()
            .route("/v1/charges", post(mini))
            .with_state(state),
    )
    .await
}

/// Each broken server fails exactly its case (and the exit status counts one); the
/// unbroken one passes every case, so the failures are the breakage's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_each_broken_server_on_its_case() {
    let cases = [
        (Broken::Nothing, None),
        (Broken::Replay, Some("replay")),
        (Broken::KeyReuse, Some("key-reuse")),
        (Broken::Concurrent, Some("concurrent")),
        (Broken::MissingKey, Some("missing-key")),
        (Broken::InvalidKey, Some("invalid-key")),
        (Broken::Tenants, Some("tenants")),
        (Broken::ServerError, Some("5xx")),
    ];
    for (broken, failing) in cases {
        let server = serve_mini(broken).await;
        let (code, report, output) = check(&server.url("/v1/charges")).await;
        let verdicts = verdicts(&report);
        for (case, verdict) in &verdicts {
            let expected = if Some(case.as_str()) == failing {
                "fail"
            } else {
                "pass"
            };
            assert_eq!(verdict, expected, "{broken:?}: case {case}\n{output}");
        }
        assert_eq!(code, u8::from(failing.is_some()), "{broken:?}\n{output}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_prints_a_table_and_skips_what_it_cannot_run() {
    let server = serve_mini(Broken::MissingKey).await;
    let out = cli::run(&["check", &server.url("/v1/charges"), "-d", CHARGE], "").await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", cli::describe(&out));
    let row = |case: &str| {
        text.lines()
            .find(|l| l.starts_with(case))
            .unwrap_or_else(|| panic!("no row {case}:\n{text}"))
            .to_owned()
    };
    assert!(row("missing-key").contains("fail"), "{text}");
    assert!(row("replay").contains("pass"), "{text}");
    assert!(row("tenants").contains("skip"), "{text}");
    assert!(row("5xx").contains("skip"), "{text}");
    assert!(
        text.contains("< 200"),
        "the failing case shows its evidence:\n{text}"
    );
    assert!(text.contains("1 of 7 cases failed"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_asks_before_sending_beyond_this_machine() {
    // 192.0.2.0/24 is TEST-NET-1: nothing answers there, and nothing is sent unconfirmed.
    let out = cli::run(&["check", "http://192.0.2.1/v1/charges"], "n\n").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{}", cli::describe(&out));
    assert!(
        err.contains("real requests") && err.contains("not confirmed"),
        "{err}"
    );
}

/// Routes for the proxy in front of the Python upstream: charges need a key, scoped by
/// the API key (stripe-node's `Authorization`).
const ROUTES: &str = r#"
[default]
key = "off"

[[route]]
path = "/v1/charges"
methods = ["POST"]
key = "required"
scope_header = "Authorization"
key_reused_status = 400
"#;

fn routes_file() -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{}.toml", support::unique("idemkey_routes")));
    std::fs::write(&path, ROUTES).expect("write the routes file");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_runs_each_stripe_node_call_once_through_faults() {
    let upstream = PythonVerifier::start_script("upstream.py", &[]).await;
    let routes = routes_file();
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(""),
        "--config",
        routes.to_str().expect("utf-8 path"),
        "--faults",
        "lose=0.3,reset=0.1,delay=0.1@20ms",
        "--seed",
        "7",
    ]);
    let calls = 8;
    let lines = node_client_retrying("stripe", &proxy.url(""), calls, 6).await;
    assert_eq!(lines.len(), calls, "{lines:?}");
    let mut ids: Vec<_> = lines
        .iter()
        .map(|l| l["id"].as_str().expect("an id").to_owned())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), calls, "one charge per call: {lines:?}");
    let faults = &proxy.health().await["faults"];
    let lost = faults["lost_responses"].as_u64().expect("count");
    let resets = faults["resets"].as_u64().expect("count");
    assert!(lost > 0 && resets > 0, "the seed injects both: {faults}");
    assert_eq!(
        upstream.executions().await,
        calls as u64,
        "one execution per call although {lost} answers were lost: {faults}"
    );
    let _ = std::fs::remove_file(routes);
}

/// The control of the test above: the same faults with `--no-verify` let every lost
/// answer's retry run again upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_without_the_verifier_lets_lost_answers_run_twice() {
    let upstream = PythonVerifier::start_script("upstream.py", &[]).await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(""),
        "--no-verify",
        "--faults",
        "lose=0.3,reset=0.1",
        "--seed",
        "7",
    ]);
    let calls = 8;
    let lines = node_client_retrying("stripe", &proxy.url(""), calls, 6).await;
    assert_eq!(lines.len(), calls, "{lines:?}");
    let lost = proxy.health().await["faults"]["lost_responses"]
        .as_u64()
        .expect("count");
    assert!(lost > 0, "the seed loses answers");
    assert_eq!(
        upstream.executions().await,
        calls as u64 + lost,
        "each lost answer ran its charge once more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_audit_reports_a_key_changed_between_retries() {
    let upstream = PythonVerifier::start_script("upstream.py", &[]).await;
    let proxy = Proxy::start(&["--upstream", &upstream.url(""), "--audit"]);
    let client = reqwest::Client::new();
    let send = |key: &'static str| {
        client
            .post(proxy.url("/v1/charges"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(CHARGE)
            .send()
    };
    let first = send("k-1").await.expect("first");
    assert_eq!(first.status(), 200);
    let retry = send("k-1").await.expect("a retry keeping its key");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let changed = send("k-2").await.expect("a retry with a new key");
    assert_eq!(
        changed.status(),
        200,
        "the proxy cannot tell it apart: it runs"
    );
    assert_eq!(upstream.executions().await, 2);
    assert_eq!(proxy.health().await["audit_reports"], 1);
    let reports: Vec<serde_json::Value> = proxy
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON report"))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(
        (
            &reports[0]["audit"],
            &reports[0]["previous_key"],
            &reports[0]["key"]
        ),
        (&"key-changed".into(), &"k-1".into(), &"k-2".into())
    );
}

/// With `metrics`, the proxy answers `GET /metrics` itself: the verifier's decisions as
/// Prometheus text, one fresh request and its replay.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_serves_its_decisions_at_metrics() {
    let upstream = PythonVerifier::start_script("upstream.py", &[]).await;
    let proxy = Proxy::start(&["--upstream", &upstream.url("")]);
    let client = reqwest::Client::new();
    for expected_replay in [false, true] {
        let answer = client
            .post(proxy.url("/v1/charges"))
            .header("idempotency-key", "k-metrics")
            .header("content-type", "application/json")
            .body(CHARGE)
            .send()
            .await
            .expect("a keyed charge");
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.headers().contains_key("idempotent-replayed"),
            expected_replay
        );
        // The whole answer before the retry: an answer that streams (the upstream's body
        // not there at the first read) is recorded as it ends, and a retry sent on its
        // head alone would rightly find it still in progress (409).
        answer.bytes().await.expect("the charge's body");
    }
    assert_eq!(upstream.executions().await, 1);
    let page = client
        .get(proxy.url("/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("GET /metrics");
    assert_eq!(
        page.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = page.text().await.expect("the page");
    let lines: Vec<&str> = text.lines().collect();
    for series in [
        r#"idemkey_server_requests_total{decision="fresh"} 1"#,
        r#"idemkey_server_requests_total{decision="replay"} 1"#,
    ] {
        assert!(lines.contains(&series), "no {series:?} in:\n{text}");
    }
    assert!(
        lines.contains(&"# TYPE idemkey_server_requests_total counter"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_lets_requests_in_flight_finish_and_records_them_on_sigterm() {
    let upstream = PythonVerifier::start_script("upstream.py", &[]).await;
    let db = std::env::temp_dir().join(format!("{}.db", support::unique("idemkey_proxy")));
    let store = format!("sqlite://{}", db.display());
    let args = ["--upstream", &upstream.url(""), "--store", &store];
    let proxy = Proxy::start(&args);
    let url = proxy.url("/v1/charges");
    let slow = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .header("idempotency-key", "slow-1")
            .header("content-type", "application/json")
            .body(r#"{"amount":100,"delay_ms":1500}"#)
            .send()
            .await
    });
    // In flight: claimed (the record exists), its answer 1.5 s away.
    let records = idemkey::store::open(&store).await.expect("open sqlite");
    let id = RecordId::new("", "slow-1");
    while records.inspect(&id).await.expect("inspect").is_none() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .expect("join");
    assert!(status.success(), "exited cleanly: {status}");
    let answer = slow
        .await
        .expect("join")
        .expect("the request in flight is answered");
    assert_eq!(answer.status(), 200);
    let body = answer.text().await.expect("body");

    let again = Proxy::start(&args);
    let replay = reqwest::Client::new()
        .post(again.url("/v1/charges"))
        .header("idempotency-key", "slow-1")
        .header("content-type", "application/json")
        .body(r#"{"amount":100,"delay_ms":1500}"#)
        .send()
        .await
        .expect("replay");
    assert_eq!(
        replay.headers()["idempotent-replayed"],
        "true",
        "recorded before exit"
    );
    assert_eq!(replay.text().await.expect("body"), body);
    assert_eq!(upstream.executions().await, 1);
    drop(again);
    let _ = std::fs::remove_file(&db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_release_and_stuck_on_a_store() {
    let db = std::env::temp_dir().join(format!("{}.db", support::unique("idemkey_admin")));
    let url = format!("sqlite://{}", db.display());
    let store = idemkey::store::open(&url).await.expect("open sqlite");
    let id = RecordId::new("tenant-a", "order-42");
    store
        .claim(ClaimRequest {
            id: &id,
            fingerprint: b"fp",
            token: FencingToken::random(),
            lease: Duration::from_millis(1),
            retention: Duration::from_secs(3600),
        })
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;

    let out = cli::run(
        &[
            "inspect", &url, "--scope", "tenant-a", "--key", "order-42", "--json",
        ],
        "",
    )
    .await;
    assert!(out.status.success(), "{}", cli::describe(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (info["id"].as_str(), info["state"].as_str()),
        (Some(id.to_hex().as_str()), Some("stuck"))
    );

    let out = cli::run(&["stuck", &url, "--older-than", "0s", "--json"], "").await;
    assert!(out.status.success(), "{}", cli::describe(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["id"].as_str(), Some(id.to_hex().as_str()));
    let out = cli::run(&["stuck", &url, "--older-than", "1h"], "").await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("no claim older than 1h"));

    let out = cli::run(&["release", &url, "--id", &id.to_hex()], "n\n").await;
    assert_eq!(
        out.status.code(),
        Some(125),
        "declined: {}",
        cli::describe(&out)
    );
    assert!(store.inspect(&id).await.expect("inspect").is_some(), "kept");
    let out = cli::run(
        &["release", &url, "--scope", "tenant-a", "--key", "order-42"],
        "y\n",
    )
    .await;
    assert!(out.status.success(), "{}", cli::describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("released"));
    assert!(
        store.inspect(&id).await.expect("inspect").is_none(),
        "released"
    );
    let out = cli::run(
        &["inspect", &url, "--scope", "tenant-a", "--key", "order-42"],
        "",
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no record"),
        "{}",
        cli::describe(&out)
    );
    let out = cli::run(&["release", &url, "--key", "order-42", "--yes"], "").await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to release"));

    let out = cli::run(&["inspect", "memory", "--key", "k"], "").await;
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("inside the process"));
    drop(store);
    let _ = std::fs::remove_file(&db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_expired_records_in_one_pass_and_says_so() {
    let db = std::env::temp_dir().join(format!("{}.db", support::unique("idemkey_sweep")));
    let url = format!("sqlite://{}", db.display());
    let store = idemkey::store::open(&url).await.expect("open sqlite");
    let claim = |key: String, lease: Duration| {
        let store = &store;
        async move {
            store
                .claim(ClaimRequest {
                    id: &RecordId::new("t", &key),
                    fingerprint: b"fp",
                    token: FencingToken::random(),
                    lease,
                    retention: Duration::ZERO,
                })
                .await
                .expect("claim");
        }
    };
    for i in 0..250 {
        claim(format!("old-{i}"), Duration::from_millis(1)).await;
    }
    claim("live".into(), Duration::from_secs(3600)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let out = cli::run(&["sweep", "--store", &url, "--batch", "100", "--json"], "").await;
    assert!(out.status.success(), "{}", cli::describe(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["removed"], 250, "{report}");
    assert_eq!(report["batches"], 3, "{report}");
    assert_eq!(report["outcome"], "complete", "{report}");
    assert!(
        report["rows_per_second"].as_f64().is_some_and(|r| r > 0.0),
        "{report}"
    );

    let out = cli::run(&["sweep", "--store", &url], "").await;
    assert!(out.status.success(), "{}", cli::describe(&out));
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.starts_with("removed 0 records in "), "{line}");
    assert!(line.contains("nothing expired left"), "{line}");
    assert!(
        store
            .inspect(&RecordId::new("t", "live"))
            .await
            .expect("inspect")
            .is_some()
    );

    let out = cli::run(&["sweep", "--store", &url, "--batch", "0"], "").await;
    assert_eq!(out.status.code(), Some(125), "{}", cli::describe(&out));
    let out = cli::run(&["sweep", "--store", "memory"], "").await;
    assert_eq!(out.status.code(), Some(125), "{}", cli::describe(&out));
    let _ = std::fs::remove_file(&db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizing_prints_the_sizing_modules_estimate() {
    use idemkey::store::sizing::{StoreKind, Workload, estimate};
    let day = Duration::from_secs(24 * 3600);
    let expected =
        estimate(StoreKind::Postgres, &Workload::new(1000.0, day, 400)).expect("estimate");
    for (rate, store) in [
        ("1000/s", "postgres"),
        ("60000/min", "postgresql://app@db/app"),
        ("1000", "POSTGRES"),
    ] {
        let out = cli::run(
            &[
                "sizing",
                "--rate",
                rate,
                "--retention",
                "24h",
                "--response-bytes",
                "400",
                "--store",
                store,
                "--json",
            ],
            "",
        )
        .await;
        assert!(out.status.success(), "{}", cli::describe(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(report["store"], "postgres", "{report}");
        assert_eq!(report["records"], expected.records, "{report}");
        assert_eq!(report["live_records"], 86_400_000, "{report}");
        assert_eq!(
            report["expired_records"], expected.expired_records,
            "{report}"
        );
        assert_eq!(
            report["bytes_per_record"], expected.bytes_per_record,
            "{report}"
        );
        assert_eq!(report["bytes"], expected.bytes, "{report}");
    }

    let mut workload = Workload::new(50.0, 7 * day, 2048);
    workload.expired_allowance = Some(Duration::from_secs(600));
    let expected = estimate(StoreKind::Redis, &workload).expect("estimate");
    let out = cli::run(
        &[
            "sizing",
            "--rate",
            "3000/min",
            "--retention",
            "7days",
            "--response-bytes",
            "2048",
            "--store",
            "redis",
            "--expired-for",
            "10m",
        ],
        "",
    )
    .await;
    assert!(out.status.success(), "{}", cli::describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("records: 30,270,000 (30,240,000 within"),
        "{text}"
    );
    let per_record = format!("({} bytes per record", expected.bytes_per_record);
    assert!(text.contains(&per_record), "{text}");

    for (flag, value, says) in [
        ("--rate", "fast", "not a rate"),
        ("--rate", "10/week", "not a rate"),
        ("--store", "oracle://db", "unknown store"),
        ("--retention", "forever", "not a duration"),
        ("--response-bytes", "-1", "-1"),
    ] {
        let mut args = vec![
            "sizing",
            "--rate",
            "1/s",
            "--retention",
            "1h",
            "--response-bytes",
            "10",
            "--store",
            "memory",
        ];
        let at = args.iter().position(|a| *a == flag).expect("flag") + 1;
        args[at] = value;
        let out = cli::run(&args, "").await;
        assert_eq!(out.status.code(), Some(125), "{}", cli::describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{}",
            cli::describe(&out)
        );
    }
}

/// `--dialect VENDOR` puts the vendor's dialect in front of a plain upstream (a Python
/// process): for each vendor, idemkey's client with the vendor's profile sees a repeat
/// replayed (or GoCardless's conflict), a reused key with another body as key-reused
/// (Orb's 409 as in progress), and a raw request without a key the vendor's status;
/// each key runs upstream once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_speaks_each_vendors_dialect() {
    use idemkey::IdempotencyKey;
    use idemkey::client::{
        Error, IdempotentClientBuilder, RequestBuilderExt, ResponseExt, VendorProfile,
    };
    use idemkey::protocol::dialect::{Dialect, Refusal};

    let upstream = PythonVerifier::start_script("upstream.py", &[]).await;
    for (n, dialect) in Dialect::all().into_iter().enumerate() {
        let id = dialect.id();
        let proxy = Proxy::start(&["--upstream", &upstream.url(""), "--dialect", id]);
        let client = IdempotentClientBuilder::new(reqwest::Client::new())
            .profile(VendorProfile::from_dialect(&dialect))
            .max_retries(2)
            .retry_after_cap(Duration::from_millis(1))
            .build();
        let key = IdempotencyKey::new(format!("order-{id}")).expect("valid");
        let send = |amount: u32| {
            client
                .post(proxy.url("/v1/charges"))
                .idempotency_key(key.clone())
                .json(&serde_json::json!({ "amount": amount }))
                .send()
        };
        let first = send(100).await.unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(first.status(), 200, "{id}");
        match send(100).await {
            Ok(again) => {
                let info = again.idempotency().expect("keyed");
                assert_eq!(info.replayed(), dialect.replay_header().is_some(), "{id}");
            }
            Err(e) => {
                let err = Error::try_from_middleware(e).expect("ours");
                assert!(
                    dialect.refuses_replays() && err.is_already_executed(),
                    "{id}: {err}"
                );
            }
        }
        let err =
            Error::try_from_middleware(send(200).await.expect_err("another body")).expect("ours");
        if dialect.recognition(Refusal::KeyReused).is_some() {
            assert!(err.is_key_reused(), "{id}: {err}");
        } else {
            assert!(err.is_in_progress(), "{id}: {err}");
        }
        let raw = reqwest::Client::new()
            .post(proxy.url("/v1/charges"))
            .json(&serde_json::json!({ "amount": 1 }))
            .send()
            .await
            .expect("answered");
        assert_eq!(
            Some(raw.status()),
            dialect.status(Refusal::MissingKey),
            "{id}"
        );
        assert_eq!(
            upstream.executions().await,
            n as u64 + 1,
            "{id}: once per key"
        );
    }
}
