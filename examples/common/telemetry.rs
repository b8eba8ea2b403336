//! How the examples log: a `tracing` subscriber on standard error that honours
//! `RUST_LOG`. Included by path (`#[path = "common/telemetry.rs"] mod telemetry;`).
//!
//! idemkey reports what it cannot answer through the caller, a store that fails, an
//! outcome recorded late, a lease lost while running, as `tracing` events; without a
//! subscriber they go nowhere. The default filter shows idemkey's warnings and errors
//! (and the examples' own); `RUST_LOG=idemkey=debug` shows more, `RUST_LOG=off` none.

use tracing_subscriber::EnvFilter;

/// The filter used when `RUST_LOG` is unset (or not a valid filter).
const DEFAULT_FILTER: &str = "warn,idemkey=info";

/// Installs the subscriber: formatted lines on standard error, filtered by `RUST_LOG`
/// (default `warn,idemkey=info`). A second call (or another subscriber already
/// installed) leaves the first in place.
pub(crate) fn init_tracing() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // An error here means a subscriber is already installed: keep that one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
