//! Ranks as threads: every collective × every data type × every reduction
//! operator × rank counts 1..=8 × counts {0, 1, 7, more than one chunk},
//! in place and out of place, with each algorithm forced through
//! `Config::algo`. Expected results are computed independently here with
//! the documented semantics (integers wrap, `Avg` = sum / nranks truncated
//! for integers, f16 / bf16 accumulate in f32 per step).
//!
//! Also: several communicators driven at once, non-blocking scopes, grouped
//! point-to-point, and invalid arguments (rejected before anything is sent,
//! the communicator still usable afterwards).
//!
//! Each rank records what went wrong instead of panicking, so the other
//! ranks keep in step and a failure is reported, not a hang.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use comm_core::algo::Algorithm;
use comm_core::config::TransportChoice;
use half::{bf16, f16};
use sncl::{Collective, Communicator, Config, Element, ReduceOp};

// ---------------------------------------------------------------------------
// Values and the reference semantics.

/// A test element type: random bits for data movement, exact small values
/// for reductions, and an independent reference of each operator.
trait TE: Element + Debug {
    const NAME: &'static str;
    const INT: bool;
    /// Arbitrary bits (NaN patterns included for floats): moved, never reduced.
    fn from_bits(h: u64) -> Self;
    /// The bits, for exact comparison.
    fn bits(self) -> u64;
    /// An input for a reduction with `op` whose result is exact in this type.
    fn gen(op: ReduceOp, h: u64) -> Self;
    /// Reference `a op b` (`Avg` sums).
    fn comb(op: ReduceOp, a: Self, b: Self) -> Self;
    /// Reference final step (`Avg` divides by the rank count).
    fn fin(self, op: ReduceOp, n: usize) -> Self;
}

macro_rules! int_te {
    ($t:ty) => {
        impl TE for $t {
            const NAME: &'static str = stringify!($t);
            const INT: bool = true;
            fn from_bits(h: u64) -> Self {
                h as $t
            }
            fn bits(self) -> u64 {
                self as u64
            }
            fn gen(op: ReduceOp, h: u64) -> Self {
                // Integers are exact with wrapping: any value will do. Odd
                // factors keep products from collapsing to zero.
                let v = (h >> 7) as $t;
                if op == ReduceOp::Prod {
                    v | 1
                } else {
                    v
                }
            }
            fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::BitAnd => a & b,
                    ReduceOp::BitOr => a | b,
                    ReduceOp::BitXor => a ^ b,
                }
            }
            fn fin(self, op: ReduceOp, n: usize) -> Self {
                if op == ReduceOp::Avg {
                    self / (n as $t)
                } else {
                    self
                }
            }
        }
    };
}
int_te!(i8);
int_te!(u8);
int_te!(i32);
int_te!(u32);
int_te!(i64);
int_te!(u64);

/// Small values whose sums and products are exact even in bf16: integers in
/// -8..=8, and factors ±0.5, ±1, ±2 for products (8 of them stay within
/// 2^-8..2^8).
fn float_gen(op: ReduceOp, h: u64) -> f64 {
    match op {
        ReduceOp::Prod => [1.0, 2.0, -1.0, 0.5, 1.0, -2.0, 1.0, -0.5][(h >> 61) as usize],
        _ => ((h >> 32) % 17) as f64 - 8.0,
    }
}

fn fcomb<F: PartialOrd + std::ops::Add<Output = F> + std::ops::Mul<Output = F>>(
    op: ReduceOp,
    a: F,
    b: F,
) -> F {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Max => {
            if a > b {
                a
            } else {
                b
            }
        }
        ReduceOp::Min => {
            if a < b {
                a
            } else {
                b
            }
        }
        _ => panic!("bitwise reference on a float"),
    }
}

impl TE for f32 {
    const NAME: &'static str = "f32";
    const INT: bool = false;
    fn from_bits(h: u64) -> Self {
        f32::from_bits(h as u32)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn gen(op: ReduceOp, h: u64) -> Self {
        float_gen(op, h) as f32
    }
    fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
        fcomb(op, a, b)
    }
    fn fin(self, op: ReduceOp, n: usize) -> Self {
        if op == ReduceOp::Avg {
            self / n as f32
        } else {
            self
        }
    }
}

