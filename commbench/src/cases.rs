//! One benchmark case: a collective, a data type and a reduction at one
//! size, timed out of place and in place, then checked.

use std::time::Instant;

use comm_core::shape::OpShape;
use half::{bf16, f16};
use kernels::{F8E4M3, F8E5M2};
use sncl::{as_bytes, as_bytes_mut, Communicator, DataType, Element, ReduceOp, Result};

/// The collectives commbench runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bench {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
    Gather,
    Scatter,
    SendRecv,
}

impl Bench {
    pub fn parse(s: &str) -> Option<Bench> {
        Some(match s {
            "all_reduce" => Bench::AllReduce,
            "reduce_scatter" => Bench::ReduceScatter,
            "all_gather" => Bench::AllGather,
            "broadcast" => Bench::Broadcast,
            "reduce" => Bench::Reduce,
            "alltoall" => Bench::AllToAll,
            "gather" => Bench::Gather,
            "scatter" => Bench::Scatter,
            "sendrecv" => Bench::SendRecv,
            _ => return None,
        })
    }

    pub fn collective(self) -> sncl::Collective {
        use sncl::Collective as C;
        match self {
            Bench::AllReduce => C::AllReduce,
            Bench::ReduceScatter => C::ReduceScatter,
            Bench::AllGather => C::AllGather,
            Bench::Broadcast => C::Broadcast,
            Bench::Reduce => C::Reduce,
            Bench::AllToAll => C::AllToAll,
            Bench::Gather => C::Gather,
            Bench::Scatter => C::Scatter,
            Bench::SendRecv => C::SendRecv,
        }
    }

    pub fn reduces(self) -> bool {
        self.collective().is_reducing()
    }

    pub fn rooted(self) -> bool {
        self.collective().is_rooted()
    }

    /// Whether the size column is the total over ranks (nccl-tests' convention).
    pub fn size_is_total(self) -> bool {
        matches!(
            self,
            Bench::ReduceScatter
                | Bench::AllGather
                | Bench::AllToAll
                | Bench::Gather
                | Bench::Scatter
        )
    }

    /// nccl-tests' bus-bandwidth factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let nf = n as f64;
        match self {
            Bench::AllReduce => 2.0 * (nf - 1.0) / nf,
            Bench::ReduceScatter
            | Bench::AllGather
            | Bench::AllToAll
            | Bench::Gather
            | Bench::Scatter => (nf - 1.0) / nf,
            Bench::Broadcast | Bench::Reduce | Bench::SendRecv => 1.0,
        }
    }

    pub fn has_in_place(self) -> bool {
        !matches!(
            self,
            Bench::AllToAll | Bench::Gather | Bench::Scatter | Bench::SendRecv
        )
    }
}

/// What the inputs hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// Small integers, which every order of reduction gives exactly.
    Exact,
    /// In deterministic mode (`SNCL_DETERMINISTIC=1`): floats of random
    /// mantissa, sign and binade, whose sums round differently in almost
    /// any other order, checked bit for bit against the canonical order
    /// (integers stay [`Values::Exact`]: every order gives their bits).
    Inexact,
}

impl Values {
    /// The values a case on `comm` uses.
    pub fn of(comm: &Communicator) -> Values {
        if comm.config().deterministic {
            Values::Inexact
        } else {
            Values::Exact
        }
    }
}

