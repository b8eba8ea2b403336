//! How the example servers serve their app: hyper's HTTP/1.1 server with a header-read
//! timeout, which `axum::serve` does not set, and a graceful shutdown. Included by path
//! (`#[path = "common/serve.rs"] mod serve;`).
//!
//! A server that waits forever for a client is a server any client can exhaust: 200
//! connections stalled in the middle of their headers hold 200 sockets and tasks for as
//! long as they like. hyper closes a connection whose head has not arrived within the
//! header-read timeout (it needs a timer to do so); the body-read timeout is the
//! verifier's own (`IdempotencyLayer::body_read_timeout`), which answers
//! `408 body-timeout` before any key is claimed.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Default header-read timeout of the examples: a client has this long to send a whole
/// request head (and, on a kept-alive connection, the head of its next request).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default body-read timeout of the examples: a request body has this long to arrive.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a shutdown waits for open connections to finish their requests.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` resolves, closing any connection whose
/// request head takes longer than `header_read_timeout`; then lets open connections
/// finish (for up to 10 s).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: pause instead of spinning.
                    eprintln!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client that went away or timed out ends its connection; nothing to do.
            let _ = conn.await;
        });
    }
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!("connections still open after {DRAIN:?}; closing them");
    }
}

/// Milliseconds from the command line, as a duration.
pub(crate) fn millis(flag: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("{flag} {value:?}: {e}; give whole milliseconds"))
}

/// The address to listen on, from `--addr`: `IP:PORT` or `HOST:PORT` (`localhost:3000`;
/// a name resolves to its IPv4 address when it has one, as `localhost` does).
pub(crate) fn listen_addr(value: &str) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = value
        .to_socket_addrs()
        .map_err(|e| format!("--addr {value:?}: {e}; give HOST:PORT, e.g. 127.0.0.1:3000"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("--addr {value:?} resolves to no address"))
}
