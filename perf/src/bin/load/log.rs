//! `load --log FILTER`: the cost of logging as a service runs with it. Two server
//! processes of this program, one with a formatting subscriber installed at FILTER
//! (`tracing_subscriber::fmt` with an `EnvFilter`, writing to its standard error, as
//! `examples/common/telemetry.rs` installs it) and one with no subscriber (logging off);
//! each round drives the bare handler, fresh keys and replays against both, the order
//! of the two alternating between rounds. It prints requests per second and the server
//! process's CPU per request of each, the logging process's as ratios of the other's,
//! and how much the logging process wrote (read from its standard error and counted, not
//! shown: a filter that prints per request shows here).
//!
//! `--span-level LEVEL` sets `IdempotencyLayer::span_level` in both processes (only the
//! logging one can see a span), to measure a request span built at that level.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, BufReader};
use tracing_subscriber::EnvFilter;

use super::{Args, Workload, cpu_micros, run, start_server};

/// The subscriber of the logging server process: formatted lines on standard error,
/// filtered by `filter` (an `EnvFilter` directive, as `RUST_LOG` takes).
pub(crate) fn install(filter: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter).map_err(|e| format!("--log {filter}: {e}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))
}

/// The server arguments for `level` (`--span-level LEVEL`), none without.
pub(crate) fn span_level_args(level: Option<tracing::Level>) -> Vec<String> {
    level
        .map(|l| vec!["--span-level".to_owned(), l.to_string()])
        .unwrap_or_default()
}

/// The two processes, by index: logging off, logging at the filter.
const PROCESSES: [&str; 2] = ["off", "log"];
/// The workloads of each round.
const WORKLOADS: [Workload; 3] = [Workload::Bare, Workload::Fresh, Workload::Replay];

/// Runs the comparison (`load --log FILTER`).
pub(crate) async fn compare(args: &Args, filter: &str, body: &Bytes) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let store = args.store.as_deref();
    let level = span_level_args(args.span_level);
    let (mut off, off_addrs) = start_server(&exe, store, &level, Stdio::inherit()).await?;
    let mut log_args = vec!["--log".to_owned(), filter.to_owned()];
    log_args.extend(level.iter().cloned());
    let (mut logging, log_addrs) = start_server(&exe, store, &log_args, Stdio::piped()).await?;
    let written = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let stderr = logging
        .stderr
        .take()
        .ok_or("the logging server has no stderr")?;
    let counter = Arc::clone(&written);
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            counter
                .0
                .fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
            counter.1.fetch_add(1, Ordering::Relaxed);
        }
    });
    let pids = [off.id(), logging.id()];
    let addrs = [off_addrs, log_addrs];
    let seconds = Duration::from_secs(args.seconds);
    println!(
        "{} round(s) of {} s per workload and process, {} connections, {} client threads; \
         log filter {filter:?}, request span level {}",
        args.rounds,
        args.seconds,
        args.connections,
        args.threads,
        args.span_level
            .map_or("default".to_owned(), |l| l.to_string())
    );
    // [workload][process]: requests within the windows, CPU microseconds, requests
    // answered (for the CPU per request).
    let mut done = [[0u64; 2]; WORKLOADS.len()];
    let mut cpu = [[(0u64, 0u64); 2]; WORKLOADS.len()];
    let mut answered_by_log = 0u64;
    for round in 1..=args.rounds {
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for (w, workload) in WORKLOADS.into_iter().enumerate() {
            for p in order {
                let addr = match workload {
                    Workload::Bare => addrs[p].bare,
                    _ => addrs[p].verified,
                };
                let before = pids[p].and_then(cpu_micros);
                // Keys of their own per process (a shared store would otherwise turn
                // the second process's fresh keys into replays).
                let keys = round * 2 + p as u32;
                let (n, answered) =
                    run(workload, addr, args.connections, seconds, keys, body).await?;
                let used = before.zip(pids[p].and_then(cpu_micros));
                done[w][p] += n;
                if p == 1 {
                    answered_by_log += answered;
                }
                let per_request = used.map(|(a, b)| {
                    cpu[w][p].0 += b - a;
                    cpu[w][p].1 += answered;
                    format!(
                        ", server CPU {:.2} us/req",
                        (b - a) as f64 / answered.max(1) as f64
                    )
                });
                println!(
                    "round {round} {:>6} {:>3}: {:>9.0} req/s{}",
                    workload.name(),
                    PROCESSES[p],
                    n as f64 / seconds.as_secs_f64(),
                    per_request.unwrap_or_default()
                );
            }
        }
    }
    let secs = seconds.as_secs_f64() * f64::from(args.rounds);
    let us = |(used, answered): (u64, u64)| used as f64 / answered.max(1) as f64;
    println!(
        "{:>8} {:>10} {:>10} {:>8} {:>12} {:>12} {:>8}",
        "workload", "off req/s", "log req/s", "log/off", "off CPU us", "log CPU us", "log/off"
    );
    for (w, workload) in WORKLOADS.into_iter().enumerate() {
        let [off_n, log_n] = done[w];
        let [off_cpu, log_cpu] = cpu[w].map(us);
        println!(
            "{:>8} {:>10.0} {:>10.0} {:>8.3} {:>12.2} {:>12.2} {:>8.3}",
            workload.name(),
            off_n as f64 / secs,
            log_n as f64 / secs,
            log_n as f64 / off_n.max(1) as f64,
            off_cpu,
            log_cpu,
            log_cpu / off_cpu.max(f64::MIN_POSITIVE)
        );
    }
    let bare = done[0];
    let of_bare = |w: usize, p: usize| done[w][p] as f64 / bare[p].max(1) as f64;
    println!(
        "fresh/bare off {:.2} log {:.2}  replay/bare off {:.2} log {:.2}",
        of_bare(1, 0),
        of_bare(1, 1),
        of_bare(2, 0),
        of_bare(2, 1)
    );
    off.kill().await.map_err(|e| e.to_string())?;
    logging.kill().await.map_err(|e| e.to_string())?;
    // The logging process is gone: its standard error ends and the count is final.
    let _ = reader.await;
    let (bytes, lines) = (
        written.0.load(Ordering::Relaxed),
        written.1.load(Ordering::Relaxed),
    );
    println!(
        "the logging process wrote {lines} line(s), {bytes} bytes ({:.3} bytes per request)",
        bytes as f64 / answered_by_log.max(1) as f64
    );
    Ok(())
}
