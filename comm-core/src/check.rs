//! Symbolic execution of schedules: runs every rank's schedule together with
//! rendezvous message matching (a send completes only when its receiver
//! takes it, the strictest buffering, so a schedule that passes cannot
//! deadlock on finite transport slots), tracking for every element which
//! ranks' contributions it holds. Proves that each output element holds every
//! expected contribution exactly once and was finalized exactly once.

use crate::schedule::{BufId, Op, Region, Schedule};

/// Most ranks the checker tracks.
pub const MAX_RANKS: usize = 1024;

/// A set of ranks (bit i = rank i), up to [`MAX_RANKS`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Mask([u64; MAX_RANKS / 64]);

impl Mask {
    /// The empty set.
    pub const EMPTY: Mask = Mask([0; MAX_RANKS / 64]);

    /// `{rank}`.
    pub fn one(rank: usize) -> Mask {
        let mut m = Mask::EMPTY;
        m.0[rank / 64] |= 1 << (rank % 64);
        m
    }

    /// `{0, ..., n-1}`.
    pub fn all(n: usize) -> Mask {
        let mut m = Mask::EMPTY;
        for r in 0..n {
            m.0[r / 64] |= 1 << (r % 64);
        }
        m
    }

    fn intersects(&self, o: &Mask) -> bool {
        self.0.iter().zip(o.0.iter()).any(|(a, b)| a & b != 0)
    }

    fn union(&self, o: &Mask) -> Mask {
        let mut m = *self;
        for (a, b) in m.0.iter_mut().zip(o.0.iter()) {
            *a |= b;
        }
        m
    }
}

impl std::fmt::Debug for Mask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ranks: Vec<usize> = (0..MAX_RANKS)
            .filter(|r| self.0[r / 64] & (1 << (r % 64)) != 0)
            .collect();
        write!(f, "{ranks:?}")
    }
}

/// A symbolic element: the set of ranks whose input element `idx` it sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sym {
    /// Contributing ranks.
    pub mask: Mask,
    /// Index of the element in the contributing ranks' input buffers.
    pub idx: usize,
    /// Whether the operator's final step has been applied.
    pub fin: bool,
}

/// What a collective must produce, per rank and output element.
pub type Expect<'a> = &'a dyn Fn(usize, usize) -> Option<Sym>;

/// Input and output sizes of one rank, and how its buffers alias.
#[derive(Clone, Copy, Debug)]
pub struct Buffers {
    /// Elements of the input.
    pub send: usize,
    /// Elements of the output.
    pub recv: usize,
    /// In place: the input is the output starting at this element.
    pub in_place_at: Option<usize>,
}

struct RankState {
    send: Vec<Option<Sym>>,
    recv: Vec<Option<Sym>>,
    scratch: Vec<Option<Sym>>,
    /// Point-to-point buffers (`BufId::Peer(k)`), sized by the schedule.
    peers: Vec<Vec<Option<Sym>>>,
    in_place_at: Option<usize>,
    step: usize,
    done: Vec<bool>,
}

impl RankState {
    fn resolve(&self, reg: Region) -> (BufId, usize) {
        match (reg.buf, self.in_place_at) {
            (BufId::Send, Some(at)) => (BufId::Recv, at + reg.offset),
            (b, _) => (b, reg.offset),
        }
    }

    fn buf(&self, b: BufId) -> &Vec<Option<Sym>> {
        match b {
            BufId::Send => &self.send,
            BufId::Recv => &self.recv,
            BufId::Scratch => &self.scratch,
            BufId::Peer(k) => &self.peers[usize::from(k)],
        }
    }

    fn buf_mut(&mut self, b: BufId) -> &mut Vec<Option<Sym>> {
        match b {
            BufId::Send => &mut self.send,
            BufId::Recv => &mut self.recv,
            BufId::Scratch => &mut self.scratch,
            BufId::Peer(k) => &mut self.peers[usize::from(k)],
        }
    }

    fn read(&self, reg: Region) -> Result<Vec<Option<Sym>>, String> {
        let (b, o) = self.resolve(reg);
        let v = self.buf(b);
        v.get(o..o + reg.len)
            .map(|s| s.to_vec())
            .ok_or_else(|| format!("read {reg:?} outside a buffer of {} elements", v.len()))
    }

