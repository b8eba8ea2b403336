//! `idemkey proxy`: the verifier as a reverse proxy in front of any HTTP API.

mod audit;
mod config;
mod faults;
#[cfg(feature = "metrics")]
mod metrics;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower_service::Service;

use idemkey::server::{
    Engine, Idempotency, IdempotencyLayer, body::RequestBody, body::ResponseBody,
    extract::HeaderScope, policy::KeyRequirement,
};
use idemkey::testing::{Fault, FaultPlan, FaultRates};

/// Put the verifier in front of an HTTP API written in any language.
///
/// Every request to `--listen` goes to `--upstream` through the verifier: a keyed
/// request runs upstream at most once, retries get the stored response, a key reused
/// with another request gets 422, a duplicate of a running request 409. Routes (which
/// paths and methods need keys, scope header, retention, fingerprint, body limits) come
/// from `--config FILE`; without one, keys are required on every method but GET, HEAD,
/// OPTIONS and TRACE, and records are unscoped.
///
/// `GET /healthz` answers the proxy itself (with what `--faults` and `--audit` did so
/// far); so does `GET /metrics` (Prometheus text) when idemkey is built with features
/// `cli,metrics`, and without `metrics` that path goes to the upstream like any other.
/// SIGTERM or Ctrl-C stops accepting connections, lets requests in flight finish
/// (their outcomes are recorded), then exits.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {
    /// Where to listen (`127.0.0.1:0` picks a free port; the first line printed says
    /// which).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The API behind the proxy, an http:// URL (a path prefix is kept:
    /// http://127.0.0.1:4000/api).
    #[arg(long)]
    upstream: String,
    /// The store: memory (default), redis://, postgres://, sqlite://PATH, mysql://,
    /// dynamodb://TABLE (each needs its idemkey feature).
    #[arg(long, default_value = "memory")]
    store: String,
    /// The routes file (TOML): its format is in idemkey-cli's README.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Inject faults between clients and the proxy: `lose=RATE` (the request runs, its
    /// answer is dropped), `reset=RATE` (the connection is closed before anything runs),
    /// `delay=DURATION` (or `RATE`, or `RATE@DURATION`), comma-separated.
    #[arg(long, value_parser = faults::parse, value_name = "FAULTS")]
    faults: Option<FaultRates>,
    /// Answer as this vendor's API does: standard (default), stripe, stainless, adyen,
    /// paypal, square, checkout, gocardless. The key is read where the vendor puts it
    /// (PayPal-Request-Id, Cko-Idempotency-Key, Square's `idempotency_key` body field)
    /// within its length limit; a reused key, a duplicate in progress, a missing or
    /// invalid key and an unavailable store get the vendor's status, error body and
    /// retry hints; replays carry the vendor's marker, if it has one. A route's
    /// `dialect` in --config wins over this flag.
    #[arg(long, value_name = "VENDOR",
        value_parser = clap::builder::PossibleValuesParser::new(idemkey::protocol::Dialect::ALL_NAMES))]
    dialect: Option<String>,
    /// The seed of `--faults`: the same seed and order of requests give the same faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Forward every request without the verifier (with --faults: a pure fault
    /// injector in front of an API that verifies keys itself).
    #[arg(long)]
    no_verify: bool,
    /// Report clients that change the key between retries of one request (same
    /// fingerprint and scope, new key, within --audit-window): one JSON line each on
    /// standard output.
    #[arg(long)]
    audit: bool,
    /// How far apart two requests may be to count as retries of one.
    #[arg(long, default_value = "60s", value_parser = crate::durations::parse)]
    audit_window: Duration,
    /// How long a claim holds its key if the proxy dies while the request runs.
    #[arg(long, default_value = "5s", value_parser = crate::durations::parse)]
    lease: Duration,
    /// How long a shutdown waits for requests in flight.
    #[arg(long, default_value = "30s", value_parser = crate::durations::parse)]
    drain: Duration,
}

type Body = UnsyncBoxBody<Bytes, BodyError>;

/// A body that broke off (the client's or the upstream's connection).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct BodyError(#[from] hyper::Error);

/// How long a client has to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request body has to arrive (`408` beyond, before any key is claimed).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The hyper client to the upstream, as the service the verifier wraps.
#[derive(Clone)]
struct Upstream {
    client: Client<HttpConnector, RequestBody<Body>>,
    scheme_authority: String,
    prefix: String,
    host: HeaderValue,
}

