//! Checked collectives: run an operation on a communicator and compare the
//! result with the reference, element by element; thread-rank helpers and
//! the table of cases the process tests run.

use std::sync::mpsc;
use std::time::Duration;

use half::{bf16, f16};

use sncl::{Communicator, Config, ReduceOp};

use super::reference::*;

// ---------------------------------------------------------------------------
// One rank's view: its communicator and what went wrong.

pub struct Stop;
pub type Res = Result<(), Stop>;

pub struct Rk<'c> {
    pub c: &'c Communicator,
    pub r: usize,
    pub n: usize,
    pub tag: String,
    pub salt: u64,
    pub errs: Vec<String>,
    /// Run the collectives through `Communicator::scope` (non-blocking
    /// form, then `Work::wait`) instead of the blocking calls.
    pub nb: bool,
}

impl<'c> Rk<'c> {
    pub fn new(c: &'c Communicator, tag: &str) -> Rk<'c> {
        Rk {
            c,
            r: c.rank(),
            n: c.size(),
            tag: tag.to_string(),
            salt: 0,
            errs: Vec::new(),
            nb: false,
        }
    }

    pub fn next(&mut self) -> u64 {
        self.salt += 1;
        self.salt
    }

    pub fn seeds(&self, salt: u64) -> Vec<u64> {
        (0..self.n).map(|q| seed(salt, q)).collect()
    }

    pub fn push(&mut self, msg: String) {
        if self.errs.len() < 12 {
            self.errs
                .push(format!("[{} n={} rank {}] {msg}", self.tag, self.n, self.r));
        }
    }

    /// An operation's result: an error stops this rank (the communicator is
    /// aborted after a failed operation, so going on would only add noise).
    pub fn ok(&mut self, what: &str, r: sncl::Result<()>) -> Res {
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                self.push(format!("{what}: failed: {e}"));
                Err(Stop)
            }
        }
    }

    /// Compares `got` with `want(i)` where that is Some, bit for bit.
    pub fn check<T: TE>(&mut self, what: &str, got: &[T], want: impl Fn(usize) -> Option<T>) {
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

/// A collective call, blocking or (when `nb`) non-blocking through a scope.
macro_rules! call {
    ($nb:expr, $c:expr, $m:ident ( $($a:expr),* $(,)? )) => {
        if $nb {
            $c.scope(|s| s.$m($($a),*)?.wait())
        } else {
            $c.$m($($a),*)
        }
    };
}

pub fn place(in_place: bool) -> &'static str {
    if in_place {
        "in place"
    } else {
        "out of place"
    }
}

// ---------------------------------------------------------------------------
// The collectives, each checked against the reference on every rank.

pub fn t_all_reduce<T: TE>(k: &mut Rk, op: ReduceOp, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let nb = k.nb;
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
        k.ok(&what, call!(nb, c, all_reduce_in_place(&mut b, op)))?;
        b
    } else {
        let mut recv = sentinel::<T>(count, s);
        k.ok(&what, call!(nb, c, all_reduce(&send, &mut recv, op)))?;
        recv
    };
    k.check(&what, &got, |i| Some(reduce_ref::<T>(op, &seeds, i)));
    Ok(())
}

pub fn t_reduce_scatter<T: TE>(k: &mut Rk, op: ReduceOp, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let nb = k.nb;
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
        k.ok(&what, call!(nb, c, reduce_scatter_in_place(&mut b, op)))?;
        b[r * count..(r + 1) * count].to_vec()
    } else {
        let mut recv = sentinel::<T>(count, s);
        k.ok(&what, call!(nb, c, reduce_scatter(&send, &mut recv, op)))?;
        recv
    };
    k.check(&what, &got, |j| {
        Some(reduce_ref::<T>(op, &seeds, r * count + j))
    });
    Ok(())
}

pub fn t_reduce<T: TE>(k: &mut Rk, op: ReduceOp, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let nb = k.nb;
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
        k.ok(&what, call!(nb, c, reduce_in_place(&mut b, op, root)))?;
        if r == root {
            k.check(&what, &b, |i| Some(reduce_ref::<T>(op, &seeds, i)));
        } else {
            k.check(&format!("{what} (non-root buffer)"), &b, |i| Some(send[i]));
        }
    } else {
        // Non-roots pass an empty recv, or a full one that must stay untouched.
        let full = r == root || s.is_multiple_of(2);
        let mut recv = sentinel::<T>(if full { count } else { 0 }, s);
        k.ok(&what, call!(nb, c, reduce(&send, &mut recv, op, root)))?;
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

pub fn t_broadcast<T: TE>(k: &mut Rk, count: usize, from: bool) -> Res {
    let c = k.c;
    let nb = k.nb;
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
        k.ok(&what, call!(nb, c, broadcast_from(&send, &mut recv, root)))?;
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
        k.ok(&what, call!(nb, c, broadcast(&mut b, root)))?;
        b
    };
    k.check(&what, &got, |i| Some(want[i]));
    Ok(())
}

