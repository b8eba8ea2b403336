//! Where a server's CPU goes, by kind of work: reads `perf script` output (samples with
//! call stacks, `perf record --call-graph dwarf`) on standard input and prints the share
//! of samples in each category, and with `--us-per-request X` (the server's CPU per
//! request from `load`, measured without perf) the microseconds each share stands for.
//!
//! ```sh
//! target/release/load --serve --store postgres://root@127.0.0.1:5432/test &  # prints ADDRs
//! perf record -F 999 --call-graph dwarf,16384 -p "$(pgrep -f 'load --serve')" -o cpu.data &
//! target/release/load --drive ADDR --connections 16 --requests 1000 --workload fresh
//! kill -INT %2; perf script -i cpu.data | cargo run --release -p perf --bin cpu_shares
//! ```
//!
//! A sample is put in the first category that matches, in this order: a system call on a
//! socket or a file (its own kernel work included, so that a loopback send's wake of its
//! peer counts as the send's), split by whether a database driver is on the stack
//! (sqlx, tokio-postgres) or not (HTTP); `fsync`; waiting in `epoll_wait`; a `futex`
//! (one thread waking or waiting for another); other kernel work (switches,
//! interrupts); the allocator; then the first frame, leaf first, that names a part of
//! the program: the driver, the verifier (idemkey or the floor), the app (the charge
//! handler of `examples/common/charge_app.rs` and its JSON), HTTP (hyper, axum, tower),
//! the runtime (tokio), telemetry (tracing, metrics).
#![allow(
    clippy::print_stdout,
    reason = "a command-line program prints its results"
)]

use std::collections::HashMap;
use std::io::BufRead;
use std::process::ExitCode;

const USAGE: &str = "usage: perf script -i FILE | cpu_shares [--us-per-request X]";

