//! Claim latency in the memory store while its sweep removes millions of expired
//! records, against the same claims with no sweep running, and the sweep's rate.
//!
//! ```sh
//! cargo run --release -p perf --bin memory_sweep -- [--records 10000000] [--live 10] [--rate 10000]
//! ```
//!
//! Fills one `MemoryStore` (on a runtime of 2 workers) with N completed records, each
//! with a 32-byte fingerprint and a 120-byte response, `--live` percent kept for an
//! hour and the rest expiring together at one deadline after the fill. Then requests
//! arrive at `--rate` a second, each a fresh key: a driver thread spawns one task per
//! request, as a server's accept loop would, and a request's latency runs from its
//! spawn to the end of its claim, so time spent waiting for a worker counts. Two
//! windows:
//!
//! - **quiet**: N records, nothing expired, no sweep running (the store sweeps by
//!   itself at most every 5 s while claims arrive; the window starts after the no-op
//!   sweep the first claim starts has had twice the time a whole sweep of the store took,
//!   and ends before the next one is due);
//! - **sweeping**: from the first claim after the deadline, which starts the store's
//!   own sweep, until the expired records' bytes are off the store's count.
//!
//! It prints the fill rate (a claim and a completion per record: the hot path), p50,
//! p99, p99.9 and the maximum of both latencies in both windows, the sweep's records
//! per second, and the process's resident set. Last, with no request arriving, it
//! expires another quarter as many records and times explicit passes of one batch
//! (`sweep_pass` with a budget of zero, batches of `--batch` records, the store's own
//! sweeps' 256 by default): the longest a task waits behind the sweep on its worker. About 4.5 GB at 10 million records.
//! Linux only (reads `/proc/self/statm`). `--fill-only` stops after the fill, to compare
//! the hot path of two builds in alternating runs.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemkey::store::{
    ClaimRequest, FencingToken, MemoryStore, RecordId, Store, SweepOptions, SweepOutcome,
};

const USAGE: &str = "usage: memory_sweep [--records N] [--live PERCENT] [--rate PER_SECOND] [--batch N] [--fill-only]   (defaults 10000000, 10, 10000, 256)";

/// A completed record's fingerprint and response sizes.
const FINGERPRINT: usize = 32;
const RESPONSE: usize = 120;
/// The time the store waits between two of its own sweeps (`memory.rs`: 5 s).
const AUTO_SWEEP: Duration = Duration::from_secs(5);
const HOUR: Duration = Duration::from_secs(3600);

struct Args {
    records: u64,
    live_percent: u64,
    rate: u64,
    /// The batch of the last phase's passes.
    batch: u64,
    /// Stop after the fill (its rate: the hot path, to compare builds).
    fill_only: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        records: 10_000_000,
        live_percent: 10,
        rate: 10_000,
        batch: 256,
        fill_only: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--records" => &mut a.records,
            "--live" => &mut a.live_percent,
            "--rate" => &mut a.rate,
            "--batch" => &mut a.batch,
            "--fill-only" => {
                a.fill_only = true;
                continue;
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        };
        let v = args.next().ok_or(format!("{arg} needs a value; {USAGE}"))?;
        *slot = v
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or(format!("{arg} {v}: use a positive integer"))?;
    }
    if a.live_percent >= 100 {
        return Err(format!(
            "--live {}: use a percentage below 100 (some records must expire)",
            a.live_percent
        ));
    }
    Ok(a)
}

/// A record id from a kind byte and a number: distinct, and no SHA-256 per record.
fn id(kind: u8, n: u64) -> RecordId {
    let mut b = [0_u8; 32];
    b[0] = kind;
    b[1..9].copy_from_slice(&n.to_le_bytes());
    RecordId::from_bytes(b)
}

