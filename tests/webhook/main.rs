//! Webhook receivers: presets, signatures, batches, over memory and Redis.
//!
//! One test binary per wing of the tests (links once, builds the support tree once);
//! each file below is a module, gated by the features it needs.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "server")]
mod webhook_batches;
#[cfg(feature = "server")]
mod webhook_presets;
#[cfg(feature = "server")]
mod webhook_receivers;
#[cfg(all(feature = "server", feature = "redis"))]
mod webhook_redis;
#[cfg(feature = "server")]
mod webhook_signed;
