//! End to end: the client paired with the verifier through faults, peers nobody here
//! wrote (PyPI, npm), the example servers, the queue consumers on real brokers.
//!
//! One test binary per wing of the tests (links once, builds the support tree once);
//! each file below is a module, gated by the features it needs.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "test-util")]
mod example_servers;
#[cfg(feature = "test-util")]
mod explore;
mod fault_proxy;
#[cfg(feature = "test-util")]
mod interop;
mod pairing;
#[cfg(all(feature = "test-util", feature = "postgres"))]
mod queues_nats;
#[cfg(all(feature = "test-util", feature = "postgres"))]
mod queues_rabbitmq;
mod vendor_dialects;