impl TE for f64 {
    const NAME: &'static str = "f64";
    const INT: bool = false;
    fn from_bits(h: u64) -> Self {
        f64::from_bits(h)
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn gen(op: ReduceOp, h: u64) -> Self {
        float_gen(op, h)
    }
    fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
        fcomb(op, a, b)
    }
    fn fin(self, op: ReduceOp, n: usize) -> Self {
        if op == ReduceOp::Avg {
            self / n as f64
        } else {
            self
        }
    }
}

macro_rules! half_te {
    ($t:ty, $name:expr) => {
        impl TE for $t {
            const NAME: &'static str = $name;
            const INT: bool = false;
            fn from_bits(h: u64) -> Self {
                <$t>::from_bits(h as u16)
            }
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
            fn gen(op: ReduceOp, h: u64) -> Self {
                <$t>::from_f64(float_gen(op, h))
            }
            fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
                // f32 accumulation, rounded once per step.
                <$t>::from_f32(fcomb(op, a.to_f32(), b.to_f32()))
            }
            fn fin(self, op: ReduceOp, n: usize) -> Self {
                if op == ReduceOp::Avg {
                    <$t>::from_f32(self.to_f32() / n as f32)
                } else {
                    self
                }
            }
        }
    };
}
half_te!(f16, "f16");
half_te!(bf16, "bf16");

fn ops_for<T: TE>() -> &'static [ReduceOp] {
    if T::INT {
        &ReduceOp::ALL
    } else {
        &[
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ]
    }
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Per (operation, rank) seed: every rank derives every other rank's input.
fn seed(salt: u64, rank: usize) -> u64 {
    mix(salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ mix(rank as u64 + 0x1234_5678))
}

/// The `i`-th random word of a seed.
#[inline]
fn hh(seed: u64, i: usize) -> u64 {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x ^ (x >> 32)
}

/// Reference reduction of element `i` over every rank's input.
fn reduce_ref<T: TE>(op: ReduceOp, seeds: &[u64], i: usize) -> T {
    let mut acc = T::gen(op, hh(seeds[0], i));
    for s in &seeds[1..] {
        acc = T::comb(op, acc, T::gen(op, hh(*s, i)));
    }
    acc.fin(op, seeds.len())
}

fn sentinel<T: TE>(len: usize, salt: u64) -> Vec<T> {
    let s = mix(salt ^ 0xDEAD_BEEF);
    (0..len).map(|i| T::from_bits(hh(s, i))).collect()
}

fn data<T: TE>(seed: u64, len: usize, offset: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_bits(hh(seed, offset + i)))
        .collect()
}

// ---------------------------------------------------------------------------
// One rank's view: its communicator and what went wrong.

struct Stop;
type Res = Result<(), Stop>;

struct Rk<'c> {
    c: &'c Communicator,
    r: usize,
    n: usize,
    tag: String,
    salt: u64,
    errs: Vec<String>,
}

impl<'c> Rk<'c> {
    fn new(c: &'c Communicator, tag: &str) -> Rk<'c> {
        Rk {
            c,
            r: c.rank(),
            n: c.size(),
            tag: tag.to_string(),
            salt: 0,
            errs: Vec::new(),
        }
    }

    fn next(&mut self) -> u64 {
        self.salt += 1;
        self.salt
    }

    fn seeds(&self, salt: u64) -> Vec<u64> {
        (0..self.n).map(|q| seed(salt, q)).collect()
    }

    fn push(&mut self, msg: String) {
        if self.errs.len() < 12 {
            self.errs
                .push(format!("[{} n={} rank {}] {msg}", self.tag, self.n, self.r));
        }
    }

    /// An operation's result: an error stops this rank (the communicator is
    /// aborted after a failed operation, so going on would only add noise).
    fn ok(&mut self, what: &str, r: sncl::Result<()>) -> Res {
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                self.push(format!("{what}: failed: {e}"));
                Err(Stop)
            }
        }
    }

    /// Compares `got` with `want(i)` where that is Some, bit for bit.
    fn check<T: TE>(&mut self, what: &str, got: &[T], want: impl Fn(usize) -> Option<T>) {
        let mut bad = 0usize;
        let mut first = None;
        for (i, g) in got.iter().enumerate() {
            if let Some(w) = want(i) {
                if g.bits() != w.bits() {
                    bad += 1;
                    if first.is_none() {
                        first = Some((i, *g, w));
                    }
                }
            }
        }
        if let Some((i, g, w)) = first {
            self.push(format!(
                "{what}: {bad} of {} elements wrong; first at [{i}]: got {g:?}, want {w:?}",
                got.len()
            ));
        }
    }
}

