//! The operator-facing record view of store contract v2, for the stores that implement
//! v2's `inspect`, `force_release` and `list_in_progress` as inherent functions until the
//! `Store` trait has them (then this file gives way to the trait's own types, which have
//! the same fields).

use std::time::SystemTime;

use bytes::Bytes;

use super::RecordId;

/// One record as a store holds it (for operators: inspect, stuck keys).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))] // read by tests until the Store trait returns it
pub(crate) struct RecordInfo {
    pub(crate) id: RecordId,
    pub(crate) state: RecordState,
    /// The fingerprint the current claim (or the completed request) was made with.
    pub(crate) fingerprint: Bytes,
    /// When the current claim was made, by the store's clock, as wall-clock time.
    pub(crate) created: SystemTime,
    /// End of the lease (in progress) or of the retention (completed).
    pub(crate) expires: SystemTime,
    /// Size of the stored payload in bytes (completed records), `None` in progress.
    pub(crate) payload_len: Option<u64>,
}

/// Whether a record is held by a claim or completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordState {
    InProgress,
    Completed,
}
