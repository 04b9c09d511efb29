//! The send queues of a connection: which work requests are signalled and
//! which work requests a completion retires (issue 36, risk 10).
//!
//! A signalled work request costs the NIC a completion entry and the
//! progress loop a CQ poll; NCCL and perftest signal one in several. Here
//! every [`SIGNAL_EVERY`]-th work request on a queue pair is signalled,
//! and so is one whose completion the connection waits for (a lent or
//! GPUDirect payload: `flush` waits for it) and one that takes the last
//! slot the connection may use (so a full queue always has a completion
//! coming). An unsignalled request is done — its slot and its source free —
//! once a later completion of its queue pair is polled (ibv_post_send(3)),
//! so a completion retires every request before it.
//!
//! The same rule holds for a staging slot a WRITE reads: the slot is the
//! NIC's until a completion covering that WRITE is polled (a retransmission
//! reads it again, and the responder writes what it reads), not merely
//! until the peer credits the slot. So the queues remember, per staging
//! slot, the WRITE that last read it ([`SendQueues::reader`]); the
//! connection reuses the slot only once it is retired, and where no
//! signalled request follows that WRITE on its queue pair it posts one
//! (found by the strict emulation's source check once ODP faults delayed
//! a signalled completion behind credits: issue 36, risk 8).

use std::collections::VecDeque;

use crate::verbs::SendWr;

/// One work request in this many is signalled.
pub(crate) const SIGNAL_EVERY: u32 = 4;

/// One posted work request: its wr_id, whether it is signalled, and the
/// staging slot it reads (if any).
type Posted = (u64, bool, Option<usize>);

/// Per queue pair: the work requests posted and not yet retired, in order,
/// and how many were posted since the last signalled one; per staging
/// slot, the queue pair and wr_id of the unretired WRITE that reads it.
#[derive(Debug)]
pub(crate) struct SendQueues {
    qs: Vec<(VecDeque<Posted>, u32)>,
    readers: Vec<Option<(usize, u64)>>,
}

impl SendQueues {
    /// Queues for `nqps` queue pairs, over a staging area of `slots` slots.
    pub(crate) fn new(nqps: usize, slots: usize) -> SendQueues {
        SendQueues {
            qs: (0..nqps).map(|_| (VecDeque::new(), 0)).collect(),
            readers: vec![None; slots],
        }
    }

    /// Where staging slot `slot` is still read by a WRITE no polled
    /// completion has retired: its queue pair, and whether a completion
    /// that will retire it is coming (a signalled request at or after it).
    pub(crate) fn reader(&self, slot: usize) -> Option<(usize, bool)> {
        let (q, wr_id) = self.readers.get(slot).copied().flatten()?;
        let posted = &self.qs[q].0;
        let at = posted.iter().position(|p| p.0 == wr_id)?;
        Some((q, posted.iter().skip(at).any(|p| p.1)))
    }

    /// Whether a completion is coming on some queue pair (a signalled
    /// request posted and not retired).
    pub(crate) fn awaiting(&self) -> bool {
        self.qs.iter().any(|(posted, _)| posted.iter().any(|p| p.1))
    }

    /// Work requests of QP `q` posted and not retired (their slots).
    pub(crate) fn outstanding(&self, q: usize) -> u32 {
        self.qs[q].0.len() as u32
    }

    /// Sets `wrs`' signalling before they are posted on `q`: `must(wr)`
    /// for those whose completion is awaited; `limit` is how many slots the
    /// connection may fill.
    pub(crate) fn mark(
        &mut self,
        q: usize,
        wrs: &mut [SendWr],
        limit: u32,
        must: impl Fn(&SendWr) -> bool,
    ) {
        let (posted, since) = &mut self.qs[q];
        let mut held = posted.len() as u32;
        for wr in wrs {
            held += 1;
            wr.signaled = must(wr) || *since + 1 >= SIGNAL_EVERY || held >= limit;
            *since = if wr.signaled { 0 } else { *since + 1 };
        }
    }