/// Claims and completes records `range` of `kind`, each kept until `until` (or an hour).
async fn fill(
    store: MemoryStore,
    kind: u8,
    range: std::ops::Range<u64>,
    until: Option<Instant>,
) -> Result<(), String> {
    let fingerprint = [7_u8; FINGERPRINT];
    let response = [b'x'; RESPONSE];
    for n in range {
        let keep = match until {
            None => HOUR,
            Some(t) => t
                .checked_duration_since(Instant::now())
                // A second to spare: the completion must come before the lease ends.
                .filter(|d| *d > Duration::from_secs(1))
                .ok_or("the fill overran its deadline: the machine is slower than projected; run again or with fewer --records")?,
        };
        let (id, token) = (id(kind, n), FencingToken::random());
        store
            .claim(ClaimRequest {
                id: &id,
                fingerprint: &fingerprint,
                token,
                lease: keep,
                retention: keep,
            })
            .await
            .map_err(|e| format!("filling record {n}: {e}"))?;
        store
            .complete(&id, token, Bytes::copy_from_slice(&response), keep)
            .await
            .map_err(|e| format!("completing record {n}: {e}"))?;
        if n % 1024 == 0 {
            // As a server's tasks do: the store's own sweep task gets its turns.
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// Fills `range` from two tasks (one per worker); returns the time it took.
async fn fill_both(
    store: &MemoryStore,
    kind: u8,
    range: std::ops::Range<u64>,
    until: Option<Instant>,
) -> Result<Duration, String> {
    let started = Instant::now();
    let mid = range.start + (range.end - range.start) / 2;
    let a = tokio::spawn(fill(store.clone(), kind, range.start..mid, until));
    let b = tokio::spawn(fill(store.clone(), kind, mid..range.end, until));
    for t in [a, b] {
        t.await.map_err(|e| format!("fill task: {e}"))??;
    }
    Ok(started.elapsed())
}

/// One request's times: when it was spawned (since the run's start), its latency from
/// the spawn, and the time of its claim alone, in nanoseconds.
#[derive(Clone, Copy)]
struct Sample {
    at: u64,
    latency: u64,
    claim: u64,
}

struct Driver {
    store: MemoryStore,
    base: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    started: Arc<AtomicU64>,
    /// Requests spawned (the next key).
    next_key: Arc<AtomicU64>,
}

impl Driver {
    /// Spawns `rate` requests a second on `rt` from a thread of its own until `stop`.
    fn drive(&self, rt: &tokio::runtime::Handle, rate: u64, stop: &AtomicBool) {
        let began = Instant::now();
        let mut sent = 0_u64;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_micros(500));
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let due = (began.elapsed().as_secs_f64() * rate as f64) as u64;
            for _ in sent..due {
                let spawned = Instant::now();
                let store = self.store.clone();
                let samples = Arc::clone(&self.samples);
                let started = Arc::clone(&self.started);
                let key = self.next_key.fetch_add(1, Ordering::Relaxed);
                let base = self.base;
                rt.spawn(async move {
                    started.fetch_add(1, Ordering::Relaxed);
                    let id = id(2, key);
                    let t0 = Instant::now();
                    let claim = store
                        .claim(ClaimRequest {
                            id: &id,
                            fingerprint: &[7; FINGERPRINT],
                            token: FencingToken::random(),
                            lease: HOUR,
                            retention: HOUR,
                        })
                        .await;
                    let done = Instant::now();
                    if let Err(e) = claim {
                        eprintln!("claim failed: {e}");
                    }
                    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                    let s = Sample {
                        at: ns(spawned - base),
                        latency: ns(done - spawned),
                        claim: ns(done - t0),
                    };
                    samples.lock().expect("samples").push(s);
                });
            }
            sent = sent.max(due);
        }
    }
}

/// `p50 / p99 / p99.9 / max` of `v`, in microseconds.
fn quantiles(mut v: Vec<u64>) -> String {
    if v.is_empty() {
        return "no samples".to_owned();
    }
    v.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    format!(
        "p50 {:.2} / p99 {:.2} / p99.9 {:.2} / max {:.2} µs",
        q(0.5),
        q(0.99),
        q(0.999),
        q(1.0)
    )
}

fn report(name: &str, samples: &[Sample], from: Duration, to: Duration) {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let inside: Vec<Sample> = samples
        .iter()
        .filter(|s| s.at >= ns(from) && s.at < ns(to))
        .copied()
        .collect();
    eprintln!(
        "{name}: {} requests over {:.2} s\n  latency from spawn: {}\n  claim alone:        {}",
        inside.len(),
        to.saturating_sub(from).as_secs_f64(),
        quantiles(inside.iter().map(|s| s.latency).collect()),
        quantiles(inside.iter().map(|s| s.claim).collect()),
    );
}

/// Resident set size of this process in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Runs the driver on its own thread while `during` runs here, then waits for every
/// request it spawned to end; returns what `during` returns.
fn with_requests<T>(
    driver: &Driver,
    rt: &tokio::runtime::Runtime,
    rate: u64,
    during: impl FnOnce() -> T,
) -> T {
    let stop = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| driver.drive(rt.handle(), rate, &stop));
        let out = during();
        stop.store(true, Ordering::Relaxed);
        out
    });
    let spawned = driver.next_key.load(Ordering::Relaxed);
    while (driver.samples.lock().expect("samples").len() as u64) < spawned {
        std::thread::sleep(Duration::from_millis(10));
    }
    out
}