impl Upstream {
    fn new(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--upstream {url:?}: {e}; give an http:// URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "--upstream {url:?}: the proxy reaches its upstream over plain http:// only"
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("--upstream {url:?} names no host"))?;
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            scheme_authority: format!("http://{authority}"),
            prefix: uri.path().trim_end_matches('/').to_owned(),
            host: HeaderValue::from_str(authority.as_str())
                .map_err(|e| format!("--upstream {url:?}: {e}"))?,
        })
    }

    async fn forward(self, req: Request<RequestBody<Body>>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let target = format!("{}{}{path}", self.scheme_authority, self.prefix);
        parts.uri = match target.parse() {
            Ok(uri) => uri,
            Err(e) => return bad_gateway(&format!("cannot address the upstream: {e}")),
        };
        parts.headers.insert(header::HOST, self.host.clone());
        match self.client.request(Request::from_parts(parts, body)).await {
            Ok(response) => response.map(boxed),
            Err(e) => bad_gateway(&format!("the upstream did not answer: {e}")),
        }
    }
}

impl Service<Request<RequestBody<Body>>> for Upstream {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestBody<Body>>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// A hyper body as the proxy's one body type.
fn boxed(body: Incoming) -> Body {
    body.map_err(BodyError).boxed_unsync()
}

fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// `502` as an RFC 9457 problem: the upstream failed, nothing was recorded (the key is
/// released, as for any 5xx).
fn bad_gateway(detail: &str) -> Response<Body> {
    problem(StatusCode::BAD_GATEWAY, "Bad Gateway", detail)
}

fn problem(status: StatusCode, title: &str, detail: &str) -> Response<Body> {
    problem_bytes(status, title, detail).map(full)
}

/// An RFC 9457 problem with `title` and `detail`.
fn problem_bytes(status: StatusCode, title: &str, detail: &str) -> Response<Bytes> {
    let body = serde_json::json!({ "title": title, "status": status.as_u16(), "detail": detail });
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(idemkey::protocol::problem::PROBLEM_JSON),
    );
    response
}

/// One route and the verifier made for it.
struct Verified {
    route: config::Route,
    service: Idempotency<Upstream>,
    body_limit: usize,
}

