//! The example programs (`examples/*.rs`) as the processes a user runs: the binaries
//! cargo builds beside the tests, started on a free port and killed by their pid.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The binary of example `name`, built by `cargo test`/`cargo nextest run` beside the
/// tests.
pub(crate) fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile dir");
    let bin = dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build --all-features --examples`",
        bin.display()
    );
    bin
}

/// An example server, listening on a free port of 127.0.0.1; killed on drop.
pub(crate) struct ExampleServer {
    name: String,
    child: Child,
    port: u16,
}

impl ExampleServer {
    /// Starts example `name` with `--addr 127.0.0.1:<free port>` and `args`, and waits
    /// (bounded) until it listens.
    pub(crate) fn start(name: &str, args: &[&str]) -> Self {
        let port = super::free_port();
        let child = Command::new(binary(name))
            .args(["--addr", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let mut server = Self {
            name: name.to_owned(),
            child,
            port,
        };
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("{name} {args:?} exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        server.kill();
        panic!("{name} {args:?} did not listen within 10 s");
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `http://127.0.0.1:<port><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `GET /stats`, as JSON (the example's counters).
    pub(crate) async fn stats(&self) -> serde_json::Value {
        super::verifier::http()
            .get(self.url("/stats"))
            .send()
            .await
            .expect("GET /stats")
            .json()
            .await
            .expect("/stats is JSON")
    }

    /// Kills the process (SIGKILL, by its pid) and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ExampleServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for ExampleServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on port {}", self.name, self.port)
    }
}

/// An example program that is not a server (a queue consumer): started with `args`,
/// killed with SIGKILL by its pid, or waited for (bounded).
pub(crate) struct ExampleProcess {
    name: String,
    child: Child,
}

impl ExampleProcess {
    /// Starts example `name` with `args` (stderr inherited, so a failing test shows
    /// its log).
    pub(crate) fn start(name: &str, args: &[&str]) -> Self {
        let child = Command::new(binary(name))
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Self {
            name: name.to_owned(),
            child,
        }
    }

    /// Whether it is still running; panics when it exited with a failure.
    pub(crate) fn running(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) if status.success() => false,
            Ok(Some(status)) => panic!("{} exited: {status}", self.name),
            Err(e) => panic!("{}: {e}", self.name),
        }
    }

    /// Waits up to `bound` for it to exit by itself, successfully.
    pub(crate) fn wait(&mut self, bound: Duration) {
        let start = std::time::Instant::now();
        while self.running() {
            assert!(
                start.elapsed() < bound,
                "{} did not exit within {bound:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the process (SIGKILL, by its pid) and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ExampleProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
