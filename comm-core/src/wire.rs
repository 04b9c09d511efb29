//! What travels with every piece of data: the communicator, the operation's
//! sequence number and its fingerprint, so a receiver can tell a mismatched
//! collective from a slow one.

use kernels::{DataType, ReduceOp};

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

/// What every rank must agree on for one operation. Compared piece by piece
/// on receive; a difference is a mismatched collective.
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
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.collective == Collective::Tagged {
            return write!(f, "tagged(tag={}, bytes={})", self.root, self.count);
        }
        write!(
            f,
            "{}(dtype={}, op={}, count={}, root={})",
            self.collective.name(),
            self.dtype.name(),
            self.op.name(),
            self.count,
            self.root
        )
    }
}

/// Header of one piece of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PieceHeader {
    /// Communicator id (hash of the unique id and the communicator's path).
    pub comm_id: u64,
    /// Sequence number of the operation on this communicator (starts at 1).
    pub seq: u64,
    /// The operation's fingerprint.
    pub fingerprint: Fingerprint,
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

/// Encoded size of a [`PieceHeader`].
pub const HEADER_BYTES: usize = 48;
/// Header flag (byte 27): bytes 40..44 hold the payload's CRC32C.
const FLAG_CHECKSUM: u8 = 1;

/// The CRC32C (Castagnoli) of `data`, as [`PieceHeader::checksum`] carries
/// it. The `crc-fast` crate folds with carry-less multiplication
/// (PCLMULQDQ / VPCLMULQDQ, chosen at run time): 2.0-2.5x the `crc32c`
/// crate's SSE4.2 `crc32` instruction path on this project's x86 machines
/// (docs/PERF.md §11b), and the checksum's cost is its compute.
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
        kernels::copy(d, s);
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
    /// Writes the header into `out` (little endian).
    pub fn encode(&self, out: &mut [u8; HEADER_BYTES]) {
        out[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.comm_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        out[24] = self.fingerprint.collective as u8;
        out[25] = self.fingerprint.dtype as u8;
        out[26] = self.fingerprint.op as u8;
        out[27] = if self.checksum.is_some() {
            FLAG_CHECKSUM
        } else {
            0
        };
        out[28..32].copy_from_slice(&self.fingerprint.root.to_le_bytes());
        out[32..40].copy_from_slice(&self.fingerprint.count.to_le_bytes());
        out[40..44].copy_from_slice(&self.checksum.unwrap_or(0).to_le_bytes());
        out[44..48].fill(0);
    }

    /// Reads a header, rejecting anything that is not one.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<PieceHeader, HeaderError> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32_at(0) != HEADER_MAGIC {
            return Err(HeaderError("bad magic"));
        }
        let collective = Collective::from_u8(b[24]).ok_or(HeaderError("unknown collective"))?;
        let dtype = DataType::from_u8(b[25]).ok_or(HeaderError("unknown dtype"))?;
        let op = ReduceOp::from_u8(b[26]).ok_or(HeaderError("unknown reduce op"))?;
        if b[27] & !FLAG_CHECKSUM != 0 {
            return Err(HeaderError("unknown flags"));
        }
        let has_checksum = b[27] & FLAG_CHECKSUM != 0;
        if b[44..48] != [0; 4] || (!has_checksum && b[40..44] != [0; 4]) {
            return Err(HeaderError("reserved bytes are not zero"));
        }
        Ok(PieceHeader {
            checksum: has_checksum.then(|| u32_at(40)),
            comm_id: u64_at(8),
            seq: u64_at(16),
            len: u32_at(4),
            fingerprint: Fingerprint {
                collective,
                dtype,
                op,
                root: u32_at(28) as i32,
                count: u64_at(32),
            },
        })
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
            fingerprint: Fingerprint {
                collective: Collective::Broadcast,
                dtype: DataType::Bfloat16,
                op: ReduceOp::Max,
                root: 3,
                count: 1_000_003,
            },
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
        b[27] |= 2;
        assert_eq!(PieceHeader::decode(&b), Err(HeaderError("unknown flags")));
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
                fingerprint: Fingerprint {
                    collective: Collective::AllReduce,
                    dtype,
                    op: ReduceOp::Sum,
                    root: 0,
                    count: 5,
                },
            };
            let mut b = [0u8; HEADER_BYTES];
            h.encode(&mut b);
            assert_eq!(b[25], dtype as u8);
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
            fingerprint: Fingerprint {
                collective: Collective::AllReduce,
                dtype: DataType::Float8e5m2,
                op: ReduceOp::Sum,
                root: 0,
                count: 5,
            },
        }
        .encode(&mut b);
        b[25] = DataType::ALL.len() as u8;
        assert_eq!(PieceHeader::decode(&b), Err(HeaderError("unknown dtype")));
    }
}
