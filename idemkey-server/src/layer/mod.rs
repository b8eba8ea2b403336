//! The tower layer, in tower-http's layout: [`IdempotencyLayer`] (its setters, in
//! `layer.rs`; what they build, the runtime configuration every request shares, in
//! `config.rs`), [`Idempotency`] (the service and the pipeline each request goes
//! through, in `service.rs`) and [`ResponseFuture`] (with the future that finishes a
//! handler whose caller went away, in `future.rs`). The bodies it hands on are in
//! [`body`](super::body), stored responses beside [`record`](super::record); the tee
//! that streams a response while it copies it to the record is in `tee.rs`, gRPC's
//! particulars beside the bodies (`server/grpc.rs`).

mod config;
mod future;
#[allow(clippy::module_inception)] // tower-http's layout: `layer/layer.rs` is the Layer
mod layer;
mod service;
mod tee;

pub use self::config::KeyRequirement;
pub use self::future::ResponseFuture;
pub use self::layer::IdempotencyLayer;
pub use self::service::Idempotency;
