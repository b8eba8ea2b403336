//! The connection: one server through a reconnecting manager, or a cluster; and how a
//! failed call or connection becomes a [`StoreError`].

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use crate::store::StoreError;

/// One server through a reconnecting manager, or a cluster.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// A failed connection to the Redis at `at` (host:port): a configuration error when
/// Redis answered the connection's setup with a refusal (a wrong password or user, a
/// database number out of range) or the client's settings are invalid; otherwise
/// unavailable, naming the address tried.
pub(super) fn connect_failed(at: &str, e: RedisError) -> StoreError {
    match e.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig | ErrorKind::Server(_) => {
            StoreError::configuration_from(
                format!(
                    "Redis at {at} refused the connection's setup ({e}); check the password, \
                     user and database number in the URL (a database is 0 to one less than \
                     the server's `databases` setting, 16 by default)"
                ),
                e,
            )
        }
        _ => StoreError::unavailable(format!("Redis: connecting to {at} failed ({e})"), e),
    }
}

/// A call that failed: unavailable, and when Redis refused the write because it is full
/// (`OOM`), a message that says so and what to do.
pub(super) fn unavailable(what: &str, e: RedisError) -> StoreError {
    if super::memory::is_oom(&e) {
        return super::memory::full(what, e);
    }
    StoreError::unavailable(format!("Redis: {what} failed ({e})"), e)
}
