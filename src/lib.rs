//! # idemkey
//!
//! Outgoing API calls that are safe to retry, and incoming requests that are safe to
//! receive twice.
//!
//! - **Client half** (feature `client`): a [`reqwest_middleware`] middleware that gives
//!   every logical non-idempotent call an `Idempotency-Key` and keeps it fixed across every
//!   retry, with idempotency-aware exponential backoff that honours the server's retry
//!   hints, a client-wide retry budget, and vendor profiles (Stripe, Adyen, PayPal,
//!   Square, Checkout.com, GoCardless, Stainless-style APIs).
//! - **Server half** (feature `server`): a verifier that runs each keyed request at most
//!   once, replays the stored response to retries, rejects a reused key whose request
//!   differs, and answers concurrent duplicates with a conflict. It comes as a
//!   framework-free engine, a `tower` layer, and a function-level API, over pluggable
//!   [stores][`store`]; see [`server`] for the ways in and [`fingerprint`] for what
//!   makes two requests "the same".
//! - **Test helpers** (feature `test-util`): [`testing`] serves a verifier-wrapped app on
//!   127.0.0.1 and injects faults (lost responses, delays, resets) between a client and
//!   it, to prove exactly-once effects in your own tests.
//!
//! Both halves follow one wire protocol, written once in [`protocol`] with its behaviour
//! table: the IETF `Idempotency-Key` header (bare or RFC 8941 sf-string),
//! `Idempotent-Replayed: true` on replays (the client also reads `Idempotency-Replayed`),
//! and RFC 9457 problem responses with a stable `type` per case.
//!
//! # Feature flags
//!
//! - `client` (default): the `client` module, over `reqwest` and `reqwest-middleware`.
//! - `server` (default): the `server`, `store` and `fingerprint` modules, with the
//!   in-memory store.
//! - `redis`, `postgres`, `sqlite`, `mysql`, `dynamodb`: the shared and durable stores
//!   (`RedisStore`, `PostgresStore`, `SqliteStore`, `MySqlStore`, `DynamoStore`); each
//!   implies `server`.
//! - `outbox`: `client::outbox`, a durable outbox for outgoing calls (persisted before
//!   they are sent, finished after a crash with the same key), with the in-memory
//!   journal; `outbox-sqlite` and `outbox-postgres` add its SQLite and PostgreSQL
//!   journals (sqlx with that database's driver; neither brings the verifier).
//! - `test-util`: the `testing` module (test server, fault injector, the store
//!   conformance suite); implies `client` and `server`.
//!
//! Items behind a feature are marked with it on docs.rs.
//!
// The links above point at modules that a feature set may leave out; there they lead to
// the list of feature flags instead, so the crate docs build without broken links under
// every feature set.
#![cfg_attr(
    not(feature = "client"),
    doc = "[`reqwest_middleware`]: #feature-flags"
)]
#![cfg_attr(not(feature = "server"), doc = "[`store`]: #feature-flags")]
#![cfg_attr(not(feature = "server"), doc = "[`server`]: #feature-flags")]
#![cfg_attr(not(feature = "server"), doc = "[`fingerprint`]: #feature-flags")]
#![cfg_attr(not(feature = "test-util"), doc = "[`testing`]: #feature-flags")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "client")]
pub mod client;
mod framing;
pub mod key;
pub mod protocol;
pub mod telemetry;

#[cfg(feature = "server")]
pub mod fingerprint;
#[cfg(feature = "server")]
mod json_pointer;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod store;

#[cfg(feature = "test-util")]
pub mod testing;

pub use key::{IdempotencyKey, InvalidKey};
