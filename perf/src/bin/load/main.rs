//! Load program: the same charge handler with and without the verifier, measured in one
//! run, alternating, so that a shared or noisy machine affects both alike.
//!
//! ```sh
//! cargo run --release -p perf --bin load -- [--seconds 5] [--rounds 3] [--connections 32] [--threads 2]
//!     [--delay-ms MS] [--proxy PATH/TO/idemkey]
//! ```
//!
//! It starts a server process of its own (this program with `--serve`) that serves the
//! charge app of `examples/common/charge_app.rs` three times, on three ports:
//! `POST /v1/charges` bare, behind `IdempotencyLayer` over the memory store, and behind
//! the floor verifier of `floor.rs` beside this file (the least work any verifier must do:
//! hash key and scope, fingerprint the body, claim and complete a record in a concurrent
//! map, keep a copy of the answer). Then it drives, for each round, five workloads of
//! `--seconds` each over `--connections` keep-alive HTTP/1.1 connections:
//!
//! - `bare`: the handler without the verifier;
//! - `fresh`: the verifier, a new key per request (claim, run, store, every time);
//! - `replay`: the verifier, one key per connection (the first request runs, every later
//!   one is a replay);
//! - `floor-fresh` and `floor-replay`: the same two against the floor verifier.
//!
//! - `proxied` (with `--proxy`, the path of a built `idemkey` binary): the bare handler
//!   behind `idemkey proxy` (memory store, a new key per request), started as a process
//!   of its own: the proxy's overhead against calling the upstream directly.
//!
//! `--delay-ms` makes each charge wait that long before answering (the handler's own
//! I/O, as an API behind the proxy has).
//!
//! `--store URL` puts the verifier over the store `idemkey::store::open` makes of URL
//! (`redis://127.0.0.1:6379`, `postgres://user@host/db`, `sqlite://PATH`, `mysql://...`)
//! instead of the memory store; over PostgreSQL, MySQL/MariaDB or SQLite the floor
//! verifier runs that store's statements from the least client on the store's driver
//! (`sql_floor.rs`),
//! so that `fresh/floor` and the CPU per request compare the verifier with the
//! database's part of the job. Keys carry the driver's process id,
//! so a store that outlives a run does not turn the next run's fresh keys into replays.
//!
//! It prints requests per second per round and workload, then the ratios against
//! `bare` of the same rounds (totals over all rounds), for example
//! `fresh/bare 0.62  replay/bare 0.95`, the floor's (`floor fresh/bare 0.70  floor
//! replay/bare 0.97`) and idemkey's against the floor (`fresh/floor 0.89  replay/floor
//! 0.98`).
//!
//! With `--peers`, each round also drives `axum-idempotent-fresh` and
//! `axum-idempotent-replay` (the same app behind axum-idempotent, which the `--serve`
//! process serves too) and `express-fresh` and `express-replay` (the same charge logic
//! behind express-idempotency in a Node process it starts), as `peers.rs` beside this
//! file describes, and prints idemkey's and the floor's throughput against each peer's
//! (`idemkey/axum-idempotent: fresh 1.40  replay 1.07 ...`) and each peer's server CPU
//! per request against idemkey's. With or without it, every workload is checked to run
//! the handler once per key (the app's `GET /stats` before and after), so that a
//! verifier that answers without deduplicating fails the run instead of looking fast.
//!
//! With `--against PATH`, it compares two builds instead: PATH is this program built
//! another way (for example without idemkey's `metrics` feature), started as a second
//! server process; each round drives `fresh` and `replay` against both verifiers, in
//! alternating order, and it prints `fresh this/other` and `replay this/other`, then
//! each server's CPU per request for both workloads (the CPU ratio `this/other` in
//! brackets: lower is cheaper; with `--store`, on the same database). Both
//! servers install the Prometheus recorder of `examples/common/metrics.rs`, so a build
//! with `--features metrics` (perf's, which turns on idemkey's) measures idemkey's
//! metrics with a real recorder against the same program without them.
//!
//! With `--log FILTER` (for example `--log 'warn,idemkey=info'`, the examples' default),
//! it measures the cost of logging instead (`log.rs` beside this file): a server process
//! with a formatting subscriber at FILTER against one with logging off, bare, fresh and
//! replay on both each round, with `--span-level LEVEL` for the layer's request span.
//!
//! With `--drive ADDR --requests N --workload bare|fresh|replay`, it sends N requests one
//! after another over one keep-alive connection to a server already serving at ADDR
//! (`load --serve`, which prints `BARE ADDR`, `FLOOR ADDR`, `AXUM-IDEMPOTENT ADDR` and
//! `VERIFIED ADDR`, for example under `valgrind --tool=callgrind`; `bare` goes to the
//! first, `fresh` and `replay` to the verifier's or the floor's,
//! `axum-idempotent-fresh` and `axum-idempotent-replay` to the peer's): instructions per request without a timed window. Each driver process sends
//! keys of its own, so a first drive can warm the server up (then
//! `callgrind_control --zero`) and a second one be measured alone.
#![allow(
    clippy::print_stdout,
    reason = "a command-line program prints its results"
)]

