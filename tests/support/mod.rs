//! Real-server test support: connection strings of the shared servers, unique names for
//! isolation, and private server processes that a test may kill.
#![allow(dead_code, unreachable_pub)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The shared Redis (`IDEMKEY_REDIS_URL`, default `redis://127.0.0.1:6379`).
pub fn redis_url() -> String {
    std::env::var("IDEMKEY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The shared PostgreSQL (`IDEMKEY_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`).
pub fn postgres_url() -> String {
    std::env::var("IDEMKEY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A name no other test (or run) uses: `<base>_<random hex>`.
pub fn unique(base: &str) -> String {
    format!(
        "{base}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    )
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port on 127.0.0.1 to find a free one")
        .port()
}

/// Waits (bounded) until something accepts connections on `port`.
fn wait_listening(port: u16, what: &str) {
    for _ in 0..200 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{what} did not start listening on 127.0.0.1:{port} within 5 s");
}

/// A private `redis-server` on a free port, without persistence, killed by its own
/// process id on drop (or by [`RedisServer::kill`]).
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a private server on a free port.
    pub fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
        };
        server.restart();
        server
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server process (by its pid) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill the private redis-server");
            child.wait().expect("reap the private redis-server");
        }
    }

    /// Starts the server again on the same port (empty: nothing was persisted).
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed and on PATH?)");
        self.child = Some(child);
        wait_listening(self.port, "the private redis-server");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The directory of PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`).
pub fn postgres_bin_dir() -> PathBuf {
    let root = PathBuf::from("/usr/lib/postgresql");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .collect()
        })
        .unwrap_or_default();
    versions.retain(|p| p.join("initdb").exists());
    versions.sort();
    versions
        .pop()
        .unwrap_or_else(|| panic!("no PostgreSQL server binaries under {}", root.display()))
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh, empty directory under the system temp dir.
    pub fn new(base: &str) -> Self {
        let path = std::env::temp_dir().join(unique(base));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        Self(path)
    }

    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A PostgreSQL store on the shared server with its own table (created).
#[cfg(feature = "postgres")]
pub async fn postgres_store(table: &str) -> idemkey::store::PostgresStore {
    let url = postgres_url();
    let store = idemkey::store::PostgresStore::builder(&url)
        .table(table)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"));
    store.migrate().await.expect("create the test table");
    store
}

/// Drops a test table made by [`postgres_store`].
#[cfg(feature = "postgres")]
pub async fn drop_postgres_table(store: &idemkey::store::PostgresStore, table: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS \"{table}\""
    )))
    .execute(store.pool())
    .await
    .expect("drop the test table");
}
