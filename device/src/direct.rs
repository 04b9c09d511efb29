//! The direct all-reduce (nvlink version 2): one kernel per rank reads its
//! peers' buffers where they lie (CUDA IPC mappings; the emulated device's
//! shared memory), synchronised by epoch counters in IPC memory
//! (`kernels/cuda/sncl_direct.cu` has the protocol). [`DirectAllReduce`]
//! describes one launch; [`crate::Device::direct_all_reduce`] enqueues it.
//!
//! The host's side of a deadline: the kernel polls an abort word in pinned
//! host memory ([`CONTROL_WORDS`] words: abort, the peer it waits on + 1,
//! aborted) that the host sets when it gives up.

pub use kernels::cuda::DirectAlgo;
use kernels::cuda::{DIRECT_LL_BLOCK_BYTES, DIRECT_MAX_BLOCKS, DIRECT_MAX_RANKS};
use kernels::{DataType, ReduceOp};

use crate::{DeviceError, DevicePtr, Result};

/// Bytes of one rank's flag area (IPC device memory, zero at creation):
/// a counter per block, then a fingerprint word per block (the staged
/// form's check that every rank called the same operation).
pub const FLAG_BYTES: usize = 2 * DIRECT_MAX_BLOCKS * 8;

/// Bytes of the LL region after a lane's flag area: per block, two slots
/// (by the parity of its epoch) of [`DIRECT_LL_BLOCK_BYTES`] of lines and
/// two header lines (`kernels/cuda/sncl_direct.cu`, "LL").
pub const LL_BYTES: usize = DIRECT_MAX_BLOCKS * 2 * (DIRECT_LL_BLOCK_BYTES + 16);

/// Bytes of the flag area of a staged launch ([`Staged`], the kernel
/// path's lane): [`FLAG_BYTES`], then the LL region ([`LL_BYTES`]), all
/// zero at creation.
pub const LANE_FLAG_BYTES: usize = FLAG_BYTES + LL_BYTES;

/// Whether an LL launch ([`DirectAlgo::LowLatency`]) of `count` elements
/// of `elem_bytes` with `grid` blocks of `block` threads fits the LL
/// region: thread t of block b sends packs (16 bytes) b * block + t + k *
/// grid * block as 4 lines of 8 bytes each, at line 4 (k * block + t) of
/// the block's slot of [`DIRECT_LL_BLOCK_BYTES`].
pub fn ll_fits(elem_bytes: usize, count: usize, grid: u32, block: u32) -> bool {
    let packs = count.saturating_mul(elem_bytes).div_ceil(16);
    let threads = (grid.max(1) as usize).saturating_mul(block.max(1) as usize);
    let passes = packs.div_ceil(threads);
    passes
        .saturating_mul(block.max(1) as usize)
        .saturating_mul(4 * 8)
        <= DIRECT_LL_BLOCK_BYTES
}

/// `u32` words of the pinned control block: `[0]` abort (the host sets it
/// to 1), `[1]` the peer the kernel waits on long + 1 (0: none), `[2]` 1
/// once the kernel gave up, `[3]` the peer whose staged operation differs
/// from this rank's + 1 (0: none; see [`Staged::fingerprint`]).
pub const CONTROL_WORDS: usize = 4;

/// One direct all-reduce launch. Every rank launches its own with the same
/// `algo`, `dtype`, `op`, `count`, `epoch` and `grid`.
#[derive(Clone, Copy, Debug)]
pub struct DirectAllReduce<'a> {
    /// One-shot or two-shot.
    pub algo: DirectAlgo,
    /// Element type.
    pub dtype: DataType,
    /// Sum, prod, max or min (avg: sum here, then [`crate::Device::divide`]).
    pub op: ReduceOp,
    /// Elements of every input and output.
    pub count: usize,
    /// This rank.
    pub rank: usize,
    /// Every rank's input, as this process addresses it (its own, and the
    /// peers' IPC mappings), in rank order.
    pub inputs: &'a [DevicePtr],
    /// Every rank's output likewise (two-shot reads the peers'; one-shot
    /// only writes `outputs[rank]`).
    pub outputs: &'a [DevicePtr],
    /// Every rank's flag area likewise ([`DirectAllReduce::flag_bytes`]).
    pub flags: &'a [DevicePtr],
    /// One-shot in place (`outputs[rank] == inputs[rank]`): `count`
    /// elements of this rank's memory the sum goes through.
    pub scratch: Option<DevicePtr>,
    /// The pinned control block ([`CONTROL_WORDS`] words from
    /// [`crate::Device::alloc_pinned`]).
    pub control: *mut u32,
    /// The operation's number on these flags: from 1, one more per
    /// operation, the same on every rank. 0: each block derives it on the
    /// device, one more than the epoch its own flag says it completed, so
    /// that a launch replayed from a CUDA graph runs the next epoch; every
    /// operation on these flags must then use 0 and the same grid on every
    /// rank.
    pub epoch: u64,
    /// Blocks of the launch (1 to `DIRECT_MAX_BLOCKS`), the same on every
    /// rank ([`grid`]).
    pub grid: u32,
    /// `Some`: the kernel path's staged form (see [`Staged`]); `inputs`
    /// are then the lane buffers and `outputs` unused.
    pub staged: Option<Staged>,
}

