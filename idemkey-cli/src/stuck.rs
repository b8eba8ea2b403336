//! `idemkey stuck STORE_URL [--older-than 5m]`: claims that have been running too long.

use std::time::{Duration, SystemTime};

/// List records in progress claimed longer ago than `--older-than`, oldest first: live
/// claims of slow requests, and abandoned claims whose owner died (`stuck`, their lease
/// over). Release one with `idemkey release STORE_URL --id ID`.
#[derive(Debug, clap::Args)]
pub(crate) struct StuckArgs {
    /// The store: redis://, postgres://, sqlite://PATH, mysql:// or dynamodb://TABLE.
    store: String,
    /// Only claims at least this old (`30s`, `5m`, `2h`).
    #[arg(long, default_value = "5m", value_parser = super::durations::parse)]
    older_than: Duration,
    /// At most this many records are read from the store.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// Print JSON (an array) instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: StuckArgs) -> Result<(), String> {
    let engine = super::open_store(&args.store).await?;
    let records = engine
        .list_in_progress(args.limit)
        .await
        .map_err(|e| format!("the store could not list records in progress: {e}"))?;
    let now = SystemTime::now();
    let old: Vec<_> = records
        .iter()
        .filter(|r| now.duration_since(r.created).unwrap_or_default() >= args.older_than)
        .collect();
    if args.json {
        let list: Vec<_> = old.iter().map(|r| super::inspect::to_json(r)).collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(());
    }
    if old.is_empty() {
        println!(
            "no claim older than {} in progress",
            super::durations::show(args.older_than)
        );
        return Ok(());
    }
    println!("{:<64}  {:<11}  {:>12}  LEASE", "ID", "STATE", "AGE");
    for r in old {
        let age = now.duration_since(r.created).unwrap_or_default();
        let lease = match r.expires.duration_since(now) {
            Ok(left) => format!("ends in {}", super::durations::show(left)),
            Err(e) => format!("ended {} ago", super::durations::show(e.duration())),
        };
        println!(
            "{}  {:<11}  {:>12}  {lease}",
            r.id.to_hex(),
            super::inspect::state(r, now),
            super::durations::show(age),
        );
    }
    Ok(())
}
