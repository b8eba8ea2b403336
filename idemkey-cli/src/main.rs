//! `idemkey`: idempotency keys from the command line, for APIs in any language.
//!
//! - `idemkey check URL`: black-box conformance of one endpoint (exit status: the
//!   number of failed cases);
//! - `idemkey proxy`: the verifier as a reverse proxy in front of any HTTP API, with
//!   optional fault injection and a client-side audit;
//! - `idemkey inspect`, `release`, `stuck`: look up, force-release and list records in
//!   a store;
//! - `idemkey sweep --store URL`: one sweep pass of a SQL store, from cron;
//! - `idemkey sizing`: the records and storage a store will hold.
//!
//! The `idemkey-cli` crate: `cargo install idemkey-cli` (every store built in; its
//! README is the manual).
#![allow(
    clippy::print_stdout,
    reason = "a command line answers on standard output"
)]

mod check;
mod durations;
mod inspect;
mod proxy;
mod release;
mod sizing;
mod stuck;
mod sweep;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit status of an error that stopped a subcommand before it could answer (a usage
/// error, an unreachable store, a declined confirmation): far above the number of
/// failed cases `check` can report.
const EXIT_ERROR: u8 = 125;

/// Idempotency keys on the command line: check an API, put a verifier in front of one,
/// fix a stuck key.
#[derive(Debug, Parser)]
#[command(name = "idemkey", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Check(check::CheckArgs),
    Proxy(proxy::ProxyArgs),
    Inspect(inspect::InspectArgs),
    Release(release::ReleaseArgs),
    Stuck(stuck::StuckArgs),
    Sweep(sweep::SweepArgs),
    Sizing(sizing::SizingArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_ERROR)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idemkey: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Check(args) => check::run(args).await,
            Command::Proxy(args) => proxy::run(args).await.map(|()| 0),
            Command::Inspect(args) => inspect::run(args).await.map(|()| 0),
            Command::Release(args) => release::run(args).await.map(|()| 0),
            Command::Stuck(args) => stuck::run(args).await.map(|()| 0),
            Command::Sweep(args) => sweep::run(args).await.map(|()| 0),
            Command::Sizing(args) => sizing::run(&args).map(|()| 0),
        }
    });
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("idemkey: {message}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Opens the store at `url` for an admin subcommand, refusing the memory store (it
/// lives in the process that made it, so another process never sees its records).
async fn open_store(url: &str) -> Result<idemkey::server::Engine, String> {
    if url == "memory" || url.starts_with("memory:") {
        return Err(
            "the memory store lives inside the process that serves it; inspect a shared \
             store instead (redis://, postgres://, sqlite://PATH, mysql://, dynamodb://)"
                .into(),
        );
    }
    let store = idemkey::store::open(url)
        .await
        .map_err(|e| format!("cannot open the store {}: {e}", redact(url)))?;
    Ok(idemkey::server::Engine::builder(store).build())
}

/// `url` without a password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Asks `question` on standard error and reads a yes or no from standard input.
fn confirm(question: &str) -> Result<bool, String> {
    use std::io::Write;
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}
