//! Per-tier accounting: what operators of multi-tier clusters watch — the
//! share of traffic that crosses the slow tier, how often collectives are
//! called, and how long ranks wait on their peers.

use std::time::Duration;

/// Counters of one rank of one communicator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// The rank.
    pub rank: usize,
    /// Operations run.
    pub ops: u64,
    /// Operations per collective name.
    pub ops_by_collective: Vec<(String, u64)>,
    /// Per caller's tag ([`crate::CollConfig::tag`]; untagged operations
    /// are not listed): the tag, its operations and their busy time,
    /// ordered by tag.
    pub ops_by_tag: Vec<(u64, u64, Duration)>,
    /// Bytes sent to ranks of this node.
    pub intra_sent: u64,
    /// Bytes received from ranks of this node.
    pub intra_received: u64,
    /// Bytes sent to other nodes.
    pub inter_sent: u64,
    /// Bytes received from other nodes.
    pub inter_received: u64,
    /// Time spent waiting on peers.
    pub wait_time: Duration,
    /// Time spent inside operations.
    pub busy_time: Duration,
    /// Bytes per transport kind (`shm`, `rdma`, `tcp`, ...), as
    /// `(kind, sent, received)`, in the order the kinds were first used.
    pub by_transport: Vec<(String, u64, u64)>,
    /// TCP segments the kernel retransmitted on this communicator's
    /// connections since they opened (`TCP_INFO`; other transports count
    /// none). A rate-limited link that drops is visible here.
    pub retransmits: u64,
}

impl Stats {
    /// Share of sent bytes that crossed nodes (0 when nothing was sent).
    pub fn cross_tier_share(&self) -> f64 {
        let total = self.intra_sent + self.inter_sent;
        if total == 0 {
            0.0
        } else {
            self.inter_sent as f64 / total as f64
        }
    }

    /// Adds another communicator's counters (bytes and times; its op
    /// counts are kept apart as they are parts of this one's operations).
    pub fn absorb(&mut self, o: &Stats) {
        self.intra_sent += o.intra_sent;
        self.intra_received += o.intra_received;
        self.inter_sent += o.inter_sent;
        self.inter_received += o.inter_received;
        self.wait_time += o.wait_time;
        self.retransmits += o.retransmits;
        for (kind, sent, received) in &o.by_transport {
            self.add_transport_bytes(kind, *sent, *received);
        }
    }

    /// Bytes sent and received on the device tier: over `nvlink`
    /// connections (device pieces device to device, and the host pieces of
    /// host operations between the same ranks). `(0, 0)` without nvlink.
    pub fn device_tier(&self) -> (u64, u64) {
        self.by_transport
            .iter()
            .find(|(k, _, _)| k == "nvlink")
            .map_or((0, 0), |(_, s, r)| (*s, *r))
    }

    /// Adds `sent` / `received` bytes to transport `kind`'s counters.
    pub fn add_transport_bytes(&mut self, kind: &str, sent: u64, received: u64) {
        match self.by_transport.iter_mut().find(|(k, _, _)| k == kind) {
            Some((_, s, r)) => {
                *s += sent;
                *r += received;
            }
            None => self.by_transport.push((kind.to_string(), sent, received)),
        }
    }

    /// Adds every counter of `o`, operation counts included.
    pub fn merge(&mut self, o: &Stats) {
        self.absorb(o);
        self.ops += o.ops;
        self.busy_time += o.busy_time;
        for (c, k) in &o.ops_by_collective {
            match self.ops_by_collective.iter_mut().find(|(c2, _)| c2 == c) {
                Some((_, m)) => *m += k,
                None => self.ops_by_collective.push((c.clone(), *k)),
            }
        }
        for (tag, k, busy) in &o.ops_by_tag {
            match self.ops_by_tag.iter_mut().find(|(t, _, _)| t == tag) {
                Some((_, m, b)) => {
                    *m += k;
                    *b += *busy;
                }
                None => self.ops_by_tag.push((*tag, *k, *busy)),
            }
        }
        self.ops_by_tag.sort();
    }

    /// Difference of two snapshots (`self` later than `earlier`).
    pub fn since(&self, earlier: &Stats) -> Stats {
        let ops_by_collective = self
            .ops_by_collective
            .iter()
            .map(|(c, n)| {
                let before = earlier
                    .ops_by_collective
                    .iter()
                    .find(|(c2, _)| c2 == c)
                    .map_or(0, |(_, m)| *m);
                (c.clone(), n - before)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        let ops_by_tag = self
            .ops_by_tag
            .iter()
            .map(|(tag, n, busy)| {
                let (n0, b0) = earlier
                    .ops_by_tag
                    .iter()
                    .find(|(t, _, _)| t == tag)
                    .map_or((0, Duration::ZERO), |(_, n0, b0)| (*n0, *b0));
                (*tag, n - n0, busy.saturating_sub(b0))
            })
            .filter(|(_, n, _)| *n > 0)
            .collect();
        Stats {
            rank: self.rank,
            ops: self.ops - earlier.ops,
            ops_by_collective,
            ops_by_tag,
            intra_sent: self.intra_sent - earlier.intra_sent,
            intra_received: self.intra_received - earlier.intra_received,
            inter_sent: self.inter_sent - earlier.inter_sent,
            inter_received: self.inter_received - earlier.inter_received,
            wait_time: self.wait_time.saturating_sub(earlier.wait_time),
            busy_time: self.busy_time.saturating_sub(earlier.busy_time),
            retransmits: self.retransmits.saturating_sub(earlier.retransmits),
            by_transport: self
                .by_transport
                .iter()
                .map(|(k, s, r)| {
                    let (s0, r0) = earlier
                        .by_transport
                        .iter()
                        .find(|(k0, _, _)| k0 == k)
                        .map_or((0, 0), |(_, s0, r0)| (*s0, *r0));
                    (k.clone(), s - s0, r - r0)
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_tier_is_the_nvlink_bytes() {
        let mut s = Stats::default();
        assert_eq!(s.device_tier(), (0, 0));
        s.add_transport_bytes("shm", 5, 6);
        s.add_transport_bytes("nvlink", 7, 8);
        s.add_transport_bytes("nvlink", 1, 1);
        assert_eq!(s.device_tier(), (8, 9));
    }
}