#[allow(clippy::cast_precision_loss)]
fn measure(args: &Args, rt: &tokio::runtime::Runtime) -> Result<(), String> {
    let live = args.records * args.live_percent / 100;
    let expiring = args.records - live;
    let store = MemoryStore::builder()
        .max_records(args.records + 2_000_000)
        .max_bytes(1 << 40)
        .build()
        .map_err(|e| e.to_string())?;
    let rss_before = rss();

    // Live records first: their rate projects the deadline of the rest.
    let took = rt.block_on(fill_both(&store, 0, 0..live.max(1), None))?;
    let per_record = took.as_secs_f64() / live.max(1) as f64;
    // Twice the projected fill, then room for the quiet window (a pause of 5 s, a window
    // of 5 s, a whole no-op sweep).
    let deadline = Instant::now()
        + Duration::from_secs_f64(per_record * expiring as f64 * 2.0)
        + Duration::from_secs(20);
    let took_expiring = rt.block_on(fill_both(&store, 1, 0..expiring, Some(deadline)))?;
    let fill_end = Instant::now();
    eprintln!(
        "filled {} records ({live} live, {expiring} expiring) at {:.0} ns a record (claim + complete, 2 tasks); resident set grew {:.0} MiB ({} B a record)",
        store.len(),
        (took + took_expiring).as_secs_f64() * 1e9 / args.records as f64,
        rss().saturating_sub(rss_before) as f64 / f64::from(1 << 20),
        rss().saturating_sub(rss_before) / args.records
    );
    if args.fill_only {
        return Ok(());
    }

    // A whole sweep with nothing to remove: how long the quiet window waits for the
    // store's own no-op sweep to end.
    std::thread::sleep(Duration::from_secs(1));
    let scan_started = Instant::now();
    let removed = rt
        .block_on(store.sweep())
        .map_err(|e| format!("sweep: {e}"))?;
    let scan = scan_started.elapsed();
    eprintln!(
        "a sweep with nothing expired ({removed} removed) took {:.1} ms",
        scan.as_secs_f64() * 1e3
    );

    let driver = Driver {
        store: store.clone(),
        base: Instant::now(),
        samples: Arc::new(Mutex::new(Vec::new())),
        started: Arc::new(AtomicU64::new(0)),
        next_key: Arc::new(AtomicU64::new(0)),
    };
    // Quiet: the first claim after a pause of 5 s starts the store's no-op sweep.
    std::thread::sleep(
        (fill_end + AUTO_SWEEP + Duration::from_millis(100))
            .saturating_duration_since(Instant::now()),
    );
    let t1 = driver.base.elapsed();
    let window_end = t1 + AUTO_SWEEP - Duration::from_millis(200);
    with_requests(&driver, rt, args.rate, || {
        std::thread::sleep(window_end.saturating_sub(driver.base.elapsed()));
    });
    if Instant::now() >= deadline {
        return Err("the quiet window ran past the records' deadline; run again".to_owned());
    }

    // Sweeping: the first claim after the deadline starts the store's sweep; it has
    // ended when the expired records' bytes are off the count.
    std::thread::sleep(
        deadline
            .max(driver.base + t1 + AUTO_SWEEP)
            .saturating_duration_since(Instant::now())
            + Duration::from_millis(100),
    );
    let expired_bytes = expiring * (MemoryStore::RECORD_OVERHEAD + (FINGERPRINT + RESPONSE) as u64);
    let claim_bytes = MemoryStore::RECORD_OVERHEAD + FINGERPRINT as u64;
    let kept_bytes = store.stored_bytes() - expired_bytes;
    let started_before = driver.started.load(Ordering::Relaxed);
    let t2 = driver.base.elapsed();
    let t3 = with_requests(&driver, rt, args.rate, || {
        loop {
            std::thread::sleep(Duration::from_millis(1));
            let claimed = driver.started.load(Ordering::Relaxed) - started_before;
            if store.stored_bytes() <= kept_bytes + claimed * claim_bytes {
                let t3 = driver.base.elapsed();
                std::thread::sleep(Duration::from_millis(300));
                return t3;
            }
            if driver.base.elapsed() > t2 + Duration::from_secs(600) {
                return t2 + Duration::from_secs(600);
            }
        }
    });
    let samples = driver.samples.lock().expect("samples").clone();
    report(
        "quiet (N records, no sweep)",
        &samples,
        t1 + 2 * scan + Duration::from_millis(300),
        window_end,
    );
    report("sweeping", &samples, t2, t3);
    let sweep = t3 - t2;
    eprintln!(
        "sweep: {expiring} expired records removed in {:.2} s: {:.0} records/s; {} records left; peak resident set {:.0} MiB",
        sweep.as_secs_f64(),
        expiring as f64 / sweep.as_secs_f64(),
        store.len(),
        rss() as f64 / f64::from(1 << 20)
    );
    let batch = u32::try_from(args.batch).unwrap_or(u32::MAX);
    steps(&store, rt, per_record, expiring / 4, batch)
}

