//! What the caller sees on every response: the key, the attempts, the replay flag.

use crate::IdempotencyKey;
use idemkey_core::protocol::headers;

/// The idempotency facts of one logical request, stored in the extensions of the
/// response that answered it (read them with [`ResponseExt::idempotency`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyInfo {
    key: IdempotencyKey,
    attempts: u32,
    replayed: bool,
    shared: bool,
}

impl IdempotencyInfo {
    pub(crate) fn new(key: IdempotencyKey, attempts: u32, replayed: bool) -> Self {
        Self {
            key,
            attempts,
            replayed,
            shared: false,
        }
    }

    pub(crate) fn set_shared(&mut self, shared: bool) {
        self.shared = shared;
    }

    /// The key every attempt carried.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// How many attempts were sent, this response's included (1 when the first one
    /// answered).
    ///
    /// Counted by this crate's retry middleware ([`IdempotentClientBuilder`](crate::IdempotentClientBuilder)),
    /// or by [`IdempotencyKeyMiddleware`](crate::IdempotencyKeyMiddleware) when it
    /// runs inside another retry middleware. Placed *outside*
    /// `reqwest_retry::RetryTransientMiddleware`, the key middleware sees one pass and
    /// that crate exposes no count, so this reads 1 whatever was sent.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the server replayed a stored response instead of executing the request
    /// again: `Idempotent-Replayed: true` or `Idempotency-Replayed: true`, the two
    /// spellings in the wild ([`headers::is_replayed`]).
    #[must_use]
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// Whether this answer came from a concurrent call of the same client with the same
    /// key and request, whose one request this call shared instead of sending its own
    /// ([`IdempotentClientBuilder::single_flight`](crate::IdempotentClientBuilder::single_flight)).
    /// The body was read into memory to be shared; [`attempts`](Self::attempts) counts
    /// that call's attempts.
    #[must_use]
    pub fn shared(&self) -> bool {
        self.shared
    }
}

/// Reads [`IdempotencyInfo`] off a [`reqwest::Response`].
///
/// ```no_run
/// use idemkey::client::{IdempotentClientBuilder, ResponseExt};
///
/// # async fn run() -> Result<(), reqwest_middleware::Error> {
/// let client = IdempotentClientBuilder::default().build();
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

/// Stores the facts in the response's extensions (updating what an inner layer put).
pub(crate) fn annotate(response: &mut reqwest::Response, key: &IdempotencyKey, attempts: u32) {
    if let Some(info) = response.extensions_mut().get_mut::<IdempotencyInfo>()
        && info.key == *key
    {
        info.attempts = attempts;
        return;
    }
    let replayed = headers::is_replayed(response.headers());
    response
        .extensions_mut()
        .insert(IdempotencyInfo::new(key.clone(), attempts, replayed));
}
