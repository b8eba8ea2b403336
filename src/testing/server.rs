//! A real HTTP server on 127.0.0.1 for tests.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// An axum app served on `127.0.0.1` on a free port until dropped.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Binds `127.0.0.1:0` and serves `app` in a background task.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(app: axum::Router) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "test server stopped");
            }
        });
        Ok(Self { addr, task })
    }

    /// Serves `app` wrapped in the verifier `layer` (every route behind it).
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start_verified(
        app: axum::Router,
        layer: crate::server::IdempotencyLayer,
    ) -> std::io::Result<Self> {
        Self::start(app.layer(layer)).await
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
