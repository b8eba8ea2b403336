//! Test support (feature `test-util`).
//!
//! - [`conformance`]: the store conformance suite. Every store in this crate passes it,
//!   and third-party [`Store`](crate::store::Store) implementations can run it from
//!   their own tests.

pub mod conformance;
