//! The hash of a [`RecordId`](super::RecordId) in the in-process maps keyed by it (the
//! memory store's records, the local waiters of settlements).
//!
//! A record id is already a SHA-256 digest, so the map's default SipHash (about 300
//! instructions for its 32 bytes, three to four times per fresh request) buys nothing
//! but resistance to flooding. That resistance still matters: anyone who picks keys can
//! grind them until their digests share the low bits a map indexes by. So the digest is
//! not used as it is; its words are mixed with a random per-map seed by a folded
//! 64x64->128-bit multiply (foldhash's construction), which an attacker who does not
//! know the seed cannot steer into one bucket.

use std::hash::{BuildHasher, Hasher};

/// Builds [`IdHasher`]s with one random seed per map.
#[derive(Clone, Debug)]
pub(crate) struct IdHashBuilder {
    seed: [u64; 2],
}

impl Default for IdHashBuilder {
    fn default() -> Self {
        // `RandomState` is std's own source of per-map randomness (seeded from the OS
        // once per thread); two of its hashes give two independent 64-bit words.
        let state = std::collections::hash_map::RandomState::new();
        let word = |n: u64| {
            let mut h = state.build_hasher();
            h.write_u64(n);
            h.finish()
        };
        Self {
            // Odd, so that no multiplier is zero.
            seed: [word(0) | 1, word(1) | 1],
        }
    }
}

impl BuildHasher for IdHashBuilder {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher {
            seed: self.seed,
            state: self.seed[1],
        }
    }
}

/// See the [module docs](self).
#[derive(Clone, Debug)]
pub(crate) struct IdHasher {
    seed: [u64; 2],
    state: u64,
}

/// The high and low halves of the 128-bit product, folded: every input bit reaches every
/// output bit.
fn fold_mul(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    // Truncation intended: the low half.
    #[allow(clippy::cast_possible_truncation)]
    let low = full as u64;
    low ^ (full >> 64) as u64
}

impl IdHasher {
    fn mix(&mut self, word: u64) {
        self.state = fold_mul(self.state ^ word, self.seed[0]);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length tags the tail, so that "a" and "a\0" differ.
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        fold_mul(self.state, self.seed[1])
    }
}

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
