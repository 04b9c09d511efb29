//! What travels with every piece of data: the communicator, the operation's
//! sequence number, the length and (when checksumming) the CRC32C; and,
//! on the first piece of each message, the operation's fingerprint, so a
//! receiver can tell a mismatched collective from a slow one. The receiver
//! checks the fingerprint once per message and the sequence number on
//! every piece; later pieces carry a short header ([`SHORT_HEADER_BYTES`]).

use crate::{DataType, ReduceOp};

/// The kind of operation, as commbench names it.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// all_reduce
    AllReduce = 1,
    /// reduce_scatter
    ReduceScatter = 2,
    /// all_gather (also all_gatherv)
    AllGather = 3,
    /// broadcast
    Broadcast = 4,
    /// reduce
    Reduce = 5,
    /// alltoall (also alltoallv)
    AllToAll = 6,
    /// gather
    Gather = 7,
    /// scatter
    Scatter = 8,
    /// point-to-point send/recv group
    SendRecv = 9,
    /// barrier
    Barrier = 10,
    /// all_gatherv (variable counts)
    AllGatherV = 11,
    /// alltoallv (variable counts)
    AllToAllV = 12,
    /// a tagged point-to-point message (sncl extension: `root` carries the
    /// tag, `count` the message's bytes; matched by tag, see the root
    /// crate's `comm::tagged`)
    Tagged = 13,
}

impl Collective {
    /// commbench's name of the operation (also used in `SNCL_ALGO`).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::SendRecv => "sendrecv",
            Collective::Barrier => "barrier",
            Collective::AllGatherV => "all_gatherv",
            Collective::AllToAllV => "alltoallv",
            Collective::Tagged => "tagged",
        }
    }

    /// The collectives with one count per rank block (no variable counts,
    /// no point-to-point, no barrier): the ones the device path runs.
    pub const UNIFORM: [Collective; 8] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
    ];

    /// Every collective.
    pub const ALL: [Collective; 13] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
        Collective::SendRecv,
        Collective::Barrier,
        Collective::AllGatherV,
        Collective::AllToAllV,
        Collective::Tagged,
    ];

    /// Whether operations of this kind run a schedule chosen by the planner
    /// (every kind but tagged point-to-point messages, which the runtime
    /// matches itself: `src/comm/tagged.rs`).
    pub fn is_scheduled(self) -> bool {
        self != Collective::Tagged
    }

    /// Parses commbench's name.
    pub fn from_name(name: &str) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether the collective has a root rank.
    pub const fn is_rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }

    /// Whether the collective reduces (takes a reduction operator).
    pub const fn is_reducing(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Numeric value back to the enum.
    pub fn from_u8(v: u8) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| *c as u8 == v)
    }
}

/// What every rank must agree on for one operation. Carried by the first
/// piece of each message and compared on receive; a difference is a
/// mismatched collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator (Sum where the collective has none).
    pub op: ReduceOp,
    /// Root rank, or -1.
    pub root: i32,
    /// The element count every rank must agree on (0 where counts vary by rank).
    pub count: u64,
    /// A digest of the call's own settings that shape its schedule (its
    /// algorithm, chunk and protocol; `sncl::CollConfig`), 0 where the call
    /// has none: ranks that pass different settings for the same call
    /// fail it as mismatched instead of running different schedules.
    pub settings: u8,
}

/// Encoded size of a [`Fingerprint`] (the last part of a full piece
/// header, and the fingerprint of a lane line).
pub const FINGERPRINT_BYTES: usize = HEADER_BYTES - SHORT_HEADER_BYTES;

