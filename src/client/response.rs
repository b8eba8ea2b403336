//! What the caller sees on every response: the key, the attempts, the replay flag.

use crate::IdempotencyKey;
use crate::protocol::headers::IDEMPOTENT_REPLAYED;

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