fn main() -> ExitCode {
    let mut per_request = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--us-per-request" => match args.next().and_then(|v| v.parse::<f64>().ok()) {
                Some(us) if us.is_finite() && us > 0.0 => per_request = Some(us),
                _ => {
                    eprintln!("--us-per-request needs a positive number; {USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let mut shares: HashMap<&'static str, u64> = HashMap::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut total = 0u64;
    let mut count = |stack: &mut Vec<Frame>| {
        if !stack.is_empty() {
            *shares.entry(category(stack)).or_default() += 1;
            total += 1;
            stack.clear();
        }
    };
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else {
            eprintln!("cpu_shares: standard input is not text; {USAGE}");
            return ExitCode::FAILURE;
        };
        // A sample's header starts at the line's start; its frames are indented.
        match line.starts_with([' ', '\t']) {
            true => stack.extend(Frame::parse(&line)),
            false => count(&mut stack),
        }
    }
    count(&mut stack);
    if total == 0 {
        eprintln!("cpu_shares: no samples with call stacks read; {USAGE}");
        return ExitCode::FAILURE;
    }
    let mut rows: Vec<_> = shares.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (name, n) in rows {
        let share = n as f64 / total as f64;
        match per_request {
            Some(us) => println!("{:6.2}% {:7.2} us  {name}", 100.0 * share, share * us),
            None => println!("{:6.2}%  {name}", 100.0 * share),
        }
    }
    println!("{total} samples");
    ExitCode::SUCCESS
}

/// One frame of a sample's stack: its symbol (offset dropped) and whether it is the
/// kernel's.
struct Frame {
    symbol: String,
    kernel: bool,
}

impl Frame {
    /// A frame line of `perf script`: `\t ADDR SYMBOL+OFFSET (DSO)`.
    fn parse(line: &str) -> Option<Frame> {
        let line = line.trim();
        let (_addr, rest) = line.split_once(' ')?;
        let (symbol, dso) = rest.rsplit_once(" (")?;
        let symbol = symbol.rsplit_once("+0x").map_or(symbol, |(s, _)| s);
        Some(Frame {
            symbol: symbol.to_owned(),
            kernel: dso.starts_with("[kernel"),
        })
    }
}

const SOCKET_SEND: &[&str] = &["__send", "__libc_send", "sendto", "__GI___writev", "writev"];
const SOCKET_RECEIVE: &[&str] = &["__libc_recv", "recv", "recvfrom", "__GI___readv", "readv"];
const FILE_IO: &[&str] = &["__libc_pwrite64", "__libc_pread64", "pwrite64", "pread64"];
const FSYNC: &[&str] = &[
    "fdatasync",
    "__libc_fdatasync",
    "fsync",
    "__libc_fsync",
    "__GI_fsync",
];
const ALLOCATOR: &[&str] = &[
    "malloc",
    "_int_malloc",
    "__GI___libc_malloc",
    "__libc_malloc",
    "free",
    "cfree",
    "_int_free",
    "__GI___libc_free",
    "__libc_free",
    "malloc_consolidate",
    "unlink_chunk",
    "tcache_get",
    "tcache_put",
    "realloc",
    "_int_realloc",
];

/// What a database driver's symbols name: a socket call under one is the database's.
const DRIVER: &[&str] = &[
    "sqlx",
    "tokio_postgres",
    "postgres_protocol",
    "postgres_types",
    "sqlite3",
    "rusqlite",
    "flume",
];

/// Parts of the program by the crates or C libraries their symbols name, in the order
/// they are tried on each frame.
const PARTS: &[(&str, &[&str])] = &[
    ("driver (sqlx, tokio-postgres, rusqlite, SQLite)", DRIVER),
    (
        "verifier (idemkey or the floor)",
        &["idemkey", "floor", "sha2"],
    ),
    ("the app (charge handler, JSON)", &["charge_app", "serde"]),
    (
        "HTTP (hyper, axum, tower)",
        &["hyper", "axum", "http", "tower", "matchit", "mime"],
    ),
    ("runtime (tokio)", &["tokio", "mio", "futures"]),
    ("telemetry (tracing, metrics)", &["tracing", "metrics"]),
];

fn category(stack: &[Frame]) -> &'static str {
    let is = |names: &[&str]| stack.iter().any(|f| names.contains(&f.symbol.as_str()));
    let driver = || {
        stack
            .iter()
            .any(|f| DRIVER.iter().any(|p| f.symbol.contains(p)))
    };
    if is(FSYNC) {
        return "fsync";
    }
    if is(FILE_IO) {
        return "file read/write";
    }
    if is(SOCKET_SEND) {
        return if driver() {
            "database send"
        } else {
            "HTTP send"
        };
    }
    if is(SOCKET_RECEIVE) {
        return if driver() {
            "database receive"
        } else {
            "HTTP receive"
        };
    }
    if is(&["epoll_wait"]) {
        return "epoll_wait";
    }
    if stack.iter().any(|f| f.symbol.contains("futex")) || is(&["syscall"]) {
        return "futex (threads waking threads)";
    }
    let leaf = &stack[0];
    if leaf.kernel {
        return "kernel, other (switches, interrupts)";
    }
    if ALLOCATOR.contains(&leaf.symbol.as_str()) {
        return "allocator";
    }
    if leaf.symbol.contains("clock_gettime") {
        return "clock";
    }
    // Generic frames of the standard library name the types they were instantiated with,
    // not the part of the program that runs them: the next frame out does.
    let generic = |f: &&Frame| {
        [
            "core::", "<core::", "alloc::", "<alloc::", "std::", "<std::", "__mem", "[",
        ]
        .iter()
        .any(|p| f.symbol.starts_with(p))
    };
    for frame in stack.iter().filter(|f| !f.kernel).filter(|f| !generic(f)) {
        if let Some((name, _)) = PARTS
            .iter()
            .find(|(_, marks)| marks.iter().any(|m| frame.symbol.contains(m)))
        {
            return name;
        }
    }
    "other"
}