/// Element types commbench can fill with test values.
pub trait BenchElem: Element + PartialEq + Default {
    fn from_i64(v: i64) -> Self;
    /// The float closest to `x`; integer types have none.
    fn from_f64(_x: f64) -> Option<Self> {
        None
    }
    /// Element `i` of rank `r`'s input (see [`value`]).
    fn value(r: usize, i: usize, op: ReduceOp) -> Self {
        Self::from_i64(value(r, i, op))
    }
    /// Element `i` of rank `r`'s input with `values`.
    fn element(r: usize, i: usize, op: ReduceOp, values: Values) -> Self {
        match values {
            Values::Exact => Self::value(r, i, op),
            Values::Inexact => {
                Self::from_f64(inexact(r, i, op)).unwrap_or_else(|| Self::value(r, i, op))
            }
        }
    }
}
macro_rules! bench_int {
    ($($t:ty),*) => {$(impl BenchElem for $t { fn from_i64(v: i64) -> Self { v as $t } })*};
}
bench_int!(i8, u8, i32, u32, i64, u64);
impl BenchElem for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn from_f64(x: f64) -> Option<Self> {
        Some(x as f32)
    }
}
impl BenchElem for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn from_f64(x: f64) -> Option<Self> {
        Some(x)
    }
}
impl BenchElem for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn from_f64(x: f64) -> Option<Self> {
        Some(f16::from_f64(x))
    }
}
impl BenchElem for bf16 {
    fn from_i64(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn from_f64(x: f64) -> Option<Self> {
        Some(bf16::from_f64(x))
    }
}
/// fp8 holds few integers exactly (e5m2: 0 to 8), so a sum's partial sums
/// must stay small whatever order the ranks combine in: for sum and avg an
/// element is 1 on one rank in eight and 0 elsewhere (exact up to 64 ranks);
/// the other ops use [`value`] (0 to 8, order-independent).
macro_rules! bench_fp8 {
    ($($t:ty),*) => {$(
        impl BenchElem for $t {
            fn from_i64(v: i64) -> Self {
                <$t>::from_f64(v as f64)
            }
            fn from_f64(x: f64) -> Option<Self> {
                Some(<$t>::from_f64(x))
            }
            fn value(r: usize, i: usize, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => Self::from_i64(i64::from((i + r) % 8 == 0)),
                    _ => Self::from_i64(value(r, i, op)),
                }
            }
        }
    )*};
}
bench_fp8!(F8E4M3, F8E5M2);

/// Value of element `i` of rank `r`'s input: small integers so every
/// reduction is exact in every type (products stay tiny).
fn value(r: usize, i: usize, op: ReduceOp) -> i64 {
    match op {
        ReduceOp::Prod => {
            if (i + r).is_multiple_of(7) {
                2
            } else {
                1
            }
        }
        _ => ((r * 13 + i * 7) % 9) as i64,
    }
}