impl Fingerprint {
    /// Little endian: 0 collective, 1 dtype, 2 op, 3 settings, 4..8 root,
    /// 8..16 count.
    pub fn encode(&self) -> [u8; FINGERPRINT_BYTES] {
        let mut out = [0u8; FINGERPRINT_BYTES];
        out[0] = self.collective as u8;
        out[1] = self.dtype as u8;
        out[2] = self.op as u8;
        out[3] = self.settings;
        out[4..8].copy_from_slice(&self.root.to_le_bytes());
        out[8..16].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    /// A 64-bit digest of [`Fingerprint::encode`]'s bytes (FNV-1a, never
    /// 0): the same in every process and build, for checks where the whole
    /// fingerprint does not fit (device flags, window offers).
    pub fn digest(&self) -> u64 {
        crate::hash::fnv1a(self.encode()) | 1
    }

    /// Reads what [`Fingerprint::encode`] wrote; a peer's bytes that are not
    /// a fingerprint are an error, never a panic.
    pub fn decode(b: &[u8; FINGERPRINT_BYTES]) -> Result<Fingerprint, HeaderError> {
        let [r0, r1, r2, r3] = [b[4], b[5], b[6], b[7]];
        let mut count = [0u8; 8];
        count.copy_from_slice(&b[8..16]);
        Ok(Fingerprint {
            collective: Collective::from_u8(b[0]).ok_or(HeaderError("unknown collective"))?,
            dtype: DataType::from_u8(b[1]).ok_or(HeaderError("unknown dtype"))?,
            op: ReduceOp::from_u8(b[2]).ok_or(HeaderError("unknown reduce op"))?,
            root: i32::from_le_bytes([r0, r1, r2, r3]),
            count: u64::from_le_bytes(count),
            settings: b[3],
        })
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.collective == Collective::Tagged {
            return write!(f, "tagged(tag={}, bytes={})", self.root, self.count);
        }
        write!(
            f,
            "{}(dtype={}, op={}, count={}, root={}",
            self.collective.name(),
            self.dtype.name(),
            self.op.name(),
            self.count,
            self.root
        )?;
        if self.settings != 0 {
            write!(f, ", call settings #{:02x}", self.settings)?;
        }
        f.write_str(")")
    }
}

/// Header of one piece of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PieceHeader {
    /// Communicator id (hash of the unique id and the communicator's path).
    pub comm_id: u64,
    /// Sequence number of the operation on this communicator (starts at 1).
    pub seq: u64,
    /// The operation's fingerprint: on the first piece of each message
    /// (the executor sends it where a send starts, and checks it where a
    /// receive starts); `None` on the pieces after it, whose sequence
    /// number ties them to the same operation.
    pub fingerprint: Option<Fingerprint>,
    /// Payload bytes of this piece.
    pub len: u32,
    /// CRC32C of the payload, when the sender checksums pieces
    /// (`SNCL_CHECKSUM=1`).
    ///
    /// Sending: `Some(_)` asks the transport for a checksummed piece. The
    /// transport computes the CRC32C itself, in the pass that already reads
    /// the payload (its copy into a slot or staging buffer, block by block
    /// with [`copy_checksummed`]; or just after the kernel copied the bytes,
    /// while they are in cache), and sends that value: the one given here
    /// is ignored. Receiving: the value the sender computed; the executor
    /// verifies it in the pass that writes or reduces the payload
    /// ([`CHECKSUM_BLOCK`] at a time), so an operation that fails on a
    /// mismatch may have written part of the piece (its output is then
    /// undefined, as after any failed operation).
    pub checksum: Option<u32>,
}

/// Encoded size of a [`PieceHeader`] that carries a fingerprint: the
/// largest, and the size of the fixed header area of slot transports
/// (shared memory, RDMA, device inboxes).
pub const HEADER_BYTES: usize = 48;
/// Encoded size of a [`PieceHeader`] without a fingerprint: magic, len,
/// comm_id, seq, flags and the CRC32C.
pub const SHORT_HEADER_BYTES: usize = 32;
/// Header flag (byte 24): bytes 28..32 hold the payload's CRC32C.
const FLAG_CHECKSUM: u8 = 1;
/// Header flag (byte 24): bytes 32..48 hold the fingerprint.
const FLAG_FINGERPRINT: u8 = 2;

