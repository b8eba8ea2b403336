//! The stores against the real databases: the conformance suite (and that it catches
//! broken stores), each store, several instances, outages, failover.
//!
//! One test binary per wing of the tests (links once, builds the support tree once);
//! each file below is a module, gated by the features it needs.

#[path = "../support/mod.rs"]
mod support;

#[cfg(all(
    feature = "test-util",
    feature = "redis",
    feature = "postgres",
    feature = "sqlite"
))]
mod charge_server_stores;
#[cfg(feature = "test-util")]
mod conformance_catches;
#[cfg(feature = "test-util")]
mod memory_bound;
#[cfg(all(feature = "test-util", feature = "redis"))]
mod redis_failover;
#[cfg(all(feature = "test-util", feature = "redis"))]
mod redis_memory;
#[cfg(all(
    feature = "test-util",
    feature = "redis",
    feature = "postgres",
    feature = "sqlite"
))]
mod store_conformance;
#[cfg(all(feature = "test-util", feature = "dynamodb"))]
mod store_dynamodb;
#[cfg(all(feature = "test-util", feature = "redis", feature = "postgres"))]
mod store_multi_instance;
#[cfg(all(feature = "test-util", feature = "mysql"))]
mod store_mysql;
#[cfg(all(feature = "test-util", feature = "redis", feature = "postgres"))]
mod store_outage;
#[cfg(all(feature = "test-util", feature = "postgres"))]
mod store_postgres;
#[cfg(all(feature = "test-util", feature = "redis"))]
mod store_redis;
#[cfg(all(feature = "test-util", feature = "redis"))]
mod store_redis_quota;
#[cfg(all(feature = "test-util", feature = "sqlite"))]
mod store_sqlite;
#[cfg(all(
    feature = "test-util",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]
mod store_sweep;