fn place(in_place: bool) -> &'static str {
    if in_place {
        "in place"
    } else {
        "out of place"
    }
}

// ---------------------------------------------------------------------------
// The collectives, each checked against the reference on every rank.

fn t_all_reduce<T: TE>(k: &mut Rk, op: ReduceOp, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let s = k.next();
    let seeds = k.seeds(s);
    let send: Vec<T> = (0..count).map(|i| T::gen(op, hh(seeds[k.r], i))).collect();
    let what = format!(
        "all_reduce<{}>({op:?}, count={count}, {})",
        T::NAME,
        place(in_place)
    );
    let got = if in_place {
        let mut b = send;
        k.ok(&what, c.all_reduce_in_place(&mut b, op))?;
        b
    } else {
        let mut recv = sentinel::<T>(count, s);
        k.ok(&what, c.all_reduce(&send, &mut recv, op))?;
        recv
    };
    k.check(&what, &got, |i| Some(reduce_ref::<T>(op, &seeds, i)));
    Ok(())
}

fn t_reduce_scatter<T: TE>(k: &mut Rk, op: ReduceOp, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let seeds = k.seeds(s);
    let send: Vec<T> = (0..n * count)
        .map(|i| T::gen(op, hh(seeds[r], i)))
        .collect();
    let what = format!(
        "reduce_scatter<{}>({op:?}, count={count}, {})",
        T::NAME,
        place(in_place)
    );
    let got = if in_place {
        let mut b = send;
        k.ok(&what, c.reduce_scatter_in_place(&mut b, op))?;
        b[r * count..(r + 1) * count].to_vec()
    } else {
        let mut recv = sentinel::<T>(count, s);
        k.ok(&what, c.reduce_scatter(&send, &mut recv, op))?;
        recv
    };
    k.check(&what, &got, |j| {
        Some(reduce_ref::<T>(op, &seeds, r * count + j))
    });
    Ok(())
}

fn t_reduce<T: TE>(k: &mut Rk, op: ReduceOp, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let root = (s as usize * 7) % n;
    let seeds = k.seeds(s);
    let send: Vec<T> = (0..count).map(|i| T::gen(op, hh(seeds[r], i))).collect();
    let what = format!(
        "reduce<{}>({op:?}, count={count}, root={root}, {})",
        T::NAME,
        place(in_place)
    );
    if in_place {
        let mut b = send.clone();
        k.ok(&what, c.reduce_in_place(&mut b, op, root))?;
        if r == root {
            k.check(&what, &b, |i| Some(reduce_ref::<T>(op, &seeds, i)));
        } else {
            k.check(&format!("{what} (non-root buffer)"), &b, |i| Some(send[i]));
        }
    } else {
        // Non-roots pass an empty recv, or a full one that must stay untouched.
        let full = r == root || s.is_multiple_of(2);
        let mut recv = sentinel::<T>(if full { count } else { 0 }, s);
        k.ok(&what, c.reduce(&send, &mut recv, op, root))?;
        if r == root {
            k.check(&what, &recv, |i| Some(reduce_ref::<T>(op, &seeds, i)));
        } else {
            let untouched = sentinel::<T>(recv.len(), s);
            k.check(&format!("{what} (non-root recv)"), &recv, |i| {
                Some(untouched[i])
            });
        }
        k.check(&format!("{what} (send)"), &send, |i| {
            Some(T::gen(op, hh(seeds[r], i)))
        });
    }
    Ok(())
}

