//! A real HTTP server on 127.0.0.1 that records every request (key, attempt number,
//! arrival time) and answers from a per-test script.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use idemkey::testing::TestServer;
use tokio::time::Instant;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// The key header's value as sent (None when absent).
    pub(crate) key: Option<String>,
    /// 1 for the first request with this key (or the first without one), 2 for the next...
    pub(crate) attempt: u32,
    /// Arrival time on tokio's clock (paused clocks work).
    pub(crate) at: Instant,
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) body: Bytes,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    status: StatusCode,
    headers: Vec<(HeaderName, String)>,
    body: String,
}

impl Reply {
    /// 200 with a small JSON body.
    pub(crate) fn ok() -> Self {
        Self::status(200).body(r#"{"id":"ch_1","status":"succeeded"}"#)
    }

    pub(crate) fn status(status: u16) -> Self {
        Self {
            status: StatusCode::from_u16(status).expect("a valid status code"),
            headers: vec![(
                HeaderName::from_static("content-type"),
                "application/json".into(),
            )],
            body: String::new(),
        }
    }

    pub(crate) fn body(mut self, body: &str) -> Self {
        self.body = body.into();
        self
    }

    pub(crate) fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers
            .push((HeaderName::from_static(name), value.into()));
        self
    }

    pub(crate) fn retry_after(self, value: impl Into<String>) -> Self {
        self.header("retry-after", value)
    }

    /// Marks the answer as a replay of a stored response.
    pub(crate) fn replayed(self) -> Self {
        self.header("idempotent-replayed", "true")
    }

    /// 409 `in-progress` problem, as the verifier answers a concurrent duplicate.
    pub(crate) fn in_progress() -> Self {
        let mut r = Self::status(409)
            .retry_after("0")
            .body(r#"{"type":"in-progress","title":"a request with this key is in progress"}"#);
        r.headers[0].1 = "application/problem+json".into();
        r
    }

    /// A problem document of idemkey's verifier, with `Retry-After: 0`.
    pub(crate) fn problem(status: u16, problem: idemkey::protocol::Problem) -> Self {
        let body = format!(
            r#"{{"type":"{}","title":"{}"}}"#,
            problem.type_uri(),
            problem.title()
        );
        let mut r = Self::status(status).retry_after("0").body(&body);
        r.headers[0].1 = "application/problem+json".into();
        r
    }

    fn into_response(self, key: Option<&str>) -> Response {
        let mut response = (self.status, self.body).into_response();
        for (name, value) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, v);
            }
        }
        if let Some(k) = key.and_then(|k| HeaderValue::from_str(k).ok()) {
            response
                .headers_mut()
                .insert(HeaderName::from_static("x-seen-key"), k);
        }
        response
    }
}

/// How the script is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reply i answers the i-th request overall.
    Global,
    /// Reply i answers attempt i of every key.
    PerKey,
}

struct Shared {
    header: HeaderName,
    script: Vec<Reply>,
    mode: Mode,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    records: Vec<Record>,
    per_key: HashMap<Option<String>, u32>,
}

/// The running server; stops when dropped.
pub(crate) struct Recorder {
    server: TestServer,
    shared: Arc<Shared>,
}

impl Recorder {
    /// Answers the i-th request overall with `script[i]`, then 200.
    pub(crate) async fn start(script: impl IntoIterator<Item = Reply>) -> Self {
        Self::spawn(
            "idempotency-key",
            script.into_iter().collect(),
            Mode::Global,
        )
        .await
    }

    /// Answers attempt i of every key with `script[i - 1]`, then 200.
    pub(crate) async fn per_key(script: impl IntoIterator<Item = Reply>) -> Self {
        Self::spawn(
            "idempotency-key",
            script.into_iter().collect(),
            Mode::PerKey,
        )
        .await
    }

    /// Like [`Recorder::start`], reading the key from another header.
    pub(crate) async fn with_header(
        header: &'static str,
        script: impl IntoIterator<Item = Reply>,
    ) -> Self {
        Self::spawn(header, script.into_iter().collect(), Mode::Global).await
    }

    async fn spawn(header: &'static str, script: Vec<Reply>, mode: Mode) -> Self {
        let shared = Arc::new(Shared {
            header: HeaderName::from_static(header),
            script,
            mode,
            log: Mutex::new(Log::default()),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = super::serve(app).await;
        Self { server, shared }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// Every request so far, in arrival order.
    pub(crate) fn records(&self) -> Vec<Record> {
        self.shared.log.lock().expect("log lock").records.clone()
    }

    /// The keys of every request so far, in arrival order.
    pub(crate) fn keys(&self) -> Vec<Option<String>> {
        self.records().into_iter().map(|r| r.key).collect()
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers
        .get(&shared.header)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let reply = {
        let mut log = shared.log.lock().expect("log lock");
        let attempt = {
            let n = log.per_key.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let index = match shared.mode {
            Mode::Global => log.records.len(),
            Mode::PerKey => attempt as usize - 1,
        };
        log.records.push(Record {
            key: key.clone(),
            attempt,
            at: Instant::now(),
            method,
            path: uri.path().to_owned(),
            body,
        });
        shared.script.get(index).cloned().unwrap_or_else(Reply::ok)
    };
    reply.into_response(key.as_deref())
}
