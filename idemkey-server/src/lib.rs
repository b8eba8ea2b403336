//! The verifier: run each keyed request at most once, replay its response to retries.
//!
//! Three ways in, one [`Engine`] underneath:
//!
//! - [`IdempotencyLayer`], a `tower` layer for axum, hyper and any tower stack;
//! - [`Engine::once`], a function-level API for queue consumers and jobs;
//! - [`Engine::claim`], the framework-free engine for anything else: it answers in its
//!   own terms ([`Claimed`]), which the layer turns into HTTP answers.
//!
//! # Behaviour
//!
//! What the verifier answers in each situation is the wire protocol's
//! [behaviour table](idemkey_core::protocol#behaviour): written once, there. The
//! [`OutcomePolicy`](policy::OutcomePolicy) decides which handler responses are kept;
//! [`IdempotencyLayer::stripe_compatible`] answers a reused key with 400 instead of 422;
//! [`EngineBuilder::fail_open`] runs the handler unguarded when the store fails. Problems
//! are [`Problem`](idemkey_core::protocol::Problem)s, sent by a [`Rejection`].
//!
//! # Keys, scopes and records
//!
//! The key comes from an [`ExtractKey`](extract::ExtractKey) (default: the `Idempotency-Key` header, bare or
//! RFC 8941 sf-string), the scope from an [`ExtractScope`](extract::ExtractScope) (default: none; typically the
//! API credential or the tenant). A record's address is
//! [`RecordId::new(scope, key)`](crate::store::RecordId::new), a SHA-256 over both, so
//! raw keys and scopes never reach the store and two tenants using one key never meet.
//!
//! ## Keys and scopes in headers: one rule
//!
//! | header | key ([`HeaderKey`](extract::HeaderKey), [`KeySource::header`](extract::KeySource::header)) | scope ([`HeaderScope`](extract::HeaderScope), [`ScopeSource::header`](extract::ScopeSource::header)) |
//! |---|---|---|
//! | absent | no key: `400 missing-key` where one is required | no scope: the unscoped space, or the source's fallback |
//! | sent more than once | `400 invalid-key` | `400 invalid-scope` |
//! | empty (or only spaces and tabs) | `400 invalid-key` | `400 invalid-scope` |
//! | not visible ASCII | `400 invalid-key` (a key is 1 to 255 visible ASCII characters, bare or RFC 8941 sf-string) | the scope, as opaque bytes: hex-encoded and marked, so it never equals a textual scope |
//!
//! Spaces and tabs around a value are not part of it. A sender that means "no key" or
//! "no scope" leaves the header out: a header that is there but empty is a malformed
//! message, and guessing what it meant could run a request unguarded. A scope has no
//! grammar (it is an API credential, a tenant id, a shop's domain), so any bytes are one;
//! it only reaches the store hashed together with the key.
//!
//! JSON fields are data rather than protocol and follow the encoders that write them: an
//! absent field, `null` and `""` all mean "no value" (see [`KeySource`](extract::KeySource)).
//!
//! # Leases, renewal, retention
//!
//! A claim holds a short lease ([`EngineBuilder::lease`], default 5 s) that the engine
//! renews every third of it while the handler runs. If the process dies, the lease runs
//! out and the next request takes the key over; the dead owner's fencing token can no
//! longer complete, renew or release it. A completed record is kept for the retention
//! period ([`EngineBuilder::retention`], default 24 h; per layer with
//! [`IdempotencyLayer::retention`]); a claim asks the store for that same retention, for
//! which an abandoned claim is kept.
//!
//! An outcome is not given up because the store blinked: an owner whose store is
//! unavailable when the handler answers keeps the outcome and records it once the store
//! is back, for up to the retention, in the background so its caller is answered at
//! once ([`Execution`]; what remains is in the
//! [layer docs](IdempotencyLayer#when-the-store-fails-after-the-handler-answered)).
//!
//! # Cancellation
//!
//! hyper drops a request's future when the client disconnects. The layer polls the
//! claimed handler in place and, if its future is dropped before the handler ends, moves
//! the rest to a spawned task, so it finishes anyway, its response is recorded, and the
//! retry receives the replay. A handler that panics releases its key instead. A request
//! dropped while its claim is in flight, before the handler started, leaves at most a
//! claim, which its lease expires.
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
//!
#![doc = include_str!("guide.md")]
//!
#![doc = include_str!("queues.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod body;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod engine;
mod execution;
pub mod extract;
pub mod fingerprint;
mod grpc;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod inbox;
mod json_pointer;
mod layer;
pub(crate) mod once;
pub mod policy;
mod quota;
pub(crate) mod record;
mod rejection;
pub mod store;
mod stored_response;
mod telemetry;
pub mod webhook;

// The root holds the ways in (the engine, the layer, the function API) and what their
// signatures name; the parts a user configures are in the modules that say what they are
// (`extract`, `policy`, `body`), each under one path.
pub use engine::{ClaimError, Claimed, Engine, EngineBuilder};
pub use execution::{Completion, Execution, Recording};
pub use layer::{Idempotency, IdempotencyLayer, ResponseFuture};
pub use once::{OnceError, Settled};
pub use rejection::Rejection;
// The key type, from idemkey-core: one type for both halves and the facade. Each crate
// re-exports it so that it can be used alone; through the facade its path is
// `idemkey::IdempotencyKey`.
pub use idemkey_core::{IdempotencyKey, InvalidKey};
