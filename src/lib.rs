//! # idemkey
//!
//! Outgoing API calls that are safe to retry, and incoming requests that are safe to
//! receive twice.
//!
//! - **Client half** (feature `client`, [`client`]): a `reqwest-middleware` middleware
//!   that gives every logical non-idempotent call an `Idempotency-Key` and keeps it fixed
//!   across every retry, with idempotency-aware exponential backoff that honours the server's retry
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
//! # Crates
//!
//! This crate is a facade: each module is a crate of its own, re-exported under the
//! path it has always had. `idemkey-core` holds the key and the wire protocol
//! ([`key`], [`protocol`], [`telemetry`]); `idemkey-client` the client half
//! ([`client`]); `idemkey-server` the verifier with its stores ([`server`],
//! [`store`], [`fingerprint`]). A library that only makes calls can depend on
//! `idemkey-client` alone, whose version does not move with a database driver or a
//! server framework; one that only receives, on `idemkey-server`.
//!
//! # Feature flags
//!
//! - `client` (default): the `client` module (`idemkey-client`), over `reqwest` and
//!   `reqwest-middleware`.
//! - `server` (default): the `server`, `store` and `fingerprint` modules
//!   (`idemkey-server`), with the in-memory store.
//! - `json` (default): `.json(..)` on the client's request builder.
//! - `redis`, `postgres`, `sqlite`, `mysql`, `dynamodb`: the shared and durable stores
//!   (`RedisStore`, `PostgresStore`, `SqliteStore`, `MySqlStore`, `DynamoStore`); each
//!   implies `server`.
//! - `outbox`: `client::outbox`, a durable outbox for outgoing calls (persisted before
//!   they are sent, finished after a crash with the same key), with the in-memory
//!   journal; `outbox-sqlite` and `outbox-postgres` add its SQLite and PostgreSQL
//!   journals (sqlx with that database's driver; neither brings the verifier).
//! - `metrics`: counters and histograms through the `metrics` facade, in the halves
//!   that are on.
//! - `admin`: `server::admin`, list, inspect and force-release records over HTTP.
//! - `test-util`: the `testing` module (test server, fault injector and proxy, the
//!   store and journal conformance suites); implies `client` and `server`.
//!
//! Items behind a feature are marked with it on docs.rs.
//!
// The links above point at modules that a feature set may leave out; there they lead to
// the list of feature flags instead, so the crate docs build without broken links under
// every feature set.
#![cfg_attr(not(feature = "client"), doc = "[`client`]: #feature-flags")]
#![cfg_attr(not(feature = "server"), doc = "[`store`]: #feature-flags")]
#![cfg_attr(not(feature = "server"), doc = "[`server`]: #feature-flags")]
#![cfg_attr(not(feature = "server"), doc = "[`fingerprint`]: #feature-flags")]
#![cfg_attr(not(feature = "test-util"), doc = "[`testing`]: #feature-flags")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The facade: each module is a crate of the workspace, under the path it has always
// had, so that code written against `idemkey` does not change with the crate layout.

#[cfg(feature = "client")]
#[doc(inline)]
pub use idemkey_client as client;
#[doc(inline)]
pub use idemkey_core::{key, protocol, telemetry};

#[cfg(feature = "server")]
#[doc(inline)]
pub use idemkey_server as server;
#[cfg(feature = "server")]
#[doc(inline)]
pub use idemkey_server::{fingerprint, store};

#[cfg(feature = "test-util")]
pub mod testing;

pub use idemkey_core::{IdempotencyKey, InvalidKey};
