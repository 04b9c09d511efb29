//! The event engine: runs compact programs of every simulated rank with
//! rendezvous matching (a message starts when both its sender and its
//! receiver reached the step that holds it, then takes the tier's latency,
//! then moves at the rate max-min fairness gives it on every link it
//! crosses).
//!
//! Two frames: *per rank* (one entity per rank) and *symmetric* (one
//! entity per local position of node 0; the ranks at the same position of
//! the other nodes are the same entity shifted by whole nodes, so a message
//! is matched through its orbit under node rotation and per-node links are
//! those of node 0). The symmetric frame needs node-major numbering and a
//! schedule that is invariant under rotating nodes (rings over nodes,
//! `hier`).
//!
//! *Aggregated* runs ([`run_aggregated`]): a run of `R` alike steps executes
//! as one step whose messages carry `R` × the bytes and take `R` × the
//! latency, and whose local work is `R` × the step's. That is exact when the
//! run's steps go in lockstep with one bottleneck (every step of a ring, the
//! steady state of a pipelined tree: the period is the slowest edge's
//! latency + transfer), and it turns the 2(n−1) steps of a ring on 65,664
//! ranks into a handful of events. Tests compare it with step-by-step
//! execution.

use std::collections::{BinaryHeap, VecDeque};

use crate::model::{Cluster, Nic, BURST_PEAK_FACTOR};
use crate::program::Program;

/// What one simulated execution produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// When the last rank finished, µs.
    pub time_us: f64,
    /// Per entity: when it finished, µs.
    pub finish_us: Vec<f64>,
    /// Per entity: time spent with its step posted but its messages not yet
    /// started because a peer was not ready, µs.
    pub wait_us: Vec<f64>,
    /// Bytes sent between ranks of one node, all ranks together.
    pub intra_bytes: f64,
    /// Bytes sent between nodes, all ranks together.
    pub inter_bytes: f64,
    /// Events processed.
    pub events: u64,
    /// Whether every program ran to its end (false: a message was never matched).
    pub complete: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Flow {
    res: [u32; 4],
    nres: u8,
    /// Bytes left at `t0`.
    remaining: f64,
    /// When `remaining` was last brought up to date.
    t0: f64,
    rate: f64,
    src: u32,
    dst: u32,
    /// Past its latency (counted on its resources).
    live: bool,
    /// Bumped whenever the flow's pending event becomes stale.
    ver: u32,
    /// Component search stamp.
    seen: u32,
    /// Rate being assigned by the current progressive filling (< 0: none yet).
    fill_rate: f64,
}

impl Flow {
    fn res(&self) -> &[u32] {
        &self.res[..self.nres as usize]
    }
}

/// What a queued event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum What {
    /// A flow gets past its latency (`ver` must still match).
    Activate(u32, u32),
    /// A flow ends at its current rate (`ver` must still match).
    Finish(u32, u32),
    /// An entity's local work ends: `true` posts its messages, `false`
    /// moves it to its next step.
    Timer(u32, bool),
}

