//! The memory store's map: records spread over a fixed number of shards, each a hash
//! map behind a lock of its own, as many as the store's bound calls for.
//!
//! A sharded map of a few shards (`DashMap` makes 4 per core) holds a shard's lock
//! while its sweep scans over millions of records at 10 million records: every claim
//! on that shard waits for the whole scan. Here the number of shards grows with
//! [`max_records`](super::MemoryStoreBuilder::max_records), so that a full store has
//! about [`RECORDS_PER_SHARD`] records in each, and the sweep
//! ([`MemoryStore::sweep_step`](super::MemoryStore)) takes one shard's lock at a time:
//! no claim waits longer than one look at one shard.
//!
//! Each shard is a [`std::collections::HashMap`], so the sweep removes with
//! [`HashMap::extract_if`] (no `unsafe`, which the crate forbids and which `DashMap`'s
//! shard access needs).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Record;
use crate::store::RecordId;
use crate::store::id_hash::IdHashBuilder;

/// The records a shard holds, on average, when the store holds its `max_records`
/// (with the number of shards a power of two, between half this and this).
pub(super) const RECORDS_PER_SHARD: u64 = 2_048;

/// The fewest shards: claims from many tasks on a small store still spread.
const MIN_SHARDS: usize = 32;

/// The most shards: 2 MiB of shard headers, about 6,000 records a shard at 100 million.
const MAX_SHARDS: usize = 16_384;

/// One shard's records.
pub(super) type Shard = HashMap<RecordId, Record, IdHashBuilder>;

/// A shard's lock on a cache line (two lines: what x86-64 fetches together) of its own,
/// so that claims on neighbouring shards do not contend for one line.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// The shards, and the hash that picks one for a record.
pub(super) struct Shards {
    shards: Box<[Padded]>,
    /// The same seeded hash as the shards' maps (one seed per store).
    hasher: IdHashBuilder,
    /// `64 - log2(shards)`.
    shift: u32,
}

/// The number of shards for a store of `max_records`: a power of two, about one per
/// [`RECORDS_PER_SHARD`] records, between [`MIN_SHARDS`] and [`MAX_SHARDS`].
pub(super) fn shard_amount(max_records: u64) -> usize {
    let wanted = usize::try_from(max_records.div_ceil(RECORDS_PER_SHARD)).unwrap_or(MAX_SHARDS);
    wanted.clamp(MIN_SHARDS, MAX_SHARDS).next_power_of_two()
}

impl Shards {
    /// Empty shards for a store of `max_records`.
    pub(super) fn for_records(max_records: u64) -> Self {
        let n = shard_amount(max_records);
        let hasher = IdHashBuilder::default();
        Self {
            shards: (0..n)
                .map(|_| Padded(Mutex::new(HashMap::with_hasher(hasher.clone()))))
                .collect(),
            hasher,
            shift: 64 - n.trailing_zeros(),
        }
    }

    /// The number of shards.
    pub(super) fn count(&self) -> usize {
        self.shards.len()
    }

    /// The shard that holds `id`, locked.
    pub(super) fn lock_for(&self, id: &RecordId) -> MutexGuard<'_, Shard> {
        self.lock(self.index(id))
    }

    /// The shard of `id`: the bits of its hash below the top 7 (the shard's map takes
    /// its control bytes from the top 7 and its bucket from the lowest bits, which must
    /// still differ within a shard).
    fn index(&self, id: &RecordId) -> usize {
        let h = self.hasher.hash_one(id);
        // Truncation intended: at most 14 bits are left.
        #[allow(clippy::cast_possible_truncation)]
        let i = (h << 7 >> self.shift) as usize;
        i
    }

    /// Shard `i` (below [`count`](Self::count)), locked. A lock poisoned by a panic in
    /// another thread is taken anyway: every change to a shard is a single map
    /// operation, so the map is whole.
    pub(super) fn lock(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The records held, one shard locked at a time.
    pub(super) fn len(&self) -> usize {
        (0..self.count()).map(|i| self.lock(i).len()).sum()
    }

    /// `true` when no shard holds a record.
    pub(super) fn is_empty(&self) -> bool {
        (0..self.count()).all(|i| self.lock(i).is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_of_shards_follows_the_bound() {
        assert_eq!(shard_amount(1), MIN_SHARDS);
        assert_eq!(shard_amount(100_000), 64);
        // The default bound: 1,000,000 records, about 1,950 a shard.
        assert_eq!(shard_amount(1_000_000), 512);
        // 10 million: about 1,220 a shard.
        assert_eq!(shard_amount(10_000_000), 8_192);
        assert_eq!(shard_amount(1_000_000_000), MAX_SHARDS);
        assert_eq!(shard_amount(u64::MAX), MAX_SHARDS);
        for n in [1, 5_000, 3_000_000, u64::MAX] {
            assert!(shard_amount(n).is_power_of_two());
        }
    }

    #[test]
    fn ids_spread_over_the_shards() {
        let shards = Shards::for_records(1_000_000);
        let mut used = vec![0_u32; shards.count()];
        for i in 0..shards.count() * 8 {
            used[shards.index(&RecordId::new("", &format!("k{i}")))] += 1;
        }
        // 8 ids a shard on average: a fair spread leaves almost none empty (e^-8).
        let empty = used.iter().filter(|n| **n == 0).count();
        assert!(empty < shards.count() / 50, "{empty} empty shards");
    }
}