/// Element `i` of rank `r`'s input in [`Values::Inexact`]: a sign, a
/// 40-bit mantissa and a binade from -2 to 2 (products: -1 or 0, so a
/// product over many ranks stays finite in f32) drawn from a hash of
/// `(r, i)`.
fn inexact(r: usize, i: usize, op: ReduceOp) -> f64 {
    let mut z = (r as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(i as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let sign = if z >> 63 == 1 { -1.0 } else { 1.0 };
    let mantissa = 1.0 + ((z >> 11) & ((1 << 40) - 1)) as f64 / (1u64 << 40) as f64;
    let binade = match op {
        ReduceOp::Prod => (z >> 4) % 2,
        _ => (z >> 4) % 5,
    } as i32
        - if op == ReduceOp::Prod { 1 } else { 2 };
    sign * mantissa * 2f64.powi(binade)
}

fn input<T: BenchElem>(r: usize, len: usize, op: ReduceOp, values: Values) -> Vec<T> {
    (0..len).map(|i| T::element(r, i, op, values)).collect()
}

/// Rank `r`'s input of `len` elements of `dtype` as bytes (the device
/// benchmark uploads it).
pub fn input_bytes(dtype: DataType, r: usize, len: usize, op: ReduceOp, values: Values) -> Vec<u8> {
    fn bytes<T: BenchElem>(r: usize, len: usize, op: ReduceOp, values: Values) -> Vec<u8> {
        sncl::as_bytes(&input::<T>(r, len, op, values)).to_vec()
    }
    crate::with_dtype!(dtype, bytes(r, len, op, values))
}

/// Result of one timed direction.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Mean time per op (µs), averaged over ranks.
    pub mean_us: f64,
    /// Median over iterations of the slowest rank's time (µs).
    pub median_us: f64,
    /// Elements outside the expected result, summed over ranks.
    pub wrong: u64,
    /// Elements outside the expected result on this rank alone: its exit
    /// status rests on this, not only on the sum (which sncl's own
    /// all-reduce computes), so the launcher's exit codes catch a wrong
    /// result even if that all-reduce were wrong too.
    pub own_wrong: u64,
    /// This rank's traffic during the warm-up and timed iterations.
    pub traffic: sncl::Stats,
}

/// Shape of one case.
pub struct Case {
    pub bench: Bench,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
    /// Elements per rank block (the unit each rank contributes).
    pub count: usize,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    /// Codec and scope for a compressed all_reduce.
    pub compress: Option<(sncl::Codec, sncl::CompressScope)>,
    /// Buffers in windows (`Communicator::alloc_window`), as nccl-tests'
    /// registered buffers.
    pub window: bool,
    /// CUDA graph launches of the captured timed iterations (`-G`; 0: none).
    pub graph_launches: usize,
    /// Operations per timed iteration (`-m`).
    pub agg: usize,
    /// How a size's time comes from the ranks' times (`-a`: 0 rank 0's,
    /// 1 average, 2 minimum, 3 maximum).
    pub average: u8,
    /// Whether to run out of place (`-O 1`, the default).
    pub out_of_place: bool,
    /// Elements every host buffer starts past its allocation (`-u`).
    pub unalign: usize,
    /// Every benchmarked call's own settings (`--tag`; the default changes
    /// nothing).
    pub config: sncl::CollConfig,
}

/// The reduction over `n` ranks of elements `offset..offset + len`: with
/// exact values in rank order (any order gives the same), with inexact
/// ones in the canonical order of deterministic mode
/// (`comm_core::algo::canonical_split`), a block at a time.
fn reduce_expected<T: BenchElem>(
    n: usize,
    len: usize,
    offset: usize,
    op: ReduceOp,
    values: Values,
) -> Vec<T> {
    if values == Values::Inexact {
        return canonical_expected(n, len, offset, op);
    }
    let mut acc: Vec<T> = (0..len).map(|i| T::value(0, offset + i, op)).collect();
    for r in 1..n {
        let other: Vec<T> = (0..len).map(|i| T::value(r, offset + i, op)).collect();
        kernels::reduce_inplace(T::DTYPE, op, as_bytes_mut(&mut acc), as_bytes(&other));
    }
    if op == ReduceOp::Avg {
        kernels::divide(T::DTYPE, as_bytes_mut(&mut acc), n);
    }
    acc
}

fn canonical_expected<T: BenchElem>(n: usize, len: usize, offset: usize, op: ReduceOp) -> Vec<T> {
    /// Elements per block: the ranks' inputs of one block are held at once.
    const BLOCK: usize = 1 << 16;
    fn node<T: BenchElem>(inputs: &[Vec<T>], lo: usize, hi: usize, op: ReduceOp) -> Vec<T> {
        if hi - lo == 1 {
            return inputs[lo].clone();
        }
        let mid = comm_core::algo::canonical_split(lo, hi);
        let (a, b) = (node(inputs, lo, mid, op), node(inputs, mid, hi, op));
        let mut out = vec![T::default(); a.len()];
        kernels::reduce_into(
            T::DTYPE,
            op,
            as_bytes_mut(&mut out),
            as_bytes(&a),
            as_bytes(&b),
        );
        out
    }
    let mut out = Vec::with_capacity(len);
    for start in (0..len).step_by(BLOCK) {
        let l = BLOCK.min(len - start);
        let inputs: Vec<Vec<T>> = (0..n)
            .map(|r| {
                (0..l)
                    .map(|i| T::element(r, offset + start + i, op, Values::Inexact))
                    .collect()
            })
            .collect();
        let mut part = node(&inputs, 0, n, op);
        if op == ReduceOp::Avg {
            kernels::divide(T::DTYPE, as_bytes_mut(&mut part), n);
        }
        out.extend(part);
    }
    out
}

fn count_wrong<T: BenchElem>(got: &[T], want: &[T]) -> u64 {
    let (g, w) = (as_bytes(got), as_bytes(want));
    let s = std::mem::size_of::<T>();
    g.chunks(s).zip(w.chunks(s)).filter(|(a, b)| a != b).count() as u64
}

/// One buffer: plain memory (its elements start `skip` elements into the
/// allocation: `-u`), or a window the communicator shares.
enum Buf<T: BenchElem> {
    Plain { alloc: Vec<T>, skip: usize },
    Window(sncl::Window<T>),
}

impl<T: BenchElem> std::ops::Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Plain { alloc, skip } => &alloc[*skip..],
            Buf::Window(w) => w,
        }
    }
}

