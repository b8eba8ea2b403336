//! Payloads over the item limit: kept in chunk items of their own (256 KiB each,
//! written before the record points at them, read in parallel, deleted after).

use aws_sdk_dynamodb::error::DisplayErrorContext;
use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, TryStreamExt, stream};

use super::item::{Item, blob, num};
use super::{CHUNK, CHUNK_CONCURRENCY, DynamoStore, attr};
use crate::store::{RecordId, StoreError};

/// The key of chunk `i` of the completion `write` of record `id` (52 bytes, so it never
/// meets a record's 32-byte key).
pub(super) fn chunk_key(id: &[u8], write: &[u8], i: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(id.len() + write.len() + 4);
    key.extend_from_slice(id);
    key.extend_from_slice(write);
    key.extend_from_slice(&u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes());
    key
}

impl DynamoStore {
    /// The payload of a completed record: inline, or read from its chunks (`None` when
    /// a chunk is gone).
    pub(super) async fn payload(&self, item: &Item<'_>) -> Result<Option<Bytes>, StoreError> {
        if item.0.contains_key(attr::PAYLOAD) {
            return item.bytes(attr::PAYLOAD).map(Some);
        }
        let (id, write) = (item.bytes(attr::ID)?, item.bytes(attr::WRITE)?);
        let (count, len) = (item.num(attr::CHUNKS)?, item.num(attr::PAYLOAD_LEN)?);
        let chunks: Vec<Option<Bytes>> = stream::iter(0..count)
            .map(|i| {
                let key = chunk_key(&id, &write, i);
                async move {
                    match self.get(&key).await? {
                        Some(chunk) => Item(&chunk).bytes(attr::CHUNK).map(Some),
                        None => Ok(None),
                    }
                }
            })
            .buffered(CHUNK_CONCURRENCY)
            .try_collect()
            .await?;
        let mut payload = BytesMut::with_capacity(usize::try_from(len).unwrap_or(0));
        for chunk in chunks {
            match chunk {
                Some(chunk) => payload.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
        if payload.len() as u64 != len {
            return Err(StoreError::corrupt(format!(
                "DynamoDB: a payload of {len} bytes came back from its chunks as {} bytes",
                payload.len()
            )));
        }
        Ok(Some(payload.freeze()))
    }

    pub(super) async fn write_chunks(
        &self,
        id: &RecordId,
        write: &[u8; 16],
        payload: &Bytes,
        until: u64,
    ) -> Result<(), StoreError> {
        // Owned slices: a stream of borrowed chunks is not `Send` in an async trait.
        let chunks = (0..payload.len().div_ceil(CHUNK)).map(|i| {
            (
                i,
                payload.slice(i * CHUNK..payload.len().min((i + 1) * CHUNK)),
            )
        });
        stream::iter(chunks)
            .map(|(i, chunk)| async move {
                self.client
                    .put_item()
                    .table_name(&self.table)
                    .item(attr::ID, blob(&chunk_key(id.as_bytes(), write, i as u64)))
                    .item(attr::CHUNK, blob(&chunk))
                    .item(attr::TTL, num(until.div_ceil(1000)))
                    .send()
                    .await
                    .map(drop)
                    .map_err(|e| self.failed("writing a payload chunk", e))
            })
            .buffer_unordered(CHUNK_CONCURRENCY)
            .try_collect::<()>()
            .await
    }

    /// Deletes the chunk items of a completion, best effort (they expire by TTL anyway).
    pub(super) async fn delete_chunks(&self, id: &[u8], write: &[u8], count: u64) {
        stream::iter(0..count)
            .map(|i| async move {
                let deleted = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .key(attr::ID, blob(&chunk_key(id, write, i)))
                    .send()
                    .await;
                if let Err(e) = deleted {
                    tracing::debug!(error = %DisplayErrorContext(&e), "a payload chunk is left to expire by TTL");
                }
            })
            .buffer_unordered(CHUNK_CONCURRENCY)
            .collect::<()>()
            .await;
    }
}
