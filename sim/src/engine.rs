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

use std::collections::{HashMap, VecDeque};

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

#[derive(Clone, Copy, Debug)]
struct Flow {
    res: [u32; 4],
    nres: u8,
    remaining: f64,
    rate: f64,
    active_at: f64,
    src: u32,
    dst: u32,
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
    chans: HashMap<u64, Chan>,
    flows: Vec<Flow>,
    /// (when, entity, what): `true` posts the entity's messages (its copies
    /// are done), `false` moves it to its next step.
    timers: Vec<(f64, u32, bool)>,
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
            chans: HashMap::new(),
            flows: Vec::new(),
            timers: Vec::new(),
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
            for f in &self.flows {
                let t = if f.active_at > self.now {
                    f.active_at
                } else if f.rate > 0.0 {
                    self.now + f.remaining / f.rate
                } else {
                    f64::INFINITY
                };
                next = next.min(t);
            }
            for &(t, _, _) in &self.timers {
                next = next.min(t);
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
            self.advance(next);
        }
        self.out.complete = self.ents.iter().all(|e| e.done);
        for (i, e) in self.ents.iter().enumerate() {
            self.out.finish_us[i] = e.finish;
            self.out.wait_us[i] = e.wait;
        }
        self.out.time_us = self.ents.iter().map(|e| e.finish).fold(0.0, f64::max);
        self.out
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
        let mut done: Vec<(u32, u32)> = Vec::new();
        let mut i = 0;
        while i < self.flows.len() {
            let f = &mut self.flows[i];
            if f.active_at <= self.now {
                let fin = self.now + f.remaining / f.rate.max(1e-300);
                f.remaining -= f.rate * dt;
                if fin <= t + tol || f.remaining <= 1e-9 {
                    done.push((f.src, f.dst));
                    self.flows.swap_remove(i);
                    self.dirty = true;
                    continue;
                }
            } else if f.active_at <= t + tol {
                self.dirty = true;
                if f.remaining <= 0.0 {
                    done.push((f.src, f.dst));
                    self.flows.swap_remove(i);
                    continue;
                }
            }
            i += 1;
        }
        self.now = t;
        for (s, d) in done {
            self.op_done(s as usize);
            self.op_done(d as usize);
        }
        let mut k = 0;
        while k < self.timers.len() {
            if self.timers[k].0 <= t + tol {
                let (_, e, post) = self.timers.swap_remove(k);
                if post {
                    self.post_msgs(e as usize);
                } else {
                    self.next_step(e as usize);
                }
            } else {
                k += 1;
            }
        }
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
            self.timers.push((self.now + extra, e as u32, false));
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
                    self.timers.push((self.now + local, e as u32, false));
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
                self.timers.push((self.now + copy, e as u32, true));
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
        let ch = self.chans.entry(key).or_default();
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
            self.chans.remove(&key);
        }
        let s = (key >> 32) as usize;
        let d = (key & 0xffff_ffff) as usize;
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
        self.flows.push(Flow {
            res,
            nres: nres as u8,
            remaining: bytes,
            rate: 0.0,
            active_at: self.now + lat * lat_mult,
            src: se as u32,
            dst: re as u32,
        });
        self.dirty = true;
    }

    /// Max-min fair rates of the flows that are past their latency.
    fn rates(&mut self) {
        let now = self.now;
        let mut touched: Vec<u32> = Vec::new();
        let mut live: Vec<usize> = Vec::new();
        for (i, f) in self.flows.iter_mut().enumerate() {
            f.rate = 0.0;
            if f.active_at <= now + EPS * now.max(1.0) {
                live.push(i);
                for &r in &f.res[..f.nres as usize] {
                    let r = r as usize;
                    if self.cnt[r] == 0 {
                        touched.push(r as u32);
                        let peak = self.bucket[r] && self.tokens[r] > 0.0;
                        self.rem[r] = if peak {
                            self.cap[r] * BURST_PEAK_FACTOR
                        } else {
                            self.cap[r]
                        };
                    }
                    self.cnt[r] += 1;
                }
            }
        }
        while !live.is_empty() {
            let mut share = f64::INFINITY;
            for &r in &touched {
                let r = r as usize;
                if self.cnt[r] > 0 {
                    share = share.min(self.rem[r] / self.cnt[r] as f64);
                }
            }
            let lim = share * (1.0 + 1e-9);
            let mut keep = Vec::with_capacity(live.len());
            for &i in &live {
                let f = self.flows[i];
                let hit = f.res[..f.nres as usize]
                    .iter()
                    .any(|&r| self.rem[r as usize] / self.cnt[r as usize] as f64 <= lim);
                if hit {
                    self.flows[i].rate = share;
                } else {
                    keep.push(i);
                }
            }
            for &i in &live {
                if self.flows[i].rate > 0.0 {
                    let f = self.flows[i];
                    for &r in &f.res[..f.nres as usize] {
                        let r = r as usize;
                        if self.cnt[r] > 0 {
                            self.rem[r] -= share;
                            self.cnt[r] -= 1;
                        }
                    }
                }
            }
            if keep.len() == live.len() {
                break;
            }
            live = keep;
        }
        for &r in &touched {
            self.cnt[r as usize] = 0;
        }
        if !self.has_bucket {
            return;
        }
        self.usage.fill(0.0);
        for f in &self.flows {
            for &r in &f.res[..f.nres as usize] {
                self.usage[r as usize] += f.rate;
            }
        }
    }
}