impl<T: BenchElem> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Plain { alloc, skip } => &mut alloc[*skip..],
            Buf::Window(w) => w,
        }
    }
}

impl<T: BenchElem> Buf<T> {
    /// `data` copied into a window when `window` (collective; every rank
    /// passes the same length), else kept, `skip` elements into its
    /// allocation.
    fn new(comm: &Communicator, data: Vec<T>, window: bool, skip: usize) -> Result<Buf<T>> {
        if !window || data.is_empty() {
            if skip == 0 {
                return Ok(Buf::Plain { alloc: data, skip });
            }
            let mut alloc = vec![T::default(); skip];
            alloc.extend(data);
            return Ok(Buf::Plain { alloc, skip });
        }
        let mut w = comm.alloc_window::<T>(data.len())?;
        w[..data.len()].copy_from_slice(&data);
        Ok(Buf::Window(w))
    }
}

/// Buffers of one case on one rank.
struct Bufs<T: BenchElem> {
    send: Buf<T>,
    recv: Buf<T>,
}

fn run_once<T: BenchElem>(
    comm: &Communicator,
    c: &Case,
    b: &mut Bufs<T>,
    in_place: bool,
) -> Result<()> {
    let (n, r) = (comm.size(), comm.rank());
    let op = c.op;
    let cc = comm.configured(&c.config);
    match (c.bench, in_place) {
        (Bench::AllReduce, false) => cc.all_reduce(&b.send[..], &mut b.recv[..], op),
        (Bench::AllReduce, true) => cc.all_reduce_in_place(&mut b.recv[..], op),
        (Bench::ReduceScatter, false) => cc.reduce_scatter(&b.send[..], &mut b.recv[..], op),
        (Bench::ReduceScatter, true) => cc.reduce_scatter_in_place(&mut b.recv[..], op),
        (Bench::AllGather, false) => cc.all_gather(&b.send[..], &mut b.recv[..]),
        (Bench::AllGather, true) => cc.all_gather_in_place(&mut b.recv[..]),
        (Bench::Broadcast, false) => cc.broadcast_from(&b.send[..], &mut b.recv[..], c.root),
        (Bench::Broadcast, true) => cc.broadcast(&mut b.recv[..], c.root),
        (Bench::Reduce, false) => cc.reduce(&b.send[..], &mut b.recv[..], op, c.root),
        (Bench::Reduce, true) => cc.reduce_in_place(&mut b.recv[..], op, c.root),
        (Bench::AllToAll, _) => cc.alltoall(&b.send[..], &mut b.recv[..]),
        (Bench::Gather, _) => cc.gather(&b.send[..], &mut b.recv[..], c.root),
        (Bench::Scatter, _) => cc.scatter(&b.send[..], &mut b.recv[..], c.root),
        (Bench::SendRecv, _) => comm.group(|g| {
            g.send(&b.send[..], (r + 1) % n);
            g.recv(&mut b.recv[..], (r + n - 1) % n);
        }),
    }
}

/// Fills the buffers for one run (in place: the input goes where the
/// collective reads it from).
fn prepare<T: BenchElem>(comm: &Communicator, c: &Case, in_place: bool) -> Result<Bufs<T>> {
    let (n, r, cnt) = (comm.size(), comm.rank(), c.count);
    // The extents and the in-place layout come from the operation's shape;
    // point-to-point moves `cnt` each way.
    let shape = OpShape::new(c.bench.collective(), T::DTYPE, cnt, n).with_root(c.root);
    let layout = in_place.then(|| shape.in_place(r)).flatten();
    let (send_len, recv_len) = match (c.bench, layout) {
        (Bench::SendRecv, _) => (cnt, cnt),
        (_, Some(l)) => (shape.send_elems(r), l.elems),
        (_, None) => (shape.send_elems(r), shape.recv_elems(r)),
    };
    let send = input::<T>(r, send_len, c.op, Values::of(comm));
    let mut recv = vec![T::default(); recv_len];
    if let Some(l) = layout {
        recv[l.input_at..l.input_at + send.len()].copy_from_slice(&send);
    }
    // Windows take the same length on every rank: all_reduce's buffers.
    let window = c.window && c.bench == Bench::AllReduce;
    Ok(Bufs {
        send: Buf::new(comm, send, window, c.unalign)?,
        recv: Buf::new(comm, recv, window, c.unalign)?,
    })
}

