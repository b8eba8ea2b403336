//! A record's bytes in Redis (the layout of [`RedisStore`](super::RedisStore)): what a
//! claim writes, and decoding what the scripts and commands answer.

use std::time::{Duration, SystemTime};

use ::redis::Value;
use bytes::Bytes;

use crate::store::{
    Claim, ClaimRequest, FencingToken, RecordId, RecordInfo, RecordState, StoreError, clamp_forever,
};

/// Bytes before the fingerprint of a record: `P` (in progress) or `C` (completed), the
/// claim's token (32 hex digits), its retention (13 digits), `L` and its lease or `C`
/// and its creation time (13 digits), the fingerprint's length (10 digits).
pub(super) const HEAD: usize = 70;

pub(super) fn fenced_unless(written: bool) -> Result<(), StoreError> {
    if written {
        Ok(())
    } else {
        Err(StoreError::fenced())
    }
}

/// A lease or retention in milliseconds, "forever" held to 100 years (13 decimal
/// digits, the width of the record's fields; Lua numbers stay exact integers).
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(clamp_forever(d).as_millis()).unwrap_or(u64::MAX)
}

/// One record as stored (the layout of [`RedisStore`]).
pub(super) struct Record {
    completed: bool,
    retention: u64,
    /// `Err(lease)` while the claim's time is derived from the key's expiry.
    created: Result<u64, u64>,
    fingerprint: Bytes,
    /// What follows the fingerprint: the payload of a completed record read whole.
    payload: Bytes,
}

/// The value of a new in-progress record.
pub(super) fn progress_value(req: &ClaimRequest<'_>) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEAD + req.fingerprint.len());
    v.extend_from_slice(
        format!(
            "P{}{:013}L{:013}{:010}",
            req.token.to_hex(),
            millis(req.retention),
            millis(req.lease),
            req.fingerprint.len()
        )
        .as_bytes(),
    );
    v.extend_from_slice(req.fingerprint);
    v
}

/// `P` and the token: the head of the record the token holds.
pub(super) fn holder(token: FencingToken) -> String {
    format!("P{}", token.to_hex())
}

pub(super) fn corrupt_record() -> StoreError {
    StoreError::corrupt(
        "a Redis record has an unexpected layout (written by another program, or by the hash layout of an earlier version)",
    )
}

pub(super) fn number(v: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(corrupt_record)
}

pub(super) fn decode_record(bytes: &Bytes) -> Result<Record, StoreError> {
    if bytes.len() < HEAD {
        return Err(corrupt_record());
    }
    let completed = match bytes[0] {
        b'P' => false,
        b'C' => true,
        _ => return Err(corrupt_record()),
    };
    let at = number(&bytes[47..60])?;
    let created = match bytes[46] {
        b'L' => Err(at),
        b'C' => Ok(at),
        _ => return Err(corrupt_record()),
    };
    let len = usize::try_from(number(&bytes[60..HEAD])?).map_err(|_| corrupt_record())?;
    let end = HEAD
        .checked_add(len)
        .filter(|end| *end <= bytes.len())
        .ok_or_else(corrupt_record)?;
    Ok(Record {
        completed,
        retention: number(&bytes[33..46])?,
        created,
        fingerprint: bytes.slice(HEAD..end),
        payload: bytes.slice(end..),
    })
}

pub(super) fn bulk(v: Option<Value>) -> Result<Bytes, StoreError> {
    match v {
        Some(Value::BulkString(b)) => Ok(Bytes::from(b)),
        _ => Err(corrupt_record()),
    }
}

/// Reads the reply of the inspect script for record `id`.
pub(super) fn decode_info(v: Value, id: RecordId) -> Result<Option<RecordInfo>, StoreError> {
    let bad = || StoreError::corrupt("Redis inspect script returned an unexpected reply");
    let mut items = match v {
        Value::Nil => return Ok(None),
        Value::Array(items) => items.into_iter(),
        _ => return Err(bad()),
    };
    let head = bulk(items.next())?;
    let mut int = || match items.next() {
        Some(Value::Int(n)) => Ok(u64::try_from(n).unwrap_or(0)),
        _ => Err(bad()),
    };
    let (expire_at, payload_len) = (int()?, int()?);
    let time = |ms: u64| {
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let record = decode_record(&head)?;
    let (state, expires, payload_len) = if record.completed {
        (RecordState::Completed, expire_at, Some(payload_len))
    } else {
        (
            RecordState::InProgress,
            expire_at.saturating_sub(record.retention),
            None,
        )
    };
    // A derived creation time: before any renewal, the lease ends at the key's expiry
    // minus the retention.
    let lease_end = expire_at.saturating_sub(record.retention);
    let created = record
        .created
        .unwrap_or_else(|lease| lease_end.saturating_sub(lease));
    Ok(Some(RecordInfo {
        id,
        state,
        fingerprint: record.fingerprint,
        created: time(created),
        expires: time(expires),
        payload_len,
    }))
}

/// What a claim found: the record (or nothing, when it wrote its own) and the key's
/// `PTTL` at that moment. `None` for an expired lease (or a key gone since).
pub(super) fn decode_found(found: Option<Bytes>, pttl: i64) -> Result<Option<Claim>, StoreError> {
    let Some(found) = found else {
        return Ok(Some(Claim::Acquired { takeover: false }));
    };
    let record = decode_record(&found)?;
    if record.completed {
        return Ok(Some(Claim::Completed {
            fingerprint: record.fingerprint,
            payload: record.payload,
        }));
    }
    let left = u64::try_from(pttl)
        .unwrap_or(0)
        .saturating_sub(record.retention);
    Ok((left > 0).then(|| Claim::InProgress {
        fingerprint: record.fingerprint,
        lease_remaining: Duration::from_millis(left),
    }))
}

pub(super) fn decode_takeover(v: Value) -> Result<Claim, StoreError> {
    let bad = || StoreError::corrupt("Redis takeover script returned an unexpected reply");
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let mut items = items.into_iter();
    match items.next() {
        Some(Value::Int(1)) => Ok(Claim::Acquired {
            takeover: matches!(items.next(), Some(Value::Int(1))),
        }),
        Some(Value::Int(3)) => decode_found(Some(bulk(items.next())?), 0)?.ok_or_else(bad),
        Some(Value::Int(2)) => {
            let record = decode_record(&bulk(items.next())?)?;
            let Some(Value::Int(left)) = items.next() else {
                return Err(bad());
            };
            Ok(Claim::InProgress {
                fingerprint: record.fingerprint,
                lease_remaining: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
            })
        }
        _ => Err(bad()),
    }
}