pub fn t_all_gather<T: TE>(k: &mut Rk, count: usize, in_place: bool) -> Res {
    let c = k.c;
    let nb = k.nb;
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
        k.ok(&what, call!(nb, c, all_gather_in_place(&mut buf)))?;
    } else {
        k.ok(&what, call!(nb, c, all_gather(&mine, &mut buf)))?;
    }
    k.check(&what, &buf, |i| {
        Some(T::from_bits(hh(seeds[i / count.max(1)], i % count.max(1))))
    });
    Ok(())
}

pub fn t_alltoall<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let nb = k.nb;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let seeds = k.seeds(s);
    // Block d of rank q's input is element range d*count.. of q's stream.
    let send = data::<T>(seeds[r], n * count, 0);
    let mut recv = sentinel::<T>(n * count, s);
    let what = format!("alltoall<{}>(count={count})", T::NAME);
    k.ok(&what, call!(nb, c, alltoall(&send, &mut recv)))?;
    let cm = count.max(1);
    k.check(&what, &recv, |i| {
        let (q, j) = (i / cm, i % cm);
        Some(T::from_bits(hh(seeds[q], r * count + j)))
    });
    Ok(())
}

pub fn t_gather<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let nb = k.nb;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let root = (s as usize * 3) % n;
    let seeds = k.seeds(s);
    let send = data::<T>(seeds[r], count, 0);
    let mut recv = sentinel::<T>(if r == root { n * count } else { 0 }, s);
    let what = format!("gather<{}>(count={count}, root={root})", T::NAME);
    k.ok(&what, call!(nb, c, gather(&send, &mut recv, root)))?;
    let cm = count.max(1);
    k.check(&what, &recv, |i| {
        Some(T::from_bits(hh(seeds[i / cm], i % cm)))
    });
    Ok(())
}

pub fn t_scatter<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let nb = k.nb;
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
    k.ok(&what, call!(nb, c, scatter(&send, &mut recv, root)))?;
    k.check(&what, &recv, |i| Some(T::from_bits(hh(src, r * count + i))));
    Ok(())
}

/// Irregular counts (zeros included) laid out in reverse rank order with gaps.
pub fn t_all_gatherv<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let nb = k.nb;
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
    k.ok(
        &what,
        call!(nb, c, all_gatherv(&send, &mut recv, &counts, &displs)),
    )?;
    k.check(&what, &recv, |i| match owner[i] {
        Some((q, j)) => Some(T::from_bits(hh(seeds[q], j))),
        None => Some(untouched[i]),
    });
    Ok(())
}

pub fn t_alltoallv<T: TE>(k: &mut Rk, count: usize) -> Res {
    const STRIDE: usize = 1 << 24;
    let c = k.c;
    let nb = k.nb;
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
        call!(
            nb,
            c,
            alltoallv(
                &send,
                &send_counts,
                &send_displs,
                &mut recv,
                &recv_counts,
                &recv_displs,
            )
        ),
    )?;
    k.check(&what, &recv, |i| match owner[i] {
        Some((q, j)) => Some(T::from_bits(hh(seeds[q], r * STRIDE + j))),
        None => Some(untouched[i]),
    });
    Ok(())
}

// ---------------------------------------------------------------------------
// Ranks as threads.

/// Runs `f` on every rank of `comms` (one thread each); returns the failures.
pub fn on_ranks(
    comms: &[Communicator],
    tag: &str,
    f: impl Fn(&mut Rk) -> Res + Sync,
) -> Vec<String> {
    on_ranks_with(comms, tag, false, f)
}

/// [`on_ranks`], with the collectives blocking or non-blocking (`nb`).
pub fn on_ranks_with(
    comms: &[Communicator],
    tag: &str,
    nb: bool,
    f: impl Fn(&mut Rk) -> Res + Sync,
) -> Vec<String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || {
                    let mut k = Rk::new(c, tag);
                    k.nb = nb;
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

/// Runs `f(rank, comm)` on one thread per rank of `comms`; each rank's
/// result with how long its call took.
pub fn timed_on_ranks<R: Send>(
    comms: &[Communicator],
    f: impl Fn(usize, &Communicator) -> R + Sync,
) -> Vec<(R, Duration)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || {
                    let t = std::time::Instant::now();
                    let out = f(r, c);
                    (out, t.elapsed())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// (op, count, algo) of every flight recorder entry of `c`, oldest first:
/// what ran, as the recorder saw it.
pub fn flight_ops(c: &Communicator) -> Vec<(String, usize, String)> {
    let field = |line: &str, key: &str| -> String {
        let at = line
            .find(&format!("\"{key}\":"))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            + key.len()
            + 3;
        let rest = &line[at..];
        let end = rest.find([',', '}']).expect("field end");
        rest[..end].trim_matches('"').to_string()
    };
    c.flight_recorder_json()
        .lines()
        .filter(|l| l.contains("\"algo\":"))
        .map(|l| {
            (
                field(l, "op"),
                field(l, "count").parse().expect("count"),
                field(l, "algo"),
            )
        })
        .collect()
}

/// The algorithm the flight recorder noted for `c`'s last operation.
pub fn last_algorithm(c: &Communicator) -> String {
    flight_ops(c).pop().expect("a flight record").2
}

pub fn init(n: usize, cfg: Config) -> Vec<Communicator> {
    Communicator::init_threads(n, cfg).unwrap_or_else(|e| panic!("init_threads({n}) failed: {e}"))
}

pub fn assert_clean(errs: Vec<String>) {
    if !errs.is_empty() {
        let shown: Vec<&str> = errs.iter().take(40).map(String::as_str).collect();
        panic!("{} failure(s):\n{}", errs.len(), shown.join("\n"));
    }
}

/// Runs `f` with a watchdog: a hang is a test failure, not a stuck suite.
pub fn within<R: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no result within {limit:?} (hang or deadlock)")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: the test thread panicked"),
    }
}

