//! A real HTTP proxy on 127.0.0.1 that injects faults between any client and any server.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, Request, Response, Uri};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::faults::{Fault, FaultPlan, FaultStats, Shot};
use crate::protocol::headers::IDEMPOTENCY_KEY;

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// An HTTP/1.1 reverse proxy on `127.0.0.1` that forwards every request to an upstream
/// and injects [`Fault`]s by a deterministic plan, at the network level: the client
/// under test sees real dropped connections, whatever language it is written in.
///
/// - [`Fault::LoseResponse`]: the request is forwarded, the upstream's whole answer is
///   read (the upstream finished with it), then the client's connection is closed
///   without an answer: the case idempotency keys exist for.
/// - [`Fault::Reset`]: the connection is closed before anything is forwarded.
/// - [`Fault::Delay`]: the request waits, then is forwarded.
///
/// Attempts are numbered overall and per idempotency key (the `Idempotency-Key` header
/// unless [`FaultProxy::start_with_header`] names another), as for
/// [`FaultInjector`](super::FaultInjector). Bodies stream through in both directions.
/// The proxy stops when dropped.
///
/// ```
/// use idemkey::testing::{Fault, FaultProxy, TestServer};
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let app = axum::Router::new().route("/", axum::routing::post(|| async { "done" }));
/// let upstream = TestServer::start(app).await?;
/// // Lose the first answer to each key.
/// let proxy = FaultProxy::start(upstream.addr(), |shot| {
///     if shot.key_attempt == 0 { Fault::LoseResponse } else { Fault::None }
/// })
/// .await?;
/// let client = reqwest::Client::new();
/// let send = || client.post(proxy.url("/")).header("idempotency-key", "k-1").send();
/// assert!(send().await.is_err(), "the first answer is lost");
/// assert_eq!(send().await?.text().await?, "done");
/// assert_eq!(proxy.stats().lost_responses, 1);
/// # Ok(()) }
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    planner: Arc<FaultPlan>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Shared {
    upstream: SocketAddr,
    header: HeaderName,
    planner: Arc<FaultPlan>,
    client: Client<HttpConnector, Incoming>,
}

/// The client's connection is closed without an answer.
#[derive(Debug, thiserror::Error)]
#[error("fault proxy: connection dropped on purpose")]
struct Dropped;

impl FaultProxy {
    /// Starts a proxy in front of `upstream` that injects `plan(shot)` into each request,
    /// counting attempts per `Idempotency-Key`.
    ///
    /// # Errors
    /// No port could be bound on 127.0.0.1.
    pub async fn start(
        upstream: SocketAddr,
        plan: impl Fn(Shot) -> Fault + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        Self::start_with_header(upstream, IDEMPOTENCY_KEY, plan).await
    }

    /// As [`FaultProxy::start`], counting attempts per value of header `key_header` (a
    /// vendor's key header, such as `PayPal-Request-Id`).
    ///
    /// # Errors
    /// No port could be bound on 127.0.0.1.
    pub async fn start_with_header(
        upstream: SocketAddr,
        key_header: HeaderName,
        plan: impl Fn(Shot) -> Fault + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let planner = Arc::new(FaultPlan::new(plan));
        let shared = Arc::new(Shared {
            upstream,
            header: key_header,
            planner: planner.clone(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        });
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| forward(shared.clone(), req));
                    // An error here is a dropped connection: on purpose, or the peer's.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            planner,
            accept,
        })
    }

    /// The address clients connect to.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What the proxy did so far.
    #[must_use]
    pub fn stats(&self) -> FaultStats {
        self.planner.stats()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn forward(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Dropped> {
    let key = req
        .headers()
        .get(&shared.header)
        .map(|v| v.as_bytes().to_vec());
    let upstream = async {
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        parts.uri =
            Uri::try_from(format!("http://{}{path}", shared.upstream)).map_err(|_| Dropped)?;
        shared
            .client
            .request(Request::from_parts(parts, body))
            .await
            .map_err(|_| Dropped)
    };
    match shared.planner.apply(key.as_deref(), upstream).await {
        Some(Ok(response)) => Ok(response.map(BodyExt::boxed)),
        Some(Err(e)) => Err(e),
        None => Err(Dropped),
    }
}

impl FaultPlan {
    /// Decides the fault of a request carrying idempotency key `key` (`None`: no key)
    /// and applies it around `forward`, the future that sends the request on and
    /// answers it: `None` means "close the client's connection without an answer".
    ///
    /// - [`Fault::Reset`]: `forward` is dropped unpolled (nothing reaches the server);
    ///   `None`.
    /// - [`Fault::Delay`]: waits, then `Some(forward.await)`.
    /// - [`Fault::LoseResponse`]: runs `forward` and reads the whole response body (the
    ///   server finished with the request), counts it lost; `None`.
    /// - [`Fault::None`]: `Some(forward.await)`, untouched.
    ///
    /// ```
    /// use idemkey::testing::{Fault, FaultPlan};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let plan = FaultPlan::new(Fault::cycle(vec![Fault::LoseResponse, Fault::None]));
    /// let answer = || async { Ok::<_, ()>(http::Response::new(String::from("done"))) };
    /// assert!(plan.apply(Some(b"k"), answer()).await.is_none(), "lost");
    /// assert!(plan.apply(Some(b"k"), answer()).await.is_some());
    /// assert_eq!(plan.stats().lost_responses, 1);
    /// # }
    /// ```
    pub async fn apply<B, E>(
        &self,
        key: Option<&[u8]>,
        forward: impl Future<Output = Result<Response<B>, E>>,
    ) -> Option<Result<Response<B>, E>>
    where
        B: http_body::Body,
    {
        match self.decide(key) {
            Fault::Reset => None,
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                Some(forward.await)
            }
            Fault::None => Some(forward.await),
            Fault::LoseResponse => {
                let response = forward.await;
                if let Ok(response) = response {
                    // Read it all: the upstream has finished with this request.
                    let _ = response.into_body().collect().await;
                    self.lost();
                }
                None
            }
        }
    }
}
