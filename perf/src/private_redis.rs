//! A private `redis-server` for the measurement programs (included by path by each that
//! needs one): on a free port of 127.0.0.1, without persistence, killed by its pid when
//! dropped (also on a panic), so that a measurement never counts anyone else's commands.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The server; killed when dropped.
pub(crate) struct PrivateRedis {
    child: Child,
    /// `redis://127.0.0.1:<port>`.
    pub(crate) url: String,
}

impl PrivateRedis {
    /// Starts one and waits (up to 5 s) until it listens.
    pub(crate) fn start() -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server (is it on PATH?): {e}"))?;
        let server = Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!(
            "redis-server did not listen on port {port} within 5 s"
        ))
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
