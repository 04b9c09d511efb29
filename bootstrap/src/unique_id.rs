//! [`UniqueId`]: what rank 0 hands to every other rank (like
//! `ncclUniqueId`): the root's address and the job secret.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::auth::sha256;
use comm_core::{Error, Result};

/// Size of [`UniqueId::to_bytes`], the same as `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

const MAGIC: &[u8; 4] = b"SNCL";
const VERSION: u8 = 1;

/// Identifies one job's rendezvous: where the root's store listens and the
/// secret connections must prove they know.
///
/// Rank 0 creates it ([`UniqueId::new`]), passes it to the other ranks out of
/// band (as 128 bytes through the C ABI, or as hex), and every rank
/// connects with it. `Debug` does not print the secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    /// The root's store address.
    pub root: SocketAddr,
    /// The shared secret.
    pub secret: [u8; 16],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UniqueId")
            .field("root", &self.root)
            .field("secret", &"<redacted>")
            .field("comm_id", &format_args!("{:016x}", self.comm_id()))
            .finish()
    }
}

fn bad(detail: impl std::fmt::Display) -> Error {
    Error::Config(format!(
        "invalid sncl unique id: {detail}; pass the bytes (or hex) that rank 0's \
         UniqueId::to_bytes / ncclGetUniqueId produced, unchanged, to every rank"
    ))
}

impl UniqueId {
    /// A unique id for a root at `root` with a fresh random secret.
    ///
    /// Fails only if the OS random source does (reported as rank 0, the
    /// rank that creates unique ids).
    pub fn new(root: SocketAddr) -> Result<UniqueId> {
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| Error::Io {
            rank: 0,
            context: "drawing a random secret for the sncl unique id".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(UniqueId { root, secret })
    }

    /// The fixed 128-byte encoding.
    ///
    /// Layout: `"SNCL"`, version (1), address family (4 or 6), port (u16 BE),
    /// 16 address bytes (IPv4 in the first 4), IPv6 flow info and scope id
    /// (u32 BE each), 16 secret bytes, 8 bytes of SHA-256 checksum over the
    /// preceding 52 bytes, zeros.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[6..8].copy_from_slice(&self.root.port().to_be_bytes());
        match self.root {
            SocketAddr::V4(a) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&a.ip().octets());
                b[24..28].copy_from_slice(&a.flowinfo().to_be_bytes());
                b[28..32].copy_from_slice(&a.scope_id().to_be_bytes());
            }
        }
        b[32..48].copy_from_slice(&self.secret);
        let sum = sha256(&[&b[..52]]);
        b[52..60].copy_from_slice(&sum[..8]);
        b
    }

    /// Decodes [`UniqueId::to_bytes`]; rejects anything else with a
    /// [`Error::Config`] saying what is wrong.
    pub fn from_bytes(b: &[u8; UNIQUE_ID_BYTES]) -> Result<UniqueId> {
        if &b[..4] != MAGIC {
            return Err(bad(
                "it does not start with \"SNCL\" (not an sncl unique id, or all zeros)",
            ));
        }
        if b[4] != VERSION {
            return Err(bad(format!(
                "version {} (this sncl understands version {VERSION}); are all ranks running the same sncl?",
                b[4]
            )));
        }
        let sum = sha256(&[&b[..52]]);
        if b[52..60] != sum[..8] {
            return Err(bad(
                "checksum mismatch (the bytes were corrupted or truncated in transit)",
            ));
        }
        if b[60..].iter().any(|&x| x != 0) {
            return Err(bad("non-zero padding"));
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let root = match b[5] {
            4 => SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::new(b[8], b[9], b[10], b[11]),
                port,
            )),
            6 => {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&b[8..24]);
                let flow = u32::from_be_bytes([b[24], b[25], b[26], b[27]]);
                let scope = u32::from_be_bytes([b[28], b[29], b[30], b[31]]);
                SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope))
            }
            f => return Err(bad(format!("unknown address family {f}"))),
        };
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&b[32..48]);
        Ok(UniqueId { root, secret })
    }

    /// [`UniqueId::to_bytes`] as 256 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.to_bytes())
    }

    /// Parses [`UniqueId::to_hex`] (either case, surrounding whitespace
    /// ignored).
    pub fn from_hex(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() != 2 * UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "expected {} hex digits, got {}",
                2 * UNIQUE_ID_BYTES,
                s.len()
            )));
        }
        let mut b = [0u8; UNIQUE_ID_BYTES];
        decode_hex(s, &mut b).map_err(bad)?;
        UniqueId::from_bytes(&b)
    }

    /// A 64-bit id of this job's communicator: a hash (SHA-256, truncated) of
    /// root address and secret. Identical in every process given the same
    /// unique id; use it to tag logs and to check ranks joined the same job.
    pub fn comm_id(&self) -> u64 {
        let bytes = self.to_bytes();
        let h = sha256(&[b"sncl-comm-id", &bytes[..48]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&h[..8]);
        u64::from_le_bytes(a)
    }

    /// The root's IP.
    pub fn root_ip(&self) -> IpAddr {
        self.root.ip()
    }
}

/// Decodes hex digits into `out` (whose length must be half of `s`'s).
pub(crate) fn decode_hex(s: &str, out: &mut [u8]) -> std::result::Result<(), String> {
    if s.len() != 2 * out.len() {
        return Err(format!(
            "expected {} hex digits, got {}",
            2 * out.len(),
            s.len()
        ));
    }
    hex::decode_to_slice(s, out).map_err(|e| match e {
        hex::FromHexError::InvalidHexCharacter { c, .. } => format!("{c:?} is not a hex digit"),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_hex_round_trip() {
        for root in [
            "10.0.0.1:29501".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 29501, 7, 3)),
            "[::1]:1".parse().unwrap(),
        ] {
            let id = UniqueId::new(root).unwrap();
            assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
            let hex = id.to_hex();
            assert_eq!(hex.len(), 256);
            assert_eq!(UniqueId::from_hex(&hex).unwrap(), id);
            assert_eq!(
                UniqueId::from_hex(&format!(" {} \n", hex.to_uppercase())).unwrap(),
                id
            );
            assert!(!format!("{id:?}").contains(&format!("{:?}", id.secret)));
        }
    }

    #[test]
    fn secrets_differ_and_comm_id_is_stable() {
        let root: SocketAddr = "10.0.0.1:29501".parse().unwrap();
        let a = UniqueId::new(root).unwrap();
        let b = UniqueId::new(root).unwrap();
        assert_ne!(a.secret, b.secret);
        assert_ne!(a.comm_id(), b.comm_id());
        let fixed = UniqueId {
            root,
            secret: *b"0123456789abcdef",
        };
        // Pinned: must never change across processes, builds or versions.
        assert_eq!(fixed.comm_id(), fixed.comm_id());
        assert_eq!(format!("{:016x}", fixed.comm_id()), PINNED_COMM_ID);
    }

    const PINNED_COMM_ID: &str = "3a8fa071b01a1511";

    #[test]
    fn rejects_garbage() {
        let id = UniqueId::new("1.2.3.4:5".parse().unwrap()).unwrap();
        let mut b = id.to_bytes();
        b[40] ^= 1;
        assert!(UniqueId::from_bytes(&b)
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
        assert!(UniqueId::from_hex("abc").is_err());
        let mut h = id.to_hex();
        h.replace_range(0..1, "g");
        assert!(UniqueId::from_hex(&h)
            .unwrap_err()
            .to_string()
            .contains("hex digit"));
    }
}
