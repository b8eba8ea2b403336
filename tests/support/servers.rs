//! The private servers a test starts when it must kill, fill or count one: a
//! `redis-server` ([`RedisServer`]), a Redis Cluster of three ([`RedisCluster`]), a
//! PostgreSQL cluster of its own ([`PgServer`], `initdb` and `postgres`), a `mariadbd`
//! ([`MariaDbServer`]); each on a free port of 127.0.0.1, in a [`TempDir`] of its own,
//! removed by its own process id when dropped.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, free_port_where, port_is_free, unique};

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

    /// Starts a private server on a free port, without persistence, with more
    /// `redis-server` arguments (`["--maxmemory", "2mb"]`, `["--rename-command",
    /// "CONFIG", ""]`).
    pub(crate) fn start_with_args(args: &[&str]) -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            aof_dir: None,
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