/// A staged direct collective (the kernel path's lane): the kernel copies
/// this rank's `source` into its lane buffer (`inputs[rank]`) round by
/// round, reads every rank's lane and writes `result`, so the caller's
/// buffers need not be mapped by the peers and may be any size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staged {
    /// Which collective; [`DirectAllReduce::count`] is then the elements
    /// of one rank's piece ([`Staged::extents`]).
    pub collective: StagedCollective,
    /// This rank's input (its own memory; a broadcast's non-root passes
    /// `result`).
    pub source: DevicePtr,
    /// This rank's output (`source` for in place; a reduce's non-root
    /// passes `source`).
    pub result: DevicePtr,
    /// Elements per round: at most a lane buffer's, a whole number of
    /// 16-byte packs. Round k runs epoch `epoch + k`, so a launch of
    /// `count.div_ceil(chunk)` rounds needs epoch 0 (derived on the
    /// device) unless it runs one round.
    pub chunk: usize,
    /// A hash of the call (collective, type, op, count, root), the same
    /// on every rank that makes the same call; 0: unchecked. Ranks whose
    /// fingerprints differ all stop at the first round's "ready", before
    /// writing a result, naming a differing peer in control word 3.
    pub fingerprint: u64,
}

/// The collectives the staged kernel runs (NCCL's conventions for the
/// extents, [`Staged::extents`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagedCollective {
    /// One-shot or two-shot by [`DirectAllReduce::algo`].
    AllReduce,
    /// Every rank's `count` elements, in rank order, to every rank.
    AllGather,
    /// Piece r of the fold of every rank's `nranks × count` to rank r.
    ReduceScatter,
    /// The root's `count` elements to every rank.
    Broadcast {
        /// The rank whose source is sent.
        root: usize,
    },
    /// The fold of every rank's `count` elements to the root.
    Reduce {
        /// The rank that receives the result.
        root: usize,
    },
    /// Piece q of every rank's `nranks × count` to rank q, in rank order.
    AllToAll,
    /// Every rank's `count` elements, in rank order, to the root.
    Gather {
        /// The rank that receives every piece.
        root: usize,
    },
    /// Piece q of the root's `nranks × count` to rank q.
    Scatter {
        /// The rank whose pieces are sent.
        root: usize,
    },
}

impl StagedCollective {
    /// The collective's name in errors (as sncl's `Collective::name`).
    pub fn name(self) -> &'static str {
        match self {
            StagedCollective::AllReduce => "all_reduce",
            StagedCollective::AllGather => "all_gather",
            StagedCollective::ReduceScatter => "reduce_scatter",
            StagedCollective::Broadcast { .. } => "broadcast",
            StagedCollective::Reduce { .. } => "reduce",
            StagedCollective::AllToAll => "alltoall",
            StagedCollective::Gather { .. } => "gather",
            StagedCollective::Scatter { .. } => "scatter",
        }
    }

    /// The kernel ABI's `coll` and `root`.
    fn abi(self) -> (i32, i32) {
        match self {
            StagedCollective::AllReduce => (0, 0),
            StagedCollective::AllGather => (1, 0),
            StagedCollective::ReduceScatter => (2, 0),
            StagedCollective::Broadcast { root } => (3, root as i32),
            StagedCollective::Reduce { root } => (4, root as i32),
            StagedCollective::AllToAll => (5, 0),
            StagedCollective::Gather { root } => (6, root as i32),
            StagedCollective::Scatter { root } => (7, root as i32),
        }
    }

    /// The root of a rooted collective.
    pub fn root(self) -> Option<usize> {
        match self {
            StagedCollective::Broadcast { root }
            | StagedCollective::Reduce { root }
            | StagedCollective::Gather { root }
            | StagedCollective::Scatter { root } => Some(root),
            _ => None,
        }
    }

    /// Whether a round holds a share of each of `nranks` pieces (the lane
    /// holds `nranks × chunk` elements, piece q at `q × chunk`).
    pub fn has_pieces(self) -> bool {
        matches!(
            self,
            StagedCollective::ReduceScatter
                | StagedCollective::AllToAll
                | StagedCollective::Scatter { .. }
        )
    }

    /// Whether it folds (else it only copies, and any element type and op
    /// name a kernel that does).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            StagedCollective::AllReduce
                | StagedCollective::ReduceScatter
                | StagedCollective::Reduce { .. }
        )
    }
}

