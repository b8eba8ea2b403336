//! The integration tests' support, one tree that every test binary includes with
//! `mod support;` (as reqwest's `tests/support/` is): real servers on 127.0.0.1.
//!
//! - here: connection strings of the shared stores, unique names for isolation, private
//!   server processes that a test may kill (by pid), and [`serve`], the one loopback
//!   server for an axum app;
//! - [`client`]: a client with millisecond backoff, idemkey's typed error out of a
//!   middleware error;
//! - [`gate`]: the gate a handler waits at;
//! - [`recorder`]: a server that records every request and answers from a script (the
//!   client tests);
//! - [`verifier`]: HTTP shortcuts against a verifier, [`verifier::Answer`], a store that
//!   fails on demand;
//! - [`apps`]: the examples' charge app over a given store;
//! - [`examples`]: the example programs run as processes;
//! - [`raw`]: HTTP/1.1 over a raw TCP socket (stalled heads, short bodies,
//!   `Expect: 100-continue`);
//! - [`webhook`]: the example webhook receiver and provider-shaped deliveries;
//! - [`telemetry`]: the spans and metrics the crate emits, captured (feature
//!   `metrics`);
//! - [`queues`]: the queue consumer examples' scenario: charges, seeded kills, the
//!   ledger's check;
//! - [`peers`]: verifiers and clients nobody here wrote (PyPI, npm), installed at pinned
//!   versions into a cache folder.
#![allow(
    dead_code,
    reason = "each test binary includes the whole tree and uses a part of it"
)]

