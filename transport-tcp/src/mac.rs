//! SipHash-2-4 (Aumasson & Bernstein), used as a keyed MAC so a connecting
//! rank proves it knows the communicator's secret without sending it.

fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-2-4 of `msg` under the 128-bit `key`.
pub(crate) fn siphash24(key: &[u8; 16], msg: &[u8]) -> u64 {
    let k0 = u64::from_le_bytes(key[0..8].try_into().expect("8 bytes"));
    let k1 = u64::from_le_bytes(key[8..16].try_into().expect("8 bytes"));
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let chunks = msg.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        let m = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        v[3] ^= m;
        round(&mut v);
        round(&mut v);
        v[0] ^= m;
    }
    let mut b = (msg.len() as u64) << 56;
    for (i, &byte) in rem.iter().enumerate() {
        b |= u64::from(byte) << (8 * i);
    }
    v[3] ^= b;
    round(&mut v);
    round(&mut v);
    v[0] ^= b;
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// A 128-bit tag: two SipHash-2-4 runs over `domain`-separated copies of `msg`.
pub(crate) fn mac128(key: &[u8; 16], domain: u8, msg: &[u8]) -> [u8; 16] {
    let mut buf = Vec::with_capacity(msg.len() + 2);
    buf.extend_from_slice(&[domain, 0]);
    buf.extend_from_slice(msg);
    let a = siphash24(key, &buf);
    buf[1] = 1;
    let b = siphash24(key, &buf);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

/// Compares two tags without an early exit.
pub(crate) fn tags_equal(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> [u8; 16] {
        std::array::from_fn(|i| i as u8)
    }

    #[test]
    fn reference_vectors() {
        // From the SipHash paper / reference implementation (vectors.h).
        assert_eq!(siphash24(&key(), &[]), 0x726f_db47_dd0e_0e31);
        let msg: Vec<u8> = (0u8..15).collect();
        assert_eq!(siphash24(&key(), &msg), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn mac_depends_on_key_domain_and_message() {
        let k = key();
        let mut k2 = k;
        k2[15] ^= 1;
        let t = mac128(&k, b'H', b"hello");
        assert!(tags_equal(&t, &mac128(&k, b'H', b"hello")));
        assert!(!tags_equal(&t, &mac128(&k2, b'H', b"hello")));
        assert!(!tags_equal(&t, &mac128(&k, b'A', b"hello")));
        assert!(!tags_equal(&t, &mac128(&k, b'H', b"hellp")));
    }
}
