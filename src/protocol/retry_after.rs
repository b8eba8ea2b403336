//! `Retry-After` (RFC 9110 §10.2.3): written by the verifier, read by the client.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};

/// `d` in whole seconds as `Retry-After` sends it: rounded up, at least 1, saturating
/// (`Duration::MAX` is a valid setting, "as long as it takes").
///
/// ```
/// use std::time::Duration;
/// use idemkey::protocol::retry_after::whole_seconds;
/// assert_eq!(whole_seconds(Duration::ZERO), 1);
/// assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
/// assert_eq!(whole_seconds(Duration::MAX), u64::MAX);
/// ```
#[must_use]
pub fn whole_seconds(d: Duration) -> u64 {
    d.as_secs()
        .saturating_add(u64::from(d.subsec_nanos() > 0))
        .max(1)
}

/// The `Retry-After` value for a wait of `d` (delta-seconds, see [`whole_seconds`]).
#[must_use]
pub fn to_header_value(d: Duration) -> HeaderValue {
    HeaderValue::from(whole_seconds(d))
}

/// The wait a `Retry-After` value asks for, at `now`: delta-seconds (digits only) or an
/// HTTP date (a date in the past means no wait). More seconds than a `u64` holds still
/// mean "wait long" and saturate to `Duration::MAX` (cap it yourself). `None` for a
/// value that is neither.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
/// use idemkey::protocol::retry_after::parse;
/// let now = SystemTime::now();
/// assert_eq!(parse(&HeaderValue::from_static("3"), now), Some(Duration::from_secs(3)));
/// assert_eq!(parse(&HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"), now), Some(Duration::ZERO));
/// assert_eq!(parse(&HeaderValue::from_static("-1"), now), None);
/// ```
#[must_use]
pub fn parse(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let value = value.to_str().ok()?.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(value.parse().map_or(Duration::MAX, Duration::from_secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// [`parse`] of the `Retry-After` header in `headers`, if there is one.
#[must_use]
pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    parse(headers.get(http::header::RETRY_AFTER)?, now)
}
