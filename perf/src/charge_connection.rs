//! One keep-alive HTTP/1.1 connection posting to the charge app's `POST /v1/charges`
//! (`examples/common/charge_app.rs`): what the load programs share (included by path by
//! each that needs it).

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A connection to a server of the charge app, with `TCP_NODELAY` (requests are
/// small and sent one after another).
pub(crate) struct ChargeConnection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    task: tokio::task::JoinHandle<Result<(), hyper::Error>>,
    /// The session cookie [`ChargeConnection::open_session`] was given, sent with every
    /// charge.
    cookie: Option<HeaderValue>,
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
            cookie: None,
        })
    }

    /// Posts to `path` (a route that opens a session, for a verifier that keeps its
    /// records in the caller's session) and sends the cookie it sets (its `name=value`)
    /// with every later charge.
    #[allow(
        dead_code,
        reason = "only the load program's peers (`load --peers`) keep sessions"
    )]
    pub(crate) async fn open_session(&mut self, path: &str) -> Result<(), String> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::HOST, "127.0.0.1")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let head = self.exchange(req).await?;
        let cookie = head
            .headers
            .get(header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next());
        let status = head.status;
        let cookie = cookie.ok_or(format!("POST {path} answered {status} without a cookie"))?;
        self.cookie = Some(HeaderValue::from_str(cookie).map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Posts `body` (JSON) under the idempotency key `key`, reads the whole answer and
    /// returns its status.
    pub(crate) async fn post(&mut self, key: &str, body: &Bytes) -> Result<StatusCode, String> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("/v1/charges")
            .header(header::HOST, "127.0.0.1")
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key);
        if let Some(cookie) = &self.cookie {
            req = req.header(header::COOKIE, cookie);
        }
        let req = req
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())?;
        Ok(self.exchange(req).await?.status)
    }

    /// Sends `req`, reads the whole answer and returns its head.
    async fn exchange(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<http::response::Parts, String> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let (head, body) = resp.into_parts();
        body.collect().await.map_err(|e| e.to_string())?;
        Ok(head)
    }
}

impl Drop for ChargeConnection {
    fn drop(&mut self) {
        self.task.abort();
    }
}
