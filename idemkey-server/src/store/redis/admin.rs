//! The operators' side of the Redis store: every record under the prefix, by `SCAN` on
//! the server or on every primary of a cluster, and reading one record
//! ([`Store::list_in_progress`](crate::store::Store::list_in_progress),
//! [`Store::inspect`](crate::store::Store::inspect)).

use std::collections::HashSet;

use ::redis::Value;
use ::redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};

use super::RedisStore;
use super::codec::decode_info;
use super::conn::{Conn, unavailable};
use crate::store::{RecordId, RecordInfo, StoreError};

/// How many keys one `SCAN` call asks a server to look at.
pub(super) const SCAN_COUNT: usize = 1000;
/// How many records [`Store::list_in_progress`] reads at once.
pub(super) const READS_IN_FLIGHT: usize = 64;

impl RedisStore {
    /// Every key under the prefix (each once), by `SCAN` on the server or on every
    /// primary of the cluster.
    pub(super) async fn scan_keys(&self) -> Result<HashSet<String>, StoreError> {
        let err = |e| unavailable("listing records (SCAN)", e);
        let bad = |e: ::redis::ParsingError| {
            StoreError::corrupt(format!("Redis Cluster answered SCAN unexpectedly: {e}"))
        };
        let scan = |cursor: u64| {
            let mut cmd = ::redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(self.pattern())
                .arg("COUNT")
                .arg(SCAN_COUNT);
            cmd
        };
        let mut keys = HashSet::new();
        match &self.conn {
            Conn::Single(c) => {
                let mut conn = c.clone();
                let mut cursor = 0;
                loop {
                    let (next, page): (u64, Vec<String>) =
                        scan(cursor).query_async(&mut conn).await.map_err(err)?;
                    keys.extend(page);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Conn::Cluster(c) => {
                let mut conn = c.clone();
                // The first page of every primary at once; then each primary on its own.
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let first = conn.route_command(scan(0), all).await.map_err(err)?;
                let Value::Map(nodes) = first else {
                    return Err(StoreError::corrupt(
                        "Redis Cluster answered SCAN with an unexpected reply",
                    ));
                };
                for (node, page) in nodes {
                    let node: String = ::redis::from_redis_value(node).map_err(bad)?;
                    let Some((host, port)) = node
                        .rsplit_once(':')
                        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                    else {
                        return Err(StoreError::corrupt(format!(
                            "Redis Cluster named a node {node:?}, not host:port"
                        )));
                    };
                    let (mut cursor, first): (u64, Vec<String>) =
                        ::redis::from_redis_value(page).map_err(bad)?;
                    keys.extend(first);
                    while cursor != 0 {
                        let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let page = conn.route_command(scan(cursor), at).await.map_err(err)?;
                        let (next, page): (u64, Vec<String>) =
                            ::redis::from_redis_value(page).map_err(bad)?;
                        keys.extend(page);
                        cursor = next;
                    }
                }
            }
        }
        Ok(keys)
    }

    /// The record at `key` (of record `id`), or `None` when the key does not exist.
    pub(super) async fn read(
        &self,
        key: String,
        id: RecordId,
    ) -> Result<Option<RecordInfo>, StoreError> {
        let reply: Value = self
            .scripts
            .inspect
            .key(key)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| unavailable("inspecting a record", e))?;
        decode_info(reply, id)
    }
}