    /// Records `wrs` as posted on `q`; `slot_of(wr)` is the staging slot
    /// a request reads, if any.
    pub(crate) fn posted(
        &mut self,
        q: usize,
        wrs: &[SendWr],
        slot_of: impl Fn(&SendWr) -> Option<usize>,
    ) {
        for w in wrs {
            let slot = slot_of(w).filter(|&s| s < self.readers.len());
            if let Some(s) = slot {
                self.readers[s] = Some((q, w.wr_id));
            }
            self.qs[q].0.push_back((w.wr_id, w.signaled, slot));
        }
    }

    /// A completion of `q` was polled: calls `retired` with the wr_id of
    /// each work request it retires, oldest first. A success is a
    /// signalled request's: it retires it and the unsignalled ones before
    /// it. An error or flush completion is one request's (each completes
    /// by itself then): it retires the oldest.
    pub(crate) fn complete(&mut self, q: usize, success: bool, mut retired: impl FnMut(u64)) {
        let posted = &mut self.qs[q].0;
        while let Some((wr_id, signaled, slot)) = posted.pop_front() {
            if let Some(s) = slot {
                if self.readers[s] == Some((q, wr_id)) {
                    self.readers[s] = None;
                }
            }
            retired(wr_id);
            if signaled || !success {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(wr_id: u64) -> SendWr {
        SendWr {
            signaled: true,
            wr_id,
            local: (0, 0, 0),
            remote_addr: 0,
            rkey: 0,
            imm: None,
        }
    }

    #[test]
    fn one_in_four_is_signalled_and_a_completion_retires_the_ones_before() {
        let mut s = SendQueues::new(1, 0);
        let mut wrs: Vec<SendWr> = (0..8).map(wr).collect();
        s.mark(0, &mut wrs, 100, |w| w.wr_id == 5);
        let sig: Vec<bool> = wrs.iter().map(|w| w.signaled).collect();
        assert_eq!(sig, [false, false, false, true, false, true, false, false]);
        s.posted(0, &wrs, |_| None);
        assert_eq!(s.outstanding(0), 8);
        let mut gone = Vec::new();
        s.complete(0, true, |id| gone.push(id));
        assert_eq!(gone, [0, 1, 2, 3]);
        s.complete(0, true, |id| gone.push(id));
        assert_eq!(gone, [0, 1, 2, 3, 4, 5]);
        assert_eq!(s.outstanding(0), 2);
        // Flushes complete one by one.
        s.complete(0, false, |id| gone.push(id));
        assert_eq!(s.outstanding(0), 1);
        // The request that takes the last allowed slot is signalled.
        let mut more: Vec<SendWr> = (10..12).map(wr).collect();
        s.mark(0, &mut more, 3, |_| false);
        assert_eq!(
            more.iter().map(|w| w.signaled).collect::<Vec<_>>(),
            [false, true]
        );
    }

    #[test]
    fn a_staging_slot_is_read_until_a_completion_covering_its_write_is_polled() {
        let mut s = SendQueues::new(2, 4);
        let mut wrs: Vec<SendWr> = (0..3).map(wr).collect();
        s.mark(1, &mut wrs, 100, |_| false);
        s.posted(1, &wrs, |w| Some(w.wr_id as usize));
        // Unsignalled, nothing signalled behind them: no completion comes.
        assert_eq!(s.reader(0), Some((1, false)));
        assert_eq!(s.reader(2), Some((1, false)));
        assert_eq!(s.reader(3), None, "never read");
        let mut fence = [wr(99)];
        s.mark(1, &mut fence, 100, |_| true);
        s.posted(1, &fence, |_| None);
        assert_eq!(s.reader(0), Some((1, true)), "the signalled one covers it");
        s.complete(1, true, |_| {});
        assert_eq!(s.reader(0), None, "retired");
        assert_eq!(s.reader(2), None);
    }
}
