//! What the in-process measurement programs share (included by path by each that needs
//! it): the process's resident set growth over a run of charges through an axum router.

use axum::Router;
use axum::body::Body;
use http::Request;
use tower::ServiceExt;

/// How much this process's resident set grew while `records` fresh charges (keys
/// `0..records`) went through `app`, after 1,000 others warmed up the allocator, the
/// router and the runtime.
pub(crate) async fn rss_growth(app: &Router, records: u64) -> Result<u64, String> {
    for key in 0..1_000 {
        post_charge(app, u64::MAX - key).await?;
    }
    let before = rss()?;
    for key in 0..records {
        post_charge(app, key).await?;
    }
    Ok(rss()?.saturating_sub(before))
}

/// Resident set size of this process in bytes.
fn rss() -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm")
        .map_err(|e| format!("reading /proc/self/statm: {e} (this program needs Linux)"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("unexpected /proc/self/statm: {statm:?}"))?;
    // The page size of every Linux target this crate is built for.
    Ok(pages * 4096)
}

/// `POST /v1/charges` with key `key-<key>` and a small JSON body, through `app` in
/// process; an error unless it is answered 2xx.
pub(crate) async fn post_charge(app: &Router, key: u64) -> Result<(), String> {
    let req = Request::post("/v1/charges")
        .header("content-type", "application/json")
        .header("idempotency-key", format!("key-{key:016}"))
        .body(Body::from(format!(r#"{{"amount":100,"n":{key}}}"#)))
        .map_err(|e| format!("building a request: {e}"))?;
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .map_err(|e| format!("request {key}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("request {key} answered {}", resp.status()));
    }
    Ok(())
}