impl Staged {
    /// Elements of `rank`'s (source, result) for pieces of `count` among
    /// `nranks` ranks. A rooted collective's non-roots use one side only
    /// and pass one buffer as both: `count` elements each.
    pub fn extents(&self, count: usize, nranks: usize, rank: usize) -> (usize, usize) {
        match self.collective {
            StagedCollective::AllGather => (count, count * nranks),
            StagedCollective::Gather { root } if root == rank => (count, count * nranks),
            StagedCollective::ReduceScatter => (count * nranks, count),
            StagedCollective::Scatter { root } if root == rank => (count * nranks, count),
            StagedCollective::AllToAll => (count * nranks, count * nranks),
            _ => (count, count),
        }
    }

    /// Elements of each rank's lane a round uses.
    pub fn lane_count(&self, count: usize, nranks: usize) -> usize {
        let round = count.min(self.chunk);
        if self.collective.has_pieces() {
            round * nranks
        } else {
            round
        }
    }
}

impl DirectAllReduce<'_> {
    /// Ranks of the operation.
    pub fn nranks(&self) -> usize {
        self.inputs.len()
    }

    /// Whether the output is the input (in place).
    pub fn in_place(&self) -> bool {
        match self.staged {
            Some(s) => s.source == s.result,
            None => self.outputs.get(self.rank) == self.inputs.get(self.rank),
        }
    }

    /// Elements of each rank's input, output and scratch the kernel
    /// touches: a round's for a staged launch, else the count.
    pub fn shared_count(&self) -> usize {
        match self.staged {
            Some(s) if s.chunk > 0 => s.lane_count(self.count, self.nranks()),
            _ => self.count,
        }
    }

    /// Bytes of each flag area the launch uses: [`LANE_FLAG_BYTES`] for a
    /// staged launch (the LL region: LL uses it, and any staged operation
    /// may clear this rank's slots), else [`FLAG_BYTES`].
    pub fn flag_bytes(&self) -> usize {
        if self.staged.is_some() {
            LANE_FLAG_BYTES
        } else {
            FLAG_BYTES
        }
    }

    /// Checks what every backend needs (before anything is enqueued) for
    /// a launch of `block` threads a block, and names the kernel.
    pub(crate) fn check(&self, ordinal: usize, block: u32) -> Result<String> {
        let bad = |detail: String| DeviceError::InvalidArgument {
            ordinal,
            call: "direct_all_reduce",
            detail,
        };
        let n = self.nranks();
        if !(2..=DIRECT_MAX_RANKS).contains(&n) {
            return Err(bad(format!("{n} ranks: expected 2 to {DIRECT_MAX_RANKS}")));
        }
        if self.outputs.len() != n || self.flags.len() != n {
            return Err(bad(format!(
                "{n} inputs but {} outputs and {} flag areas: expected one of each per rank",
                self.outputs.len(),
                self.flags.len()
            )));
        }
        if self.rank >= n {
            return Err(bad(format!("rank {} of {n} ranks", self.rank)));
        }
        if self.epoch >= u64::MAX / 4 {
            return Err(bad(format!(
                "epoch {}: expected less than 2^62 (0: derived on the device)",
                self.epoch
            )));
        }
        if self.grid == 0 || self.grid as usize > DIRECT_MAX_BLOCKS {
            return Err(bad(format!(
                "grid {}: expected 1 to {DIRECT_MAX_BLOCKS} blocks",
                self.grid
            )));
        }
        if self.control.is_null() || !(self.control as usize).is_multiple_of(4) {
            return Err(bad(format!(
                "control block {:p}: expected an aligned pinned allocation",
                self.control
            )));
        }
        if let Some(st) = self.staged {
            let pack = 16 / self.dtype.size().clamp(1, 16);
            if st.chunk == 0 || !st.chunk.is_multiple_of(pack) {
                return Err(bad(format!(
                    "staged chunk of {} elements: expected a positive multiple of {pack} \
                     (16-byte packs of {})",
                    st.chunk,
                    self.dtype.name()
                )));
            }
            if self.epoch != 0 && self.count > st.chunk {
                return Err(bad(format!(
                    "epoch {} for {} rounds: a staged launch of several rounds derives its \
                     epochs on the device (epoch 0)",
                    self.epoch,
                    self.count.div_ceil(st.chunk)
                )));
            }
            let lanes = self.inputs.iter().fold(0u64, |b, p| b | p.0);
            if lanes % 16 != 0 {
                return Err(bad("a lane buffer is not 16-byte aligned".into()));
            }
            if let Some(root) = st.collective.root() {
                if root >= n {
                    return Err(bad(format!("root {root} of {n} ranks")));
                }
            }
            if (st.source.0 | st.result.0) % self.dtype.size() as u64 != 0 {
                return Err(bad(format!(
                    "the source or result is not aligned to its {}-byte {} elements",
                    self.dtype.size(),
                    self.dtype.name()
                )));
            }
            if self.algo == DirectAlgo::LowLatency
                && (st.collective != StagedCollective::AllReduce
                    || !ll_fits(self.dtype.size(), self.count, self.grid, block))
            {
                return Err(bad(format!(
                    "the LL kernel runs a staged all-reduce whose lines fit a block's LL \
                     slot: {} elements of {} over {} blocks of {block} threads do not",
                    self.count,
                    self.dtype.name(),
                    self.grid
                )));
            }
        } else if self.algo == DirectAlgo::LowLatency {
            return Err(bad("the LL kernel runs staged all-reduces only".into()));
        } else if self.algo == DirectAlgo::OneShot && self.in_place() && self.scratch.is_none() {
            return Err(bad(
                "one-shot in place needs a scratch buffer of count elements".into(),
            ));
        }
        let bits = self
            .inputs
            .iter()
            .chain(self.outputs)
            .chain(self.scratch.iter())
            .fold(0u64, |b, p| b | p.0);
        let align = self.dtype.size() as u64;
        if bits % align != 0 {
            return Err(bad(format!(
                "a buffer is not aligned to its {}-byte {} elements",
                align,
                self.dtype.name()
            )));
        }
        // A copy runs any dtype's sum kernel (the op is not applied).
        let op = match self.staged {
            Some(st) if !st.collective.reduces() => ReduceOp::Sum,
            _ => self.op,
        };
        kernels::cuda::direct_kernel(self.dtype, op).ok_or_else(|| {
            bad(format!(
                "{} {}: the direct kernels reduce with sum, prod, max, min or avg",
                self.dtype.name(),
                self.op.name()
            ))
        })
    }
}

