//! The `idemkey` command line as the process a user runs: one-shot
//! subcommands and the proxy, killed by its pid.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The binary cargo built for these tests.
pub(crate) const IDEMKEY: &str = env!("CARGO_BIN_EXE_idemkey");

/// Runs `idemkey <args>` to its end (bounded: 120 s), `stdin` written to its input.
pub(crate) async fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = tokio::process::Command::new(IDEMKEY)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start idemkey {args:?}: {e}"));
    if let Some(mut input) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        let _ = input.write_all(stdin.as_bytes()).await;
    }
    tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("idemkey {args:?} did not finish within 120 s"))
        .unwrap_or_else(|e| panic!("run idemkey {args:?}: {e}"))
}

/// The exit status, standard output and standard error, for assertion messages.
pub(crate) fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `idemkey proxy --listen 127.0.0.1:0 <args>`, its standard output collected line by
/// line (the audit's reports); killed on drop.
pub(crate) struct Proxy {
    child: Child,
    addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// Starts the proxy and waits (bounded) for the address it prints.
    pub(crate) fn start(args: &[&str]) -> Self {
        let mut child = Command::new(IDEMKEY)
            .args(["proxy", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start idemkey proxy {args:?}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let _ = tx.send(first);
            for line in reader.lines().map_while(Result::ok) {
                collected.lock().expect("lines").push(line);
            }
        });
        let first = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("idemkey proxy {args:?} printed no address within 30 s"));
        let addr = first
            .trim()
            .strip_prefix("listening on http://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| {
                let status = child.try_wait();
                panic!("idemkey proxy {args:?} did not start: printed {first:?}, status {status:?}")
            });
        Self { child, addr, lines }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What the proxy printed after its address.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// `GET /healthz`.
    pub(crate) async fn health(&self) -> serde_json::Value {
        reqwest::get(self.url("/healthz"))
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("GET /healthz")
            .json()
            .await
            .expect("health JSON")
    }

    /// Sends SIGTERM (by pid) and waits (bounded) for the exit.
    pub(crate) fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(killed.success(), "kill -TERM {pid}");
        for _ in 0..600 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("idemkey proxy did not exit within 30 s of SIGTERM");
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::io::stderr().flush();
    }
}
