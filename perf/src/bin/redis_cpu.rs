//! Redis CPU per fresh request (claim + complete) and per replay of the Redis store,
//! against the floor of plain commands, counted by the server with `INFO commandstats`.
//!
//! ```sh
//! cargo run --release -p perf --bin redis_cpu -- [--requests 20000]
//! ```
//!
//! Starts a private `redis-server` (on `PATH`) on a free port of 127.0.0.1, without
//! persistence, and kills it by its process id at the end. Each phase runs the same
//! number of operations from 16 concurrent tasks, on fresh record ids, after
//! `CONFIG RESETSTAT`:
//!
//! - the store: claims of absent records, completes of those claims, claims that find
//!   the completed records (replays);
//! - the floor: `SET key value NX PX ms` on absent keys (a claim), `SET key value PX ms`
//!   (a completion), and `SET key value NX PX ms` on existing keys (a claim that finds
//!   the record).
//!
//! A phase's Redis CPU is the `usec` of the commands its clients sent: Redis counts the
//! commands a Lua script calls as well, inside the script's own `usec`, so a phase that
//! ran scripts is counted by its `EVAL`/`EVALSHA` lines alone (each phase sends either
//! scripts only or plain commands only). The figures go to standard error.

#[path = "../private_redis.rs"]
mod private_redis;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemkey::store::{Claim, ClaimRequest, FencingToken, RecordId, RedisStore, Store};
use private_redis::PrivateRedis;
use redis::aio::MultiplexedConnection;

const USAGE: &str = "usage: redis_cpu [--requests N]   (default 20000)";
/// Concurrent clients, as redis-benchmark's default 50 would overload a 2-core machine.
const CLIENTS: usize = 16;
/// A typical stored response: status, a few headers, a small JSON body.
const PAYLOAD: usize = 160;
/// A SHA-256 fingerprint.
const FINGERPRINT: [u8; 32] = [0xA5; 32];

/// `(calls, usec)` per command.
async fn stats(admin: &mut MultiplexedConnection) -> Result<HashMap<String, (u64, u64)>, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .map_err(|e| format!("INFO: {e}"))?;
    let mut commands = HashMap::new();
    for line in info.lines() {
        if let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        {
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            commands.insert(name.to_owned(), (field("calls="), field("usec=")));
        }
    }
    Ok(commands)
}

/// One phase's figures: Redis CPU (µs) per operation by commandstats, and the commands
/// run per operation.
struct Cost {
    usec: f64,
    calls: String,
}

/// Runs `n` operations (`op(i)`) from [`CLIENTS`] tasks and measures them.
async fn phase<F, Fut>(admin: &mut MultiplexedConnection, n: usize, op: F) -> Result<Cost, String>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(admin)
        .await
        .map_err(|e| format!("CONFIG RESETSTAT: {e}"))?;
    let op = Arc::new(op);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let op = Arc::clone(&op);
        tasks.spawn(async move {
            for i in (c..n).step_by(CLIENTS) {
                op(i).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("a client task failed: {e}"))??;
    }
    let commands = stats(admin).await?;
    let sent: Vec<_> = commands
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat" | "config"))
        .collect();
    let scripts = sent.iter().any(|(name, _)| name.starts_with("eval"));
    let top_level = |name: &str| !scripts || name.starts_with("eval");
    let usec: u64 = sent
        .iter()
        .filter(|(name, _)| top_level(name))
        .map(|(_, (_, usec))| usec)
        .sum();
    let mut calls: Vec<String> = sent
        .iter()
        .map(|(name, (calls, usec))| {
            let nested = if top_level(name) { "" } else { " in scripts" };
            format!(
                "{name}{nested} {:.2} × {:.2} µs",
                *calls as f64 / n as f64,
                *usec as f64 / *calls.max(&1) as f64
            )
        })
        .collect();
    calls.sort();
    Ok(Cost {
        usec: usec as f64 / n as f64,
        calls: calls.join(", "),
    })
}

