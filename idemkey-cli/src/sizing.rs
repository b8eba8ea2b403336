//! `idemkey sizing`: the records and storage a store will hold, from the figures of
//! `idemkey::store::sizing`.

use std::time::Duration;

use idemkey::store::sizing::{Estimate, StoreKind, Workload, estimate};

/// Estimate how many records a store holds and how much storage they take: records ≈
/// new keys per second × (retention + how long expired records stay until removed),
/// each costing the store's measured bytes per record plus its bytes per response byte.
/// Nothing is connected to.
#[derive(Debug, clap::Args)]
pub(crate) struct SizingArgs {
    /// New keys per time unit: `1000/s`, `60000/min`, `5/ms`, `2000000/day`, or a plain
    /// number per second.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    rate: f64,
    /// How long completed records are kept (`24h`, `7days`).
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse)]
    retention: Duration,
    /// The typical stored response body, in bytes.
    #[arg(long, value_name = "BYTES")]
    response_bytes: u64,
    /// The store: memory, sqlite, postgres, mysql, redis, dynamodb, or a connection
    /// string of one (only its scheme is read).
    #[arg(long, value_name = "KIND|URL", value_parser = parse_store)]
    store: StoreKind,
    /// How long expired records stay before they are removed (the sweep period of a SQL
    /// store); by default the store's: 5m for SQL stores, 5s for memory, 0 for Redis,
    /// 2days for DynamoDB.
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse)]
    expired_for: Option<Duration>,
    /// Print one JSON object instead of lines of text.
    #[arg(long)]
    json: bool,
}

/// `1000/s`, `60000/min`, `1000` (per second): keys per second.
fn parse_rate(text: &str) -> Result<f64, String> {
    let bad = |why: &str| {
        format!("{text:?} is not a rate ({why}): write it like 1000/s, 60000/min or 1000")
    };
    let (count, unit) = text.trim().split_once('/').unwrap_or((text.trim(), "s"));
    let count: f64 = count
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| bad("the count is not a number"))?;
    if !count.is_finite() || count < 0.0 {
        return Err(bad("the count must be zero or more"));
    }
    let per = match unit.trim() {
        "ms" => 0.001,
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        "d" | "day" => 86_400.0,
        _ => return Err(bad("the unit is not one of ms, s, min, h, day")),
    };
    Ok(count / per)
}

fn parse_store(text: &str) -> Result<StoreKind, String> {
    text.parse().map_err(|e| format!("{e}"))
}

/// `bytes` for people, in powers of 1024 and 1000.
fn show_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    let units = [
        ("KiB", "KB"),
        ("MiB", "MB"),
        ("GiB", "GB"),
        ("TiB", "TB"),
        ("PiB", "PB"),
    ];
    let mut binary = (b, "B");
    let mut decimal = (b, "B");
    for (i, (bin, dec)) in units.iter().enumerate() {
        let exp = i32::try_from(i + 1).unwrap_or(1);
        if b >= 1024f64.powi(exp) {
            binary = (b / 1024f64.powi(exp), bin);
        }
        if b >= 1000f64.powi(exp) {
            decimal = (b / 1000f64.powi(exp), dec);
        }
    }
    if binary.1 == "B" {
        format!("{bytes} B")
    } else {
        format!(
            "{:.1} {} ({:.1} {})",
            binary.0, binary.1, decimal.0, decimal.1
        )
    }
}

/// `n` with thousands separators.
fn show_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn json(args: &SizingArgs, e: &Estimate) -> serde_json::Value {
    let footprint = e.store.footprint();
    serde_json::json!({
        "store": e.store.name(),
        "rate_per_second": args.rate,
        "retention_seconds": args.retention.as_secs_f64(),
        "response_bytes": args.response_bytes,
        "expired_allowance_seconds": e.expired_allowance.as_secs_f64(),
        "live_records": e.live_records,
        "expired_records": e.expired_records,
        "records": e.records,
        "fixed_bytes_per_record": footprint.bytes_per_record,
        "bytes_per_response_byte": footprint.bytes_per_response_byte,
        "bytes_per_record": e.bytes_per_record,
        "bytes": e.bytes,
    })
}

pub(crate) fn run(args: &SizingArgs) -> Result<(), String> {
    let mut workload = Workload::new(args.rate, args.retention, args.response_bytes);
    workload.expired_allowance = args.expired_for;
    let e = estimate(args.store, &workload).map_err(|e| e.to_string())?;
    if args.json {
        println!("{}", json(args, &e));
        return Ok(());
    }
    let footprint = e.store.footprint();
    println!(
        "records: {} ({} within the retention of {} + {} expired, kept up to {} until removed)",
        show_count(e.records),
        show_count(e.live_records),
        super::durations::show(args.retention),
        show_count(e.expired_records),
        super::durations::show(e.expired_allowance),
    );
    println!(
        "storage: {} ({} bytes per record: {} + {} per response byte; {})",
        show_bytes(e.bytes),
        e.bytes_per_record,
        footprint.bytes_per_record,
        footprint.bytes_per_response_byte,
        footprint.measured_as,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_in_any_unit_are_per_second() {
        assert_eq!(parse_rate("1000/s"), Ok(1000.0));
        assert_eq!(parse_rate("60000/min"), Ok(1000.0));
        assert_eq!(parse_rate("1000"), Ok(1000.0));
        assert_eq!(parse_rate("7200/h"), Ok(2.0));
        for bad in ["", "fast", "10/week", "-1/s", "inf", "NaN/s", "1/s/s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bytes_and_counts_read_well() {
        assert_eq!(show_bytes(512), "512 B");
        assert_eq!(show_bytes(2048), "2.0 KiB (2.0 KB)");
        assert_eq!(show_bytes(u64::MAX), "16384.0 PiB (18446.7 PB)");
        assert_eq!(show_count(86_700_000), "86,700,000");
        assert_eq!(show_count(0), "0");
    }
}
