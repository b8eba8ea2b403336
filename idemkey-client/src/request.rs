//! Per-request options, carried through the request's [`http::Extensions`].

use http::Extensions;
use serde::Serialize;

use crate::{IdempotencyKey, InvalidKey};

/// The caller's choice of key for one call, stored by [`RequestBuilderExt`].
#[derive(Debug, Clone)]
pub(crate) enum KeyChoice {
    /// Use this key (whatever the method).
    Use(IdempotencyKey),
    /// The caller asked for a key that is not valid: refuse before sending.
    Invalid(InvalidKey),
    /// No key for this call (and so no automatic retry of a POST or PATCH).
    Off,
}

/// What this crate's middlewares know of a logical request, in one entry of its
/// extensions (one allocation, not one per fact): the key fixed by the first middleware
/// that saw it, which every later pass (a retry through the same extensions) reuses;
/// `passes`, how many times the key middleware saw this logical request (once per
/// attempt when it is placed inside another retry middleware); and the attempt being
/// sent (0 until this crate's retry loop sends one).
#[derive(Debug, Clone, Default)]
pub(crate) struct InFlight {
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) passes: u32,
    /// The key was generated at random by this crate (so no other call can carry it).
    pub(crate) random: bool,
    pub(crate) attempt: u32,
}

/// The number of the attempt being sent, set by the retry middleware in the request's
/// extensions before each attempt (1 for the first).
///
/// Middlewares added with
/// [`IdempotentClientBuilder::with_inner`](crate::IdempotentClientBuilder::with_inner) run once per
/// attempt and can read it, for example to tell the server which attempt it sees:
///
/// ```
/// use idemkey::client::Attempt;
/// use reqwest_middleware::{Middleware, Next};
///
/// struct AttemptHeader;
///
/// #[async_trait::async_trait]
/// impl Middleware for AttemptHeader {
///     async fn handle(
///         &self,
///         mut req: reqwest::Request,
///         ext: &mut http::Extensions,
///         next: Next<'_>,
///     ) -> reqwest_middleware::Result<reqwest::Response> {
///         if let Some(attempt) = Attempt::get(ext) {
///             req.headers_mut().insert("x-attempt", attempt.number().into());
///         }
///         next.run(req, ext).await
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt(pub(crate) u32);

impl Attempt {
    /// The attempt recorded in `extensions`, if a retry middleware of this crate set one.
    #[must_use]
    pub fn get(extensions: &Extensions) -> Option<Attempt> {
        extensions
            .get::<InFlight>()
            .filter(|f| f.attempt > 0)
            .map(|f| Attempt(f.attempt))
    }

    /// Records `attempt` in `extensions`.
    pub(crate) fn set(extensions: &mut Extensions, attempt: u32) {
        match extensions.get_mut::<InFlight>() {
            Some(in_flight) => in_flight.attempt = attempt,
            None => {
                extensions.insert(InFlight {
                    attempt,
                    ..InFlight::default()
                });
            }
        }
    }

    /// The attempt's number, counting from 1.
    #[must_use]
    pub fn number(self) -> u32 {
        self.0
    }
}

/// Attempts made so far for the logical request whose extensions these are: this
/// crate's retry loop counts them exactly; without it, the key middleware's passes
/// (once per attempt inside another retry middleware) are the best count there is.
pub(crate) fn attempts_so_far(ext: &Extensions) -> u32 {
    ext.get::<InFlight>()
        .map_or(1, |f| if f.attempt > 0 { f.attempt } else { f.passes })
        .max(1)
}

/// Per-call key options on [`reqwest_middleware::RequestBuilder`].
///
/// They win over the client's defaults for that call; a key header set on the request
/// wins over them (the client never replaces a key the caller set).
///
/// ```no_run
/// use idemkey::client::{IdempotentClientBuilder, RequestBuilderExt};
/// use idemkey::IdempotencyKey;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = IdempotentClientBuilder::default().build();
/// let charge = serde_json::json!({"amount": 1000, "currency": "eur", "order": "o-42"});
///
/// // Re-running this line (in any process) sends the same key: the server replays.
/// client.post("http://127.0.0.1:8080/charges")
///     .derive_idempotency_key("create_charge", &charge)
///     .body(charge.to_string())
///     .send()
///     .await?;
///
/// // A key that comes from elsewhere.
/// client.post("http://127.0.0.1:8080/refunds")
///     .idempotency_key(IdempotencyKey::new("refund-o-42")?)
///     .send()
///     .await?;
///
/// // No key, and therefore no automatic retry of this POST.
/// client.post("http://127.0.0.1:8080/log").without_idempotency_key().send().await?;
/// # Ok(())
/// # }
/// ```
pub trait RequestBuilderExt: Sized {
    /// Sends this key with the call (whatever its method), on every attempt.
    fn idempotency_key(self, key: IdempotencyKey) -> Self;

    /// Derives the key from an operation name and its payload
    /// ([`IdempotencyKey::derive`]): the same operation and payload give the same key
    /// in every process, so re-running the call is recognised as a retry. A payload
    /// that cannot be serialised makes the call fail with
    /// [`Error::is_invalid_key`](crate::Error::is_invalid_key), before sending.
    fn derive_idempotency_key<T: Serialize + ?Sized>(self, operation: &str, payload: &T) -> Self;

    /// Sends this call without a key. A POST or PATCH without a key is not retried.
    fn without_idempotency_key(self) -> Self;
}

impl RequestBuilderExt for reqwest_middleware::RequestBuilder {
    fn idempotency_key(self, key: IdempotencyKey) -> Self {
        self.with_extension(KeyChoice::Use(key))
    }

    fn derive_idempotency_key<T: Serialize + ?Sized>(self, operation: &str, payload: &T) -> Self {
        let choice = match IdempotencyKey::derive(operation, &payload) {
            Ok(key) => KeyChoice::Use(key),
            Err(e) => KeyChoice::Invalid(e),
        };
        self.with_extension(choice)
    }

    fn without_idempotency_key(self) -> Self {
        self.with_extension(KeyChoice::Off)
    }
}
