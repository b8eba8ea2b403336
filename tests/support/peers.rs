//! Peers nobody here wrote, installed by the tests themselves at pinned versions into a
//! cache folder kept between runs (`IDEMKEY_PEER_CACHE`, default
//! `~/.cache/idemkey-peers`): Python verifiers from PyPI, run with `python3`
//! (`IDEMKEY_PYTHON` to choose another), and Node clients from npm, run with `node`. A
//! failed install fails the test, loudly, with the installer's output.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod install;

/// The Python peers and every package they load, pinned (installed with `--no-deps`, so
/// nothing drifts): idemkit 1.0.2 and fastapi-idempotency 0.1.1 under FastAPI/uvicorn.
pub(crate) const PYTHON_PEERS: &[&str] = &[
    "idemkit==1.0.2",
    "fastapi-idempotency==0.1.1",
    "fastapi==0.165.0",
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "click==8.5.1",
    "h11==0.16.0",
    "idna==3.20",
    "opentelemetry-api==1.45.2",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
];

/// The Node peers (neither has runtime dependencies): stripe-node and orb-billing, a
/// Stainless-generated SDK.
pub(crate) const NODE_PEERS: &[&str] = &["stripe@23.1.0", "orb-billing@6.11.0"];

fn cache_dir() -> PathBuf {
    std::env::var_os("IDEMKEY_PEER_CACHE").map_or_else(
        || {
            std::env::var_os("HOME")
                .map_or_else(std::env::temp_dir, PathBuf::from)
                .join(".cache/idemkey-peers")
        },
        PathBuf::from,
    )
}

fn python() -> String {
    std::env::var("IDEMKEY_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The directory the Python peers are installed in (a `pip --target` folder).
pub(crate) fn python_site() -> PathBuf {
    install::installed(&cache_dir(), "python", PYTHON_PEERS, |dir| {
        let mut pip = Command::new(python());
        pip.args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
        ])
        .args(["--no-deps", "--target"])
        .arg(dir)
        .args(PYTHON_PEERS);
        pip
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The `node_modules` folder the Node peers are installed in.
pub(crate) fn node_modules() -> PathBuf {
    install::node_modules(&cache_dir(), "node", NODE_PEERS).unwrap_or_else(|e| panic!("{e}"))
}

/// The folder of the peers' scripts (`tests/peers/` at the workspace's root): the
/// nearest one above the package whose tests include this tree (the facade is the
/// root; idemkey-cli's tests include the tree from a folder below it).
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("tests/peers"))
        .find(|dir| dir.is_dir())
        .expect("tests/peers/ in the package's folder or one above it")
}

/// A Python verifier (`tests/peers/verifier.py`) on a free port of 127.0.0.1, killed by
/// its pid on drop.
pub(crate) struct PythonVerifier {
    child: Child,
    addr: SocketAddr,
}

impl PythonVerifier {
    /// Starts `verifier.py <args>` and waits (bounded) for the port it prints.
    pub(crate) async fn start(args: &[&str]) -> Self {
        Self::start_script("verifier.py", args).await
    }

    /// Starts `tests/peers/<script> <args>` (a script that prints `PORT <n>` and
    /// answers `GET /stats` with its executions, such as `upstream.py`, a plain API
    /// without idempotency) and waits (bounded) for the port it prints.
    pub(crate) async fn start_script(script: &str, args: &[&str]) -> Self {
        let site = python_site();
        let mut child = Command::new(python())
            .arg(scripts().join(script))
            .args(args)
            .env("PYTHONPATH", &site)
            .env("PYTHONNOUSERSITE", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {} verifier.py: {e}", python()));
        let stdout = child.stdout.take().expect("piped stdout");
        let first_line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        let line = tokio::time::timeout(Duration::from_secs(60), first_line)
            .await
            .unwrap_or_else(|_| panic!("verifier.py {args:?} printed no port within 60 s"))
            .expect("the reading task")
            .unwrap_or_else(|e| panic!("read verifier.py's stdout: {e}"));
        let port: u16 = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| {
                let status = child.try_wait();
                panic!("verifier.py {args:?} did not start: printed {line:?}, status {status:?}")
            });
        Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Charges the app executed.
    pub(crate) async fn executions(&self) -> u64 {
        let stats: serde_json::Value = reqwest::get(self.url("/stats"))
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("GET /stats")
            .json()
            .await
            .expect("stats JSON");
        stats["executions"].as_u64().expect("a count")
    }

    /// Lets held charges answer.
    pub(crate) async fn release(&self) {
        reqwest::get(self.url("/release"))
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("GET /release");
    }
}

impl Drop for PythonVerifier {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `tests/peers/client.cjs <peer> <base> <calls>` and returns its JSON lines.
pub(crate) async fn node_client(peer: &str, base: &str, calls: usize) -> Vec<serde_json::Value> {
    node_client_retrying(peer, base, calls, 2).await
}

/// As [`node_client`], the SDK retrying each call up to `retries` times.
pub(crate) async fn node_client_retrying(
    peer: &str,
    base: &str,
    calls: usize,
    retries: u32,
) -> Vec<serde_json::Value> {
    let modules = node_modules();
    let out = tokio::process::Command::new("node")
        .arg(scripts().join("client.cjs"))
        .args([peer, base, &calls.to_string(), &retries.to_string()])
        .env("NODE_PATH", &modules)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .unwrap_or_else(|_| panic!("node client.cjs {peer} did not finish within 120 s"))
        .unwrap_or_else(|e| panic!("run node client.cjs {peer}: {e}"));
    assert!(
        out.status.success(),
        "node client.cjs {peer} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{peer} printed {l:?}: {e}")))
        .collect()
}
