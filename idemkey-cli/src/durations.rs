//! Durations on the command line and in the routes file (`50ms`, `5m`, `24h`), parsed by
//! humantime.

use std::time::Duration;

/// A duration such as `50ms`, `5m`, `1h 30m` or `7days`.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}): write it like 50ms, 5m or 24h"))
}

/// `d` for people: `1m 30s`, `250ms`.
pub(crate) fn show(d: Duration) -> String {
    // Whole milliseconds are precise enough for records' ages and leases.
    let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    humantime::format_duration(Duration::from_millis(millis)).to_string()
}
