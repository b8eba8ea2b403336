//! The tower layer, in tower-http's layout: [`IdempotencyLayer`] (its configuration, in
//! `layer.rs`), [`Idempotency`] (the service and the pipeline each request goes
//! through, in `service.rs`) and [`ResponseFuture`] (with the future that finishes a
//! handler whose caller went away, in `future.rs`). The bodies it hands on are in
//! [`body`](super::body), stored responses beside [`record`](super::record).

mod future;
#[allow(clippy::module_inception)] // tower-http's layout: `layer/layer.rs` is the Layer
mod layer;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::{
    DEFAULT_BODY_LIMIT, DEFAULT_STORED_RESPONSE_LIMIT, IdempotencyLayer, KeyRequirement,
};
pub use self::service::Idempotency;
