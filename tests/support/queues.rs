//! The queue consumer examples' scenario (`tests/queues_*.rs`): 500 charges, 10 % of
//! them published twice; the consumer example run as a process and SIGKILLed mid-stream
//! at seeded points of its progress, restarted, and finally run until idle; then the
//! account's ledger and balance checked against the distinct charges.

use std::time::Duration;

use super::examples::ExampleProcess;

/// The distinct charges of the scenario.
pub(crate) const CHARGES: usize = 500;
/// How many consumers are killed mid-stream.
pub(crate) const KILLS: usize = 4;

/// The seed of the duplicates and the kill points (fixed: a failure reproduces).
const SEED: u64 = 0x1de3_c0de_5eed_0016;

/// One charge: its id (the broker's message id) and amount.
pub(crate) struct Charge {
    pub(crate) id: String,
    pub(crate) amount: i64,
}

impl Charge {
    /// The payload the consumer examples read: `{"id": ..., "amount": ...}`.
    pub(crate) fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"id": self.id, "amount": self.amount}))
            .expect("a JSON payload")
    }
}

/// A small deterministic generator (xorshift64*): the scenario needs spread, not
/// quality.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// The scenario for the run named `run`: the 500 distinct charges, and the indices of
/// the 50 of them published a second time (as a producer does after a lost publisher
/// confirm).
pub(crate) fn charges(run: &str) -> (Vec<Charge>, Vec<usize>) {
    let charges = (0..CHARGES)
        .map(|i| Charge {
            id: format!("{run}-charge-{i}"),
            amount: i64::try_from(1 + (i * 7919) % 997).expect("small"),
        })
        .collect();
    let mut rng = Rng(SEED);
    let mut twice: Vec<usize> = Vec::new();
    while twice.len() < CHARGES / 10 {
        let i = usize::try_from(rng.below(CHARGES as u64)).expect("small");
        if !twice.contains(&i) {
            twice.push(i);
        }
    }
    (charges, twice)
}

/// The sum of the distinct charges: the balance the account must end with.
pub(crate) fn expected_balance(charges: &[Charge]) -> i64 {
    charges.iter().map(|c| c.amount).sum()
}

/// The points (messages in the ledger) at which the consumers are killed: seeded,
/// increasing, spread over the stream, the last well before its end.
fn kill_points() -> Vec<i64> {
    let mut rng = Rng(SEED ^ 0xdead);
    let step = (CHARGES as u64 * 4 / 5) / KILLS as u64;
    (0..KILLS as u64)
        .map(|k| i64::try_from(20 + k * step + rng.below(step / 2)).expect("small"))
        .collect()
}

/// The account tables of one run, in the shared PostgreSQL: `<accounts>` and
/// `<accounts>_ledger` (made by the consumer example), and the records table.
pub(crate) struct Ledger {
    pool: sqlx::PgPool,
    pub(crate) records: String,
    pub(crate) accounts: String,
}

impl Ledger {
    pub(crate) async fn new(run: &str) -> Self {
        Self {
            pool: super::postgres_admin(&super::postgres_url()).await,
            records: format!("{run}_rec"),
            accounts: format!("{run}_acct"),
        }
    }

    /// Ledger rows so far (0 before the consumer created the table).
    async fn rows(&self) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}_ledger\"",
            self.accounts
        )))
        .fetch_one(&self.pool)
        .await
        .unwrap_or(0)
    }

    /// The arguments the consumer example needs for this run's tables.
    pub(crate) fn args(&self, mode: &str) -> Vec<String> {
        [
            "--mode",
            mode,
            "--postgres",
            &super::postgres_url(),
            "--table",
            &self.records,
            "--accounts",
            &self.accounts,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Runs consumer example `example` with `args`: killed (SIGKILL) at each seeded
    /// kill point of its progress and restarted, then run with `--idle-exit-ms idle`
    /// until it exits by itself. Returns the number of kills.
    pub(crate) async fn run_with_kills(
        &self,
        example: &str,
        args: &[String],
        idle: Duration,
    ) -> usize {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut kills = 0;
        for point in kill_points() {
            let mut consumer = ExampleProcess::start(example, &args);
            let start = std::time::Instant::now();
            while self.rows().await < point {
                assert!(
                    consumer.running(),
                    "{example} exited before kill point {point}"
                );
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "{example} made no progress to {point} ledger rows in 120 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            consumer.kill();
            kills += 1;
        }
        let idle_ms = idle.as_millis().to_string();
        let mut last: Vec<&str> = args.clone();
        last.extend(["--idle-exit-ms", &idle_ms]);
        let mut consumer = ExampleProcess::start(example, &last);
        tokio::task::spawn_blocking(move || consumer.wait(Duration::from_secs(180)))
            .await
            .expect("the final consumer");
        kills
    }

    /// Checks the ledger against the charges. `exact`: every charge's effect ran once
    /// (the inbox). Otherwise (`once`) each kill may have repeated the one effect it
    /// interrupted between the effect and its record, and nothing else repeats.
    pub(crate) async fn check(&self, charges: &[Charge], kills: usize, exact: bool) {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT msg, count(*), min(amount) FROM \"{}_ledger\" GROUP BY msg",
            self.accounts
        )))
        .fetch_all(&self.pool)
        .await
        .expect("read the ledger");
        let balance: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT balance FROM \"{}\" WHERE id = 1",
            self.accounts
        )))
        .fetch_one(&self.pool)
        .await
        .expect("read the balance");
        assert_eq!(
            rows.len(),
            charges.len(),
            "every distinct charge was applied"
        );
        let repeats: Vec<&(String, i64, i64)> = rows.iter().filter(|r| r.1 > 1).collect();
        let repeated: i64 = repeats.iter().map(|r| (r.1 - 1) * r.2).sum();
        let expected = expected_balance(charges);
        if exact {
            assert!(repeats.is_empty(), "effects ran twice: {repeats:?}");
            assert_eq!(
                balance, expected,
                "the balance is the sum of the distinct charges"
            );
        } else {
            let extra: i64 = repeats.iter().map(|r| r.1 - 1).sum();
            eprintln!("once: {extra} repeated effects after {kills} kills");
            assert!(
                extra <= i64::try_from(kills).expect("small"),
                "{extra} repeated effects after {kills} kills: {repeats:?}"
            );
            assert_eq!(
                balance,
                expected + repeated,
                "the balance matches the ledger"
            );
        }
    }

    /// Drops the run's tables.
    pub(crate) async fn drop_tables(self) {
        for t in [
            self.records.clone(),
            self.accounts.clone(),
            format!("{}_ledger", self.accounts),
        ] {
            super::drop_postgres_table(&t).await;
        }
        self.pool.close().await;
    }
}