/// The grid of a direct all-reduce of `count` elements of `dtype` with
/// `block` threads a block: a block per `block` 16-byte packs, at most
/// `max_blocks` (the emulated device's host threads want few; a GPU's
/// co-resident limit, see docs/perf-notes/NOTEBOOK.md §14). A function of its arguments
/// only, so every rank launches the same grid.
pub fn grid(dtype: DataType, count: usize, block: u32, max_blocks: u32) -> u32 {
    let packs = count.saturating_mul(dtype.size()).div_ceil(16);
    let cap = max_blocks.clamp(1, DIRECT_MAX_BLOCKS as u32) as usize;
    packs.div_ceil(block.max(1) as usize).clamp(1, cap) as u32
}

/// The launch shape a backend runs the direct kernels with: (threads a
/// block, the most blocks). CUDA: 512 threads and 32 blocks, few enough
/// that every rank's kernel stays resident beside its peers' (each block
/// waits on its peers' blocks); the emulated device: its host kernels'
/// 256 threads and 4 blocks (every block is a round of flag waits).
pub const fn launch_limits(backend: crate::Backend) -> (u32, u32) {
    match backend {
        crate::Backend::Cuda => (512, 32),
        crate::Backend::Emu => (kernels::cuda::BLOCK_THREADS, 4),
    }
}

/// Rust mirror of the kernels' `SnclDirectArgs`, with addresses as the
/// backend sees them (device addresses on CUDA, host addresses on `emu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DirectArgs {
    pub(crate) inputs: [u64; DIRECT_MAX_RANKS],
    pub(crate) outputs: [u64; DIRECT_MAX_RANKS],
    pub(crate) flags: [u64; DIRECT_MAX_RANKS],
    pub(crate) scratch: u64,
    pub(crate) control: u64,
    pub(crate) count: u64,
    pub(crate) epoch: u64,
    pub(crate) rank: i32,
    pub(crate) nranks: i32,
    pub(crate) algo: i32,
    pub(crate) in_place: i32,
    pub(crate) source: u64,
    pub(crate) result: u64,
    pub(crate) chunk: u64,
    pub(crate) coll: i32,
    pub(crate) root: i32,
    pub(crate) fingerprint: u64,
}

