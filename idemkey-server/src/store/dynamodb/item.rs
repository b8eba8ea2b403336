//! A record as a DynamoDB item: reading its attributes back, and the attribute values
//! and clock the writes use.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;

use super::{COMPLETED, IN_PROGRESS, MAX_MS, attr};
use crate::store::{FencingToken, RecordId, RecordInfo, RecordState, StoreError};

/// A record's item, read.
pub(super) struct Item<'a>(pub(super) &'a HashMap<String, AttributeValue>);

impl Item<'_> {
    pub(super) fn get(&self, name: &str) -> Result<&AttributeValue, StoreError> {
        self.0
            .get(name)
            .ok_or_else(|| StoreError::corrupt(format!("DynamoDB: an item lacks `{name}`")))
    }

    pub(super) fn bytes(&self, name: &str) -> Result<Bytes, StoreError> {
        match self.get(name)? {
            AttributeValue::B(b) => Ok(Bytes::copy_from_slice(b.as_ref())),
            _ => Err(StoreError::corrupt(format!(
                "DynamoDB: `{name}` is not binary"
            ))),
        }
    }

    pub(super) fn num(&self, name: &str) -> Result<u64, StoreError> {
        match self.get(name)? {
            AttributeValue::N(n) => n.parse().map_err(|_| {
                StoreError::corrupt(format!("DynamoDB: `{name}` is {n:?}, not a whole number"))
            }),
            _ => Err(StoreError::corrupt(format!(
                "DynamoDB: `{name}` is not a number"
            ))),
        }
    }

    pub(super) fn state(&self) -> Result<RecordState, StoreError> {
        match self.get(attr::STATE)? {
            AttributeValue::S(s) if s == IN_PROGRESS => Ok(RecordState::InProgress),
            AttributeValue::S(s) if s == COMPLETED => Ok(RecordState::Completed),
            other => Err(StoreError::corrupt(format!(
                "DynamoDB: unknown record state {other:?}"
            ))),
        }
    }

    pub(super) fn token(&self) -> Result<FencingToken, StoreError> {
        let bytes = self.bytes(attr::TOKEN)?;
        let raw: [u8; 16] = bytes.as_ref().try_into().map_err(|_| {
            StoreError::corrupt(format!("DynamoDB: a token of {} bytes", bytes.len()))
        })?;
        Ok(FencingToken::from_bytes(raw))
    }

    pub(super) fn info(&self, id: RecordId) -> Result<RecordInfo, StoreError> {
        let state = self.state()?;
        let payload_len = match state {
            RecordState::InProgress => None,
            RecordState::Completed => Some(self.num(attr::PAYLOAD_LEN)?),
        };
        Ok(RecordInfo {
            id,
            state,
            fingerprint: self.bytes(attr::FINGERPRINT)?,
            created: UNIX_EPOCH + Duration::from_millis(self.num(attr::CREATED)?),
            expires: UNIX_EPOCH + Duration::from_millis(self.num(attr::EXPIRES)?),
            payload_len,
        })
    }
}

/// `#name` -> `name` for each attribute an expression uses.
pub(super) fn names(attrs: &[&str]) -> Option<HashMap<String, String>> {
    Some(
        attrs
            .iter()
            .map(|a| (format!("#{a}"), (*a).to_owned()))
            .collect(),
    )
}

pub(super) fn blob(b: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(b))
}

pub(super) fn num(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(super) fn string(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_owned())
}

/// This process's wall clock, in milliseconds since the Unix epoch.
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A duration in milliseconds, capped at 100 years.
pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(MAX_MS)
}
