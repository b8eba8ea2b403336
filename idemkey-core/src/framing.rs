//! Length-prefixed framing, the one way idemkey joins fields before hashing them:
//! each field is its length (a big-endian `u64`) and then its bytes, so that no two
//! different sequences of fields give the same bytes (`("ab", "c")` and `("a", "bc")`
//! differ).

/// Where framed fields go: a buffer, or a hash.
pub trait Sink {
    /// Takes the next bytes.
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

#[cfg(feature = "sha2")]
impl Sink for sha2::Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        sha2::Digest::update(self, bytes);
    }
}

/// Appends one field: its length, then its bytes.
pub fn field(sink: &mut impl Sink, bytes: &[u8]) {
    sink.put(&(bytes.len() as u64).to_be_bytes());
    sink.put(bytes);
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields_cannot_shift_into_each_other() {
        let framed = |fields: &[&str]| {
            let mut out = Vec::new();
            for f in fields {
                super::field(&mut out, f.as_bytes());
            }
            out
        };
        assert_ne!(framed(&["ab", "c"]), framed(&["a", "bc"]));
        assert_eq!(framed(&["a"]), b"\0\0\0\0\0\0\0\x01a");
    }
}