    fn write(&mut self, reg: Region, data: &[Option<Sym>]) -> Result<(), String> {
        let (b, o) = self.resolve(reg);
        let v = self.buf_mut(b);
        let len = v.len();
        v.get_mut(o..o + reg.len)
            .ok_or_else(|| format!("write {reg:?} outside a buffer of {len} elements"))?
            .copy_from_slice(data);
        Ok(())
    }
}

/// The ranks of `m` as a range `[lo, hi)`, if they are contiguous.
fn mask_range(m: &Mask, n: usize) -> Option<(usize, usize)> {
    let has = |r: usize| m.0[r / 64] & (1 << (r % 64)) != 0;
    let lo = (0..n).find(|&r| has(r))?;
    let hi = (lo..n).find(|&r| !has(r)).unwrap_or(n);
    (hi..n).all(|r| !has(r)).then_some((lo, hi))
}

/// Whether combining `a` and `b` computes a node of the canonical tree
/// over `n` ranks from its two children (see [`crate::algo::canonical_split`]).
fn canonical_pair(a: &Mask, b: &Mask, n: usize) -> bool {
    let (Some(a), Some(b)) = (mask_range(a, n), mask_range(b, n)) else {
        return false;
    };
    let (left, right) = if a.0 < b.0 { (a, b) } else { (b, a) };
    let (mut lo, mut hi) = (0, n);
    while hi - lo >= 2 {
        let mid = crate::algo::canonical_split(lo, hi);
        if (lo, hi) == (left.0, right.1) {
            return left.1 == mid && right.0 == mid;
        }
        if right.1 <= mid {
            hi = mid;
        } else if left.0 >= mid {
            lo = mid;
        } else {
            return false;
        }
    }
    false
}

/// Combines two symbolic elements; with `canonical_over = Some(n)` only
/// two sibling nodes of the canonical tree over `n` ranks may combine.
fn combine(
    a: Option<Sym>,
    b: Option<Sym>,
    canonical_over: Option<usize>,
) -> Result<Option<Sym>, String> {
    match (a, b) {
        (Some(a), Some(b)) => {
            if let Some(n) = canonical_over {
                if !canonical_pair(&a.mask, &b.mask, n) {
                    return Err(format!(
                        "combines {:?} with {:?} in element {}, not two siblings of the \
                         canonical tree",
                        a.mask, b.mask, a.idx
                    ));
                }
            }
            if a.idx != b.idx {
                return Err(format!("reduces element {} with element {}", a.idx, b.idx));
            }
            if a.mask.intersects(&b.mask) {
                return Err(format!(
                    "counts a contribution twice in element {}: {:?} and {:?}",
                    a.idx, a.mask, b.mask
                ));
            }
            if a.fin || b.fin {
                return Err(format!("reduces an already finalized element {}", a.idx));
            }
            Ok(Some(Sym {
                mask: a.mask.union(&b.mask),
                idx: a.idx,
                fin: false,
            }))
        }
        _ => Err("reduces an undefined element".into()),
    }
}

/// Checks that within each step no op writes what another op of the step
/// reads or writes (the executor runs them concurrently).
fn check_step_conflicts(s: &Schedule, in_place_at: Option<usize>) -> Result<(), String> {
    let norm = |r: Region| match (r.buf, in_place_at) {
        (BufId::Send, Some(at)) => Region::new(BufId::Recv, at + r.offset, r.len),
        _ => r,
    };
    for (i, step) in s.steps.iter().enumerate() {
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for op in &step.ops {
            match *op {
                Op::Send { src, .. } => reads.push((norm(src), None)),
                Op::Recv { dst, .. } => writes.push(norm(dst)),
                Op::RecvReduce { local, dst, .. } => {
                    reads.push((norm(local), Some(norm(dst))));
                    writes.push(norm(dst));
                }
                Op::Copy { .. } | Op::Finalize { .. } => {}
            }
        }
        for (a, w) in writes.iter().enumerate() {
            for w2 in &writes[a + 1..] {
                if w.overlaps(w2) {
                    return Err(format!("step {i}: two ops write {w:?} and {w2:?}"));
                }
            }
            for (r, own) in &reads {
                if r.overlaps(w) && own.map(|d| d != *w || *r != d).unwrap_or(true) {
                    return Err(format!("step {i}: {r:?} is read while {w:?} is written"));
                }
            }
        }
    }
    Ok(())
}

