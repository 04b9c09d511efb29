//! Alpha-beta cost of each (collective, algorithm) row of the table: the
//! predicted time in µs to move `bytes` per rank with a pipeline chunk of
//! `chunk` bytes over the communicator's [`Shape`]. Flat algorithms pay the
//! slowest tier on every step; hierarchical ones pay each tier for its phase.

use super::ceil_log2;
use crate::cluster::Shape;

/// The signature of every cost function in the table.
pub type CostFn = fn(sh: &Shape, bytes: usize, chunk: usize) -> f64;

/// Pipeline chunks of a message (at least one).
fn chunks(bytes: usize, chunk: usize) -> f64 {
    (bytes.div_ceil(chunk.max(1))).max(1) as f64
}

/// No model: the collective has one automatic candidate.
pub(super) fn unmodelled(_: &Shape, _: usize, _: usize) -> f64 {
    0.0
}

/// Ring all-reduce: 2 (n - 1) steps, one message per block of n chunks.
pub(super) fn ring_all_reduce(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let n = sh.nranks;
    let nf = n as f64;
    let b = bytes as f64;
    let link = sh.slowest();
    let blocks = (bytes.div_ceil(chunk.max(1) * n)).max(1) as f64;
    2.0 * (nf - 1.0) * (blocks * link.alpha_us + b / nf / link.bytes_per_us)
}

/// Hierarchical all-reduce as `algo::hier_all_reduce` runs it: blocks of
/// `max_local × chunk` bytes one after another, each an intra-node ring
/// reduce-scatter, a cross-node ring all-reduce of the block's shards and an
/// intra-node ring all-gather. Every block pays every step's latency (the
/// blocks are not pipelined against each other) except where the node's
/// other cross-node rings cover it ([`shared_link_latency`]); the bytes are
/// the same as one pass over the whole buffer. The cross-node term charges
/// the node's shards of a step, `block / nnodes`, to one inter link (a NIC
/// per node; with a NIC per rank the simulator's time is lower).
pub(super) fn hier_all_reduce(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let b = bytes as f64;
    let (nn, ll) = (sh.nnodes as f64, sh.max_local as f64);
    let blocks = hier_blocks(sh, bytes, chunk);
    let intra = 2.0 * (ll - 1.0) * (blocks * sh.intra.alpha_us + b / ll / sh.intra.bytes_per_us);
    // A ring's step moves its shard of the block, chunk / nnodes bytes.
    let shard = chunk.min(bytes.div_ceil(sh.max_local.max(1)));
    let ring_step = shard as f64 / nn / sh.inter.bytes_per_us;
    let latency = shared_link_latency(sh.inter.alpha_us, blocks, sh.max_local, ring_step);
    let inter = 2.0 * (nn - 1.0) * (latency + b / nn / sh.inter.bytes_per_us);
    intra + inter
}

/// The latency one cross-node ring step costs over `pieces` pieces when
/// the node's `local` ranks each run such a ring at once on the node's
/// link, a piece's transfer taking `transfer` µs: the first piece pays
/// `alpha` in full; each later one only what the other rings' transfers,
/// `(local − 1) × transfer`, do not cover while this ring waits (they keep
/// the link busy). With one rank per node, or pieces too small to cover
/// it, every piece pays `alpha`, as an unshared ring does. Measured: at
/// 4 × 2 on the 1 Gbit/s bed the forced hier all-reduce reached 0.997 of
/// the goodput bound while the per-piece formula priced 205 ms of latency
/// on top (docs/perf-notes/NOTEBOOK.md §16); the simulator, whose rings share links, agrees.
pub(super) fn shared_link_latency(alpha: f64, pieces: f64, local: usize, transfer: f64) -> f64 {
    let covered = (local.max(1) - 1) as f64 * transfer;
    alpha + (pieces - 1.0).max(0.0) * (alpha - covered).max(0.0)
}

/// Blocks of `algo::hier_all_reduce`: `bytes` in pieces of `max_local ×
/// chunk` bytes (at least one).
pub(super) fn hier_blocks(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    (bytes.div_ceil(sh.max_local.max(1).saturating_mul(chunk.max(1)))).max(1) as f64
}

/// Ring reduce-scatter / all-gather: n - 1 steps of one block.
pub(super) fn ring_one_pass(sh: &Shape, bytes: usize, _chunk: usize) -> f64 {
    let nf = sh.nranks as f64;
    (nf - 1.0) * sh.slowest().msg(bytes as f64 / nf)
}

/// Hierarchical reduce-scatter / all-gather: an intra and a cross phase,
/// pipelined over pieces of `chunk` bytes of each rank's block (`bytes` is
/// the whole vector, `nranks` blocks): every piece pays each intra step's
/// latency and the cross-node steps' latency as [`shared_link_latency`] says.
pub(super) fn hier_one_pass(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let b = bytes as f64;
    let (nn, ll) = (sh.nnodes as f64, sh.max_local as f64);
    let block = bytes.div_ceil(sh.nranks.max(1));
    let pieces = block.div_ceil(chunk.max(1)).max(1) as f64;
    let ring_step = chunk.min(block) as f64 / sh.inter.bytes_per_us;
    let latency = shared_link_latency(sh.inter.alpha_us, pieces, sh.max_local, ring_step);
    (ll - 1.0) * (pieces * sh.intra.alpha_us + b / ll / sh.intra.bytes_per_us)
        + (nn - 1.0) * (latency + b / nn / sh.inter.bytes_per_us)
}

