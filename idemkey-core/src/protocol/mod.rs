//! The wire protocol both halves speak, written once: header names ([`headers`]),
//! vendor dialects ([`dialect`]),
//! problem types ([`Problem`]), status and method classes ([`status`]) and `Retry-After`
//! ([`retry_after`]).
//!
//! Always compiled (it needs only `http` and `httpdate`), so the client and the server
//! name every fact of the protocol from here and can never drift apart.
//!
#![doc = include_str!("behaviour.md")]

pub mod dialect;
pub mod headers;
pub mod problem;
pub mod retry_after;
pub mod status;

pub use dialect::{Dialect, KeyPlacement};
pub use headers::{KeyHeader, ReplayHeader};
pub use problem::Problem;