#[derive(Clone, Copy, Debug)]
struct Ev {
    t: f64,
    seq: u64,
    what: What,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    /// Reversed: the earliest event (then the first queued) is the greatest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Times are never negative, so their bits order as the times do.
        (o.t.to_bits(), o.seq).cmp(&(self.t.to_bits(), self.seq))
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Ent {
    run: usize,
    rep: u32,
    pending: u32,
    enter: f64,
    last_start: f64,
    /// When the last of the current step's flows got past its latency.
    active_from: f64,
    done: bool,
    finish: f64,
    wait: f64,
}

#[derive(Default)]
struct Chan {
    /// Posted sends: bytes, latency multiplier (steps aggregated).
    sends: VecDeque<(f64, f64)>,
    recvs: VecDeque<u32>,
}

/// Runs `progs` (one per entity) on `cl`. `symmetric` selects the frame.
pub fn run(cl: &Cluster, progs: &[Program], symmetric: bool) -> Outcome {
    Engine::new(cl, progs, symmetric).go()
}

/// Like [`run`], but each run of alike steps executes as one aggregated step
/// (see the module documentation).
pub fn run_aggregated(cl: &Cluster, progs: &[Program], symmetric: bool) -> Outcome {
    let mut e = Engine::new(cl, progs, symmetric);
    e.agg = true;
    e.go()
}

struct Engine<'a> {
    cl: &'a Cluster,
    progs: &'a [Program],
    sym: bool,
    agg: bool,
    ents: Vec<Ent>,
    /// Per receiving rank (shifted onto node 0's frame when symmetric): its
    /// open channels by sending rank (a rank has few peers at a time).
    chans: Vec<Vec<(u32, Chan)>>,
    /// Flow slots (free ones listed in `free`).
    flows: Vec<Flow>,
    free: Vec<u32>,
    /// Per resource: the live flows crossing it.
    on_res: Vec<Vec<u32>>,
    /// Resources whose flows changed since the last rate computation.
    dirty_res: Vec<u32>,
    /// Pending events (flow activations and ends, timers).
    events: BinaryHeap<Ev>,
    seq: u64,
    stamp: u32,
    res_seen: Vec<u32>,
    cap: Vec<f64>,
    bucket: Vec<bool>,
    has_bucket: bool,
    tokens: Vec<f64>,
    usage: Vec<f64>,
    rem: Vec<f64>,
    cnt: Vec<u32>,
    now: f64,
    out: Outcome,
    dirty: bool,
}

const EPS: f64 = 1e-9;

