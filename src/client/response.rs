//! What the caller sees on every response: the key, the attempts, the replay flag.

use crate::IdempotencyKey;
use crate::headers::IDEMPOTENT_REPLAYED;

/// The idempotency facts of one logical request, stored in the extensions of the
/// response that answered it (read them with [`ResponseExt::idempotency`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyInfo {
    key: IdempotencyKey,
    attempts: u32,
    replayed: bool,
}

impl IdempotencyInfo {
    pub(crate) fn new(key: IdempotencyKey, attempts: u32, replayed: bool) -> Self {
        Self {
            key,
            attempts,
            replayed,
        }
    }

    /// The key every attempt carried.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// How many attempts were sent, this response's included (1 when the first one
    /// answered).
    ///
    /// Counted by this crate's retry middleware ([`ClientBuilder`](crate::client::ClientBuilder)),
    /// or by [`IdempotencyKeyMiddleware`](crate::client::IdempotencyKeyMiddleware) when it
    /// runs inside another retry middleware. Placed *outside*
    /// `reqwest_retry::RetryTransientMiddleware`, the key middleware sees one pass and
    /// that crate exposes no count, so this reads 1 whatever was sent.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the server replayed a stored response (`Idempotent-Replayed: true`)
    /// instead of executing the request again.
    #[must_use]
    pub fn replayed(&self) -> bool {
        self.replayed
    }
}

/// Reads [`IdempotencyInfo`] off a [`reqwest::Response`].
///
/// ```no_run
/// use idemkey::client::{ClientBuilder, ResponseExt};
///
/// # async fn run() -> Result<(), reqwest_middleware::Error> {
/// let client = ClientBuilder::default().build();
/// let response = client.post("http://127.0.0.1:8080/charges").body("{}").send().await?;
/// if let Some(info) = response.idempotency() {
///     println!("key {} after {} attempt(s), replayed: {}", info.key(), info.attempts(), info.replayed());
/// }
/// # Ok(())
/// # }
/// ```
pub trait ResponseExt {
    /// The idempotency facts of the request this response answered, or `None` when the
    /// request carried no key (a GET, or a call that opted out).
    fn idempotency(&self) -> Option<&IdempotencyInfo>;
}

impl ResponseExt for reqwest::Response {
    fn idempotency(&self) -> Option<&IdempotencyInfo> {
        self.extensions().get::<IdempotencyInfo>()
    }
}

/// Whether the server marked the response as replayed.
pub(crate) fn is_replayed(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"true"))
}

/// Stores the facts in the response's extensions (updating what an inner layer put).
pub(crate) fn annotate(response: &mut reqwest::Response, key: &IdempotencyKey, attempts: u32) {
    if let Some(info) = response.extensions_mut().get_mut::<IdempotencyInfo>() {
        if info.key == *key {
            info.attempts = attempts;
            return;
        }
    }
    let replayed = is_replayed(response);
    response
        .extensions_mut()
        .insert(IdempotencyInfo::new(key.clone(), attempts, replayed));
}

/// The largest problem document read to classify a 400 answer.
const MAX_PROBLEM_BYTES: u64 = 64 * 1024;

/// Whether `response` is an RFC 9457 problem whose `type` names `case` (`key-reused`
/// from a Stripe-compatible server answers 400). Reads a small problem body and gives
/// back an equivalent response (status, version, headers, URL, extensions, body bytes).
///
/// # Errors
/// The body could not be read (the connection dropped inside it): the caller gets that
/// error rather than the answer with its body silently emptied.
pub(crate) async fn is_problem(
    mut response: reqwest::Response,
    case: &str,
) -> Result<(reqwest::Response, bool), reqwest::Error> {
    let is_problem_json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    let small = response
        .content_length()
        .is_some_and(|n| n <= MAX_PROBLEM_BYTES);
    if !is_problem_json || !small {
        return Ok((response, false));
    }
    let url = response.url().clone();
    let status = response.status();
    let version = response.version();
    let headers = std::mem::take(response.headers_mut());
    let extensions = std::mem::take(response.extensions_mut());
    let body = response.bytes().await?;
    let matches = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .as_ref()
        .and_then(|doc| doc.get("type")?.as_str().map(|t| t.ends_with(case)))
        .unwrap_or(false);
    // Only the URL goes through the builder (reqwest keeps it in a private extension);
    // a builder with nothing but an extension cannot fail.
    let mut rebuilt = reqwest::ResponseBuilderExt::url(http::Response::builder(), url)
        .body(body.clone())
        .unwrap_or_else(|_| http::Response::new(body));
    *rebuilt.status_mut() = status;
    *rebuilt.version_mut() = version;
    *rebuilt.headers_mut() = headers;
    rebuilt.extensions_mut().extend(extensions);
    Ok((reqwest::Response::from(rebuilt), matches))
}
