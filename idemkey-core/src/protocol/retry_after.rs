//! `Retry-After` (RFC 9110 §10.2.3), written by the verifier and read by the client, and
//! the other retry hints servers send.
//!
//! # The hints, and which one wins
//!
//! Two questions, each answered by the first hint present:
//!
//! **Retry at all?** `x-should-retry` ([`X_SHOULD_RETRY`]) or `Stripe-Should-Retry`
//! ([`STRIPE_SHOULD_RETRY`]), `true` or `false` ([`should_retry`]). Both SDK families
//! that send them let the hint override the status: the Stainless-generated SDKs
//! (`shouldRetry` in orb-billing 6.11.0's `src/client.ts`: "If the server explicitly
//! says whether or not to retry, obey", before any status check) and stripe-node
//! (`RequestSender._shouldRetry` in stripe 23.1.0's `cjs/RequestSender.js`: "The API
//! may ask us not to retry ... or advise us to retry ...; we defer to that", before the
//! 409 and 5xx checks). This crate does the same with two limits: a hint never makes a
//! 400 or 422 retryable ([`is_never_retried`](super::status::is_never_retried)), nor a
//! request that has no key and is not idempotent. When a response carries both headers
//! and they disagree, `false` wins.
//!
//! **How long to wait?** `retry-after-ms` ([`RETRY_AFTER_MS`], milliseconds, fractions
//! allowed), else `Retry-After` (delta-seconds or an HTTP date), else the client's own
//! backoff ([`asked_wait`]). That is the Stainless order (`retryRequest`: the
//! `retry-after-ms` header is read first, `Retry-After` only when it gave nothing). The
//! wait a server asks for replaces the backoff, as in those SDKs, but the client caps
//! it and never waits past its deadline. stripe-node 23.1.0 reads neither header (its
//! `_getSleepTimeInMS` is pure backoff).
//!
//! [`X_SHOULD_RETRY`]: super::headers::X_SHOULD_RETRY
//! [`STRIPE_SHOULD_RETRY`]: super::headers::STRIPE_SHOULD_RETRY
//! [`RETRY_AFTER_MS`]: super::headers::RETRY_AFTER_MS

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};

use super::headers::RETRY_AFTER_MS;

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

/// The wait a `retry-after-ms` value asks for: non-negative milliseconds, digits with an
/// optional fraction (`"250"`, `"1.5"`), as the Stainless SDKs parse it. Too large to
/// represent still means "wait long" and saturates to `Duration::MAX`. `None` for any
/// other value.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use idemkey::protocol::retry_after::parse_millis;
/// assert_eq!(parse_millis(&HeaderValue::from_static("250")), Some(Duration::from_millis(250)));
/// assert_eq!(parse_millis(&HeaderValue::from_static("1.5")), Some(Duration::from_micros(1500)));
/// assert_eq!(parse_millis(&HeaderValue::from_static("-1")), None);
/// assert_eq!(parse_millis(&HeaderValue::from_static("1e3")), None);
/// ```
#[must_use]
pub fn parse_millis(value: &HeaderValue) -> Option<Duration> {
    let value = value.to_str().ok()?.trim();
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || value.ends_with('.') {
        return None;
    }
    let millis: f64 = value.parse().ok()?;
    Some(Duration::try_from_secs_f64(millis / 1000.0).unwrap_or(Duration::MAX))
}

/// The wait the server asks for, at `now`: `retry-after-ms` if it parses, else
/// `Retry-After` (see the module docs for the order). `None` when neither does.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use idemkey::protocol::retry_after::asked_wait;
/// let mut h = HeaderMap::new();
/// h.insert("retry-after", "3".parse().unwrap());
/// assert_eq!(asked_wait(&h, SystemTime::now()), Some(Duration::from_secs(3)));
/// h.insert("retry-after-ms", "20".parse().unwrap());
/// assert_eq!(asked_wait(&h, SystemTime::now()), Some(Duration::from_millis(20)));
/// ```
#[must_use]
pub fn asked_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    headers
        .get(RETRY_AFTER_MS)
        .and_then(parse_millis)
        .or_else(|| from_headers(headers, now))
}

/// What the `true|false` hint headers in `names` say about retrying: `Some(false)` if
/// any says `false`, else `Some(true)` if any says `true`, else `None` (absent, or
/// another value). ASCII case and surrounding whitespace are ignored.
///
/// ```
/// use http::HeaderMap;
/// use idemkey::protocol::headers::{STRIPE_SHOULD_RETRY, X_SHOULD_RETRY};
/// use idemkey::protocol::retry_after::should_retry;
/// let both = [X_SHOULD_RETRY, STRIPE_SHOULD_RETRY];
/// let mut h = HeaderMap::new();
/// assert_eq!(should_retry(&h, &both), None);
/// h.insert("x-should-retry", "true".parse().unwrap());
/// assert_eq!(should_retry(&h, &both), Some(true));
/// h.insert("stripe-should-retry", "false".parse().unwrap());
/// assert_eq!(should_retry(&h, &both), Some(false));
/// ```
#[must_use]
pub fn should_retry(headers: &HeaderMap, names: &[HeaderName]) -> Option<bool> {
    let mut said = None;
    for name in names {
        for value in headers.get_all(name) {
            match value.as_bytes().trim_ascii() {
                v if v.eq_ignore_ascii_case(b"false") => return Some(false),
                v if v.eq_ignore_ascii_case(b"true") => said = Some(true),
                _ => {}
            }
        }
    }
    said
}