pub(crate) mod apps;
pub(crate) mod client;
pub(crate) mod examples;
pub(crate) mod gate;
pub(crate) mod moto;
pub(crate) mod peers;
#[cfg(feature = "postgres")]
pub(crate) mod queues;
pub(crate) mod raw;
pub(crate) mod recorder;
#[cfg(feature = "metrics")]
pub(crate) mod telemetry;
pub(crate) mod verifier;
pub(crate) mod webhook;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The shared Redis (`IDEMKEY_REDIS_URL`, default `redis://127.0.0.1:6379`).
pub(crate) fn redis_url() -> String {
    std::env::var("IDEMKEY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The shared PostgreSQL (`IDEMKEY_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`).
pub(crate) fn postgres_url() -> String {
    std::env::var("IDEMKEY_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The shared MySQL or MariaDB (`IDEMKEY_MYSQL_URL`, default
/// `mysql://root@127.0.0.1:3306/test`).
pub(crate) fn mysql_url() -> String {
    std::env::var("IDEMKEY_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The shared RabbitMQ (`IDEMKEY_RABBITMQ_URL`, default
/// `amqp://guest:guest@127.0.0.1:5672/%2f`).
pub(crate) fn rabbitmq_url() -> String {
    std::env::var("IDEMKEY_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The shared NATS with JetStream (`IDEMKEY_NATS_URL`, default `nats://127.0.0.1:4222`).
pub(crate) fn nats_url() -> String {
    std::env::var("IDEMKEY_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A name no other test (or run) uses: `<base>_<random hex>`.
pub(crate) fn unique(base: &str) -> String {
    format!(
        "{base}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    )
}

/// The lowest and highest port [`free_port`] hands out: below the kernel's ephemeral range
/// (32768 and up on Linux), so that no outgoing connection of another test can take the
/// port between the moment it was found free and the moment a private server binds it,
/// and low enough that a Redis Cluster node's bus port (port + 10000) is below it too.
const PRIVATE_PORTS: std::ops::RangeInclusive<u16> = 10_000..=22_767;

/// A port of [`PRIVATE_PORTS`] that was free a moment ago on 127.0.0.1 (picked at
/// random, so that tests running in parallel rarely try the same one).
pub(crate) fn free_port() -> u16 {
    free_port_where(|_| true)
}

/// A free port, as [`free_port`], that also passes `also` (for example: its Redis
/// Cluster bus port is free too).
fn free_port_where(also: impl Fn(u16) -> bool) -> u16 {
    let span = u128::from(PRIVATE_PORTS.end() - PRIVATE_PORTS.start()) + 1;
    for _ in 0..1_000 {
        let offset = uuid::Uuid::new_v4().as_u128() % span;
        let port = PRIVATE_PORTS.start() + u16::try_from(offset).expect("offset < span");
        if port_is_free(port) && also(port) {
            return port;
        }
    }
    panic!("no free port in {PRIVATE_PORTS:?} on 127.0.0.1 after 1000 tries");
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Serves `router` on a free port of 127.0.0.1 until the returned server is dropped.
pub(crate) async fn serve(router: axum::Router) -> idemkey::testing::TestServer {
    idemkey::testing::TestServer::start(router)
        .await
        .expect("bind a free port on 127.0.0.1")
}

/// Waits (bounded) until `child` accepts connections on `port`; `false` when it exited
/// first (for example because something else took the port).
fn wait_listening(child: &mut Child, port: u16, what: &str) -> bool {
    for _ in 0..400 {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{what} did not start listening on 127.0.0.1:{port} within 10 s");
}

/// A private `redis-server` on a free port, killed by its own process id on drop (or
/// by [`RedisServer::kill`]).
pub(crate) struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// More `redis-server` arguments (`--replicaof host port`).
    args: Vec<String>,
    /// With an append-only file here, fsynced on every write: records survive a kill.
    aof_dir: Option<TempDir>,
    /// Where a server without an append-only file writes what it must (the snapshot a
    /// primary makes for its replica's first sync).
    scratch: TempDir,
}

impl RedisServer {
    /// Starts a private server on a free port, without persistence.
    pub(crate) fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts a private server on a free port whose data survives [`RedisServer::kill`]
    /// (append-only file, `appendfsync always`), as a production Redis keeping
    /// idempotency records should be configured.
    pub(crate) fn start_durable() -> Self {
        Self::start_with(Some(TempDir::new("idemkey-redis")))
    }

    fn start_with(aof_dir: Option<TempDir>) -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            args: Vec::new(),
            aof_dir,
            scratch: TempDir::new("idemkey-redis-scratch"),
        };
        server.start_on_a_free_port();
        server
    }

    /// Starts a private server on a free port, without persistence, replicating
    /// `primary`; returns once the replica is in sync.
    pub(crate) fn start_replica_of(primary: &Self) -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            args: vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.port.to_string(),
            ],
            aof_dir: None,
            scratch: TempDir::new("idemkey-redis-scratch"),
        };
        server.start_on_a_free_port();
        for _ in 0..400 {
            let info = redis_cli(server.port, &["info", "replication"]);
            if info.contains("master_link_status:up") {
                return server;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("the private replica did not reach master_link_status:up within 10 s");
    }

    /// `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server process (by its pid) and waits for it to exit.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill the private redis-server");
            child.wait().expect("reap the private redis-server");
        }
    }

    /// Starts the server for the first time; when it exits at once (another process
    /// took its port in the meantime), tries again on another free port.
    fn start_on_a_free_port(&mut self) {
        for _ in 0..5 {
            if self.spawn() {
                return;
            }
            self.port = free_port();
        }
        panic!("the private redis-server exited at start on five free ports in a row");
    }

    /// Starts the server again on the same port (with the data of a durable server,
    /// empty otherwise).
    pub(crate) fn restart(&mut self) {
        assert!(
            self.spawn(),
            "the private redis-server exited instead of listening again on 127.0.0.1:{}",
            self.port
        );
    }

    /// Starts the process on `self.port`; `false` when it exited instead of listening.
    fn spawn(&mut self) -> bool {
        self.kill();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(&self.args);
        match &self.aof_dir {
            Some(dir) => cmd
                .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
                .arg(dir.path()),
            None => cmd
                .args(["--appendonly", "no", "--dir"])
                .arg(self.scratch.path()),
        };
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed and on PATH?)");
        let child = self.child.insert(child);
        wait_listening(child, self.port, "the private redis-server")
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

/// A private PostgreSQL (its own `initdb` cluster in a temporary directory) on a free
/// port, killed by the postmaster's process id on drop (or by [`PgServer::kill`]).
/// Runs as the `postgres` user when the tests run as root (PostgreSQL refuses root).
pub(crate) struct PgServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    user: Option<(u32, u32)>,
    settings: Vec<String>,
}

impl PgServer {
    /// Creates a cluster (trust auth, superuser `postgres`) and starts it.
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`PgServer::start`], with server settings (`name=value`, as `-c` options).
    pub(crate) fn start_with(settings: &[&str]) -> Self {
        use std::os::unix::fs::MetadataExt;
        let dir = TempDir::new("idemkey-pg");
        let root = std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false);
        let user = root.then(postgres_user);
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("hand the cluster directory to the postgres user");
        }
        let mut initdb = Command::new(postgres_bin_dir().join("initdb"));
        initdb.arg("-D").arg(dir.path().join("data")).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]);
        let status = as_user(&mut initdb, user)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed: {status}");
        let mut server = Self {
            port: free_port(),
            dir,
            child: None,
            user,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.restart();
        server
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Kills the postmaster (SIGKILL, by its pid) and waits for it to exit.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill the private postgres");
            child.wait().expect("reap the private postgres");
        }
    }

    /// Starts the server again on the same port and data (after crash recovery).
    pub(crate) fn restart(&mut self) {
        self.kill();
        // Backends orphaned by a kill exit by themselves; until they have, the new
        // postmaster refuses the data directory. Retry (bounded).
        for _ in 0..100 {
            let mut cmd = Command::new(postgres_bin_dir().join("postgres"));
            cmd.arg("-D")
                .arg(self.dir.path().join("data"))
                .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
                .arg(self.dir.path());
            for setting in &self.settings {
                cmd.args(["-c", setting]);
            }
            let mut child = as_user(&mut cmd, self.user)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start postgres");
            for _ in 0..200 {
                if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                    self.child = Some(child);
                    return;
                }
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the private postgres did not start on port {}", self.port);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The uid and gid of the `postgres` user, from `/etc/passwd`.
fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"postgres") && f.len() > 3)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                .flatten()
        })
        .expect("a postgres user to run the private PostgreSQL as (tests run as root)")
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    cmd
}