/// Pipelined binomial-tree all-reduce: reduce then broadcast, `l + k − 1`
/// steps each. In a full pipeline the root takes one chunk per level in
/// flight in every step of the reduce (and gives one per level in the
/// broadcast), all on its one link: a step is one latency plus `min(l, k)`
/// chunks' transfer.
pub(super) fn tree_all_reduce(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let b = bytes as f64;
    let l = ceil_log2(sh.nranks) as f64;
    let k = chunks(bytes, chunk);
    let link = sh.slowest();
    2.0 * (l + k - 1.0) * (link.alpha_us + l.min(k).max(1.0) * b / k / link.bytes_per_us)
}

/// How many times a one-way transfer of the same bytes an exchange of the
/// whole vector takes in `rd`, for large exchanges: each step sends all of
/// S to the partner and receives all of S from it at once, unpipelined (rd
/// has no chunks), and beyond what the pair's slot FIFOs (shm) or socket
/// buffers (tcp) hold in flight the two directions do not overlap as the
/// ring's alternating chunk-sized pieces do. Measured (docs/perf-notes/NOTEBOOK.md §15, quiet
/// machine, 2 ranks, same bytes per rank as the 2-rank ring): rd / ring
/// time 1.8 at 256 KiB, 1.9 at 2 MiB, 2.1 at 16 MiB over shm, 2.5 at 16
/// MiB over tcp; the lower shm ratio is taken (tcp's extra is rd's two
/// local copies of S, priced where a topology file gives the local speed).
/// Smaller exchanges: [`rd_exchange_factor`].
pub const RD_EXCHANGE_FACTOR: f64 = 2.0;

/// The bytes of an rd exchange whose two directions overlap: up to this
/// size an exchange costs one one-way transfer. Measured with today's
/// transports (docs/perf-notes/NOTEBOOK.md §28, 2 ranks, rd and the ring
/// forced, interleaved): rd within 10 % of the ring up to 256 KiB over shm
/// (faster at 128 KiB, 7–9 % slower at 32 and 256 KiB) and as fast or
/// faster up to 2 MiB over tcp (tcp 8–256 KiB: rd 1.2–1.6× faster),
/// and 1.4–1.5× slower over shm from 512 KiB, 1.5–1.9× over tcp from 4 MiB;
/// the smaller, shm's window is taken.
pub const RD_OVERLAP_BYTES: usize = 256 << 10;

/// [`RD_EXCHANGE_FACTOR`] for an exchange of `bytes`: 1 up to
/// [`RD_OVERLAP_BYTES`]; beyond, the window overlaps and the rest costs
/// the factor (so the factor tends to [`RD_EXCHANGE_FACTOR`]).
pub fn rd_exchange_factor(bytes: usize) -> f64 {
    if bytes <= RD_OVERLAP_BYTES {
        return 1.0;
    }
    let window = RD_OVERLAP_BYTES as f64 / bytes as f64;
    RD_EXCHANGE_FACTOR - (RD_EXCHANGE_FACTOR - 1.0) * window
}

/// Recursive doubling: ⌈log2 n⌉ full exchanges, two more to fold a
/// non-power-of-two rank count; each exchange's bytes cost
/// [`rd_exchange_factor`] × a one-way transfer.
pub(super) fn rd_all_reduce(sh: &Shape, bytes: usize, _chunk: usize) -> f64 {
    let n = sh.nranks;
    let l = ceil_log2(n) as f64;
    let extra = if n.is_power_of_two() { 0.0 } else { 2.0 };
    let link = sh.slowest();
    (l + extra) * (link.alpha_us + rd_exchange_factor(bytes) * bytes as f64 / link.bytes_per_us)
}

/// Pipelined binomial tree from / to the root: per step the root sends one
/// message per level in flight.
pub(super) fn tree_rooted(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let b = bytes as f64;
    let l = ceil_log2(sh.nranks) as f64;
    let k = chunks(bytes, chunk);
    (l + k - 1.0) * sh.slowest().msg(b / k) * l.min(k).max(1.0)
}

/// Pipelined chain from / to the root.
pub(super) fn chain_rooted(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let nf = sh.nranks as f64;
    let k = chunks(bytes, chunk);
    (nf - 1.0 + k - 1.0) * sh.slowest().msg(bytes as f64 / k)
}

/// Hierarchical broadcast / reduce: a tree across nodes, one within each.
pub(super) fn hier_rooted(sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let b = bytes as f64;
    let k = chunks(bytes, chunk);
    let li = ceil_log2(sh.nnodes) as f64;
    let la = ceil_log2(sh.max_local) as f64;
    (li + k - 1.0) * sh.inter.msg(b / k) * li.max(1.0)
        + (la + k - 1.0) * sh.intra.msg(b / k) * la.max(1.0)
}
