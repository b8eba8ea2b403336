//! The verifier: run each keyed request at most once, replay its response to retries.
//!
//! Three ways in, one [`Engine`] underneath:
//!
//! - [`IdempotencyLayer`], a `tower` layer for axum, hyper and any tower stack;
//! - [`Engine::once`], a function-level API for queue consumers and jobs;
//! - [`Engine::begin`], the framework-free engine for anything else.
//!
//! # Behaviour
//!
//! | situation | answer | handler runs? |
//! |---|---|---|
//! | key missing on a route that requires one | 400 `missing-key` | no |
//! | key malformed | 400 `invalid-key` | no |
//! | request body over the limit | 413 `body-too-large` | no |
//! | first request for (scope, key) | the handler's response; the [`OutcomePolicy`] decides whether it is kept | once |
//! | same (scope, key) and fingerprint, completed | the stored response: same status, body bytes and stored headers, plus `Idempotent-Replayed: true` | no |
//! | same (scope, key), different fingerprint | 422 `key-reused` (400 with [`EngineBuilder::stripe_compatible`]) | no |
//! | same (scope, key), first request still running | 409 `in-progress` with `Retry-After` (the remaining lease, capped at 1 s by default) | no |
//! | first request's owner died (lease expired) | the next request takes the key over with a new fencing token; the dead owner can no longer write | once more |
//! | store unreachable or failing | 503 `store-unavailable` with `Retry-After`; with [`EngineBuilder::fail_open`] the handler runs unguarded | no |
//! | response larger than the storage limit | sent to its caller; retries get 410 `response-not-stored` | no (not again) |
//!
//! Problems are `application/problem+json` (RFC 9457) with `type`
//! `urn:idemkey:problem:<case>`; see [`Rejection`].
//!
//! # Keys, scopes and records
//!
//! The key comes from an [`ExtractKey`] (default: the `Idempotency-Key` header, bare or
//! RFC 8941 sf-string), the scope from an [`ExtractScope`] (default: none; typically the
//! API credential or the tenant). A record's address is
//! [`RecordId::new(scope, key)`](crate::store::RecordId::new), a SHA-256 over both, so
//! raw keys and scopes never reach the store and two tenants using one key never meet.
//!
//! # Leases, renewal, retention
//!
//! A claim holds a short lease ([`EngineBuilder::lease`], default 5 s) that the engine
//! renews every third of it while the handler runs. If the process dies, the lease runs
//! out and the next request takes the key over; the dead owner's fencing token can no
//! longer complete, renew or release it. A completed record is kept for the retention
//! period ([`EngineBuilder::retention`], default 24 h; per layer with
//! [`IdempotencyLayer::retention`]).
//!
//! # Cancellation
//!
//! hyper drops a request's future when the client disconnects. The layer polls the
//! claimed handler in place and, if its future is dropped before the handler ends, moves
//! the rest to a spawned task, so it finishes anyway, its response is recorded, and the
//! retry receives the replay. (A handler that panics releases its key instead.) (A request dropped while its claim is in flight, before the
//! handler started, leaves at most a claim that its lease expires.)
//!
//! # Stored responses
//!
//! The stored payload is a versioned binary record: status, headers minus hop-by-hop
//! ones, `Content-Length` and the deny-list (`Set-Cookie` by default), and the body
//! bytes. A body over [`IdempotencyLayer::stored_response_limit`] is streamed to its
//! caller and recorded as "too large", so retries get `410 response-not-stored` rather
//! than a second execution.
//!
//! # Webhooks
//!
//! [`webhook`] keys the verifier by a provider's event id instead of a header: presets
//! for Stripe, GitHub, Standard Webhooks and others, batches, and Standard Webhooks
//! signatures.

mod body;
mod engine;
mod extract;
mod layer;
mod once;
mod policy;
pub(crate) mod record;
mod rejection;
pub mod webhook;

pub use body::{BoxError, RequestBody, ResponseBody};
pub use engine::{
    Begin, DEFAULT_IN_PROGRESS_RETRY_AFTER, DEFAULT_LEASE, DEFAULT_RETENTION,
    DEFAULT_UNAVAILABLE_RETRY_AFTER, Engine, EngineBuilder, Execution,
};
pub use extract::{ExtractKey, ExtractScope, HeaderKey, HeaderScope, Unscoped};
pub use layer::{
    DEFAULT_BODY_LIMIT, DEFAULT_STORED_RESPONSE_LIMIT, Idempotency, IdempotencyLayer,
    KeyRequirement, ResponseFuture,
};
pub use once::{Once, OnceError};
pub use policy::{Outcome, OutcomePolicy};
pub use rejection::{PROBLEM_JSON, PROBLEM_TYPE_PREFIX, Rejection};