fn expected<T: BenchElem>(
    comm: &Communicator,
    c: &Case,
    in_place: bool,
) -> Option<(usize, Vec<T>)> {
    let (n, r, cnt, op) = (comm.size(), comm.rank(), c.count, c.op);
    let values = Values::of(comm);
    let block = |src: usize, offset: usize| -> Vec<T> {
        (0..cnt)
            .map(|i| T::element(src, offset + i, op, values))
            .collect()
    };
    Some(match c.bench {
        Bench::AllReduce => (0, reduce_expected(n, cnt, 0, op, values)),
        Bench::ReduceScatter => (
            if in_place { r * cnt } else { 0 },
            reduce_expected(n, cnt, r * cnt, op, values),
        ),
        Bench::Reduce if r == c.root => (0, reduce_expected(n, cnt, 0, op, values)),
        Bench::Reduce => return None,
        Bench::AllGather => (0, (0..n).flat_map(|j| block(j, 0)).collect()),
        Bench::Broadcast => (0, block(c.root, 0)),
        Bench::AllToAll => (0, (0..n).flat_map(|j| block(j, r * cnt)).collect()),
        Bench::Gather if r == c.root => (0, (0..n).flat_map(|j| block(j, 0)).collect()),
        Bench::Gather => return None,
        Bench::Scatter => (0, block(c.root, r * cnt)),
        Bench::SendRecv => (0, block((r + n - 1) % n, 0)),
    })
}

/// Warm-up, barrier, then `iters` iterations of `agg` back-to-back runs of
/// `op`: returns the mean per op combined over ranks as `-a` says (the
/// average by default), the median over iterations of the slowest rank's
/// time per op, and this rank's traffic during the timed runs.
fn time_loop(
    comm: &Communicator,
    c: &Case,
    mut op: impl FnMut() -> Result<()>,
) -> Result<(f64, f64, sncl::Stats)> {
    for _ in 0..c.warmup {
        op()?;
    }
    comm.barrier()?;
    let before = comm.stats();
    let mut per_iter = vec![0f64; c.iters];
    let start = Instant::now();
    let mut last = start;
    let agg = c.agg.max(1);
    for t in per_iter.iter_mut() {
        for _ in 0..agg {
            op()?;
        }
        let now = Instant::now();
        *t = (now - last).as_secs_f64() * 1e6 / agg as f64;
        last = now;
    }
    let total_us = start.elapsed().as_secs_f64() * 1e6;
    let traffic = comm.stats().since(&before);
    let mean = combine_ranks(comm, total_us / (c.iters.max(1) * agg) as f64, c.average)?;
    comm.all_reduce_in_place(&mut per_iter, ReduceOp::Max)?;
    per_iter.sort_by(|a, b| a.total_cmp(b));
    let median = per_iter.get(per_iter.len() / 2).copied().unwrap_or(0.0);
    Ok((mean, median, traffic))
}

/// This rank's time `us` combined with the other ranks' as nccl-tests' `-a`
/// says: 0 rank 0's, 1 the average, 2 the minimum, 3 the maximum.
fn combine_ranks(comm: &Communicator, us: f64, average: u8) -> Result<f64> {
    let mut v = [us];
    match average {
        0 => comm.broadcast(&mut v, 0)?,
        2 => comm.all_reduce_in_place(&mut v, ReduceOp::Min)?,
        3 => comm.all_reduce_in_place(&mut v, ReduceOp::Max)?,
        _ => {
            comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
            v[0] /= comm.size() as f64;
        }
    }
    Ok(v[0])
}

