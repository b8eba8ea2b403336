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
//! measured. Three figures per variant, each the median over the rounds of a fresh
//! request's share, and its ratio to the baseline of its store: wall time; this
//! program's CPU time (the engine and the client side of the store, on one thread: the
//! runtime is current-thread), which the machine's other load barely moves; and
//! Redis's own CPU (`usec` of `INFO commandstats`, the private server serving this
//! program alone). The figures go to standard error.

#[path = "../private_redis.rs"]
mod private_redis;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use idemkey::IdempotencyKey;
use idemkey::fingerprint::Fingerprint;
use idemkey::server::policy::Quota;
use idemkey::server::{Claimed, Engine};
use idemkey::store::{MemoryStore, RedisStore};
use private_redis::PrivateRedis;

const USAGE: &str = "usage: quota_cost [--requests N] [--rounds R]   (defaults 4000, 5)";
const SCOPES: usize = 64;

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

/// This thread's CPU time, in nanoseconds.
#[allow(clippy::cast_precision_loss, reason = "a measurement")]
fn thread_cpu_ns() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// Microseconds of CPU Redis spent on every command but `INFO` since it started.
async fn redis_usec(admin: &mut redis::aio::MultiplexedConnection) -> Result<f64, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .map_err(|e| format!("INFO: {e}"))?;
    let mut usec = 0_u64;
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if name == "info" {
            continue;
        }
        usec += rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("usec="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    #[allow(clippy::cast_precision_loss, reason = "a measurement")]
    Ok(usec as f64)
}

/// Per fresh request: wall ns, this thread's CPU ns, Redis's CPU ns.
#[derive(Clone, Copy)]
struct Figures {
    wall: f64,
    cpu: f64,
    redis: f64,
}

/// `n` fresh keys through `engine`, one after another: [`Figures`] per request.
async fn round(
    engine: &Engine,
    admin: &mut redis::aio::MultiplexedConnection,
    tag: &str,
    n: usize,
) -> Result<Figures, String> {
    #[allow(clippy::cast_precision_loss, reason = "a measurement")]
    let per = n as f64;
    let redis_before = redis_usec(admin).await?;
    let cpu_before = thread_cpu_ns();
    let wall = timed(engine, tag, n).await?;
    let cpu = thread_cpu_ns() - cpu_before;
    let redis = redis_usec(admin).await? - redis_before;
    Ok(Figures {
        wall: wall / per,
        cpu: cpu / per,
        redis: redis * 1000.0 / per,
    })
}

/// `n` fresh keys through `engine`, one after another; the wall time in nanoseconds.
async fn timed(engine: &Engine, tag: &str, n: usize) -> Result<f64, String> {
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
    Ok(start.elapsed().as_nanos() as f64)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn run() -> Result<(), String> {
    let (requests, rounds) = args()?;
    let server = PrivateRedis::start()?;
    let url = server.url.clone();
    let mut admin = redis::Client::open(url.as_str())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
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
        round(engine, &mut admin, &format!("warm{i}"), requests / 4 + 1).await?;
    }
    let mut figures = vec![Vec::with_capacity(rounds); variants.len()];
    for r in 0..rounds {
        for (i, (_, _, engine)) in variants.iter().enumerate() {
            figures[i].push(round(engine, &mut admin, &format!("r{r}v{i}"), requests).await?);
        }
    }
    let med = |pick: fn(&Figures) -> f64| -> Vec<f64> {
        figures
            .iter()
            .map(|f| median(&mut f.iter().map(pick).collect::<Vec<_>>()))
            .collect()
    };
    let (wall, cpu, redis) = (med(|f| f.wall), med(|f| f.cpu), med(|f| f.redis));
    eprintln!("{requests} fresh requests per round, {rounds} rounds, medians per fresh request:");
    eprintln!(
        "| store | quota | wall ns | / no quota | client CPU ns | / no quota | Redis CPU ns | / no quota |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|");
    for (i, (store, what, _)) in variants.iter().enumerate() {
        let b = variants
            .iter()
            .position(|(s, _, _)| s == store)
            .unwrap_or(i);
        let ratio = |v: &[f64]| if v[b] > 0.0 { v[i] / v[b] } else { 1.0 };
        eprintln!(
            "| {store} | {what} | {:.0} | {:.3} | {:.0} | {:.3} | {:.0} | {:.3} |",
            wall[i],
            ratio(&wall),
            cpu[i],
            ratio(&cpu),
            redis[i],
            ratio(&redis)
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