/// The CRC32C (Castagnoli) of `data`, as [`PieceHeader::checksum`] carries
/// it. The `crc-fast` crate folds with carry-less multiplication
/// (PCLMULQDQ / VPCLMULQDQ, chosen at run time): 2.0-2.5x the `crc32c`
/// crate's SSE4.2 `crc32` instruction path on this project's x86 machines
/// (docs/perf-notes/NOTEBOOK.md §11b), and the checksum's cost is its compute.
pub fn piece_checksum(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// The block a checksumming pass works on: small enough that a block
/// read for its CRC is still in the core's L1/L2 cache when the same pass
/// copies or reduces it, so memory sees one pass over the data. A multiple
/// of every element size.
pub const CHECKSUM_BLOCK: usize = 32 << 10;

/// Extends the CRC32C `crc` (of the bytes before `data`) over `data`.
pub fn checksum_append(crc: u32, data: &[u8]) -> u32 {
    // CRC-32C's register is the finished value with its final XOR undone.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

/// Copies `src` into `dst` (equal lengths) and returns the CRC32C of the
/// bytes, in one pass: each [`CHECKSUM_BLOCK`] is checksummed and then
/// copied while it is in cache.
pub fn copy_checksummed(dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "copy_checksummed: lengths differ");
    let mut crc = Digest::new(CrcAlgorithm::Crc32Iscsi);
    for (d, s) in dst
        .chunks_mut(CHECKSUM_BLOCK)
        .zip(src.chunks(CHECKSUM_BLOCK))
    {
        crc.update(s);
        d.copy_from_slice(s);
    }
    crc.finalize() as u32
}
use crc_fast::{CrcAlgorithm, Digest};

const HEADER_MAGIC: u32 = 0x534e_434c; // "SNCL"

/// A header that does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("corrupt piece header: {0}")]
pub struct HeaderError(pub &'static str);

impl PieceHeader {
    /// The bytes [`Self::encode`] writes: [`HEADER_BYTES`] with a
    /// fingerprint, [`SHORT_HEADER_BYTES`] without.
    pub fn encoded_len(&self) -> usize {
        if self.fingerprint.is_some() {
            HEADER_BYTES
        } else {
            SHORT_HEADER_BYTES
        }
    }

    /// Writes the header into `out` (little endian) and returns its
    /// encoded length ([`Self::encoded_len`]); the rest of `out` is zeroed,
    /// so a fixed header area decodes with [`Self::decode`].
    ///
    /// Layout: 0..4 magic `"SNCL"`, 4..8 len, 8..16 comm_id, 16..24 seq,
    /// 24 flags (1: checksum, 2: fingerprint), 25..28 zero, 28..32 CRC32C
    /// (zero without checksum); with a fingerprint 32 collective, 33 dtype,
    /// 34 op, 35 zero, 36..40 root, 40..48 count.
    pub fn encode(&self, out: &mut [u8; HEADER_BYTES]) -> usize {
        out[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.comm_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        let mut flags = 0;
        if self.checksum.is_some() {
            flags |= FLAG_CHECKSUM;
        }
        if self.fingerprint.is_some() {
            flags |= FLAG_FINGERPRINT;
        }
        out[24] = flags;
        out[25..28].fill(0);
        out[28..32].copy_from_slice(&self.checksum.unwrap_or(0).to_le_bytes());
        match self.fingerprint {
            Some(fp) => {
                out[SHORT_HEADER_BYTES..].copy_from_slice(&fp.encode());
                HEADER_BYTES
            }
            None => {
                out[SHORT_HEADER_BYTES..].fill(0);
                SHORT_HEADER_BYTES
            }
        }
    }

    /// The encoded length of the header that starts with `b` (its magic
    /// and flags), before the rest has arrived: for byte streams.
    pub fn encoded_len_at(b: &[u8; SHORT_HEADER_BYTES]) -> Result<usize, HeaderError> {
        if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != HEADER_MAGIC {
            return Err(HeaderError("bad magic"));
        }
        if b[24] & !(FLAG_CHECKSUM | FLAG_FINGERPRINT) != 0 {
            return Err(HeaderError("unknown flags"));
        }
        Ok(if b[24] & FLAG_FINGERPRINT != 0 {
            HEADER_BYTES
        } else {
            SHORT_HEADER_BYTES
        })
    }

    /// Reads a header from a fixed header area ([`HEADER_BYTES`], as
    /// [`Self::encode`] fills it), rejecting anything that is not one; the
    /// area after a short header must be zero.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<PieceHeader, HeaderError> {
        let (h, n) = PieceHeader::decode_prefix(b)?;
        if b[n..].iter().any(|&x| x != 0) {
            return Err(HeaderError("reserved bytes are not zero"));
        }
        Ok(h)
    }

    /// Reads the header at the start of `b` (a byte stream: the payload may
    /// follow); returns it with its encoded length. Never panics: bytes
    /// that are not a whole header are an error.
    pub fn decode_prefix(b: &[u8]) -> Result<(PieceHeader, usize), HeaderError> {
        let short: &[u8; SHORT_HEADER_BYTES] =
            b.first_chunk().ok_or(HeaderError("truncated header"))?;
        let n = PieceHeader::encoded_len_at(short)?;
        let b = b.get(..n).ok_or(HeaderError("truncated header"))?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | u64::from(u32_at(i + 4)) << 32;
        let has_checksum = b[24] & FLAG_CHECKSUM != 0;
        if b[25..28] != [0; 3] || (!has_checksum && u32_at(28) != 0) {
            return Err(HeaderError("reserved bytes are not zero"));
        }
        let fingerprint = if n == HEADER_BYTES {
            let f = b[SHORT_HEADER_BYTES..HEADER_BYTES]
                .try_into()
                .expect("a fingerprint's bytes");
            Some(Fingerprint::decode(f)?)
        } else {
            None
        };
        let h = PieceHeader {
            checksum: has_checksum.then(|| u32_at(28)),
            comm_id: u64_at(8),
            seq: u64_at(16),
            len: u32_at(4),
            fingerprint,
        };
        Ok((h, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = PieceHeader {
            checksum: None,
            comm_id: 0xdead_beef_1234,
            seq: 77,
            len: 4096,
            fingerprint: Some(Fingerprint {
                collective: Collective::Broadcast,
                dtype: DataType::Bfloat16,
                op: ReduceOp::Max,
                root: 3,
                count: 1_000_003,
                settings: 0,
            }),
        };
        let mut b = [0u8; HEADER_BYTES];
        h.encode(&mut b);
        assert_eq!(PieceHeader::decode(&b), Ok(h));
        b[0] ^= 1;
        assert!(PieceHeader::decode(&b).is_err());
        // With a checksum: carried exactly; unknown flags are refused.
        let c = PieceHeader {
            checksum: Some(piece_checksum(b"sncl")),
            ..h
        };
        c.encode(&mut b);
        assert_eq!(PieceHeader::decode(&b), Ok(c));
        b[24] |= 4;
        assert_eq!(PieceHeader::decode(&b), Err(HeaderError("unknown flags")));
        // Without a fingerprint: the short form, the rest of the area zero;
        // from a stream, the bytes after it are the payload's.
        let s = PieceHeader {
            fingerprint: None,
            ..c
        };
        assert_eq!(s.encode(&mut b), SHORT_HEADER_BYTES);
        assert_eq!(
            b[SHORT_HEADER_BYTES..],
            [0; HEADER_BYTES - SHORT_HEADER_BYTES]
        );
        assert_eq!(PieceHeader::decode(&b), Ok(s));
        b[40] = 9;
        assert_eq!(PieceHeader::decode_prefix(&b), Ok((s, SHORT_HEADER_BYTES)));
        assert!(PieceHeader::decode(&b).is_err());
        assert_eq!(
            PieceHeader::decode_prefix(&b[..SHORT_HEADER_BYTES - 1]),
            Err(HeaderError("truncated header"))
        );
        c.encode(&mut b);
        assert_eq!(
            PieceHeader::decode_prefix(&b[..HEADER_BYTES - 1]),
            Err(HeaderError("truncated header"))
        );
        assert_eq!(
            PieceHeader::encoded_len_at(b.first_chunk().unwrap()),
            Ok(HEADER_BYTES)
        );
    }

    /// CRC32C's check value (RFC 3720, "123456789" → 0xE3069283).
    #[test]
    fn piece_checksum_is_crc32c() {
        assert_eq!(piece_checksum(b"123456789"), 0xe306_9283);
        assert_eq!(piece_checksum(b""), 0);
        assert_eq!(
            checksum_append(piece_checksum(b"1234"), b"56789"),
            0xe306_9283
        );
    }

    #[test]
    fn appending_blocks_gives_the_whole_crc() {
        let data: Vec<u8> = (0..100_003u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let whole = piece_checksum(&data);
        for split in [0, 1, 7, 4096, 65_536, 100_003] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                checksum_append(checksum_append(0, a), b),
                whole,
                "split at {split}"
            );
        }
        let mut dst = vec![0u8; data.len()];
        assert_eq!(copy_checksummed(&mut dst, &data), whole);
        assert_eq!(dst, data);
    }

    /// The blocked copy copies exactly and gives the CRC of the whole, at
    /// lengths around the block size.
    #[test]
    fn copy_checksummed_copies_and_checksums_in_one_pass() {
        for len in [
            0,
            1,
            4095,
            CHECKSUM_BLOCK,
            CHECKSUM_BLOCK + 1,
            3 * CHECKSUM_BLOCK - 7,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0u8; len];
            assert_eq!(
                copy_checksummed(&mut dst, &src),
                piece_checksum(&src),
                "{len}"
            );
            assert_eq!(dst, src, "{len}");
        }
    }

    /// Every dtype (the fp8 ones included) travels as its NCCL value; a
    /// value past the last is refused.
    #[test]
    fn every_dtype_round_trips() {
        for dtype in DataType::ALL {
            let h = PieceHeader {
                checksum: None,
                comm_id: 1,
                seq: 2,
                len: 3,
                fingerprint: Some(Fingerprint {
                    collective: Collective::AllReduce,
                    dtype,
                    op: ReduceOp::Sum,
                    root: 0,
                    count: 5,
                    settings: 0,
                }),
            };
            let mut b = [0u8; HEADER_BYTES];
            h.encode(&mut b);
            assert_eq!(b[33], dtype as u8);
            assert_eq!(PieceHeader::decode(&b), Ok(h));
        }
        assert_eq!(DataType::Float8e4m3 as u8, 10);
        assert_eq!(DataType::Float8e5m2 as u8, 11);
        let mut b = [0u8; HEADER_BYTES];
        PieceHeader {
            checksum: None,
            comm_id: 1,
            seq: 2,
            len: 3,
            fingerprint: Some(Fingerprint {
                collective: Collective::AllReduce,
                dtype: DataType::Float8e5m2,
                op: ReduceOp::Sum,
                root: 0,
                count: 5,
                settings: 0,
            }),
        }
        .encode(&mut b);
        b[33] = DataType::ALL.len() as u8;
        assert_eq!(PieceHeader::decode(&b), Err(HeaderError("unknown dtype")));
    }
}
