//! The cost of a quota of new keys per fresh request (claim, then complete, through
//! the engine), against the same store without a quota, measured in the same run.
//!
//! ```sh
//! cargo run --release -p perf --bin quota_cost -- [--requests 4000] [--rounds 5]
//! ```
//!
//! Five variants, run in alternating rounds so that the machine's noise falls on all of
//! them alike: the memory store without a quota (the baseline of the memory rows), with
//! a per-process quota; Redis without a quota (the baseline of the Redis rows), with a
//! per-process quota, with a quota shared through Redis (the claim's script charges the
//! bucket). Redis is a private `redis-server` (on `PATH`) on a free port of 127.0.0.1,
//! without persistence, killed by its process id at the end. Each round sends
//! `--requests` fresh keys one after another, spread over 64 scopes; the quota is far
//! above what the run reaches, so that every claim is admitted and only the charging is
//! measured. The figure is the median over the rounds of nanoseconds per fresh request,
//! and its ratio to the baseline of its store; the figures go to standard error.

use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use idemkey::IdempotencyKey;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::policy::Quota;
use idemkey::server::{Claimed, Engine};
use idemkey::store::{MemoryStore, RedisStore};

const USAGE: &str = "usage: quota_cost [--requests N] [--rounds R]   (defaults 4000, 5)";
const SCOPES: usize = 64;

/// The private server, killed by its pid when dropped (also on a panic).
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Result<Server, String> {
    let port = TcpListener::bind("127.0.0.1:0")
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
    let server = Server { child, port };
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

fn args() -> Result<(usize, usize), String> {
    let mut requests = 4000;
    let mut rounds = 5;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let value = it.next().and_then(|v| v.parse::<usize>().ok());
        match (a.as_str(), value) {
            ("--requests", Some(n)) if n > 0 => requests = n,
            ("--rounds", Some(n)) if n > 0 => rounds = n,
            _ => return Err(USAGE.into()),
        }
    }
    Ok((requests, rounds))
}

/// A quota no run reaches: every claim is admitted.
fn unreachable_quota() -> Result<Quota, String> {
    Quota::per_second(1e9)
        .and_then(|q| q.burst(u32::MAX))
        .map_err(|e| e.to_string())
}

/// `n` fresh keys through `engine`, one after another; nanoseconds per request.
async fn round(engine: &Engine, tag: &str, n: usize) -> Result<f64, String> {
    let fp = Fingerprint::of_bytes(b"a charge of 1000 eur");
    let scopes: Vec<String> = (0..SCOPES).map(|i| format!("tenant-{i}")).collect();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let start = Instant::now();
    for i in 0..n {
        let key = IdempotencyKey::new(format!("{tag}-{run}-{i}")).map_err(|e| e.to_string())?;
        let scope = &scopes[i % SCOPES];
        match engine
            .claim(scope, &key, &fp)
            .await
            .map_err(|e| e.to_string())?
        {
            Claimed::Execute(exec) => exec
                .complete(bytes::Bytes::from_static(b"{\"id\":\"ch_1\"}"))
                .await
                .map_err(|e| e.to_string())?,
            other => return Err(format!("a fresh key was not executed: {other:?}")),
        }
    }
    #[allow(clippy::cast_precision_loss, reason = "a measurement")]
    Ok(start.elapsed().as_nanos() as f64 / n as f64)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn run() -> Result<(), String> {
    let (requests, rounds) = args()?;
    let server = start_server()?;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let redis = || async {
        RedisStore::builder(url.clone())
            .prefix("quota-cost:")
            .connect()
            .await
            .map_err(|e| e.to_string())
    };
    let retention = Duration::from_secs(300);
    let quota = unreachable_quota()?;
    let memory = MemoryStore::new();
    let variants: Vec<(&str, &str, Engine)> = vec![
        (
            "memory",
            "no quota",
            Engine::builder(memory.clone()).retention(retention).build(),
        ),
        (
            "memory",
            "per-process quota",
            Engine::builder(memory)
                .retention(retention)
                .quota(quota)
                .build(),
        ),
        (
            "redis",
            "no quota",
            Engine::builder(redis().await?).retention(retention).build(),
        ),
        (
            "redis",
            "per-process quota",
            Engine::builder(redis().await?)
                .retention(retention)
                .quota(quota)
                .build(),
        ),
        (
            "redis",
            "shared quota (in the claim's script)",
            Engine::builder(redis().await?)
                .retention(retention)
                .quota(quota.shared())
                .build(),
        ),
    ];
    // Warm-up: connections, scripts, allocator.
    for (i, (_, _, engine)) in variants.iter().enumerate() {
        round(engine, &format!("warm{i}"), requests / 4 + 1).await?;
    }
    let mut figures = vec![Vec::with_capacity(rounds); variants.len()];
    for r in 0..rounds {
        for (i, (_, _, engine)) in variants.iter().enumerate() {
            figures[i].push(round(engine, &format!("r{r}v{i}"), requests).await?);
        }
    }
    let medians: Vec<f64> = figures.iter_mut().map(|f| median(f)).collect();
    eprintln!("{requests} fresh requests per round, {rounds} rounds, median ns per request:");
    eprintln!("| store | quota | ns / fresh request | / no quota |");
    eprintln!("|---|---|---|---|");
    for (i, (store, what, _)) in variants.iter().enumerate() {
        let base = variants
            .iter()
            .position(|(s, _, _)| s == store)
            .map_or(medians[i], |b| medians[b]);
        eprintln!(
            "| {store} | {what} | {:.0} | {:.3} |",
            medians[i],
            medians[i] / base
        );
    }
    drop(server);
    Ok(())
}

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("quota_cost: a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quota_cost: {e}");
            ExitCode::FAILURE
        }
    }
}