/// The directory of PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`).
pub(crate) fn postgres_bin_dir() -> PathBuf {
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
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// A fresh, empty directory under the system temp dir.
    pub(crate) fn new(base: &str) -> Self {
        let path = std::env::temp_dir().join(unique(base));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        Self(path)
    }

    /// Its path.
    pub(crate) fn path(&self) -> &std::path::Path {
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
pub(crate) async fn postgres_store(table: &str) -> idemkey::store::PostgresStore {
    let url = postgres_url();
    let store = idemkey::store::PostgresStore::builder(&url)
        .table(table)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"));
    store.migrate().await.expect("create the test table");
    store
}

/// A connection pool of its own to the shared PostgreSQL, for raw SQL in tests (the
/// store keeps its pool private).
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_admin(url: &str) -> sqlx::PgPool {
    sqlx::PgPool::connect(url)
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"))
}

/// Drops a test table made by [`postgres_store`].
#[cfg(feature = "postgres")]
pub(crate) async fn drop_postgres_table(table: &str) {
    let admin = postgres_admin(&postgres_url()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS \"{table}\""
    )))
    .execute(&admin)
    .await
    .expect("drop the test table");
    admin.close().await;
}

/// The rows a test wrote into a table of the previous schema before the store upgraded
/// it: `done` completed with fingerprint `fp` and payload `old payload`, `running` in
/// progress with fingerprint `fp`, held by `owner`, with an hour of lease left.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) struct PreviousRows {
    pub(crate) done: idemkey::store::RecordId,
    pub(crate) running: idemkey::store::RecordId,
    pub(crate) owner: idemkey::store::FencingToken,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl PreviousRows {
    pub(crate) fn new() -> Self {
        Self {
            done: idemkey::store::RecordId::new("old", "done"),
            running: idemkey::store::RecordId::new("old", "running"),
            owner: idemkey::store::FencingToken::random(),
        }
    }

    /// What a store upgraded at `upgrading` must show of them: the completed record is
    /// replayed, the running one is inspected (its `created` is the time of the upgrade)
    /// and listed, and its owner completes it.
    pub(crate) async fn expect_upgraded(
        &self,
        store: &dyn idemkey::store::Store,
        upgrading: std::time::SystemTime,
    ) {
        use idemkey::store::{Claim, ClaimRequest, FencingToken, RecordId};
        let claim = |id: RecordId| async move {
            store
                .claim(ClaimRequest {
                    id: &id,
                    fingerprint: b"new",
                    token: FencingToken::random(),
                    lease: Duration::from_secs(60),
                    retention: Duration::from_secs(60),
                })
                .await
                .expect("claim")
        };
        assert_eq!(
            claim(self.done).await,
            Claim::Completed {
                fingerprint: "fp".into(),
                payload: "old payload".into()
            },
            "a completed record of the previous version is replayed"
        );
        let info = store
            .inspect(&self.running)
            .await
            .expect("inspect")
            .expect("the running record of the previous version");
        let skew = Duration::from_secs(5);
        assert!(
            info.created + skew >= upgrading && info.created <= std::time::SystemTime::now() + skew,
            "a row of the previous version shows the time of the upgrade as created"
        );
        let listed = store.list_in_progress(10).await.expect("list_in_progress");
        assert_eq!(
            listed.iter().map(|r| r.id).collect::<Vec<_>>(),
            [self.running]
        );
        store
            .complete(
                &self.running,
                self.owner,
                "late".into(),
                Duration::from_secs(60),
            )
            .await
            .expect("the owner of a claim of the previous version completes it");
        assert_eq!(
            claim(self.running).await,
            Claim::Completed {
                fingerprint: "fp".into(),
                payload: "late".into()
            }
        );
    }
}

