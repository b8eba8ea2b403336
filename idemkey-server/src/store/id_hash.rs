//! The hash of a [`RecordId`](super::RecordId) in the in-process maps keyed by it (the
//! memory store's records, the local waiters of settlements).
//!
//! A record id is already a SHA-256 digest, so the map's default SipHash (about 300
//! instructions for its 32 bytes, three to four times per fresh request) buys nothing
//! but resistance to flooding. That resistance still matters: anyone who picks keys can
//! grind them until their digests share the low bits a map indexes by. So the digest is
//! not used as it is: the maps hash it with [`foldhash`]'s fast hasher, seeded at random
//! per map (a folded 64x64->128-bit multiply of the digest's words with the seed, a few
//! instructions per word), which an attacker who does not know the seed cannot steer
//! into one bucket.

/// The maps' [`BuildHasher`](std::hash::BuildHasher): one random seed per map.
pub(crate) type IdHashBuilder = foldhash::fast::RandomState;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RecordId;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    #[test]
    fn ids_spread_over_the_low_bits_a_map_indexes_by() {
        let b = IdHashBuilder::default();
        // 4096 ids into 1024 buckets by the low 10 bits: a fair hash fills most of them
        // (about 1006 expected); a constant or a broken mix fills a handful.
        let buckets: HashSet<u64> = (0..4096)
            .map(|i| b.hash_one(RecordId::new("", &format!("key-{i}"))) & 1023)
            .collect();
        assert!(buckets.len() > 950, "{} buckets of 1024", buckets.len());
    }

    #[test]
    fn ids_that_share_their_low_bytes_still_spread() {
        // What a flooder grinds for: digests equal in the bytes an unkeyed hash would
        // index by. The seeded mix still spreads them.
        let b = IdHashBuilder::default();
        let buckets: HashSet<u64> = (0..4096_u32)
            .map(|i| {
                let mut d = [0_u8; 32];
                d[28..].copy_from_slice(&i.to_be_bytes());
                b.hash_one(RecordId::from_bytes(d)) & 1023
            })
            .collect();
        assert!(buckets.len() > 950, "{} buckets of 1024", buckets.len());
    }

    #[test]
    fn maps_of_two_stores_hash_differently() {
        let id = RecordId::new("tenant", "key");
        let (a, b) = (IdHashBuilder::default(), IdHashBuilder::default());
        assert_ne!(a.hash_one(id), b.hash_one(id));
        assert_eq!(a.hash_one(id), a.hash_one(id));
    }
}
