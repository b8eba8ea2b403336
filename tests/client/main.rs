//! The client half against real servers: keys, retries, vendor dialects and profiles,
//! the outbox and its crashes.
//!
//! One test binary per wing of the tests (links once, builds the support tree once);
//! each file below is a module, gated by the features it needs.

#[path = "../support/mod.rs"]
mod support;

mod client;
mod client_dialects;
mod client_vendors;
#[cfg(all(
    feature = "test-util",
    feature = "outbox-sqlite",
    feature = "outbox-postgres"
))]
mod outbox;
#[cfg(all(
    feature = "test-util",
    feature = "outbox-sqlite",
    feature = "outbox-postgres"
))]
mod outbox_crash;