impl<'a> Engine<'a> {
    fn new(cl: &'a Cluster, progs: &'a [Program], sym: bool) -> Engine<'a> {
        let e = progs.len();
        let node_slots = if sym { 1 } else { cl.nodes };
        let nres = 4 * e + 4 * node_slots;
        let mut cap = vec![0.0; nres];
        let mut bucket = vec![false; nres];
        let burst = cl.burst_bytes > 0.0;
        let rate = |b: f64| b / 1e6; // bytes per µs
        for i in 0..e {
            cap[4 * i] = rate(cl.intra.bytes_per_s);
            cap[4 * i + 1] = rate(cl.intra.bytes_per_s);
            cap[4 * i + 2] = rate(cl.inter.bytes_per_s);
            cap[4 * i + 3] = rate(cl.inter.bytes_per_s);
            if cl.nic == Nic::PerRank {
                bucket[4 * i + 2] = burst;
                bucket[4 * i + 3] = burst;
            }
        }
        let node_nic = match cl.nic {
            Nic::PerRank => cl.inter.bytes_per_s * cl.ranks_per_node as f64,
            Nic::PerNode => cl.inter.bytes_per_s,
        };
        for k in 0..node_slots {
            let b = 4 * e + 4 * k;
            cap[b] = rate(cl.inter.bytes_per_s);
            cap[b + 1] = rate(cl.inter.bytes_per_s);
            cap[b + 2] = rate(node_nic / cl.oversubscription);
            cap[b + 3] = rate(node_nic / cl.oversubscription);
            if cl.nic == Nic::PerNode {
                bucket[b] = burst;
                bucket[b + 1] = burst;
            }
        }
        // Buckets start empty: the steady state of back-to-back operations
        // (a benchmark loop); they fill only while a link runs below its rate.
        let tokens = vec![0.0; nres];
        Engine {
            cl,
            progs,
            sym,
            agg: false,
            ents: vec![Ent::default(); e],
            chans: (0..cl.nranks()).map(|_| Vec::new()).collect(),
            flows: Vec::new(),
            free: Vec::new(),
            on_res: vec![Vec::new(); nres],
            dirty_res: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            stamp: 0,
            res_seen: vec![0; nres],
            cap,
            bucket,
            has_bucket: burst,
            tokens,
            usage: vec![0.0; nres],
            rem: vec![0.0; nres],
            cnt: vec![0; nres],
            now: 0.0,
            out: Outcome {
                finish_us: vec![0.0; e],
                wait_us: vec![0.0; e],
                ..Outcome::default()
            },
            dirty: true,
        }
    }

    fn l(&self) -> usize {
        self.cl.ranks_per_node
    }

    /// Node of a rank in the engine's frame.
    fn node(&self, rank: usize) -> usize {
        if self.sym {
            rank / self.l()
        } else {
            self.cl.node_of(rank)
        }
    }

    /// Entity that plays `rank`.
    fn ent_of(&self, rank: usize) -> usize {
        if self.sym {
            rank % self.l()
        } else {
            rank
        }
    }

    fn go(mut self) -> Outcome {
        for e in 0..self.ents.len() {
            self.enter(e);
        }
        loop {
            if self.dirty {
                self.rates();
                self.dirty = false;
            }
            let mut next = f64::INFINITY;
            while let Some(ev) = self.events.peek() {
                if self.valid(ev.what) {
                    next = ev.t;
                    break;
                }
                self.events.pop();
            }
            // `take`, not `filter`: without buckets skip the scan entirely.
            let nb = if self.has_bucket {
                self.bucket.len()
            } else {
                0
            };
            for (r, &b) in self.bucket.iter().enumerate().take(nb) {
                let over = self.usage[r] - self.cap[r];
                if b && self.tokens[r] > 0.0 && over > EPS {
                    next = next.min(self.now + self.tokens[r] / over);
                }
            }
            if !next.is_finite() {
                break;
            }
            self.out.events += 1;
            self.advance(next.max(self.now));
        }
        self.out.complete = self.ents.iter().all(|e| e.done);
        for (i, e) in self.ents.iter().enumerate() {
            self.out.finish_us[i] = e.finish;
            self.out.wait_us[i] = e.wait;
        }
        self.out.time_us = self.ents.iter().map(|e| e.finish).fold(0.0, f64::max);
        self.out
    }

    /// Whether a queued event still stands (its flow was not re-rated or ended).
    fn valid(&self, w: What) -> bool {
        match w {
            What::Activate(i, v) | What::Finish(i, v) => self.flows[i as usize].ver == v,
            What::Timer(..) => true,
        }
    }

    fn push_ev(&mut self, t: f64, what: What) {
        self.seq += 1;
        self.events.push(Ev {
            t,
            seq: self.seq,
            what,
        });
    }

    fn timer(&mut self, t: f64, e: usize, post: bool) {
        self.push_ev(t, What::Timer(e as u32, post));
    }

    fn advance(&mut self, t: f64) {
        let dt = t - self.now;
        let tol = EPS * t.max(1.0);
        let nb = if self.has_bucket {
            self.bucket.len()
        } else {
            0
        };
        for (r, &b) in self.bucket.iter().enumerate().take(nb) {
            if b {
                let tk = self.tokens[r] + (self.cap[r] - self.usage[r]) * dt;
                let tk = tk.clamp(0.0, self.cl.burst_bytes);
                if (tk <= tol) != (self.tokens[r] <= tol) {
                    self.dirty = true;
                }
                self.tokens[r] = if tk <= tol { 0.0 } else { tk };
            }
        }
        // Every event due by `t` (within the tolerance): flows first, then
        // timers, as one batch.
        let mut due: Vec<What> = Vec::new();
        while let Some(ev) = self.events.peek() {
            if ev.t > t + tol {
                break;
            }
            let w = ev.what;
            self.events.pop();
            if self.valid(w) {
                due.push(w);
            }
        }
        self.now = t;
        let mut done: Vec<(u32, u32)> = Vec::new();
        let mut timers: Vec<(u32, bool)> = Vec::new();
        for w in due {
            match w {
                What::Finish(i, _) => done.push(self.end_flow(i)),
                What::Activate(i, _) => {
                    if self.flows[i as usize].remaining <= 0.0 {
                        done.push(self.end_flow(i));
                    } else {
                        self.activate(i);
                    }
                }
                What::Timer(e, post) => timers.push((e, post)),
            }
        }
        for (s, d) in done {
            self.op_done(s as usize);
            self.op_done(d as usize);
        }
        for (e, post) in timers {
            if post {
                self.post_msgs(e as usize);
            } else {
                self.next_step(e as usize);
            }
        }
    }

    /// A flow past its latency starts sharing its resources.
    fn activate(&mut self, i: u32) {
        let f = &mut self.flows[i as usize];
        f.live = true;
        f.t0 = self.now;
        f.rate = 0.0;
        f.ver = f.ver.wrapping_add(1);
        let res = f.res;
        for &r in &res[..f.nres as usize] {
            self.on_res[r as usize].push(i);
            self.dirty_res.push(r);
        }
        self.dirty = true;
    }

    /// Removes a finished flow; returns its (sender, receiver) entities.
    fn end_flow(&mut self, i: u32) -> (u32, u32) {
        let f = self.flows[i as usize];
        if f.live {
            for &r in f.res() {
                let list = &mut self.on_res[r as usize];
                if let Some(p) = list.iter().position(|&x| x == i) {
                    list.swap_remove(p);
                }
                self.dirty_res.push(r);
            }
        }
        let slot = &mut self.flows[i as usize];
        slot.live = false;
        slot.ver = slot.ver.wrapping_add(1);
        self.free.push(i);
        self.dirty = true;
        (f.src, f.dst)
    }

    fn op_done(&mut self, e: usize) {
        let ent = &mut self.ents[e];
        ent.pending -= 1;
        if ent.pending > 0 {
            return;
        }
        ent.wait += (ent.last_start - ent.enter).max(0.0);
        let (run_i, active_from) = (ent.run, ent.active_from);
        let run = &self.progs[e].runs[run_i];
        // Reductions run piece by piece as the data arrives: what is left
        // when the transfers end is the reduction time beyond them.
        let reduce = self.local_us(run.reduce_bytes, run.repeat);
        let extra = reduce - (self.now - active_from).max(0.0);
        if extra > 0.0 {
            self.timer(self.now + extra, e, false);
        } else {
            self.next_step(e);
        }
    }

    /// Time in µs of `bytes` of local work (× `repeat` when aggregated).
    fn local_us(&self, bytes: f64, repeat: u32) -> f64 {
        if self.cl.reduce_bytes_per_s > 0.0 && bytes > 0.0 {
            let factor = if self.agg { f64::from(repeat) } else { 1.0 };
            factor * bytes / (self.cl.reduce_bytes_per_s / 1e6)
        } else {
            0.0
        }
    }

    /// Posts the messages of the entity's current step.
    fn post_msgs(&mut self, e: usize) {
        let run = &self.progs[e].runs[self.ents[e].run];
        let factor = if self.agg { f64::from(run.repeat) } else { 1.0 };
        let ent = &mut self.ents[e];
        ent.enter = self.now;
        ent.last_start = self.now;
        ent.active_from = self.now;
        ent.pending = run.msgs.len() as u32;
        for m in 0..run.msgs.len() {
            let msg = self.progs[e].runs[self.ents[e].run].msgs[m];
            self.post(e, msg.peer as usize, msg.bytes * factor, factor, msg.send);
        }
    }

    fn next_step(&mut self, e: usize) {
        let ent = &mut self.ents[e];
        ent.rep += 1;
        if self.agg || ent.rep >= self.progs[e].runs[ent.run].repeat {
            ent.rep = 0;
            ent.run += 1;
        }
        self.enter(e);
    }

    fn enter(&mut self, e: usize) {
        loop {
            let prog = &self.progs[e];
            let ent = &mut self.ents[e];
            if ent.run >= prog.runs.len() {
                ent.done = true;
                ent.finish = self.now;
                return;
            }
            let run = &prog.runs[ent.run];
            let copy = self.local_us(run.local_bytes, run.repeat);
            if run.msgs.is_empty() {
                // Nothing to overlap with: copies and reductions in turn.
                let local = copy + self.local_us(run.reduce_bytes, run.repeat);
                if local > 0.0 {
                    self.timer(self.now + local, e, false);
                    return;
                }
                let ent = &mut self.ents[e];
                ent.rep += 1;
                if self.agg || ent.rep >= run.repeat {
                    ent.rep = 0;
                    ent.run += 1;
                }
                continue;
            }
            // The executor copies first, then moves the step's messages.
            if copy > 0.0 {
                self.timer(self.now + copy, e, true);
            } else {
                self.post_msgs(e);
            }
            return;
        }
    }

    fn key(&self, e: usize, peer: usize, send: bool) -> u64 {
        let (s, d) = if !self.sym {
            if send {
                (e, peer)
            } else {
                (peer, e)
            }
        } else if send {
            (e, peer)
        } else {
            // Shift so that the sender sits on node 0.
            let n = self.cl.nodes;
            let m = self.node(peer);
            (peer % self.l(), ((n - m) % n) * self.l() + e)
        };
        ((s as u64) << 32) | d as u64
    }

    fn post(&mut self, e: usize, peer: usize, bytes: f64, lat_mult: f64, send: bool) {
        let key = self.key(e, peer, send);
        let (s, d) = ((key >> 32) as usize, (key & 0xffff_ffff) as usize);
        let list = &mut self.chans[d];
        let at = match list.iter().position(|(x, _)| *x as usize == s) {
            Some(at) => at,
            None => {
                list.push((s as u32, Chan::default()));
                list.len() - 1
            }
        };
        let ch = &mut list[at].1;
        if send {
            ch.sends.push_back((bytes, lat_mult));
        } else {
            ch.recvs.push_back(e as u32);
        }
        if ch.sends.is_empty() || ch.recvs.is_empty() {
            return;
        }
        let (bytes, lat_mult) = ch.sends.pop_front().unwrap_or_default();
        let recv_ent = ch.recvs.pop_front().unwrap_or_default() as usize;
        if ch.sends.is_empty() && ch.recvs.is_empty() {
            list.swap_remove(at);
        }
        let send_ent = self.ent_of(s);
        self.start_flow(send_ent, recv_ent, (s, d), bytes, lat_mult);
    }

    fn start_flow(&mut self, se: usize, re: usize, sd: (usize, usize), bytes: f64, lat_mult: f64) {
        let (s, d) = sd;
        let e4 = 4 * self.ents.len();
        let (ns, nd) = (self.node(s), self.node(d));
        let mult = if self.sym { self.cl.nodes as f64 } else { 1.0 };
        let mut res = [0u32; 4];
        let mut nres = 0;
        let mut push = |r: usize| {
            res[nres] = r as u32;
            nres += 1;
        };
        let lat = if ns == nd {
            push(4 * se);
            push(4 * re + 1);
            self.out.intra_bytes += bytes * mult;
            self.cl.intra.latency_us
        } else {
            let (ks, kd) = if self.sym { (0, 0) } else { (ns, nd) };
            match self.cl.nic {
                Nic::PerRank => {
                    push(4 * se + 2);
                    push(4 * re + 3);
                }
                Nic::PerNode => {
                    push(e4 + 4 * ks);
                    push(e4 + 4 * kd + 1);
                }
            }
            if self.cl.oversubscription > 1.0 {
                push(e4 + 4 * ks + 2);
                push(e4 + 4 * kd + 3);
            }
            self.out.inter_bytes += bytes * mult;
            self.cl.inter.latency_us
        };
        let active = self.now + lat * lat_mult;
        for x in [se, re] {
            self.ents[x].last_start = self.now;
            self.ents[x].active_from = self.ents[x].active_from.max(active);
        }
        let flow = Flow {
            res,
            nres: nres as u8,
            remaining: bytes,
            t0: active,
            rate: 0.0,
            src: se as u32,
            dst: re as u32,
            live: false,
            ver: 0,
            seen: 0,
            fill_rate: 0.0,
        };
        let i = match self.free.pop() {
            Some(i) => {
                let ver = self.flows[i as usize].ver.wrapping_add(1);
                self.flows[i as usize] = Flow { ver, ..flow };
                i
            }
            None => {
                self.flows.push(flow);
                (self.flows.len() - 1) as u32
            }
        };
        let v = self.flows[i as usize].ver;
        self.push_ev(active, What::Activate(i, v));
    }

    /// Max-min fair rates of the live flows. Max-min fairness splits over
    /// the connected components of flows that share resources, so only the
    /// components of resources that changed are recomputed (all of them
    /// with token buckets, whose state changes without a flow changing).
    fn rates(&mut self) {
        self.stamp = self.stamp.wrapping_add(1).max(1);
        let stamp = self.stamp;
        let mut stack: Vec<u32> = if self.has_bucket {
            self.dirty_res.clear();
            (0..self.on_res.len() as u32).collect()
        } else {
            std::mem::take(&mut self.dirty_res)
        };
        let mut touched: Vec<u32> = Vec::new();
        let mut comp: Vec<u32> = Vec::new();
        while let Some(r) = stack.pop() {
            if self.res_seen[r as usize] == stamp {
                continue;
            }
            self.res_seen[r as usize] = stamp;
            touched.push(r);
            for &i in &self.on_res[r as usize] {
                let f = &mut self.flows[i as usize];
                if f.seen != stamp {
                    f.seen = stamp;
                    comp.push(i);
                    for &q in &f.res[..f.nres as usize] {
                        if self.res_seen[q as usize] != stamp {
                            stack.push(q);
                        }
                    }
                }
            }
        }
        self.fill(&touched, &comp);
        if !self.has_bucket {
            return;
        }
        self.usage.fill(0.0);
        for f in self.flows.iter().filter(|f| f.live) {
            for &r in f.res() {
                self.usage[r as usize] += f.rate;
            }
        }
    }

    /// Progressive filling over one set of components: `touched` holds every
    /// resource of the flows `comp`; each flow's new rate is set, its bytes
    /// brought up to date and its end queued.
    fn fill(&mut self, touched: &[u32], comp: &[u32]) {
        for &r in touched {
            let r = r as usize;
            let peak = self.bucket[r] && self.tokens[r] > 0.0;
            self.rem[r] = if peak {
                self.cap[r] * BURST_PEAK_FACTOR
            } else {
                self.cap[r]
            };
            self.cnt[r] = self.on_res[r].len() as u32;
        }
        for &i in comp {
            self.flows[i as usize].fill_rate = -1.0;
        }
        let mut live: Vec<u32> = comp.to_vec();
        while !live.is_empty() {
            let mut share = f64::INFINITY;
            for &r in touched {
                let r = r as usize;
                if self.cnt[r] > 0 {
                    share = share.min(self.rem[r] / self.cnt[r] as f64);
                }
            }
            let lim = share * (1.0 + 1e-9);
            let mut keep = Vec::with_capacity(live.len());
            let mut hit = Vec::new();
            for &i in &live {
                let f = &self.flows[i as usize];
                if f.res()
                    .iter()
                    .any(|&r| self.rem[r as usize] / self.cnt[r as usize] as f64 <= lim)
                {
                    hit.push(i);
                } else {
                    keep.push(i);
                }
            }
            for &i in &hit {
                self.flows[i as usize].fill_rate = share;
                let f = self.flows[i as usize];
                for &r in f.res() {
                    let r = r as usize;
                    if self.cnt[r] > 0 {
                        self.rem[r] -= share;
                        self.cnt[r] -= 1;
                    }
                }
            }
            if hit.is_empty() {
                break;
            }
            live = keep;
        }
        for &r in touched {
            self.cnt[r as usize] = 0;
        }
        let now = self.now;
        for &i in comp {
            let f = &mut self.flows[i as usize];
            let rate = f.fill_rate.max(0.0);
            f.remaining -= f.rate * (now - f.t0);
            f.t0 = now;
            if f.rate == rate && f.rate > 0.0 {
                continue; // its queued end still stands
            }
            f.rate = rate;
            f.ver = f.ver.wrapping_add(1);
            let (v, rem) = (f.ver, f.remaining);
            if rate > 0.0 {
                self.push_ev(now + rem.max(0.0) / rate, What::Finish(i, v));
            }
        }
    }
}
