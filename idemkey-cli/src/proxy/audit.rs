//! `--audit`: clients that change the key between retries of one request.
//!
//! A client that makes a new key for each retry defeats the verifier: the retry of a
//! charge whose answer was lost runs as a new charge. The proxy remembers the key of
//! each request's fingerprint (within its scope) for a window; a request with the same
//! fingerprint and scope but another key within the window is reported, one JSON line
//! on standard output. Two deliberate, identical operations a moment apart look the
//! same: the report is a lead, not a verdict.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};

use super::{Body, config::Route, full, problem_bytes};

/// A request's scope (the scope header's bytes) and fingerprint.
type Seen = (Vec<u8>, Vec<u8>);

/// The fingerprints seen within the window, with their latest key and when it came.
pub(crate) struct Audit {
    window: Duration,
    seen: Mutex<HashMap<Seen, (String, Instant)>>,
    reports: AtomicU64,
}

/// Pruning runs when the map grows past this many entries.
const PRUNE_AT: usize = 100_000;

impl Audit {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            seen: Mutex::new(HashMap::new()),
            reports: AtomicU64::new(0),
        }
    }

    /// Reports made so far.
    pub(crate) fn reports(&self) -> u64 {
        self.reports.load(Ordering::Relaxed)
    }

    /// Reads the body of a keyed request (up to `limit` bytes), compares its
    /// fingerprint with those seen, and gives the request back to be forwarded; a body
    /// over the limit is answered `413` here.
    pub(crate) async fn observe(
        &self,
        route: &Route,
        limit: usize,
        req: Request<Body>,
    ) -> Result<Request<Body>, Response<Bytes>> {
        let Some(key) = req
            .headers()
            .get(&route.key_header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
        else {
            return Ok(req);
        };
        let (parts, body) = req.into_parts();
        let bytes = match Limited::new(body, limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                let (status, title) = if e.is::<http_body_util::LengthLimitError>() {
                    (StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large")
                } else {
                    (StatusCode::BAD_REQUEST, "Bad Request")
                };
                return Err(problem_bytes(
                    status,
                    title,
                    &format!("the request body could not be read within {limit} bytes: {e}"),
                ));
            }
        };
        let fingerprint = route.fingerprinter.fingerprint_parts(&parts, &bytes);
        let scope = route
            .scope_header
            .as_ref()
            .and_then(|h| parts.headers.get(h))
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default();
        let now = Instant::now();
        let previous = {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.len() >= PRUNE_AT {
                seen.retain(|_, (_, at)| now.duration_since(*at) <= self.window);
            }
            seen.insert((scope, fingerprint.as_bytes().to_vec()), (key.clone(), now))
        };
        if let Some((previous, at)) = previous {
            let after = now.duration_since(at);
            if previous != key && after <= self.window {
                self.reports.fetch_add(1, Ordering::Relaxed);
                let report = serde_json::json!({
                    "audit": "key-changed",
                    "method": parts.method.as_str(),
                    "path": parts.uri.path(),
                    "previous_key": previous,
                    "key": key,
                    "after_ms": u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
                    "detail": "the same request (same fingerprint and scope) came with another key: \
                               a client that makes a new key per retry runs the operation again",
                });
                println!("{report}");
            }
        }
        Ok(Request::from_parts(parts, full(bytes)))
    }
}
