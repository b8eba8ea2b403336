//! The outbox across real crashes: `examples/outbox.rs` run as a child process against
//! `charge_server` (another process), killed with SIGKILL and started again; the same
//! suite on a SQLite journal and on a PostgreSQL one.

use crate::support;

use std::os::unix::process::ExitStatusExt;
use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime};

use http::header;
use idemkey::client::outbox::{Outbox, PostgresJournal, SqliteJournal};
use idemkey::testing::{Fault, FaultProxy};
use support::examples::{ExampleServer, binary};
use tokio::process::{Child, Command};

/// The token the example sends; it must never reach the journal.
const TOKEN: &str = "sk_test_outbox_example";
/// The journal table the example is told to use.
const SQLITE_TABLE: &str = "idemkey_outbox";

/// Where the example keeps its orders and journal.
enum Backend {
    Sqlite(support::TempDir),
    Postgres(String),
}

impl Backend {
    fn sqlite() -> Self {
        Backend::Sqlite(support::TempDir::new("idemkey-outbox-crash"))
    }

    fn postgres() -> Self {
        Backend::Postgres(support::unique("idemkey_outbox_crash"))
    }

    fn db_path(&self) -> Option<std::path::PathBuf> {
        match self {
            Backend::Sqlite(dir) => Some(dir.path().join("shop.db")),
            Backend::Postgres(_) => None,
        }
    }

    fn table(&self) -> &str {
        match self {
            Backend::Sqlite(_) => SQLITE_TABLE,
            Backend::Postgres(t) => t,
        }
    }

    fn args(&self) -> Vec<String> {
        let db = match self.db_path() {
            Some(path) => path.display().to_string(),
            None => support::postgres_url(),
        };
        vec!["--db".into(), db, "--table".into(), self.table().to_owned()]
    }

    /// The example's journal, opened by the test.
    async fn outbox(&self) -> Outbox {
        match self.db_path() {
            Some(path) => Outbox::new(
                SqliteJournal::builder(path)
                    .table(self.table())
                    .open()
                    .await
                    .expect("open the SQLite journal"),
            ),
            None => Outbox::new(self.postgres_journal().await),
        }
    }

    async fn postgres_journal(&self) -> PostgresJournal {
        let url = support::postgres_url();
        PostgresJournal::builder(&url)
            .table(self.table())
            .connect()
            .await
            .unwrap_or_else(|e| panic!("the PostgreSQL at {url} must be reachable: {e}"))
    }

    /// The bearer token the example sends is nowhere in the journal's bytes.
    async fn assert_token_absent(&self) {
        let bytes = self.journal_bytes().await;
        assert!(
            !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
            "the bearer token is in the journal"
        );
    }

    /// Every byte the journal holds: the SQLite files, or the PostgreSQL rows.
    async fn journal_bytes(&self) -> Vec<u8> {
        match self {
            Backend::Sqlite(dir) => {
                // SQLite removes the `-wal` and `-shm` files when the last connection
                // closes, after checkpointing them into the database file: a file listed
                // a moment ago may be gone, its bytes moved. Read the whole set again then,
                // so that no byte the journal holds is skipped.
                'again: for _ in 0..10 {
                    let mut bytes = Vec::new();
                    for entry in std::fs::read_dir(dir.path()).expect("list the db dir") {
                        let path = entry.expect("dir entry").path();
                        match std::fs::read(&path) {
                            Ok(file) => bytes.extend(file),
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue 'again,
                            Err(e) => panic!("read the journal file {}: {e}", path.display()),
                        }
                    }
                    assert!(!bytes.is_empty(), "the journal files exist");
                    return bytes;
                }
                panic!("the journal's files kept changing while being read, 10 times");
            }
            Backend::Postgres(table) => {
                let admin = support::postgres_admin(&support::postgres_url()).await;
                let rows: Vec<Vec<u8>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT convert_to(url, 'UTF8') || headers || body
  || coalesce(response_headers, ''::bytea) FROM \"{table}\""
                )))
                .fetch_all(&admin)
                .await
                .expect("read the journal rows");
                admin.close().await;
                assert!(!rows.is_empty(), "the journal has rows");
                rows.concat()
            }
        }
    }

    async fn cleanup(&self) {
        if let Backend::Postgres(table) = self {
            support::drop_postgres_table(table).await;
            support::drop_postgres_table(&format!("{table}_orders")).await;
        }
    }
}

