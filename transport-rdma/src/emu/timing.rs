//! Strict mode's hardware timing: a WRITE that no responder answers (the
//! peer's process, device or QP is gone, or its packets cannot cross the
//! fabric) ends with `IBV_WC_RETRY_EXC_ERR` only once the requester's
//! retries run out — each try waits the local ACK timeout of
//! 4.096 µs × 2^`timeout` (ibv_modify_qp(3), the `timeout` attribute; 0
//! waits forever), and there are `retry_cnt` + 1 tries — where the
//! permissive emulation fails it at once. Work requests posted behind it on
//! the same QP complete with it, flushed, as the QP enters ERROR. At the
//! defaults (`SNCL_IB_TIMEOUT` 20, `SNCL_IB_RETRY_CNT` 7) that is 34.4 s.

use std::time::Instant;

use super::strict::Late;
use super::EmuVerbs;
use crate::verbs::WcStatus;

impl EmuVerbs {
    /// A WRITE on `qpn` that nothing answers: fails now (permissive), or
    /// once the QP's retries run out (strict; later WRITEs on the QP are
    /// flushed then).
    pub(super) fn fail_unanswered(&mut self, qpn: u32, wr_id: u64) {
        let now = Instant::now();
        let Some(qp) = self.qps.get_mut(&qpn).filter(|_| self.strict.is_some()) else {
            self.complete_send(qpn, wr_id, WcStatus::RETRY_EXC_ERR);
            return;
        };
        let status = if qp.failing.is_some() {
            WcStatus::WR_FLUSH_ERR
        } else {
            WcStatus::RETRY_EXC_ERR
        };
        let due = *qp
            .failing
            .get_or_insert_with(|| qp.retry_after.map(|d| now + d));
        self.late.push_back(Late {
            due,
            qpn,
            wr_id,
            status,
        });
    }

    /// Whether `qpn` is retrying a WRITE nothing answers (strict): what is
    /// posted behind it waits for the same end.
    pub(super) fn retrying(&self, qpn: u32) -> bool {
        self.qps.get(&qpn).is_some_and(|q| q.failing.is_some())
    }

    /// Reports the late completions that are due, in order.
    pub(super) fn release_late(&mut self) {
        let now = Instant::now();
        while let Some(l) = self.late.front() {
            // Completions per QP in order: not before its unfinished WRITEs.
            if l.due.is_none_or(|d| d > now) || self.dma_pending(l.qpn) > 0 {
                break;
            }
            let l = self.late.pop_front().expect("front");
            self.complete_send(l.qpn, l.wr_id, l.status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::strict::retries_run_out_after;

    #[test]
    fn retries_run_out_after_the_verbs_formula() {
        // The defaults: 4.096 us x 2^20 x 8 = 34.36 s.
        let d = retries_run_out_after(20, 7).unwrap();
        assert!((d.as_secs_f64() - 34.36).abs() < 0.01, "{d:?}");
        // 4.096 us x 2^14 x 1 = 67 ms.
        let d = retries_run_out_after(14, 0).unwrap();
        assert_eq!(d.as_nanos(), 4096 << 14);
        assert_eq!(retries_run_out_after(0, 7), None, "timeout 0 waits forever");
    }
}