fn t_broadcast<T: TE>(k: &mut Rk, count: usize, from: bool) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let root = (s as usize * 5 + 1) % n;
    let src = seed(s, root);
    let want = data::<T>(src, count, 0);
    let what = format!(
        "broadcast{}<{}>(count={count}, root={root})",
        if from { "_from" } else { "" },
        T::NAME
    );
    let got = if from {
        // The send buffer is ignored on non-roots: give them a short one.
        let send = if r == root {
            want.clone()
        } else {
            sentinel::<T>(3, s + 1)
        };
        let mut recv = sentinel::<T>(count, s);
        k.ok(&what, c.broadcast_from(&send, &mut recv, root))?;
        if r == root {
            k.check(&format!("{what} (send)"), &send, |i| Some(want[i]));
        }
        recv
    } else {
        let mut b = if r == root {
            want.clone()
        } else {
            sentinel::<T>(count, s)
        };
        k.ok(&what, c.broadcast(&mut b, root))?;
        b
    };
    k.check(&what, &got, |i| Some(want[i]));
    Ok(())
}

fn t_all_gather<T: TE>(k: &mut Rk, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let seeds = k.seeds(s);
    let mine = data::<T>(seeds[r], count, 0);
    let what = format!(
        "all_gather<{}>(count={count}, {})",
        T::NAME,
        place(in_place)
    );
    let mut buf = sentinel::<T>(n * count, s);
    if in_place {
        buf[r * count..(r + 1) * count].copy_from_slice(&mine);
        k.ok(&what, c.all_gather_in_place(&mut buf))?;
    } else {
        k.ok(&what, c.all_gather(&mine, &mut buf))?;
    }
    k.check(&what, &buf, |i| {
        Some(T::from_bits(hh(seeds[i / count.max(1)], i % count.max(1))))
    });
    Ok(())
}

fn t_alltoall<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let seeds = k.seeds(s);
    // Block d of rank q's input is element range d*count.. of q's stream.
    let send = data::<T>(seeds[r], n * count, 0);
    let mut recv = sentinel::<T>(n * count, s);
    let what = format!("alltoall<{}>(count={count})", T::NAME);
    k.ok(&what, c.alltoall(&send, &mut recv))?;
    let cm = count.max(1);
    k.check(&what, &recv, |i| {
        let (q, j) = (i / cm, i % cm);
        Some(T::from_bits(hh(seeds[q], r * count + j)))
    });
    Ok(())
}

fn t_gather<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let root = (s as usize * 3) % n;
    let seeds = k.seeds(s);
    let send = data::<T>(seeds[r], count, 0);
    let mut recv = sentinel::<T>(if r == root { n * count } else { 0 }, s);
    let what = format!("gather<{}>(count={count}, root={root})", T::NAME);
    k.ok(&what, c.gather(&send, &mut recv, root))?;
    let cm = count.max(1);
    k.check(&what, &recv, |i| {
        Some(T::from_bits(hh(seeds[i / cm], i % cm)))
    });
    Ok(())
}

fn t_scatter<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let root = (s as usize * 3 + 2) % n;
    let src = seed(s, root);
    let send = if r == root {
        data::<T>(src, n * count, 0)
    } else {
        Vec::new()
    };
    let mut recv = sentinel::<T>(count, s);
    let what = format!("scatter<{}>(count={count}, root={root})", T::NAME);
    k.ok(&what, c.scatter(&send, &mut recv, root))?;
    k.check(&what, &recv, |i| Some(T::from_bits(hh(src, r * count + i))));
    Ok(())
}