/// Times one direction (out of place or in place) and checks it.
pub fn run_direction<T: BenchElem>(
    comm: &Communicator,
    c: &Case,
    in_place: bool,
) -> Result<Timing> {
    let mut b = prepare::<T>(comm, c, in_place)?;
    let (mean, median, traffic) = time_loop(comm, c, || run_once(comm, c, &mut b, in_place))?;
    let mut wrong = [0u64];
    let mut own_wrong = 0;
    if c.check {
        let mut b = prepare::<T>(comm, c, in_place)?;
        run_once(comm, c, &mut b, in_place)?;
        if let Some((at, want)) = expected::<T>(comm, c, in_place) {
            wrong[0] = count_wrong(&b.recv[at..at + want.len()], &want);
        }
        own_wrong = wrong[0];
        comm.all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
    }
    Ok(Timing {
        mean_us: mean,
        median_us: median,
        wrong: wrong[0],
        own_wrong,
        traffic,
    })
}

/// Runs `f::<T>` for the runtime data type.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Float16 => $f::<f16>($($arg),*),
            DataType::Float32 => $f::<f32>($($arg),*),
            DataType::Float64 => $f::<f64>($($arg),*),
            DataType::Bfloat16 => $f::<bf16>($($arg),*),
            DataType::Float8e4m3 => $f::<kernels::F8E4M3>($($arg),*),
            DataType::Float8e5m2 => $f::<kernels::F8E5M2>($($arg),*),
        }
    };
}

/// Times a compressed all_reduce (in place on a copy of the input) and
/// counts values outside the codec's documented bound.
fn run_compressed(comm: &Communicator, c: &Case) -> Result<Timing> {
    let (codec, scope) = c.compress.as_ref().expect("compressed case");
    let (n, r, cnt, op) = (comm.size(), comm.rank(), c.count, c.op);
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|q| input::<f32>(q, cnt, op, Values::Exact))
        .collect();
    let mut buf = inputs[r].clone();
    let once = |buf: &mut Vec<f32>| -> Result<()> {
        buf.copy_from_slice(&inputs[r]);
        comm.all_reduce_compressed(buf, op, codec, None, *scope)
    };
    let (mean, median, traffic) = time_loop(comm, c, || once(&mut buf))?;
    let mut wrong = [0u64];
    let mut own_wrong = 0;
    if c.check {
        once(&mut buf)?;
        // Bound: every value the codec encodes is at most U = sum of |x_r|.
        let u: Vec<f32> = (0..cnt)
            .map(|i| inputs.iter().map(|x| x[i].abs()).sum())
            .collect();
        let k = n as f32;
        let tol = match codec {
            sncl::Codec::TopK { .. } => {
                inputs.iter().map(|x| codec.error_bound(x)).sum::<f32>() * k
            }
            _ => (k + 1.0) * codec.error_bound(&u),
        } * if op == ReduceOp::Avg { 1.0 / k } else { 1.0 }
            + 1e-4;
        for i in 0..cnt {
            let mut exact: f32 = inputs.iter().map(|x| x[i]).sum();
            if op == ReduceOp::Avg {
                exact /= k;
            }
            if (buf[i] - exact).abs() > tol {
                wrong[0] += 1;
            }
        }
        own_wrong = wrong[0];
        comm.all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
    }
    Ok(Timing {
        mean_us: mean,
        median_us: median,
        wrong: wrong[0],
        own_wrong,
        traffic,
    })
}

/// Times both directions of a case (out of place unless `-O 0`; in place
/// where the collective has that form).
pub fn run_case(comm: &Communicator, c: &Case) -> Result<(Option<Timing>, Option<Timing>)> {
    if c.compress.is_some() {
        return Ok((Some(run_compressed(comm, c)?), None));
    }
    fn both<T: BenchElem>(
        comm: &Communicator,
        c: &Case,
    ) -> Result<(Option<Timing>, Option<Timing>)> {
        let oop = if c.out_of_place {
            Some(run_direction::<T>(comm, c, false)?)
        } else {
            None
        };
        let ip = if c.bench.has_in_place() {
            Some(run_direction::<T>(comm, c, true)?)
        } else {
            None
        };
        Ok((oop, ip))
    }
    with_dtype!(c.dtype, both(comm, c))
}
