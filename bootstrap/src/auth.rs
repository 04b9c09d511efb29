//! The few cryptographic primitives sncl needs, from maintained crates
//! (`sha2`, `hmac`, `subtle`, `getrandom`) rather than hand-written code.
//!
//! * [`sha256`] / [`sha256_fields`]: hashes for ids and derived secrets
//!   (not for authentication).
//! * [`hmac_sha256`] / [`verify_hmac_sha256`]: the tags of the challenge–response
//!   handshakes (the bootstrap store's and the TCP transport's), so that a
//!   shared secret is proven without ever crossing the wire. Verification
//!   runs in constant time.
//! * [`nonce`]: fresh random challenges for those handshakes.
//!
//! Every function takes its message as a list of parts that are hashed as
//! their plain concatenation (no separators): callers either use parts of
//! fixed length or [`sha256_fields`], which length-prefixes each one.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Size of a SHA-256 digest and of an HMAC-SHA-256 tag.
pub const DIGEST_BYTES: usize = 32;
/// Size of a handshake nonce from [`nonce`].
pub const NONCE_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// SHA-256 (FIPS 180-4) of the concatenation of `parts`.
pub fn sha256(parts: &[&[u8]]) -> [u8; DIGEST_BYTES] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// SHA-256 of `fields`, each preceded by its length as a little-endian
/// `u64`, so that different splits of the same bytes (`"ab" + "c"` and
/// `"a" + "bc"`) hash differently.
pub fn sha256_fields(fields: &[&[u8]]) -> [u8; DIGEST_BYTES] {
    let mut h = Sha256::new();
    for f in fields {
        h.update((f.len() as u64).to_le_bytes());
        h.update(f);
    }
    h.finalize().into()
}

fn keyed(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes keys of any length (longer ones are hashed first).
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
    for p in parts {
        mac.update(p);
    }
    mac
}

/// HMAC-SHA-256 (RFC 2104) under `key` of the concatenation of `parts`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; DIGEST_BYTES] {
    keyed(key, parts).finalize().into_bytes().into()
}

/// Whether `tag` is the HMAC-SHA-256 under `key` of the concatenation of
/// `parts`. The comparison takes the same time wherever the first
/// difference is; a `tag` of the wrong length is simply refused.
pub fn verify_hmac_sha256(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    tag.len() == DIGEST_BYTES && keyed(key, parts).verify_slice(tag).is_ok()
}

/// Compares two byte strings (e.g. MACs computed elsewhere) without an early
/// exit on the first difference. Their lengths are not secret: different
/// lengths compare unequal at once.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// A fresh random nonce from the operating system's generator.
///
/// Fails only where the system has no usable random source; the error says
/// so.
pub fn nonce() -> std::io::Result<[u8; NONCE_BYTES]> {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n).map_err(|e| {
        std::io::Error::other(format!(
            "the system random generator failed while drawing a handshake nonce: {e}"
        ))
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LaunchEnv, UniqueId};

    fn hex(b: &[u8]) -> String {
        hex::encode(b)
    }

    #[test]
    fn sha256_vectors() {
        // FIPS 180-2 appendix B and the empty string.
        assert_eq!(
            hex(&sha256(&[])),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(&[b"abc"])),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&sha256(&[
                b"abcdbcdecdefdefgefghfghighij",
                b"hijkijkljklmklmnlmnomnopnopq"
            ])),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let million = vec![b'a'; 1_000_000];
        let chunks: Vec<&[u8]> = million.chunks(777).collect();
        assert_eq!(
            hex(&sha256(&chunks)),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn sha256_fields_prefixes_lengths() {
        assert_ne!(sha256_fields(&[b"ab", b"c"]), sha256_fields(&[b"a", b"bc"]));
        assert_eq!(
            sha256_fields(&[b"ab", b"c"]),
            sha256(&[&2u64.to_le_bytes(), b"ab", &1u64.to_le_bytes(), b"c"])
        );
    }

    #[test]
    fn hmac_vectors() {
        // RFC 4231 test cases 1 and 2.
        let t1 = hmac_sha256(&[0x0b; 20], &[b"Hi There"]);
        assert_eq!(
            hex(&t1),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        let t2 = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex(&t2),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: key longer than the block.
        let long_key = [0xaa; 131];
        let msg: &[u8] = b"Test Using Larger Than Block-Size Key - Hash Key First";
        assert_eq!(
            hex(&hmac_sha256(&long_key, &[msg])),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );

        assert!(verify_hmac_sha256(&[0x0b; 20], &[b"Hi ", b"There"], &t1));
        assert!(!verify_hmac_sha256(&[0x0b; 20], &[b"Hi there"], &t1));
        assert!(!verify_hmac_sha256(&[0x0c; 20], &[b"Hi There"], &t1));
        let mut flipped = t1;
        flipped[31] ^= 1;
        assert!(!verify_hmac_sha256(&[0x0b; 20], &[b"Hi There"], &flipped));
        assert!(!verify_hmac_sha256(&[0x0b; 20], &[b"Hi There"], &t1[..16]));
        assert!(!verify_hmac_sha256(&[0x0b; 20], &[b"Hi There"], &[]));

        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }

    #[test]
    fn nonces_differ() {
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(a, b);
    }

    /// Values computed by the hand-written SHA-256 this module replaced:
    /// derived secrets, unique ids and comm ids must not change with it.
    #[test]
    fn derived_values_unchanged() {
        let vars: std::collections::HashMap<&str, &str> = [
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "job42"),
        ]
        .into_iter()
        .collect();
        let e = LaunchEnv::from_vars(&|k| vars.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(hex(&e.secret), "cff43001e3bfd5c51c389651535bda24");

        let id = UniqueId {
            root: "10.0.0.1:29500".parse().unwrap(),
            secret: *b"0123456789abcdef",
        };
        assert_eq!(id.comm_id(), 0x766f_9fba_4f89_6536);
        let h = id.to_hex();
        assert_eq!(
            &h[..128],
            "534e434c0104733c0a000001000000000000000000000000000000000000000030313233\
             3435363738396162636465660000000019e292730038e8f200000000"
        );
        assert_eq!(UniqueId::from_hex(&h).unwrap(), id);

        let id6 = UniqueId {
            root: "[fe80::1%3]:1234".parse().unwrap(),
            secret: [7; 16],
        };
        assert_eq!(id6.comm_id(), 0x8729_e67c_56c0_e16b);
        assert_eq!(&id6.to_hex()[96..128], "0000000092c623aa14c233c500000000");
    }
}
