//! The verifier half: runs each keyed request at most once.
//!
//! - [`webhook`]: receiving provider webhooks exactly once, keyed by the provider's
//!   event id (presets for Stripe, GitHub, Standard Webhooks and others), batches, and
//!   Standard Webhooks signatures.

pub mod webhook;
