//! Bytes of memory per completed record in the memory store, measured by the growth of
//! the process's resident set while the verifier completes many small charges.
//!
//! ```sh
//! cargo run --release -p perf --bin memory_per_record -- [--records 400000]
//! ```
//!
//! Each request is a fresh key posted in-process (no network) to a small charge handler
//! behind the verifier, so every record holds what a real one does: the fingerprint
//! and the stored response (status, headers, `{"id":"ch_…","object":"charge",…}`).
//! Responses are dropped at once; only the store keeps memory. Linux only (reads
//! `/proc/self/statm`).
//!
//! The figure saw-tooths with the count: the store's sharded hash table doubles a
//! shard when it is 7/8 full, so just before a doubling a record costs least and just
//! after it most (BENCHMARKS.md has the figures at several counts).

#[path = "../in_process.rs"]
mod in_process;

use std::process::ExitCode;

use axum::Router;
use axum::routing::post;
use idemkey::server::{Engine, IdempotencyLayer};
use idemkey::store::MemoryStore;
use in_process::rss_growth;

const USAGE: &str = "usage: memory_per_record [--records N]   (default 400000)";

fn parse_args() -> Result<u64, String> {
    let mut records = 400_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--records" => {
                let v = args
                    .next()
                    .ok_or(format!("--records needs a value; {USAGE}"))?;
                records = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(format!("--records {v}: use a positive integer"))?;
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}; {USAGE}")),
        }
    }
    Ok(records)
}

async fn charge(body: String) -> ([(&'static str, &'static str); 1], String) {
    let amount: String = body.chars().filter(char::is_ascii_digit).collect();
    (
        [("content-type", "application/json")],
        format!(r#"{{"id":"ch_{amount}","object":"charge","amount":100}}"#),
    )
}

async fn measure(records: u64) -> Result<(), String> {
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(Engine::new(store.clone()));
    let app = Router::new().route("/v1/charges", post(charge).layer(layer));
    let grown = rss_growth(&app, records).await?;
    let held = store.len() as u64;
    eprintln!(
        "{held} records held; resident set grew by {:.1} MiB: {} bytes per completed record",
        grown as f64 / (1024.0 * 1024.0),
        grown / records
    );
    Ok(())
}

fn main() -> ExitCode {
    let records = match parse_args() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(measure(records)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
