//! Max-min fair sharing of the links among the live flows of the engine.

use super::{Engine, What};
use crate::model::BURST_PEAK_FACTOR;

impl Engine<'_> {
    /// Max-min fair rates of the live flows. Max-min fairness splits over
    /// the connected components of flows that share resources, so only the
    /// components of resources that changed are recomputed (all of them
    /// with token buckets, whose state changes without a flow changing).
    pub(super) fn rates(&mut self) {
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