use std::net::SocketAddr;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;

#[path = "../../../../examples/common/charge_app.rs"]
mod charge_app;
#[path = "../../charge_connection.rs"]
mod charge_connection;
mod floor;
mod log;
#[path = "../../../../examples/common/metrics.rs"]
mod metrics;
mod peers;
mod sql_floor;
use charge_app::ChargeApp;
use charge_connection::ChargeConnection;

const USAGE: &str = "usage: load [--seconds S] [--rounds R] [--connections C] [--threads T]
            [--delay-ms MS] [--proxy PATH/TO/idemkey] [--against PATH/TO/load] [--store URL]
            [--log FILTER [--span-level LEVEL]] [--peers]
       load --drive ADDR --requests N [--connections C] --workload bare|fresh|replay|
            floor-fresh|floor-replay|axum-idempotent-fresh|axum-idempotent-replay
       load --serve [--store URL] [--log FILTER] [--span-level LEVEL]
  measures the charge handler bare, behind the verifier with fresh keys, and with replays
  (and behind `idemkey proxy` with --proxy, behind axum-idempotent and
  express-idempotency with --peers); with --against, this build's verifier
  against PATH's (this program built another way); with --log, a server logging at
  FILTER against one with logging off; with --drive, N sequential requests on each
  of C connections (1 unless given) to a server at ADDR (`load --serve`: its BARE
  address for bare, VERIFIED, FLOOR or AXUM-IDEMPOTENT otherwise)";

#[derive(Debug, Clone)]
struct Args {
    seconds: u64,
    rounds: u32,
    connections: usize,
    threads: usize,
    delay_ms: u64,
    proxy: Option<String>,
    against: Option<std::path::PathBuf>,
    store: Option<String>,
    /// `--log FILTER`: compare a server logging at FILTER with one logging nothing (the
    /// server process: log at FILTER).
    log: Option<String>,
    /// `--span-level LEVEL`: the level of the layer's request span.
    span_level: Option<tracing::Level>,
    /// `--peers`: drive the peers' workloads too.
    peers: bool,
    /// `--serve`: be the server process instead.
    serve: bool,
    drive: Option<SocketAddr>,
    requests: u64,
    workload: Workload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Bare,
    Fresh,
    Replay,
    FloorFresh,
    FloorReplay,
    Proxied,
    AxumIdempotentFresh,
    AxumIdempotentReplay,
    ExpressFresh,
    ExpressReplay,
}

impl Workload {
    const ALL: [Workload; 10] = [
        Workload::Bare,
        Workload::Fresh,
        Workload::Replay,
        Workload::FloorFresh,
        Workload::FloorReplay,
        Workload::Proxied,
        Workload::AxumIdempotentFresh,
        Workload::AxumIdempotentReplay,
        Workload::ExpressFresh,
        Workload::ExpressReplay,
    ];

    /// One key per connection (every request after the first a replay).
    fn replays(self) -> bool {
        matches!(
            self,
            Workload::Replay
                | Workload::FloorReplay
                | Workload::AxumIdempotentReplay
                | Workload::ExpressReplay
        )
    }

