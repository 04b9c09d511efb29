//! Planning: the schedule of an operation (cached per shape) and the
//! algorithm the planner picks, or the one forced.

use std::sync::Arc;

use comm_core::algo::{self, Algorithm, Params};
use comm_core::schedule::Schedule;
use comm_core::tune;
use comm_core::wire::Collective;
use comm_core::{DataType, Error, Result};

use super::{Inner, RawOp, ShapeKey, State};

impl Inner {
    /// The schedule of `op` with the algorithm the planner chose for it.
    /// Uniform-count schedules are cached per shape.
    /// `device`: the buffers are device memory (planned with
    /// [`Inner::device_shape`]).
    pub(super) fn schedule(
        &self,
        st: &mut State,
        op: &RawOp,
        device: bool,
    ) -> Result<(Arc<Schedule>, Algorithm)> {
        let plan = self.plan(op.coll, op.dtype, op.count, device)?;
        let params = Params {
            nranks: self.nranks,
            rank: self.rank,
            count: op.count,
            root: op.root,
            chunk: plan.chunk_elems,
        };
        let build = |blocks| {
            let input = algo::Input {
                p: params,
                topo: &self.topo,
                blocks,
            };
            algo::build_input(op.coll, plan.algo, &input)
                .ok_or_else(|| Error::Config(algo::unavailable(op.coll, plan.algo)))
        };
        match op.coll {
            Collective::AllGatherV | Collective::AllToAllV => {
                let v = op.v.as_ref().ok_or_else(|| {
                    self.invalid(op.coll.name(), "variable counts are missing".into())
                })?;
                let counts = algo::VarCounts {
                    send_counts: &v.send_counts,
                    send_displs: &v.send_displs,
                    recv_counts: &v.recv_counts,
                    recv_displs: &v.recv_displs,
                };
                let s = build(algo::Blocks::Var(counts))?;
                return Ok((Arc::new(s), plan.algo));
            }
            Collective::SendRecv => {
                let transfers: Vec<algo::Transfer> = op
                    .p2p
                    .iter()
                    .map(|p| algo::Transfer {
                        peer: p.peer,
                        is_send: p.is_send,
                        len: p.bytes(),
                    })
                    .collect();
                let s = build(algo::Blocks::P2p(&transfers))?;
                return Ok((Arc::new(s), plan.algo));
            }
            _ => {}
        }
        let key = ShapeKey {
            coll: op.coll,
            algo: plan.algo,
            count: op.count,
            root: op.root,
            chunk: plan.chunk_elems,
        };
        if let Some(s) = st.cache.get(&key) {
            return Ok((s.clone(), plan.algo));
        }
        let s = Arc::new(build(algo::Blocks::Uniform)?);
        if st.cache.len() > 256 {
            st.cache.clear();
        }
        st.cache.insert(key, s.clone());
        Ok((s, plan.algo))
    }

    /// The planner's choice for `coll` over `count` elements of `dtype`,
    /// with the algorithm forced for it (if any): the one place an
    /// operation's algorithm is decided.
    pub(super) fn plan(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
        device: bool,
    ) -> Result<tune::Plan> {
        let forced = self
            .forced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(c, _)| *c == coll)
            .map(|(_, a)| *a);
        let esize = dtype.size();
        // The topology file's local reduction speed (`intra.reduce_bandwidth`,
        // B/s; e.g. written by `commbench calibrate`), so the runtime charges
        // reductions as the simulator does; absent: reductions are free.
        let reduce_bytes_per_us = self
            .config
            .tiers
            .cluster
            .reduce_bytes_per_s
            .filter(|b| *b > 0.0)
            .map(|b| b / 1e6);
        tune::choose_reducing(
            coll,
            forced,
            if device {
                &self.device_shape
            } else {
                &self.shape
            },
            count.saturating_mul(esize),
            esize,
            self.config.chunk_bytes,
            reduce_bytes_per_us,
        )
    }

    /// The algorithm the planner picks for a collective of `count` elements.
    pub fn algorithm_for(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
    ) -> Result<&'static str> {
        Ok(self.plan(coll, dtype, count, false)?.algo.name())
    }

    /// Forces (or releases) the algorithm of one collective; the name must
    /// be one of the collective's rows in [`algo::ALGORITHMS`].
    pub fn force_algorithm(&self, coll: Collective, algo: Option<&str>) -> Result<()> {
        let chosen = match algo {
            Some(name) => Some(
                Algorithm::parse_for(coll, name.trim())
                    .map_err(|detail| self.invalid("force_algorithm", detail))?,
            ),
            None => None,
        };
        let mut f = self.forced.lock().unwrap_or_else(|e| e.into_inner());
        f.retain(|(c, _)| *c != coll);
        f.extend(chosen.map(|a| (coll, a)));
        Ok(())
    }
}