async fn run(n: usize) -> Result<(), String> {
    let server = PrivateRedis::start()?;
    let url = server.url.clone();
    let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let store = RedisStore::builder(&url)
        .prefix("cpu:")
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let lease = Duration::from_secs(60);
    let ids: Arc<Vec<(RecordId, FencingToken)>> = Arc::new(
        (0..n)
            .map(|i| (RecordId::new("cpu", &i.to_string()), FencingToken::random()))
            .collect(),
    );
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);

    let claim = {
        let (store, ids) = (store.clone(), Arc::clone(&ids));
        move |i: usize, expect_completed: bool| {
            let (store, ids) = (store.clone(), Arc::clone(&ids));
            async move {
                let (id, token) = ids[i];
                let got = store
                    .claim(ClaimRequest {
                        id: &id,
                        fingerprint: &FINGERPRINT,
                        token: if expect_completed {
                            FencingToken::random()
                        } else {
                            token
                        },
                        lease,
                        retention: lease,
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                match (expect_completed, got) {
                    (false, Claim::Acquired { .. }) | (true, Claim::Completed { .. }) => Ok(()),
                    (_, other) => Err(format!("unexpected claim result {other:?}")),
                }
            }
        }
    };
    let claims = phase(&mut admin, n, {
        let claim = claim.clone();
        move |i| claim(i, false)
    })
    .await?;
    let completes = phase(&mut admin, n, {
        let (store, ids, payload) = (store.clone(), Arc::clone(&ids), payload.clone());
        move |i| {
            let (store, ids, payload) = (store.clone(), Arc::clone(&ids), payload.clone());
            async move {
                let (id, token) = ids[i];
                store
                    .complete(&id, token, payload, lease)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    })
    .await?;
    let replays = phase(&mut admin, n, move |i| claim(i, true)).await?;

    // The floor: plain commands with values of the records' sizes.
    let set = move |conn: &MultiplexedConnection, key: String, value: Vec<u8>, nx: bool| {
        let mut conn = conn.clone();
        async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(value);
            if nx {
                cmd.arg("NX");
            }
            cmd.arg("PX").arg(60_000);
            cmd.query_async::<redis::Value>(&mut conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    };
    let claim_value = vec![b'p'; 64 + FINGERPRINT.len()];
    let done_value = vec![b'c'; 32 + FINGERPRINT.len() + PAYLOAD];
    let conn = admin.clone();
    let floor_claims = phase(&mut admin, n, {
        let (conn, v) = (conn.clone(), claim_value.clone());
        move |i| set(&conn, format!("floor:{{{i}}}"), v.clone(), true)
    })
    .await?;
    let floor_completes = phase(&mut admin, n, {
        let (conn, v) = (conn.clone(), done_value.clone());
        move |i| set(&conn, format!("floor:{{{i}}}"), v.clone(), false)
    })
    .await?;
    let floor_replays = phase(&mut admin, n, {
        let (conn, v) = (conn.clone(), claim_value.clone());
        move |i| set(&conn, format!("floor:{{{i}}}"), v.clone(), true)
    })
    .await?;
    drop(server);

    let fresh = claims.usec + completes.usec;
    let floor_fresh = floor_claims.usec + floor_completes.usec;
    eprintln!("Redis CPU per operation, {n} operations per phase, {CLIENTS} clients");
    eprintln!("(commandstats usec; commands run per operation × usec per call)");
    for (what, c) in [
        ("store claim (fresh)", &claims),
        ("store complete", &completes),
        ("store claim (replay)", &replays),
        ("floor SET NX PX (absent)", &floor_claims),
        ("floor SET PX", &floor_completes),
        ("floor SET NX PX (present)", &floor_replays),
    ] {
        eprintln!("  {what:<28} {:>6.2} µs  [{}]", c.usec, c.calls);
    }
    eprintln!(
        "fresh request: {fresh:.2} µs vs floor {floor_fresh:.2} µs = {:.2}x",
        fresh / floor_fresh
    );
    eprintln!(
        "replay: {:.2} µs vs floor {:.2} µs = {:.2}x",
        replays.usec,
        floor_replays.usec,
        replays.usec / floor_replays.usec
    );
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut n = 20_000;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--requests", Some(v)) if v > 0 => n = v,
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    match run(n).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redis_cpu: {e}");
            ExitCode::FAILURE
        }
    }
}
