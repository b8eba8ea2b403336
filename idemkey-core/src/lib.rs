//! # idemkey-core
//!
//! What both halves of [idemkey](https://docs.rs/idemkey) share, and all that a client
//! on another HTTP stack needs to speak its protocol: the key
//! ([`IdempotencyKey`]: generation, derivation, validation, header form), the wire
//! protocol ([`protocol`]: header names, problem types, status classes,
//! `Retry-After`), and the names of the spans and metrics both halves emit
//! ([`telemetry`]).
//!
//! Most users depend on the `idemkey` facade, or on `idemkey-client` /
//! `idemkey-server` alone, which re-export what they need from here; the items
//! below are reachable under the same paths there (`idemkey::protocol`,
//! `idemkey::IdempotencyKey`).
//!
//! # Feature flags
//!
//! - `metrics`: `telemetry::describe_metrics`, and the clock the halves time their
//!   histograms with.
//! - `sha2`: the length-prefixed framing feeds a SHA-256 directly (the verifier's
//!   fingerprints and record ids).
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
pub mod framing;
pub mod key;
pub mod protocol;
pub mod telemetry;

pub use key::{IdempotencyKey, InvalidKey};