/// `SnclDirectArgs`' size: 3 x 8 pointers, 4 words of 8 bytes, 4 of 4,
/// then the staged form's 3 words of 8, 2 of 4 and its fingerprint.
pub(crate) const DIRECT_ARGS_BYTES: usize =
    3 * DIRECT_MAX_RANKS * 8 + 4 * 8 + 4 * 4 + 3 * 8 + 2 * 4 + 8;
const _: () = assert!(std::mem::size_of::<DirectArgs>() == DIRECT_ARGS_BYTES);

impl DirectArgs {
    /// The struct for `op` (checked), translating every address with `at`
    /// (what the kernel dereferences) and the control block with `ctl`.
    pub(crate) fn new(
        op: &DirectAllReduce<'_>,
        mut at: impl FnMut(DevicePtr) -> u64,
        control: u64,
    ) -> DirectArgs {
        let mut a = DirectArgs {
            scratch: op.scratch.map_or(0, &mut at),
            control,
            count: op.count as u64,
            epoch: op.epoch,
            rank: op.rank as i32,
            nranks: op.nranks() as i32,
            algo: op.algo as i32,
            in_place: i32::from(op.in_place()),
            ..Default::default()
        };
        if let Some(st) = op.staged {
            a.source = at(st.source);
            a.result = at(st.result);
            a.chunk = st.chunk as u64;
            (a.coll, a.root) = st.collective.abi();
            a.fingerprint = st.fingerprint;
        }
        for r in 0..op.nranks() {
            a.inputs[r] = at(op.inputs[r]);
            a.outputs[r] = at(op.outputs[r]);
            a.flags[r] = at(op.flags[r]);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op<'a>(ptrs: &'a [DevicePtr], control: *mut u32) -> DirectAllReduce<'a> {
        DirectAllReduce {
            algo: DirectAlgo::TwoShot,
            dtype: DataType::Float32,
            op: ReduceOp::Sum,
            count: 100,
            rank: 1,
            inputs: ptrs,
            outputs: ptrs,
            flags: ptrs,
            scratch: None,
            control,
            epoch: 1,
            grid: 2,
            staged: None,
        }
    }

    #[test]
    fn bad_launches_are_refused_naming_the_problem() {
        let mut ctl = [0u32; CONTROL_WORDS];
        let c = ctl.as_mut_ptr();
        let two = [DevicePtr(0x1000), DevicePtr(0x2000)];
        assert_eq!(
            op(&two, c).check(0, 256).unwrap(),
            "sncl_direct_all_reduce_float_sum"
        );
        let err = |o: DirectAllReduce<'_>| o.check(0, 256).unwrap_err().to_string();
        assert!(err(op(&two[..1], c)).contains("1 ranks"));
        assert!(err(DirectAllReduce {
            rank: 2,
            ..op(&two, c)
        })
        .contains("rank 2"));
        // Epoch 0 is derived on the device; 2^62 and beyond overflow the
        // flags' 4 * epoch + phase.
        assert!(DirectAllReduce {
            epoch: 0,
            ..op(&two, c)
        }
        .check(0, 256)
        .is_ok());
        assert!(err(DirectAllReduce {
            epoch: u64::MAX / 4,
            ..op(&two, c)
        })
        .contains("2^62"));
        assert!(err(DirectAllReduce {
            grid: 65,
            ..op(&two, c)
        })
        .contains("grid 65"));
        assert!(err(DirectAllReduce {
            algo: DirectAlgo::OneShot,
            ..op(&two, c)
        })
        .contains("scratch"));
        assert!(err(DirectAllReduce {
            op: ReduceOp::BitOr,
            dtype: DataType::Int32,
            ..op(&two, c)
        })
        .contains("bor"));
        let odd = [DevicePtr(0x1000), DevicePtr(0x2002)];
        assert!(err(op(&odd, c)).contains("aligned"));
        assert!(err(op(&two, std::ptr::null_mut())).contains("control"));
    }

    #[test]
    fn grids_depend_only_on_the_arguments() {
        assert_eq!(grid(DataType::Float32, 0, 256, 16), 1);
        assert_eq!(grid(DataType::Float32, 1024, 256, 16), 1);
        assert_eq!(grid(DataType::Float32, 1025, 256, 16), 2);
        assert_eq!(grid(DataType::Float32, 1 << 30, 256, 16), 16);
        assert_eq!(grid(DataType::Float32, 1 << 30, 512, 1000), 64);
    }
}
