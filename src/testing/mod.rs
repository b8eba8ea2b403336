//! Helpers for pairing the client half with the verifier in tests (feature `test-util`).
//!
//! - [`TestServer`]: serve an axum app (wrapped in the verifier) on `127.0.0.1`, on a
//!   free port.
//! - [`FaultInjector`]: a `reqwest_middleware` middleware that, by a deterministic
//!   plan, loses a response after the server processed the request, delays a request,
//!   or resets the connection before the request arrives. Put it inside the client's
//!   retry loop (`idemkey::client::IdempotentClientBuilder::with_inner`) so every attempt meets it.
//! - [`FaultProxy`]: the same faults at the network level, as a real HTTP proxy on
//!   `127.0.0.1` between any client (another process, another language) and any server.
//! - [`Explorer`]: runs your own code (an SDK's `create_charge`) once per fault
//!   schedule (every fault at every attempt, every pair, then seeded random ones) and
//!   judges each run: executed at most once, one key per operation, and a result that
//!   says what happened.
//! - [`VendorFake`]: a fake of a vendor's endpoint on `127.0.0.1`: the verifier in the
//!   vendor's [`Dialect`](crate::protocol::Dialect) (Stripe, Square, PayPal, ...) in front
//!   of a built-in handler that creates objects, or an app of the test's own.
//! - [`Executions`]: a counter of handler executions.
//! - [`conformance`]: the store conformance suite. Every store in this crate passes it,
//!   and third-party [`Store`](crate::store::Store) implementations can run it from
//!   their own tests.
//! - `journal_conformance` (feature `outbox`): the same for the client outbox's
//!   journals.
//!
//! ```
//! use axum::routing::post;
//! use idemkey::client::{IdempotentClientBuilder, ResponseExt};
//! use idemkey::server::{Engine, IdempotencyLayer};
//! use idemkey::store::MemoryStore;
//! use idemkey::testing::{Executions, Fault, FaultInjector, TestServer};
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let charges = Executions::default();
//! let handler = {
//!     let charges = charges.clone();
//!     move || async move { format!("charge {}", charges.record()) }
//! };
//! let app = axum::Router::new().route("/v1/charges", post(handler));
//! let layer = IdempotencyLayer::new(Engine::new(MemoryStore::new()));
//! let server = TestServer::start_verified(app, layer).await?;
//!
//! // Lose the response to every key's first attempt, after the server processed it.
//! let faults = FaultInjector::new(|shot| if shot.key_attempt == 0 { Fault::LoseResponse } else { Fault::None });
//! let client = IdempotentClientBuilder::new(reqwest::Client::new()).with_inner(faults.clone()).build();
//!
//! let resp = client.post(server.url("/v1/charges"))
//!     .header("content-type", "application/json")
//!     .body(r#"{"amount":100}"#)
//!     .send()
//!     .await?;
//! let info = resp.idempotency().expect("POST gets a key");
//! assert_eq!((info.attempts(), info.replayed()), (2, true));
//! assert_eq!(resp.text().await?, "charge 1");
//! assert_eq!(charges.count(), 1, "charged once although a response was lost");
//! assert_eq!(faults.stats().lost_responses, 1);
//! # Ok(()) }
//! ```

mod explore;
mod faults;
mod proxy;
mod server;
mod vendor;

pub use explore::{
    AttemptFault, Context, Explorer, Outcome, Phase, Report, Row, Schedule, ScheduleError,
    ToOutcome,
};
pub use faults::{Fault, FaultInjector, FaultPlan, FaultRates, FaultStats, Shot};
pub use proxy::FaultProxy;
pub use server::TestServer;
pub use vendor::VendorFake;

/// The store conformance suite (`idemkey-server`'s, feature `conformance` there).
#[doc(inline)]
pub use idemkey_server::conformance;

/// The outbox journal conformance suite (`idemkey-client`'s, features `outbox` and
/// `conformance` there).
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
#[doc(inline)]
pub use idemkey_client::outbox::conformance as journal_conformance;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts handler executions; clones share the count.
///
/// ```
/// let e = idemkey::testing::Executions::default();
/// let seen = e.clone();
/// e.record();
/// assert_eq!(seen.count(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Executions(Arc<AtomicU64>);

impl Executions {
    /// Counts one execution and returns the new total.
    pub fn record(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Executions so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