struct State {
    routes: Vec<Verified>,
    faults: Option<FaultPlan>,
    audit: Option<audit::Audit>,
    #[cfg(feature = "metrics")]
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// The connection is closed without an answer (a fault, on purpose).
#[derive(Debug, thiserror::Error)]
#[error("connection dropped on purpose (--faults)")]
struct Dropped;

fn layer_for(engine: &Engine, route: &config::Route, no_verify: bool) -> IdempotencyLayer {
    let mut layer = IdempotencyLayer::new(engine.clone())
        .key_header(route.key_header.clone())
        .body_read_timeout(BODY_READ_TIMEOUT)
        .fingerprinter(route.fingerprinter.clone());
    if let Some(scope) = &route.scope_header {
        layer = layer.scope(HeaderScope::new(scope.clone()));
    }
    if no_verify {
        layer = layer.requirement_by(|_| KeyRequirement::Off);
    } else if let Some(key) = route.key {
        layer = if route.methods.is_empty() {
            layer.require(key)
        } else {
            layer.requirement_by(move |_| key)
        };
    }
    if let Some(retention) = route.retention {
        layer = layer.retention(retention);
    }
    if let Some(limit) = route.body_limit {
        layer = layer.body_limit(limit);
    }
    if let Some(limit) = route.stored_response_limit {
        layer = layer.stored_response_limit(limit);
    }
    if let Some(status) = route.key_reused_status {
        layer = layer.key_reused_status(status);
    }
    if let Some(quota) = route.quota {
        layer = layer.quota(quota);
    }
    if let Some(dialect) = &route.dialect {
        layer = layer.dialect(dialect.clone());
        if route.key_header_named {
            layer = layer.key_header(route.key_header.clone());
        }
        if let Some(status) = route.key_reused_status {
            layer = layer.key_reused_status(status);
        }
    }
    layer
}

pub(crate) async fn run(args: ProxyArgs) -> Result<(), String> {
    // First of all: the verifier (engine, layers) may resolve its metric handles when it
    // is built, and a handle resolved before the recorder is installed counts nowhere.
    #[cfg(feature = "metrics")]
    let metrics = metrics::install()?;
    let config_text = match &args.config {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --config {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let config_name = args
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut routes = config::load(config_text.as_deref().map(|t| (config_name.as_str(), t)))?;
    let dialect = args
        .dialect
        .as_deref()
        .map(str::parse::<idemkey::protocol::Dialect>)
        .transpose()
        .map_err(|e| format!("--dialect: {e}"))?;
    if let Some(dialect) = &dialect {
        for route in routes.iter_mut().filter(|r| r.dialect.is_none()) {
            route.use_dialect(dialect.clone());
        }
    }
    let upstream = Upstream::new(&args.upstream)?;
    let store = idemkey::store::open(&args.store)
        .await
        .map_err(|e| format!("cannot open --store {}: {e}", super::redact(&args.store)))?;
    let engine = Engine::builder(store).lease(args.lease).build();
    for route in &routes {
        let methods: Vec<_> = route.methods.iter().map(Method::as_str).collect();
        let key = match (args.no_verify, route.key) {
            (true, _) => "off (--no-verify)".to_owned(),
            (false, None) => "required on unsafe methods".to_owned(),
            (false, Some(k)) => format!("{k:?}").to_lowercase(),
        };
        let dialect = route.dialect.as_ref().map_or("standard", |d| d.id());
        eprintln!(
            "idemkey proxy: route {} {}: key {key}, dialect {dialect}",
            route.pattern,
            if methods.is_empty() {
                "(any method)".to_owned()
            } else {
                methods.join(",")
            },
        );
    }
    let routes = routes
        .into_iter()
        .map(|route| {
            let layer = layer_for(&engine, &route, args.no_verify);
            Verified {
                body_limit: route
                    .body_limit
                    .unwrap_or(idemkey::server::IdempotencyLayer::DEFAULT_BODY_LIMIT),
                service: tower_layer::Layer::layer(&layer, upstream.clone()),
                route,
            }
        })
        .collect();
    let state = Arc::new(State {
        routes,
        faults: args
            .faults
            .map(|rates| FaultPlan::new(Fault::seeded(args.seed, rates))),
        audit: args.audit.then(|| audit::Audit::new(args.audit_window)),
        #[cfg(feature = "metrics")]
        metrics,
    });
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    println!("listening on http://{addr}");
    eprintln!(
        "idemkey proxy: http://{addr} -> {} (store {})",
        args.upstream,
        super::redact(&args.store)
    );
    serve(listener, state, args.drain).await;
    if tokio::time::timeout(args.drain, engine.wait_for_recordings())
        .await
        .is_err()
    {
        eprintln!(
            "idemkey proxy: {} outcomes still unrecorded after {} (the store is down?)",
            engine.pending_recordings(),
            crate::durations::show(args.drain)
        );
    }
    eprintln!("idemkey proxy: stopped");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn serve(listener: TcpListener, state: Arc<State>, drain: Duration) {
    let graceful = GracefulShutdown::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    eprintln!("idemkey proxy: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let service =
            service_fn(move |req| -> HandleFuture { Box::pin(handle(state.clone(), req)) });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client that went away, or a fault on purpose, ends its connection.
            let _ = conn.await;
        });
    }
    eprintln!("idemkey proxy: shutting down; letting requests in flight finish");
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!(
            "idemkey proxy: connections still open after {}; closing them",
            crate::durations::show(drain)
        );
    }
}

/// [`handle`]'s future, boxed: naming it `Send` here settles the lifetimes of the
/// borrows inside it, which the compiler cannot infer through hyper's bounds.
type HandleFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<ResponseBody>, Dropped>> + Send>,
>;

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, Dropped> {
    if req.uri().path() == "/healthz" && req.method() == Method::GET {
        return Ok(health(&state));
    }
    #[cfg(feature = "metrics")]
    if req.uri().path() == metrics::PATH && req.method() == Method::GET {
        return Ok(metrics::render(&state.metrics));
    }
    let index = state
        .routes
        .iter()
        .position(|v| v.route.matches(req.method(), req.uri().path()))
        .unwrap_or(state.routes.len() - 1);
    let verified = &state.routes[index];
    let key = req
        .headers()
        .get(&verified.route.key_header)
        .map(|v| v.as_bytes().to_vec());
    let req = req.map(boxed);
    let work = async {
        let req = match &state.audit {
            Some(audit) if verified.route.key != Some(KeyRequirement::Off) => {
                match audit
                    .observe(&verified.route, verified.body_limit, req)
                    .await
                {
                    Ok(req) => req,
                    Err(refused) => return Ok::<_, Infallible>(refused.map(ResponseBody::full)),
                }
            }
            _ => req,
        };
        let mut service = verified.service.clone();
        let Ok(()) = std::future::poll_fn(|cx| service.poll_ready(cx)).await;
        service.call(req).await
    };
    let answer = match &state.faults {
        Some(plan) => plan.apply(key.as_deref(), work).await.ok_or(Dropped)?,
        None => work.await,
    };
    let Ok(response) = answer;
    Ok(response)
}

fn health(state: &State) -> Response<ResponseBody> {
    let mut report = serde_json::json!({ "status": "ok" });
    if let Some(plan) = &state.faults {
        let s = plan.stats();
        report["faults"] = serde_json::json!({
            "attempts": s.attempts,
            "lost_responses": s.lost_responses,
            "resets": s.resets,
            "delays": s.delays,
        });
    }
    if let Some(audit) = &state.audit {
        report["audit_reports"] = audit.reports().into();
    }
    let mut response = Response::new(ResponseBody::full(Bytes::from(report.to_string())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