/// Irregular counts (zeros included) laid out in reverse rank order with gaps.
fn t_all_gatherv<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let seeds = k.seeds(s);
    let counts: Vec<usize> = (0..n).map(|q| (q * 7 + s as usize) % (count + 1)).collect();
    let mut displs = vec![0; n];
    let mut acc = 1;
    for q in (0..n).rev() {
        displs[q] = acc;
        acc += counts[q] + 1;
    }
    let mut owner = vec![None; acc + 1];
    for q in 0..n {
        for j in 0..counts[q] {
            owner[displs[q] + j] = Some((q, j));
        }
    }
    let send = data::<T>(seeds[r], counts[r], 0);
    let untouched = sentinel::<T>(acc + 1, s);
    let mut recv = untouched.clone();
    let what = format!("all_gatherv<{}>(counts={counts:?})", T::NAME);
    k.ok(&what, c.all_gatherv(&send, &mut recv, &counts, &displs))?;
    k.check(&what, &recv, |i| match owner[i] {
        Some((q, j)) => Some(T::from_bits(hh(seeds[q], j))),
        None => Some(untouched[i]),
    });
    Ok(())
}

fn t_alltoallv<T: TE>(k: &mut Rk, count: usize) -> Res {
    const STRIDE: usize = 1 << 24;
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let seeds = k.seeds(s);
    let sc = |from: usize, to: usize| (from * 5 + to * 3 + s as usize) % (count + 1);
    let send_counts: Vec<usize> = (0..n).map(|d| sc(r, d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|q| sc(q, r)).collect();
    // Send blocks packed in rank order with gaps of 2; receive blocks in
    // reverse rank order with gaps of 1.
    let mut send_displs = vec![0; n];
    let mut acc = 0;
    for d in 0..n {
        send_displs[d] = acc;
        acc += send_counts[d] + 2;
    }
    let mut send = sentinel::<T>(acc, s + 7);
    for d in 0..n {
        for j in 0..send_counts[d] {
            send[send_displs[d] + j] = T::from_bits(hh(seeds[r], d * STRIDE + j));
        }
    }
    let mut recv_displs = vec![0; n];
    let mut acc = 1;
    for q in (0..n).rev() {
        recv_displs[q] = acc;
        acc += recv_counts[q] + 1;
    }
    let mut owner = vec![None; acc];
    for q in 0..n {
        for j in 0..recv_counts[q] {
            owner[recv_displs[q] + j] = Some((q, j));
        }
    }
    let untouched = sentinel::<T>(acc, s);
    let mut recv = untouched.clone();
    let what = format!(
        "alltoallv<{}>(send_counts={send_counts:?}, recv_counts={recv_counts:?})",
        T::NAME
    );
    k.ok(
        &what,
        c.alltoallv(
            &send,
            &send_counts,
            &send_displs,
            &mut recv,
            &recv_counts,
            &recv_displs,
        ),
    )?;
    k.check(&what, &recv, |i| match owner[i] {
        Some((q, j)) => Some(T::from_bits(hh(seeds[q], r * STRIDE + j))),
        None => Some(untouched[i]),
    });
    Ok(())
}

// ---------------------------------------------------------------------------
// Suites.

const CHUNK: usize = 4096;
const SLOT: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Every collective (ring / pairwise / rd where forced).
    Full,
    /// The collectives with a tree algorithm.
    Tree,
    /// all_reduce only (recursive doubling).
    Rd,
}

fn config(kind: Kind, transport: TransportChoice) -> Config {
    use Algorithm::*;
    use Collective::*;
    let algo = match kind {
        Kind::Full => vec![
            (AllReduce, Ring),
            (Broadcast, Ring),
            (Reduce, Ring),
            (ReduceScatter, Ring),
            (AllGather, Ring),
            (AllToAll, Pairwise),
            (Gather, Pairwise),
            (Scatter, Pairwise),
            (Barrier, Rd),
        ],
        Kind::Tree => vec![(AllReduce, Tree), (Broadcast, Tree), (Reduce, Tree)],
        Kind::Rd => vec![(AllReduce, Rd)],
    };
    Config {
        timeout: Duration::from_secs(60),
        algo,
        chunk_bytes: CHUNK,
        shm_slot_bytes: SLOT,
        tcp_piece_bytes: 4096,
        transport,
        ..Default::default()
    }
}