/// A MySQL store on the shared server with its own table (created).
#[cfg(feature = "mysql")]
pub(crate) async fn mysql_store(table: &str) -> idemkey::store::MySqlStore {
    let url = mysql_url();
    let store = idemkey::store::MySqlStore::builder(&url)
        .table(table)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the MySQL/MariaDB at {url} must be reachable: {e}"));
    store.migrate().await.expect("create the test table");
    store
}

/// A pool of its own on the MySQL/MariaDB at `url`, for what a test reads or changes
/// beside the store (the store keeps its pool to itself).
#[cfg(feature = "mysql")]
pub(crate) async fn mysql_admin(url: &str) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("the MySQL/MariaDB at {url} must be reachable: {e}"))
}

/// Drops a test table made by [`mysql_store`].
#[cfg(feature = "mysql")]
pub(crate) async fn drop_mysql_table(table: &str) {
    let admin = mysql_admin(&mysql_url()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS `{table}`"
    )))
    .execute(&admin)
    .await
    .expect("drop the test table");
    admin.close().await;
}

/// A private MariaDB (its own data directory, no grant tables, no binary log) on a free
/// port, killed by its process id on drop: for tests that count the server's statements.
pub(crate) struct MariaDbServer {
    port: u16,
    child: Child,
    _dir: TempDir,
}

