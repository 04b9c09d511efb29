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
//! *Aggregated* runs ([`Options::aggregated`]): a run of `R` alike steps executes
//! as one step whose messages carry `R` × the bytes and take `R` × the
//! latency, and whose local work is `R` × the step's. That is exact when the
//! run's steps go in lockstep with one bottleneck (every step of a ring, the
//! steady state of a pipelined tree: the period is the slowest edge's
//! latency + transfer), and it turns the 2(n−1) steps of a ring on 65,664
//! ranks into a handful of events. Tests compare it with step-by-step
//! execution.

use std::collections::{BinaryHeap, VecDeque};

use crate::critical::{Bound, StepRec};
use crate::model::{Cluster, Nic};
use crate::program::Program;

mod fair;

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
    /// Per entity, each executed step's times and what ended it (asked for
    /// with [`Options::record_steps`]; empty otherwise).
    pub steps: Vec<Vec<StepRec>>,
}

/// How [`execute`] runs the programs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// The symmetric frame (else one entity per rank).
    pub symmetric: bool,
    /// Each run of alike steps as one aggregated step.
    pub aggregated: bool,
    /// Record every executed step ([`Outcome::steps`]), for the critical path.
    pub record_steps: bool,
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
    /// The entity whose post matched the message (the later of the two).
    late: u32,
    /// When the message was matched, µs.
    matched: f64,
    /// Whether it crosses nodes.
    inter: bool,
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
    /// When the entity entered its current step (before its copies).
    step_from: f64,
    /// What ended the current step's transfers (its last flow).
    bound: Bound,
    /// Reduction time left after that flow ended.
    local_extra: f64,
}

#[derive(Default)]
struct Chan {
    /// Posted sends: bytes, latency multiplier (steps aggregated).
    sends: VecDeque<(f64, f64)>,
    recvs: VecDeque<u32>,
}

/// Runs `progs` (one per entity) on `cl` as `opts` says.
pub fn execute(cl: &Cluster, progs: &[Program], opts: Options) -> Outcome {
    let mut e = Engine::new(cl, progs, opts.symmetric);
    e.agg = opts.aggregated;
    if opts.record_steps {
        e.out.steps = vec![Vec::new(); progs.len()];
        e.record = true;
    }
    e.go()
}