    fn name(self) -> &'static str {
        match self {
            Workload::Bare => "bare",
            Workload::Fresh => "fresh",
            Workload::Replay => "replay",
            Workload::FloorFresh => "floor-fresh",
            Workload::FloorReplay => "floor-replay",
            Workload::Proxied => "proxied",
            Workload::AxumIdempotentFresh => "axum-idempotent-fresh",
            Workload::AxumIdempotentReplay => "axum-idempotent-replay",
            Workload::ExpressFresh => "express-fresh",
            Workload::ExpressReplay => "express-replay",
        }
    }
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        seconds: 5,
        rounds: 3,
        connections: 32,
        threads: 2,
        delay_ms: 0,
        proxy: None,
        against: None,
        store: None,
        log: None,
        span_level: None,
        peers: false,
        serve: false,
        drive: None,
        requests: 1000,
        workload: Workload::Fresh,
    };
    // `--drive` runs one connection unless `--connections` says otherwise.
    let mut connections_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |what: &str| -> Result<u64, String> {
            let v = it.next().ok_or(format!("{what} needs a value; {USAGE}"))?;
            v.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{what} {v}: use a positive whole number"))
        };
        match arg.as_str() {
            "--seconds" => args.seconds = number("--seconds")?,
            "--rounds" => args.rounds = u32::try_from(number("--rounds")?).unwrap_or(u32::MAX),
            "--connections" => {
                args.connections = number("--connections")? as usize;
                connections_given = true;
            }
            "--threads" => args.threads = number("--threads")? as usize,
            "--delay-ms" => args.delay_ms = number("--delay-ms")?,
            "--proxy" => {
                args.proxy = Some(it.next().ok_or(format!("--proxy needs a path; {USAGE}"))?)
            }
            "--against" => {
                let path = it
                    .next()
                    .ok_or(format!("--against needs a path; {USAGE}"))?;
                args.against = Some(path.into());
            }
            "--serve" => args.serve = true,
            "--peers" => args.peers = true,
            "--store" => {
                args.store = Some(it.next().ok_or(format!("--store needs a URL; {USAGE}"))?)
            }
            "--log" => args.log = Some(it.next().ok_or(format!("--log needs a filter; {USAGE}"))?),
            "--span-level" => {
                let level = it.next().unwrap_or_default();
                args.span_level = Some(level.parse().map_err(|_| {
                    format!("--span-level {level:?}: use error, warn, info, debug or trace")
                })?);
            }
            "--drive" => {
                let addr = it
                    .next()
                    .ok_or(format!("--drive needs an address; {USAGE}"))?;
                args.drive = Some(
                    addr.parse()
                        .map_err(|e| format!("--drive {addr}: {e}; use HOST:PORT"))?,
                );
            }
            "--requests" => args.requests = number("--requests")?,
            "--workload" => {
                let name = it.next().unwrap_or_default();
                args.workload = Workload::ALL.into_iter().find(|w| w.name() == name).ok_or(
                    format!(
                        "--workload {name}: use bare, fresh, replay, floor-fresh, floor-replay, \
                         axum-idempotent-fresh or axum-idempotent-replay"
                    ),
                )?;
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    if args.drive.is_some() && !connections_given {
        args.connections = 1;
    }
    Ok(Some(args))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.serve {
        return serve(args);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build();
    match runtime
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(drive(args.clone())))
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The most records the server's memory store keeps: twice the default, so that the
/// documented runs do not fill it (the default million lasts about 8 seconds of fresh
/// keys on a quick host; a run of `--seconds 2 --rounds 6` sends up to 12 seconds of
/// them, and the floor's map is not bounded at all). Not more: the store makes a shard
/// per 2,048 records of its bound, and at 16 million (8,192 shards, 1 MiB of shard
/// locks) its fresh keys cost 4 to 5% more CPU than the default's 512 shards, where at
/// this bound (1,024) they cost the same (`load --against` a build with the default
/// store).
const MEMORY_MAX_RECORDS: u64 = 2 * MemoryStore::DEFAULT_MAX_RECORDS;

/// The server process: the bare app, the floor, the app behind axum-idempotent and the
/// verified app on free ports, printed as `BARE ADDR`, `FLOOR ADDR`,
/// `AXUM-IDEMPOTENT ADDR` and `VERIFIED ADDR` on stdout (the verifier's line last, so
/// that `--against` a build from before the floor or the peer still reads).
fn serve(args: Args) -> ExitCode {
    let store = args.store;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let result = runtime.map_err(|e| e.to_string()).and_then(|rt| {
        rt.block_on(async {
            // The same recorder in every build, so that only idemkey's metrics differ.
            let _metrics = metrics::install()?;
            if let Some(filter) = &args.log {
                log::install(filter)?;
            }
            let app = ChargeApp::new();
            let engine = match &store {
                // The memory store itself, not behind `Arc<dyn Store>`, as an app would
                // hold it, bounded above what a run's fresh keys fill; the byte budget
                // (1 KiB a record, well above the charges' records) leaves the bound to
                // the number of records.
                None => Engine::new(
                    MemoryStore::builder()
                        .max_records(MEMORY_MAX_RECORDS)
                        .max_bytes(MEMORY_MAX_RECORDS * 1024)
                        .build()
                        .map_err(|e| e.to_string())?,
                ),
                Some(url) => Engine::new(
                    idemkey::store::open(url)
                        .await
                        .map_err(|e| format!("--store {url}: {e}"))?,
                ),
            };
            let layer = IdempotencyLayer::new(engine);
            let layer = match args.span_level {
                Some(level) => layer.span_level(level),
                None => layer,
            };
            let verified = app.router(layer);
            let bare = app.bare_router();
            // Over a SQL store, the floor runs the store's statements (`sql_floor.rs`).
            let floor = sql_floor::router(&app, store.as_deref()).await?;
            let peer = peers::axum_idempotent(&app);
            let listen = async || {
                TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(|e| e.to_string())
            };
            let (bare_listener, floor_listener) = (listen().await?, listen().await?);
            let (verified_listener, peer_listener) = (listen().await?, listen().await?);
            let addr = |l: &TcpListener| l.local_addr().map_err(|e| e.to_string());
            // The driver reads these lines to know where to connect.
            println!("BARE {}", addr(&bare_listener)?);
            println!("FLOOR {}", addr(&floor_listener)?);
            println!("AXUM-IDEMPOTENT {}", addr(&peer_listener)?);
            println!("VERIFIED {}", addr(&verified_listener)?);
            let bare = tokio::spawn(async move { axum::serve(bare_listener, bare).await });
            let floor = tokio::spawn(async move { axum::serve(floor_listener, floor).await });
            let peer = tokio::spawn(async move { axum::serve(peer_listener, peer).await });
            axum::serve(verified_listener, verified)
                .await
                .map_err(|e| e.to_string())?;
            bare.abort();
            floor.abort();
            peer.abort();
            Ok::<(), String>(())
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load --serve: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where a server process of `exe --serve` listens.
struct Addrs {
    bare: SocketAddr,
    /// `None` from a build that has no floor verifier (an older one, with `--against`).
    floor: Option<SocketAddr>,
    /// `None` from a build that serves no axum-idempotent app.
    axum_idempotent: Option<SocketAddr>,
    verified: SocketAddr,
}

/// A server process of `exe --serve` (over the store at `store`, the memory store
/// without; `extra` after), its standard error to `stderr`, and its addresses.
async fn start_server(
    exe: &std::path::Path,
    store: Option<&str>,
    extra: &[String],
    stderr: Stdio,
) -> Result<(tokio::process::Child, Addrs), String> {
    let mut server = tokio::process::Command::new(exe)
        .arg("--serve")
        .args(store.map(|url| ["--store", url]).into_iter().flatten())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start the server process {}: {e}", exe.display()))?;
    let stdout = server
        .stdout
        .take()
        .ok_or("the server process has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut next = async || -> Result<String, String> {
        lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the server process exited before it was listening".to_owned())
    };
    let addr_of = |label: &str, line: &str| -> Result<SocketAddr, String> {
        line.strip_prefix(label)
            .and_then(|a| a.trim().parse().ok())
            .ok_or(format!("unexpected line from the server process: {line}"))
    };
    let bare = addr_of("BARE", &next().await?)?;
    let (mut floor, mut axum_idempotent) = (None, None);
    let mut line = next().await?;
    // The optional lines, in any order, until the verifier's.
    loop {
        match line.split_once(' ').map_or("", |(label, _)| label) {
            "FLOOR" => floor = Some(addr_of("FLOOR", &line)?),
            "AXUM-IDEMPOTENT" => axum_idempotent = Some(addr_of("AXUM-IDEMPOTENT", &line)?),
            _ => break,
        }
        line = next().await?;
    }
    let verified = addr_of("VERIFIED", &line)?;
    Ok((
        server,
        Addrs {
            bare,
            floor,
            axum_idempotent,
            verified,
        },
    ))
}

async fn drive(args: Args) -> Result<(), String> {
    let body = Bytes::from(if args.delay_ms == 0 {
        r#"{"amount":100}"#.to_owned()
    } else {
        format!(r#"{{"amount":100,"delay_ms":{}}}"#, args.delay_ms)
    });
    if let Some(addr) = args.drive {
        let (stop, done) = (AtomicBool::new(false), AtomicU64::new(0));
        let started = Instant::now();
        // Keys of their own for each driver process (the process id as the round), so
        // that a second drive against the same server sends fresh keys again.
        let round = std::process::id();
        let (stop, done) = (&stop, &done);
        futures_util::future::try_join_all((0..args.connections).map(|conn| {
            connection(
                args.workload,
                addr,
                conn,
                round,
                stop,
                done,
                body.clone(),
                args.requests,
            )
        }))
        .await?;
        println!(
            "{} {} request(s) in {:.2} s",
            done.load(Ordering::Relaxed),
            args.workload.name(),
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    if let Some(filter) = &args.log {
        return log::compare(&args, filter, &body).await;
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let level = log::span_level_args(args.span_level);
    let (mut server, addrs) =
        start_server(&exe, args.store.as_deref(), &level, Stdio::inherit()).await?;
    if let Some(other) = &args.against {
        let (mut other_server, other) =
            start_server(other, args.store.as_deref(), &[], Stdio::inherit()).await?;
        let builds = [
            (addrs.verified, server.id()),
            (other.verified, other_server.id()),
        ];
        let result = compare(&args, builds, &body).await;
        server.kill().await.map_err(|e| e.to_string())?;
        other_server.kill().await.map_err(|e| e.to_string())?;
        return result;
    }
    let mut proxy = None;
    if let Some(bin) = &args.proxy {
        let mut child = tokio::process::Command::new(bin)
            .args(["proxy", "--listen", "127.0.0.1:0", "--upstream"])
            .arg(format!("http://{}", addrs.bare))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {bin} proxy: {e}"))?;
        let stdout = child.stdout.take().ok_or("the proxy has no stdout")?;
        let line = BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the proxy exited before it was listening")?;
        let addr: SocketAddr = line
            .strip_prefix("listening on http://")
            .and_then(|a| a.trim().parse().ok())
            .ok_or(format!("unexpected line from the proxy: {line}"))?;
        proxy = Some((child, addr));
    }
    let peers = match args.peers {
        true => {
            let axum_idempotent = addrs
                .axum_idempotent
                .ok_or("the server process serves no axum-idempotent app")?;
            Some((axum_idempotent, peers::Express::start(&exe).await?))
        }
        false => None,
    };
    let seconds = Duration::from_secs(args.seconds);
    println!(
        "{} round(s) of {} s per workload, {} connections, {} client threads, handler delay {} ms",
        args.rounds, args.seconds, args.connections, args.threads, args.delay_ms
    );
    let floor = addrs
        .floor
        .ok_or("the server process serves no floor verifier")?;
    let mut totals = [0u64; Workload::ALL.len()];
    // The server process's CPU time and the requests answered, per workload (not the
    // proxy's: it is a process of its own).
    let mut cpu = [(0u64, 0u64); Workload::ALL.len()];
    let server_pid = server.id();
    for round in 1..=args.rounds {
        for (i, workload) in Workload::ALL.into_iter().enumerate() {
            // Where to send, whose CPU to count, and whose `GET /stats` counts the charges.
            let (addr, pid, app) = match (workload, &proxy, &peers) {
                (Workload::Bare, ..) => (addrs.bare, server_pid, addrs.bare),
                (Workload::Fresh | Workload::Replay, ..) => {
                    (addrs.verified, server_pid, addrs.bare)
                }
                (Workload::FloorFresh | Workload::FloorReplay, ..) => {
                    (floor, server_pid, addrs.bare)
                }
                (Workload::Proxied, Some((_, addr)), _) => (*addr, server_pid, addrs.bare),
                (Workload::AxumIdempotentFresh | Workload::AxumIdempotentReplay, _, Some(p)) => {
                    (p.0, server_pid, addrs.bare)
                }
                (Workload::ExpressFresh | Workload::ExpressReplay, _, Some((_, express))) => {
                    (express.addr(), express.pid(), express.addr())
                }
                (Workload::Proxied, None, _)
                | (
                    Workload::AxumIdempotentFresh
                    | Workload::AxumIdempotentReplay
                    | Workload::ExpressFresh
                    | Workload::ExpressReplay,
                    _,
                    None,
                ) => continue,
            };
            let ran = peers::executions(app).await?;
            let before = pid.and_then(cpu_micros);
            let (done, answered) =
                run(workload, addr, args.connections, seconds, round, &body).await?;
            let used = before.zip(pid.and_then(cpu_micros));
            let ran = peers::executions(app).await?.saturating_sub(ran);
            peers::check_runs(workload, args.connections, answered, ran)?;
            totals[i] += done;
            let per_request = used.map(|(a, b)| {
                cpu[i].0 += b - a;
                cpu[i].1 += answered;
                format!(
                    ", server CPU {:.2} us/req",
                    (b - a) as f64 / answered.max(1) as f64
                )
            });
            println!(
                "round {round} {:>12}: {:>9.0} req/s{}",
                workload.name(),
                done as f64 / seconds.as_secs_f64(),
                per_request.unwrap_or_default()
            );
        }
    }
    let ratio = |i: usize, of: usize| totals[i] as f64 / totals[of].max(1) as f64;
    println!(
        "fresh/bare {:.2}  replay/bare {:.2}",
        ratio(1, 0),
        ratio(2, 0)
    );
    println!(
        "floor fresh/bare {:.2}  floor replay/bare {:.2}",
        ratio(3, 0),
        ratio(4, 0)
    );
    println!(
        "fresh/floor {:.2}  replay/floor {:.2}",
        ratio(1, 3),
        ratio(2, 4)
    );
    let per_request: Vec<String> = Workload::ALL
        .iter()
        .zip(cpu)
        .filter(|(_, (_, answered))| *answered > 0)
        .map(|(w, (used, answered))| format!("{} {:.2}", w.name(), used as f64 / answered as f64))
        .collect();
    if !per_request.is_empty() {
        println!("server CPU per request (us): {}", per_request.join("  "));
    }
    if let Some((mut child, _)) = proxy {
        println!("proxied/bare {:.2}", ratio(5, 0));
        child.kill().await.map_err(|e| e.to_string())?;
    }
    if let Some((_, express)) = peers {
        peers::print_ratios(&totals, &cpu);
        express.stop().await?;
    }
    server.kill().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// This build's verifier (`this`) against another build's (`other`), each given by its
/// address and its server process's id: `fresh` and `replay` on both each round, the
/// order alternating between rounds; throughput, and each server's CPU per request.
async fn compare(
    args: &Args,
    builds: [(SocketAddr, Option<u32>); 2],
    body: &Bytes,
) -> Result<(), String> {
    let seconds = Duration::from_secs(args.seconds);
    println!(
        "{} round(s) of {} s per workload and build, {} connections, {} client threads",
        args.rounds, args.seconds, args.connections, args.threads
    );
    // [workload][build]: requests answered within the window, totals over the rounds;
    // and the server's CPU time (us) with the requests it answered in all.
    let mut totals = [[0u64; 2]; 2];
    let mut cpu = [[(0u64, 0u64); 2]; 2];
    for round in 1..=args.rounds {
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for (w, workload) in [Workload::Fresh, Workload::Replay].into_iter().enumerate() {
            for build in order {
                let (addr, pid) = builds[build];
                let before = pid.and_then(cpu_micros);
                let (done, answered) =
                    run(workload, addr, args.connections, seconds, round, body).await?;
                if let Some((a, b)) = before.zip(pid.and_then(cpu_micros)) {
                    cpu[w][build].0 += b - a;
                    cpu[w][build].1 += answered;
                }
                totals[w][build] += done;
                println!(
                    "round {round} {:>6} {:>5}: {:>9.0} req/s",
                    workload.name(),
                    ["this", "other"][build],
                    done as f64 / seconds.as_secs_f64()
                );
            }
        }
    }
    let ratio = |w: usize| totals[w][0] as f64 / totals[w][1].max(1) as f64;
    println!(
        "fresh this/other {:.3}  replay this/other {:.3}",
        ratio(0),
        ratio(1)
    );
    let per_request = |(us, n): (u64, u64)| us as f64 / n.max(1) as f64;
    let [fresh, replay] = cpu.map(|w| w.map(per_request));
    println!(
        "server CPU per request (us): fresh this {:.2} other {:.2} ({:.3})  \
         replay this {:.2} other {:.2} ({:.3})",
        fresh[0],
        fresh[1],
        fresh[0] / fresh[1],
        replay[0],
        replay[1],
        replay[0] / replay[1]
    );
    Ok(())
}

/// Runs one workload for `length` over `connections` connections; returns the number of
/// requests answered 200 within `length` (those answered after it prorated away), and
/// the number answered in all.
async fn run(
    workload: Workload,
    addr: SocketAddr,
    connections: usize,
    length: Duration,
    round: u32,
    body: &Bytes,
) -> Result<(u64, u64), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(connections);
    for conn in 0..connections {
        let (stop, done, body) = (stop.clone(), done.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            connection(workload, addr, conn, round, &stop, &done, body, u64::MAX).await
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    let elapsed = started.elapsed();
    // Requests answered after the window closed are not counted against a longer time.
    let n = done.load(Ordering::Relaxed);
    Ok((
        (n as f64 * length.as_secs_f64() / elapsed.as_secs_f64()) as u64,
        n,
    ))
}

/// The CPU time the process `pid` has used so far (user and system, all its threads), in
/// microseconds; `None` where `/proc` does not tell (not Linux).
///
/// `/proc/PID/stat` counts in clock ticks of `USER_HZ`, which Linux fixes at 100 per
/// second for user space on every architecture it runs on.
fn cpu_micros(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces:
    // the state is the first of them, utime the 12th and stime the 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) * 10_000)
}

/// Sends requests over one connection until `stop` or `limit` requests.
#[expect(
    clippy::too_many_arguments,
    reason = "a program's own helper, called from two places"
)]
async fn connection(
    workload: Workload,
    addr: SocketAddr,
    conn: usize,
    round: u32,
    stop: &AtomicBool,
    done: &AtomicU64,
    body: Bytes,
    limit: u64,
) -> Result<(), String> {
    // Keys of this driver process's own (its id in them): a second run against the same
    // server, or against a store that outlives the server, sends fresh keys again.
    let run = std::process::id();
    let mut charges = ChargeConnection::open(addr).await?;
    if matches!(
        workload,
        Workload::AxumIdempotentFresh | Workload::AxumIdempotentReplay
    ) {
        charges.open_session(peers::SESSION_PATH).await?;
    }
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) && n < limit {
        let key = match workload.replays() {
            false => format!("{run:x}.{round}-c{conn}-{n}"),
            true => format!("{run:x}.{round}-c{conn}"),
        };
        let status = charges.post(&key, &body).await?;
        if status != http::StatusCode::OK {
            return Err(format!("{} answered {status}", workload.name()));
        }
        done.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
    Ok(())
}