/// Explicit passes of one batch each (`Store::sweep_pass` with a budget of zero: one
/// step, the longest any task waits behind the sweep on its worker) over `n` freshly
/// expired records, with no request arriving (so the store starts no sweep itself).
#[allow(clippy::cast_precision_loss)]
fn steps(
    store: &MemoryStore,
    rt: &tokio::runtime::Runtime,
    per_record: f64,
    n: u64,
    batch: u32,
) -> Result<(), String> {
    let deadline = Instant::now()
        + Duration::from_secs_f64(per_record * n as f64 * 4.0)
        + Duration::from_secs(10);
    rt.block_on(fill_both(store, 3, 0..n, Some(deadline)))?;
    std::thread::sleep(
        deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(10),
    );
    let one = SweepOptions::new()
        .batch(batch)
        .max_duration(Duration::ZERO);
    let started = Instant::now();
    let mut times = Vec::new();
    let mut removed = 0;
    rt.block_on(async {
        loop {
            let t = Instant::now();
            let report = store.sweep_pass(&one).await.map_err(|e| e.to_string())?;
            times.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
            removed += report.removed();
            // A pass of one step over a large store never looks at every shard: it
            // ends `BudgetSpent` whatever is left, so count instead.
            if report.outcome() == SweepOutcome::Complete || removed >= n {
                return Ok::<_, String>(());
            }
        }
    })?;
    let took = started.elapsed();
    eprintln!(
        "passes of one batch ({} records): {} passes removed {removed} in {:.2} s ({:.0} records/s); a pass: {}",
        one.batch_size(),
        times.len(),
        took.as_secs_f64(),
        removed as f64 / took.as_secs_f64(),
        quantiles(times)
    );
    Ok(())
}

fn main() -> ExitCode {
    let Ok(args) = parse_args().inspect_err(|e| eprintln!("{e}")) else {
        return ExitCode::from(2);
    };
    let run = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))
        .and_then(|rt| measure(&args, &rt));
    if let Err(e) = run {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
