//! FNV-1a, the workspace's one hash that every rank, process and build
//! computes alike (std's hasher is not promised to be): communicator ids
//! derived by split and shrink, tags from names, fingerprint digests,
//! device keys.

/// FNV-1a (64-bit) of `bytes`.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    /// The published FNV-1a 64 test vectors.
    #[test]
    fn published_vectors() {
        assert_eq!(super::fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(super::fnv1a(*b"foobar"), 0x8594_4171_f739_67e8);
    }
}