/// The example as a child process.
fn example(url: &str, backend: &Backend, count: u32, crash_after: Option<u32>) -> Command {
    let mut cmd = Command::new(binary("outbox"));
    cmd.args(["--url", url, "--count", &count.to_string()])
        .args(backend.args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(k) = crash_after {
        cmd.args(["--crash-after", &k.to_string()]);
    }
    cmd
}

async fn run(url: &str, backend: &Backend, count: u32, crash_after: Option<u32>) -> Output {
    example(url, backend, count, crash_after)
        .output()
        .await
        .expect("run the outbox example")
}

/// The example's last line, after a run that ended by itself.
fn tally(out: &Output) -> String {
    assert!(
        out.status.success(),
        "the example failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

fn killed(out: &Output) -> bool {
    out.status.signal() == Some(9)
}

/// The charge server's counts: executions, orders, orders charged under several keys.
async fn stats(server: &ExampleServer) -> (u64, u64, u64) {
    let s: serde_json::Value = reqwest::get(server.url("/stats"))
        .await
        .expect("GET /stats")
        .json()
        .await
        .expect("stats JSON");
    let n = |k: &str| {
        s[k].as_u64()
            .unwrap_or_else(|| panic!("stats {s} lack {k}"))
    };
    (n("executions"), n("orders"), n("orders_with_several_keys"))
}

/// A small deterministic RNG (SplitMix64), so that the kill moments repeat per seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// 200 charges through a proxy that loses every third key's first answer; the child is
/// killed at least five times (by itself at a random request, or from outside at a
/// random moment) and started again until it finishes.
async fn two_hundred_charges_survive_repeated_kills(backend: Backend) {
    const COUNT: u32 = 200;
    let server = ExampleServer::start("charge_server", &[]);
    let proxy = FaultProxy::start(server.addr(), |shot| {
        if shot.key_index % 3 == 0 && shot.key_attempt == 0 {
            Fault::LoseResponse
        } else {
            Fault::None
        }
    })
    .await
    .expect("start the fault proxy");
    let url = proxy.url("");
    let mut rng = Rng(0x5eed_0012);
    let mut kills = 0;
    for round in 0..8 {
        if round % 2 == 0 {
            // Killed by itself right after a random request was answered.
            let out = run(&url, &backend, COUNT, Some(1 + rng.below(10) as u32)).await;
            if killed(&out) {
                kills += 1;
            } else {
                tally(&out);
            }
        } else {
            // Killed from outside, at a random moment.
            let mut child: Child = example(&url, &backend, COUNT, None)
                .spawn()
                .expect("start the example");
            tokio::time::sleep(Duration::from_millis(20 + rng.below(150))).await;
            if child.try_wait().expect("poll the child").is_none() {
                child.kill().await.expect("SIGKILL the child");
                kills += 1;
            }
        }
    }
    assert!(kills >= 5, "only {kills} runs were killed while working");
    let line = tally(&run(&url, &backend, COUNT, None).await);
    assert_eq!(line, "operations=200 done=200 pending=0 expired=0");

    let (executions, orders, several) = stats(&server).await;
    assert_eq!(executions, 200, "every charge executed exactly once");
    assert_eq!(orders, 200);
    assert_eq!(several, 0, "no operation was charged under two keys");
    assert!(proxy.stats().lost_responses > 0, "responses were lost");

    let outbox = backend.outbox().await;
    assert!(
        outbox.pending().await.expect("pending").is_empty(),
        "none pending"
    );
    for i in 1..=COUNT {
        let outcome = outbox
            .outcome(&format!("charge:{i}"))
            .await
            .expect("outcome")
            .unwrap_or_else(|| panic!("charge:{i} has no recorded outcome"));
        assert_eq!(outcome.status, 200, "charge:{i}");
    }
    drop(outbox);
    backend.assert_token_absent().await;
    backend.cleanup().await;
}

/// An operation persisted and never sent (the process died in between) is sent by the
/// next run's resume, once.
async fn persisted_but_unsent_is_sent_by_resume(backend: Backend) {
    let server = ExampleServer::start("charge_server", &[]);
    let url = server.url("");
    // What a run that crashed right after its transaction leaves behind.
    {
        let outbox = backend.outbox().await;
        let client = reqwest_middleware::ClientWithMiddleware::from(reqwest::Client::new());
        let request = client
            .post(server.url("/v1/charges"))
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .json(&serde_json::json!({"amount": 101, "order": "charge:1"}))
            .build()
            .expect("request");
        let op = outbox.prepare("charge:1", request).expect("prepare");
        outbox.enqueue(op).await.expect("enqueue");
    }
    let line = tally(&run(&url, &backend, 1, None).await);
    assert_eq!(line, "operations=1 done=1 pending=0 expired=0");
    assert_eq!(stats(&server).await, (1, 1, 0));
    let outbox = backend.outbox().await;
    let op = outbox
        .operation("charge:1")
        .await
        .expect("get")
        .expect("recorded");
    let outcome = op.outcome.expect("recorded outcome");
    assert!(
        !outcome.replayed,
        "the server had never seen it: executed now"
    );
    assert_eq!(op.attempts, 1, "one send, by the resume");
    backend.cleanup().await;
}

/// A run killed after the server executed a charge and before its outcome was recorded:
/// the next run's resume gets the replay, and the journal never held the token.
async fn executed_but_unrecorded_gets_the_replay(backend: Backend) {
    let server = ExampleServer::start("charge_server", &[]);
    let url = server.url("");
    let out = run(&url, &backend, 3, Some(2)).await;
    assert!(killed(&out), "the example killed itself: {}", out.status);
    {
        let outbox = backend.outbox().await;
        assert!(outbox.outcome("charge:1").await.expect("outcome").is_some());
        let second = outbox
            .operation("charge:2")
            .await
            .expect("get")
            .expect("persisted");
        assert!(
            second.is_pending(),
            "killed before its outcome was recorded"
        );
        assert_eq!(outbox.operation("charge:3").await.expect("get"), None);
    }
    assert_eq!(stats(&server).await.0, 2, "the server executed charge:2");

    let line = tally(&run(&url, &backend, 3, None).await);
    assert_eq!(line, "operations=3 done=3 pending=0 expired=0");
    assert_eq!(
        stats(&server).await,
        (3, 3, 0),
        "charge:2 was not executed again"
    );
    let outbox = backend.outbox().await;
    let resumed = outbox
        .outcome("charge:2")
        .await
        .expect("outcome")
        .expect("recorded");
    assert!(resumed.replayed, "the resume got the stored answer");
    drop(outbox);
    backend.assert_token_absent().await;
    backend.cleanup().await;
}

/// A pending operation older than the retention window is reported, not sent.
async fn expired_is_reported_not_sent(backend: Backend) {
    let server = ExampleServer::start("charge_server", &[]);
    let url = server.url("");
    {
        let outbox = backend.outbox().await;
        let client = reqwest_middleware::ClientWithMiddleware::from(reqwest::Client::new());
        let request = client
            .post(server.url("/v1/charges"))
            .json(&serde_json::json!({"amount": 101, "order": "charge:1"}))
            .build()
            .expect("request");
        let mut op = outbox.prepare("charge:1", request).expect("prepare");
        op.created = SystemTime::now() - Duration::from_secs(25 * 3600);
        outbox.journal().enqueue(&op).await.expect("enqueue");
    }
    let line = tally(&run(&url, &backend, 1, None).await);
    assert_eq!(line, "operations=1 done=0 pending=0 expired=1");
    assert_eq!(stats(&server).await.0, 0, "never sent");
    backend.cleanup().await;
}

macro_rules! on_both {
    ($($check:ident => $sqlite:ident, $postgres:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $check(Backend::sqlite()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            $check(Backend::postgres()).await;
        }
    )*};
}

on_both! {
    two_hundred_charges_survive_repeated_kills =>
        sqlite_two_hundred_charges_survive_repeated_kills,
        postgres_two_hundred_charges_survive_repeated_kills;
    persisted_but_unsent_is_sent_by_resume =>
        sqlite_persisted_but_unsent_is_sent_by_resume,
        postgres_persisted_but_unsent_is_sent_by_resume;
    executed_but_unrecorded_gets_the_replay =>
        sqlite_executed_but_unrecorded_gets_the_replay,
        postgres_executed_but_unrecorded_gets_the_replay;
    expired_is_reported_not_sent =>
        sqlite_expired_is_reported_not_sent,
        postgres_expired_is_reported_not_sent;
}