impl MariaDbServer {
    /// Initialises a data directory (`mariadb-install-db`) and starts `mariadbd` on it.
    pub(crate) fn start() -> Self {
        let dir = TempDir::new("idemkey-mariadb");
        let data = dir.path().join("data");
        let out = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args([
                "--user=root",
                "--skip-test-db",
                "--auth-root-authentication-method=normal",
            ])
            .output()
            .expect("run mariadb-install-db (is MariaDB installed?)");
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let mut child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .args([
                &format!("--port={port}"),
                "--bind-address=127.0.0.1",
                "--user=root",
            ])
            .args([
                "--skip-grant-tables",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        for _ in 0..400 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Self {
                    port,
                    child,
                    _dir: dir,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the private mariadbd exited at start: {status}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = child.kill();
        panic!("the private mariadbd did not listen on 127.0.0.1:{port} within 10 s");
    }

    /// `mysql://root@127.0.0.1:<port>/mysql`.
    pub(crate) fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.port)
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A DynamoDB store with a table of its own (created) on `moto`'s server.
#[cfg(feature = "dynamodb")]
pub(crate) async fn dynamo_store(
    moto: &moto::MotoServer,
    table: &str,
) -> idemkey::store::DynamoStore {
    let store = idemkey::store::DynamoStore::builder(dynamo_client(moto))
        .table(table)
        .build()
        .expect("a valid table name");
    store
        .create_table()
        .await
        .unwrap_or_else(|e| panic!("create table {table} on moto at {}: {e}", moto.url()));
    store
}

/// An SDK client for `moto`'s server (any credentials do).
#[cfg(feature = "dynamodb")]
pub(crate) fn dynamo_client(moto: &moto::MotoServer) -> idemkey::store::aws_sdk_dynamodb::Client {
    use idemkey::store::aws_sdk_dynamodb::{Client, config::Credentials};
    let config = idemkey::store::DynamoStore::sdk_config("us-east-1")
        .endpoint_url(moto.url())
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .build();
    Client::from_conf(config)
}

/// `redis-cli -p port args...`, its output (empty when it could not run).
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// A private Redis Cluster of three primaries (and as many replicas each as asked; no
/// persistence) on free ports, each node killed by its pid on drop.
pub(crate) struct RedisCluster {
    ports: Vec<u16>,
    nodes: Vec<Child>,
    _dir: TempDir,
}

impl RedisCluster {
    /// Starts three nodes, joins them into a cluster and waits until it serves.
    pub(crate) fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// Starts three primaries with `replicas` replicas each, joins them into a cluster
    /// and waits until it serves.
    pub(crate) fn start_with_replicas(replicas: usize) -> Self {
        let mut cluster = Self {
            ports: Vec::new(),
            nodes: Vec::new(),
            _dir: TempDir::new("idemkey-redis-cluster"),
        };
        while cluster.ports.len() < 3 * (1 + replicas) {
            let mut tries = 0;
            loop {
                // Each node also listens on port + 10000 (the cluster bus).
                let port =
                    free_port_where(|p| port_is_free(p + 10_000) && !cluster.ports.contains(&p));
                // Kept before it is known to run, so that a panic below still kills it.
                cluster.nodes.push(Self::spawn_node(&cluster._dir, port));
                let node = cluster.nodes.last_mut().expect("just pushed");
                if wait_listening(node, port, "a Redis Cluster node") {
                    cluster.ports.push(port);
                    break;
                }
                tries += 1;
                assert!(
                    tries < 5,
                    "a Redis Cluster node exited at start on five free ports in a row \
                     (its port or its bus port was taken)"
                );
            }
        }
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(
            status.success(),
            "redis-cli --cluster create failed: {status}"
        );
        for _ in 0..400 {
            let ok = cluster
                .ports
                .iter()
                .all(|p| redis_cli(*p, &["cluster", "info"]).contains("cluster_state:ok"));
            let synced = cluster
                .replicas()
                .iter()
                .all(|p| redis_cli(*p, &["info", "replication"]).contains("master_link_status:up"));
            if ok && synced {
                return cluster;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("the private Redis Cluster did not reach cluster_state:ok");
    }

    /// Starts one cluster node on `port` (no persistence), its files under `dir`.
    fn spawn_node(dir: &TempDir, port: u16) -> Child {
        let node_dir = dir.path().join(port.to_string());
        std::fs::create_dir_all(&node_dir).expect("node dir");
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&node_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a cluster node")
    }

    /// The ports of the nodes that are replicas now.
    pub(crate) fn replicas(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|p| redis_cli(*p, &["info", "replication"]).contains("role:slave"))
            .collect()
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}
