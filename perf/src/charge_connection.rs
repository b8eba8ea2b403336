//! One keep-alive HTTP/1.1 connection posting to the charge app's `POST /v1/charges`
//! (`examples/common/charge_app.rs`): what the load programs share (included by path by
//! each that needs it).

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A connection to a server of the charge app, with `TCP_NODELAY` (requests are
/// small and sent one after another).
pub(crate) struct ChargeConnection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    task: tokio::task::JoinHandle<Result<(), hyper::Error>>,
}

impl ChargeConnection {
    /// Connects to `addr`.
    pub(crate) async fn open(addr: SocketAddr) -> Result<Self, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
        Ok(Self {
            sender,
            task: tokio::spawn(conn),
        })
    }

    /// Posts `body` (JSON) under the idempotency key `key`, reads the whole answer and
    /// returns its status.
    pub(crate) async fn post(&mut self, key: &str, body: &Bytes) -> Result<StatusCode, String> {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/v1/charges")
            .header(header::HOST, "127.0.0.1")
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key)
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())?;
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        resp.into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(status)
    }
}

impl Drop for ChargeConnection {
    fn drop(&mut self) {
        self.task.abort();
    }
}