/// Runs all ranks' schedules symbolically and compares every rank's output
/// with `expect(rank, element)`. `bufs(rank)` gives each rank's sizes.
pub fn check(
    schedules: &[Schedule],
    bufs: &dyn Fn(usize) -> Buffers,
    expect: Expect<'_>,
) -> Result<(), String> {
    run_checked(schedules, bufs, expect, false)
}

/// [`check`], and also proves that every reduction combines two sibling
/// nodes of the canonical tree ([`crate::algo::canonical_split`]), so each
/// output element is reduced in the canonical order (deterministic mode).
pub fn check_canonical(
    schedules: &[Schedule],
    bufs: &dyn Fn(usize) -> Buffers,
    expect: Expect<'_>,
) -> Result<(), String> {
    run_checked(schedules, bufs, expect, true)
}

fn run_checked(
    schedules: &[Schedule],
    bufs: &dyn Fn(usize) -> Buffers,
    expect: Expect<'_>,
    canonical: bool,
) -> Result<(), String> {
    let n = schedules.len();
    let canonical_over = canonical.then_some(n);
    if n > MAX_RANKS {
        return Err(format!(
            "the checker tracks at most {MAX_RANKS} ranks, got {n}"
        ));
    }
    let mut ranks: Vec<RankState> = (0..n)
        .map(|r| {
            let b = bufs(r);
            let input: Vec<Option<Sym>> = (0..b.send)
                .map(|i| {
                    Some(Sym {
                        mask: Mask::one(r),
                        idx: i,
                        fin: false,
                    })
                })
                .collect();
            let mut recv = vec![None; b.recv];
            let send = match b.in_place_at {
                Some(at) => {
                    recv[at..at + b.send].copy_from_slice(&input);
                    Vec::new()
                }
                None => input,
            };
            RankState {
                send,
                recv,
                scratch: vec![None; schedules[r].scratch_elems],
                peers: peer_buffers(r, &schedules[r]),
                in_place_at: b.in_place_at,
                step: 0,
                done: Vec::new(),
            }
        })
        .collect();
    for (r, s) in schedules.iter().enumerate() {
        if s.rank != r || s.nranks != n {
            return Err(format!(
                "schedule {r} claims rank {} of {}",
                s.rank, s.nranks
            ));
        }
        check_step_conflicts(s, ranks[r].in_place_at).map_err(|e| format!("rank {r}: {e}"))?;
    }
    // Enter step 0 everywhere (copies run on entry).
    for r in 0..n {
        enter_step(&mut ranks[r], &schedules[r]).map_err(|e| format!("rank {r}: {e}"))?;
    }
    loop {
        let mut progressed = false;
        for r in 0..n {
            let Some(step) = schedules[r].steps.get(ranks[r].step) else {
                continue;
            };
            for (i, op) in step.ops.iter().enumerate() {
                if ranks[r].done[i] {
                    continue;
                }
                let Op::Send { peer: q, src } = *op else {
                    continue;
                };
                // Only the first pending send to q may match.
                let first = step.ops.iter().enumerate().position(|(j, o)| {
                    !ranks[r].done[j] && matches!(o, Op::Send { peer, .. } if *peer == q)
                });
                if first != Some(i) || q >= n {
                    if q >= n {
                        return Err(format!("rank {r}: sends to rank {q} of {n}"));
                    }
                    continue;
                }
                let Some(qstep) = schedules[q].steps.get(ranks[q].step) else {
                    continue;
                };
                let Some(j) = qstep.ops.iter().enumerate().position(|(j, o)| {
                    !ranks[q].done[j]
                        && matches!(o, Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } if *peer == r)
                }) else {
                    continue;
                };
                let data = ranks[r].read(src).map_err(|e| format!("rank {r}: {e}"))?;
                let qstep_no = ranks[q].step;
                let ctx = |e: String| format!("rank {q} receiving from {r} (step {qstep_no}): {e}");
                match qstep.ops[j] {
                    Op::Recv { dst, .. } => {
                        if dst.len != src.len {
                            return Err(ctx(format!(
                                "expects {} elements, {} sent",
                                dst.len, src.len
                            )));
                        }
                        ranks[q].write(dst, &data).map_err(ctx)?;
                    }
                    Op::RecvReduce { local, dst, .. } => {
                        if dst.len != src.len || local.len != src.len {
                            return Err(ctx(format!(
                                "expects {} elements, {} sent",
                                dst.len, src.len
                            )));
                        }
                        let mine = ranks[q].read(local).map_err(ctx)?;
                        let out = mine
                            .iter()
                            .zip(&data)
                            .map(|(a, b)| combine(*a, *b, canonical_over))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(ctx)?;
                        ranks[q].write(dst, &out).map_err(ctx)?;
                    }
                    _ => unreachable!(),
                }
                ranks[r].done[i] = true;
                ranks[q].done[j] = true;
                progressed = true;
            }
        }
        for r in 0..n {
            let s = &schedules[r];
            while let Some(step) = s.steps.get(ranks[r].step) {
                let complete = step
                    .ops
                    .iter()
                    .zip(&ranks[r].done)
                    .all(|(o, d)| *d || o.peer().is_none());
                if !complete {
                    break;
                }
                for op in &step.ops {
                    if let Op::Finalize { region } = *op {
                        let mut v = ranks[r]
                            .read(region)
                            .map_err(|e| format!("rank {r}: {e}"))?;
                        for (k, e) in v.iter_mut().enumerate() {
                            match e {
                                Some(x) if !x.fin => x.fin = true,
                                _ => {
                                    return Err(format!(
                                        "rank {r}: finalizes {region:?} element {k} = {e:?}"
                                    ))
                                }
                            }
                        }
                        ranks[r]
                            .write(region, &v)
                            .map_err(|e| format!("rank {r}: {e}"))?;
                    }
                }
                ranks[r].step += 1;
                enter_step(&mut ranks[r], s).map_err(|e| format!("rank {r}: {e}"))?;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    let stuck: Vec<String> = (0..n)
        .filter(|&r| ranks[r].step < schedules[r].steps.len())
        .map(|r| {
            format!(
                "rank {r} at step {}: {:?}",
                ranks[r].step, schedules[r].steps[ranks[r].step].ops
            )
        })
        .collect();
    if !stuck.is_empty() {
        return Err(format!("deadlock: {}", stuck.join("; ")));
    }
    for (r, st) in ranks.iter().enumerate() {
        for (i, got) in st.recv.iter().enumerate() {
            let want = expect(r, i);
            if want.is_some() && *got != want {
                return Err(format!("rank {r} output[{i}] = {got:?}, expected {want:?}"));
            }
        }
    }
    Ok(())
}

/// The point-to-point buffers a schedule uses, each as long as the furthest
/// region in it and holding this rank's own elements (what a group sends
/// from them is the caller's data; what it receives is not compared).
fn peer_buffers(r: usize, s: &Schedule) -> Vec<Vec<Option<Sym>>> {
    let mut sizes: Vec<usize> = Vec::new();
    for op in s.steps.iter().flat_map(|st| &st.ops) {
        let regions = match *op {
            Op::Send { src, .. } => [Some(src), None],
            Op::Recv { dst, .. } => [Some(dst), None],
            Op::RecvReduce { local, dst, .. } | Op::Copy { src: local, dst } => {
                [Some(local), Some(dst)]
            }
            Op::Finalize { region } => [Some(region), None],
        };
        for reg in regions.into_iter().flatten() {
            if let BufId::Peer(k) = reg.buf {
                let k = usize::from(k);
                if sizes.len() <= k {
                    sizes.resize(k + 1, 0);
                }
                sizes[k] = sizes[k].max(reg.end());
            }
        }
    }
    sizes
        .into_iter()
        .map(|len| {
            (0..len)
                .map(|idx| {
                    Some(Sym {
                        mask: Mask::one(r),
                        idx,
                        fin: false,
                    })
                })
                .collect()
        })
        .collect()
}

fn enter_step(st: &mut RankState, s: &Schedule) -> Result<(), String> {
    let Some(step) = s.steps.get(st.step) else {
        return Ok(());
    };
    st.done = vec![false; step.ops.len()];
    for op in &step.ops {
        if let Op::Copy { src, dst } = *op {
            if src.len != dst.len {
                return Err(format!("copy {src:?} -> {dst:?} changes length"));
            }
            let v = st.read(src)?;
            st.write(dst, &v)?;
        }
    }
    Ok(())
}