// ---------------------------------------------------------------------------
// Point-to-point and cases by name (for ranks as processes).

/// A group on every rank: `count + r` elements to the next rank and
/// `count + 1` elements (of another stream) to the previous one. (Never two
/// empty receives in one group: `Group::recv` wrongly rejects those, see
/// `threads_matrix::group_with_two_empty_receives`.)
pub fn t_sendrecv<T: TE>(k: &mut Rk, count: usize) -> Res {
    let c = k.c;
    let (r, n) = (k.r, k.n);
    let s = k.next();
    let seeds = k.seeds(s);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let fwd = data::<T>(seeds[r], count + r, 0);
    let back = data::<T>(seeds[r], count + 1, 1 << 24);
    let mut from_prev = sentinel::<T>(count + prev, s);
    let mut from_next = sentinel::<T>(count + 1, s + 1);
    let what = format!("group send/recv<{}>(count={count})", T::NAME);
    k.ok(
        &what,
        c.group(|g| {
            g.send(&fwd, next);
            g.recv(&mut from_prev, prev);
            g.send(&back, prev);
            g.recv(&mut from_next, next);
        }),
    )?;
    k.check(&format!("{what} from prev"), &from_prev, |i| {
        Some(T::from_bits(hh(seeds[prev], i)))
    });
    k.check(&format!("{what} from next"), &from_next, |i| {
        Some(T::from_bits(hh(seeds[next], (1 << 24) + i)))
    });
    Ok(())
}

/// Every collective form, by the name the process tests use.
pub const COLLS: [&str; 17] = [
    "all_reduce",
    "all_reduce_in_place",
    "reduce_scatter",
    "reduce_scatter_in_place",
    "reduce",
    "reduce_in_place",
    "all_gather",
    "all_gather_in_place",
    "broadcast",
    "broadcast_from",
    "alltoall",
    "all_gatherv",
    "alltoallv",
    "gather",
    "scatter",
    "sendrecv",
    "barrier",
];

pub const DTYPES: [&str; 10] = [
    "i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16",
];

pub fn is_reducing(coll: &str) -> bool {
    coll.starts_with("all_reduce") || coll.starts_with("reduce")
}

pub fn is_int(dtype: &str) -> bool {
    dtype.starts_with('i') || dtype.starts_with('u')
}

fn run_case_t<T: TE>(k: &mut Rk, coll: &str, op: ReduceOp, count: usize) -> Res {
    match coll {
        "all_reduce" => t_all_reduce::<T>(k, op, count, false),
        "all_reduce_in_place" => t_all_reduce::<T>(k, op, count, true),
        "reduce_scatter" => t_reduce_scatter::<T>(k, op, count, false),
        "reduce_scatter_in_place" => t_reduce_scatter::<T>(k, op, count, true),
        "reduce" => t_reduce::<T>(k, op, count, false),
        "reduce_in_place" => t_reduce::<T>(k, op, count, true),
        "all_gather" => t_all_gather::<T>(k, count, false),
        "all_gather_in_place" => t_all_gather::<T>(k, count, true),
        "broadcast" => t_broadcast::<T>(k, count, false),
        "broadcast_from" => t_broadcast::<T>(k, count, true),
        "alltoall" => t_alltoall::<T>(k, count),
        "all_gatherv" => t_all_gatherv::<T>(k, count),
        "alltoallv" => t_alltoallv::<T>(k, count),
        "gather" => t_gather::<T>(k, count),
        "scatter" => t_scatter::<T>(k, count),
        "sendrecv" => t_sendrecv::<T>(k, count),
        "barrier" => {
            let c = k.c;
            k.ok("barrier", c.barrier())
        }
        other => panic!("unknown collective {other}"),
    }
}

/// Runs one named case (`count` is the per-rank block for block collectives).
pub fn run_case(k: &mut Rk, coll: &str, dtype: &str, op: ReduceOp, count: usize) -> Res {
    macro_rules! by_dtype {
        ($($t:ty),*) => {
            match dtype {
                $(d if d == <$t as TE>::NAME => run_case_t::<$t>(k, coll, op, count),)*
                other => panic!("unknown dtype {other}"),
            }
        };
    }
    by_dtype!(i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16)
}
