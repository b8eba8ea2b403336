//! The verifier: the engine, the semantics table, the tower layer, streaming, gRPC, the
//! admin service, telemetry, the transactional inbox.
//!
//! One test binary per wing of the tests (links once, builds the support tree once);
//! each file below is a module, gated by the features it needs.

#[path = "../support/mod.rs"]
mod support;

#[cfg(all(feature = "test-util", feature = "admin"))]
mod admin;
mod engine;
#[cfg(feature = "test-util")]
mod grpc;
#[cfg(all(feature = "test-util", feature = "postgres", feature = "sqlite"))]
mod inbox;
mod layer_tower;
#[cfg(all(feature = "test-util", feature = "redis"))]
mod quota;
mod server_semantics;
#[cfg(feature = "test-util")]
mod streaming;
#[cfg(all(feature = "test-util", feature = "metrics", feature = "redis"))]
mod telemetry;