fn suite_t<T: TE>(k: &mut Rk, kind: Kind) -> Res {
    let n = k.n;
    let ce = CHUNK / std::mem::size_of::<T>();
    // (whole-buffer count, per-rank block count): 0, 1, 7, and more than
    // one chunk / one shared-memory slot (two ring rounds and a remainder).
    let counts = [(0, 0), (1, 1), (7, 7), (2 * ce * n + 5, 2 * ce + 5)];
    for (ci, &(total, block)) in counts.iter().enumerate() {
        for &op in ops_for::<T>() {
            for in_place in [false, true] {
                t_all_reduce::<T>(k, op, total, in_place)?;
                if kind != Kind::Rd {
                    t_reduce::<T>(k, op, total, in_place)?;
                }
                if kind == Kind::Full {
                    t_reduce_scatter::<T>(k, op, block, in_place)?;
                }
            }
        }
        if kind != Kind::Rd {
            t_broadcast::<T>(k, total, false)?;
            t_broadcast::<T>(k, total, true)?;
        }
        if kind == Kind::Full {
            t_all_gather::<T>(k, block, false)?;
            t_all_gather::<T>(k, block, true)?;
            t_alltoall::<T>(k, block)?;
            t_gather::<T>(k, block)?;
            t_scatter::<T>(k, block)?;
            t_all_gatherv::<T>(k, block)?;
            t_alltoallv::<T>(k, block)?;
            if ci == 0 {
                let c = k.c;
                k.ok("barrier", c.barrier())?;
            }
        }
    }
    Ok(())
}

fn suite(k: &mut Rk, kind: Kind, only: &[&str]) -> Res {
    macro_rules! each {
        ($($t:ty),*) => {
            $(
                if only.is_empty() || only.contains(&<$t as TE>::NAME) {
                    suite_t::<$t>(k, kind)?;
                }
            )*
        };
    }
    each!(i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16);
    Ok(())
}

/// Runs `f` on every rank of `comms` (one thread each); returns the failures.
fn on_ranks(comms: &[Communicator], tag: &str, f: impl Fn(&mut Rk) -> Res + Sync) -> Vec<String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || {
                    let mut k = Rk::new(c, tag);
                    let _ = f(&mut k);
                    k.errs
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

fn init(n: usize, cfg: Config) -> Vec<Communicator> {
    Communicator::init_threads(n, cfg).unwrap_or_else(|e| panic!("init_threads({n}) failed: {e}"))
}

fn assert_clean(errs: Vec<String>) {
    if !errs.is_empty() {
        let shown: Vec<&str> = errs.iter().take(40).map(String::as_str).collect();
        panic!("{} failure(s):\n{}", errs.len(), shown.join("\n"));
    }
}

fn matrix(n: usize) {
    let t0 = Instant::now();
    let mut errs = Vec::new();
    for kind in [Kind::Full, Kind::Tree, Kind::Rd] {
        let comms = init(n, config(kind, TransportChoice::Auto));
        for c in &comms {
            for (p, t) in c.transports().iter().enumerate() {
                let want = if p == c.rank() { "self" } else { "shm" };
                assert_eq!(*t, want, "rank {} to {p}", c.rank());
            }
        }
        errs.extend(on_ranks(&comms, &format!("{kind:?}/shm"), |k| {
            suite(k, kind, &[])
        }));
    }
    eprintln!("matrix n={n}: {:?}", t0.elapsed());
    assert_clean(errs);
}

#[test]
fn matrix_n1() {
    matrix(1);
}
#[test]
fn matrix_n2() {
    matrix(2);
}
#[test]
fn matrix_n3() {
    matrix(3);
}
#[test]
fn matrix_n4() {
    matrix(4);
}
#[test]
fn matrix_n5() {
    matrix(5);
}
#[test]
fn matrix_n6() {
    matrix(6);
}
#[test]
fn matrix_n7() {
    matrix(7);
}
#[test]
fn matrix_n8() {
    matrix(8);
}