struct Engine<'a> {
    cl: &'a Cluster,
    progs: &'a [Program],
    sym: bool,
    agg: bool,
    record: bool,
    /// Per entity: its node's compute slowdown (empty: none anywhere).
    compute: Vec<f64>,
    /// Per node: the latency its links add per message, µs, (intra, inter)
    /// (empty: none anywhere; `Cluster::extra_latency_of`).
    extra_latency: Vec<(f64, f64)>,
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

        // Slowdowns exist in the per-rank frame only (the symmetric frame
        // refuses them), where entity i is rank i.
        let slow = |i: usize| {
            if sym || cl.slowdowns.is_empty() {
                (1.0, 1.0, 1.0)
            } else {
                cl.slowdown_of(cl.node_of(i))
            }
        };
        for i in 0..e {
            let (intra, inter, _) = slow(i);
            cap[4 * i] = rate(cl.intra.bytes_per_s) / intra;
            cap[4 * i + 1] = rate(cl.intra.bytes_per_s) / intra;
            cap[4 * i + 2] = rate(cl.inter.bytes_per_s) / inter;
            cap[4 * i + 3] = rate(cl.inter.bytes_per_s) / inter;
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
            let inter = if sym { 1.0 } else { cl.slowdown_of(k).1 };
            cap[b] = rate(cl.inter.bytes_per_s) / inter;
            cap[b + 1] = rate(cl.inter.bytes_per_s) / inter;
            cap[b + 2] = rate(node_nic / cl.oversubscription) / inter;
            cap[b + 3] = rate(node_nic / cl.oversubscription) / inter;
            if cl.nic == Nic::PerNode {
                bucket[b] = burst;
                bucket[b + 1] = burst;
            }
        }
        // Buckets start empty: the steady state of back-to-back operations
        // (a benchmark loop); they fill only while a link runs below its rate.
        let tokens = vec![0.0; nres];
        let compute = if sym || cl.slowdowns.is_empty() {
            Vec::new()
        } else {
            (0..e).map(|i| slow(i).2).collect()
        };
        let extra_latency = if sym || cl.slowdowns.is_empty() {
            Vec::new()
        } else {
            (0..cl.nodes).map(|k| cl.extra_latency_of(k)).collect()
        };
        Engine {
            cl,
            progs,
            sym,
            extra_latency,
            agg: false,
            record: false,
            compute,
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
        let mut done: Vec<(u32, u32, Bound)> = Vec::new();
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
        for (s, d, bound) in done {
            self.op_done(s as usize, bound);
            self.op_done(d as usize, bound);
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

    /// Removes a finished flow; returns its (sender, receiver) entities
    /// and what it was, as the sender sees it.
    fn end_flow(&mut self, i: u32) -> (u32, u32, Bound) {
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
        let bound = Bound::Flow {
            from: f.src,
            to: f.dst,
            late: f.late,
            inter: f.inter,
            matched: f.matched,
        };
        (f.src, f.dst, bound)
    }

    fn op_done(&mut self, e: usize, bound: Bound) {
        let ent = &mut self.ents[e];
        ent.pending -= 1;
        if ent.pending > 0 {
            return;
        }
        ent.bound = bound;
        ent.wait += (ent.last_start - ent.enter).max(0.0);
        let (run_i, active_from) = (ent.run, ent.active_from);
        let run = &self.progs[e].runs[run_i];
        // Reductions run piece by piece as the data arrives: what is left
        // when the transfers end is the reduction time beyond them.
        let reduce = self.local_us(run.reduce_bytes, run.repeat, e);
        let extra = reduce - (self.now - active_from).max(0.0);
        self.ents[e].local_extra = extra.max(0.0);
        if extra > 0.0 {
            self.timer(self.now + extra, e, false);
        } else {
            self.next_step(e);
        }
    }

    /// Time in µs of entity `e`'s `bytes` of local work (× `repeat` when
    /// aggregated).
    fn local_us(&self, bytes: f64, repeat: u32, e: usize) -> f64 {
        if self.cl.reduce_bytes_per_s > 0.0 && bytes > 0.0 {
            let factor = if self.agg { f64::from(repeat) } else { 1.0 };
            let slow = self.compute.get(e).copied().unwrap_or(1.0);
            slow * factor * bytes / (self.cl.reduce_bytes_per_s / 1e6)
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
        if self.record {
            self.out.steps[e].push(StepRec {
                from: ent.step_from,
                posted: ent.enter,
                end: self.now,
                bound: ent.bound,
                local_extra: ent.local_extra,
            });
        }
        ent.bound = Bound::Local;
        ent.local_extra = 0.0;
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
            ent.step_from = self.now;
            ent.enter = self.now;
            if ent.run >= prog.runs.len() {
                ent.done = true;
                ent.finish = self.now;
                return;
            }
            let run = &prog.runs[ent.run];
            let copy = self.local_us(run.local_bytes, run.repeat, e);
            if run.msgs.is_empty() {
                // Nothing to overlap with: copies and reductions in turn.
                let local = copy + self.local_us(run.reduce_bytes, run.repeat, e);
                if local > 0.0 {
                    self.ents[e].local_extra = local;
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
        // `e` posted last: its post matched the message.
        self.start_flow([send_ent, recv_ent, e], (s, d), bytes, lat_mult);
    }

    /// Starts the flow of a matched message between the entities `[sender,
    /// receiver, the one whose post matched it]`.
    fn start_flow(&mut self, ents: [usize; 3], sd: (usize, usize), bytes: f64, lat_mult: f64) {
        let [se, re, late] = ents;
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
            self.cl.intra.latency_us + self.extra_latency.get(ns).map_or(0.0, |x| x.0)
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
            // A message waits for the slower end's network.
            let extra = |k: usize| self.extra_latency.get(k).map_or(0.0, |x| x.1);
            self.cl.inter.latency_us + extra(ns).max(extra(nd))
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
            late: late as u32,
            matched: self.now,
            inter: ns != nd,
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
}
